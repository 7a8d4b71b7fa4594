"""A searched kernel as a PyTorch custom op, built on first use. Torch only: `evoengineer export` copies this file
(with the family's op adapter) into the package it writes, and `evoengineer.load` uses it in place.

A kernel folder holds `kernel.json` (the elite: hash, params, metrics, and `build`: family, signature constants,
backend, arch, flags, and for a declared family its call as data), the recorded kernel source, the binding with its
header, and the shim naming the module; a CUDA kernel of a family whose binding launches device code also its
cubin (device_code.py). `KernelOp` compiles them into one extension through torch.utils.cpp_extension (cached by
content in the build folder), or loads the cubin through the family binding (built once, cached) with no compile of
the kernel, and hands the module to the family's `OpAdapter`, which
registers `torch.library` custom ops with fake (meta) implementations, so torch.compile(fullgraph=True) and CUDA graph
capture work, and gives the user-facing function. `DeclaredOp` is the adapter of a family that declares its call
(evoengineer.family.Signature): ``function(*inputs, *scalars) -> output`` in declared order, with the family's
reference as fallback and as the backward.

Eager calls that need no autograd skip the custom-op dispatch: the binding checks every argument before the launch
anyway, and only when it refuses one are the (slower, Python) checks run, for their message or the fallback.

`ShapeDispatch` holds several kernels of one family, each the fastest of its search on one timed shape, and runs per
call the one whose shape is nearest to the inputs (built when a call first needs it; `build()` builds them all).

Inputs outside the compiled signature raise ValueError/TypeError naming the argument and both values, unless the op
was made with ``fallback="reference"``: then the plain-PyTorch reference computes them (warned once). The kernels
are forward-only; gradients come from the reference's backward (a second custom op, so compiled graphs stay whole).
"""

import contextlib
import copy
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: builds of one folder are not serialized
    fcntl = None  # type: ignore[assignment]
from typing import Any, Callable, Iterator

import torch

try:  # an exported package carries its own copies of the flag whitelist and the device-code loader
    from . import device_code
    from .flags import ARCH, flag_problem
except ImportError:
    from evoengineer.ops import device_code
    from evoengineer.space.flags import ARCH, flag_problem

#: dtype names of signatures and declared calls
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float8_e4m3": torch.float8_e4m3fn, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
_DTYPES = DTYPES
_NAMESPACE = "evoengineer"


#: the headers every binding includes (templates/bindings/), copied into an exported package
BINDING_HEADERS = ("candidate_module.h", "cubin_module.h", "tma_host.h")


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


_dtype_name = dtype_name


# ---- a declared call, as data (evoengineer.family.Signature.to_json) -------------------------------------------------
def dim_value(dim: Any, sizes: dict[str, Any]) -> Any:
    """A declared dimension's value: an int, a size symbol or a product ("M*D") of them."""
    if isinstance(dim, int):
        return dim
    value: Any = 1
    for f in str(dim).split("*"):
        f = f.strip()
        value = value * (int(f) if f.isdigit() else sizes[f])
    return value


def size_sources(call: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Where each size symbol's value comes from: the first input that has it as a whole dimension (name, dim)."""
    sources: dict[str, tuple[str, int]] = {}
    for a in call["args"]:
        if a["kind"] == "tensor" and not a["output"]:
            for i, d in enumerate(a["dims"]):
                if isinstance(d, str) and d.isidentifier() and d not in sources and d not in call["fixed"]:
                    sources[d] = (a["name"], i)
    return sources


def resolve_sizes(call: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """The size symbols' values from the inputs, plus the fixed ones."""
    return {**{k: tensors[n].shape[i] for k, (n, i) in size_sources(call).items()}, **call["fixed"]}


def call_arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    """Argument `i` (or keyword `name`) of a call, None if not given."""
    return args[i] if len(args) > i else kwargs.get(name)


def _call_misfit(call: dict[str, Any], values: dict[str, Any], device_type: str
                 ) -> tuple[str, type[Exception]] | None:
    """Why these arguments are outside a declared call (static facts only: no data is read), or None."""
    first = None
    sizes: dict[str, tuple[Any, str]] = {k: (v, "fixed") for k, v in call["fixed"].items()}
    for a in call["args"]:
        if a["output"] if a["kind"] == "tensor" else False:
            continue
        name, v = a["name"], values.get(a["name"])
        if a["kind"] == "scalar":
            ok = isinstance(v, (bool, int, float)) if a["dtype"] in ("float32", "float64") else \
                isinstance(v, (bool, int)) if a["dtype"] == "bool" else (isinstance(v, int) and not isinstance(v, bool))
            if not ok:
                return f"{name}: expected a {a['dtype']} number, got {type(v).__name__}", TypeError
            continue
        if not isinstance(v, torch.Tensor):
            return f"{name}: expected a tensor, got {type(v).__name__}", TypeError
        if v.device.type != device_type:
            return f"{name}: on {v.device}, this kernel runs on {device_type}", ValueError
        if first is not None and v.device != first.device:
            return f"{name}: on {v.device}, expected {first.device} (the device of the first input)", ValueError
        first = first if first is not None else v
        want = DTYPES[a["dtype"]]
        if v.dtype != want:
            return f"{name}: dtype {dtype_name(v.dtype)}, but this kernel was compiled for {a['dtype']}", TypeError
        dims = a["dims"]
        if v.dim() != len(dims):
            return (f"{name}: expected {len(dims)} dimensions {_dims_text(dims)}, got {v.dim()} "
                    f"(shape {tuple(v.shape)})"), ValueError
        for i, d in enumerate(dims):
            if isinstance(d, str) and d.isidentifier():
                if d not in sizes:
                    sizes[d] = (v.shape[i], name)
                    continue
                want_n, src = sizes[d]
            else:
                try:
                    want_n, src = dim_value(d, {k: s for k, (s, _) in sizes.items()}), ""
                except KeyError:
                    continue
            if v.shape[i] != want_n:
                whence = ("this kernel was compiled for " + f"{d} = {want_n}") if src == "fixed" else \
                    f"expected {want_n}" + (f" (from {src})" if src else "")
                return f"{name}: size {i} ({d}) is {v.shape[i]}, {whence}; shape {tuple(v.shape)}", ValueError
    return None


def _dims_text(dims: list[Any]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _schema_type(a: dict[str, Any]) -> str:
    if a["kind"] == "tensor":
        return "Tensor"
    return {"float32": "float", "float64": "float", "int64": "int", "int32": "int", "bool": "bool"}[a["dtype"]]


def default_build_root() -> Path:
    """Where exported kernels are compiled: $EVOENGINEER_EXPORT_CACHE, else ~/.cache/evoengineer/ops."""
    given = os.environ.get("EVOENGINEER_EXPORT_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "evoengineer" / "ops"


def arch_list(arch: str | None) -> str | None:
    """TORCH_CUDA_ARCH_LIST for a space's arch: sm_90 -> 9.0, sm_90a -> 9.0a."""
    if not arch:
        return None
    digits = arch.removeprefix("sm_")
    return f"{digits[:-1]}.{digits[-1]}" if digits[-1].isdigit() else f"{digits[:-2]}.{digits[-2:]}"


def _registered_ops() -> dict[str, tuple[Any, Any]]:
    """Custom ops registered in this process, by kernel hash, shared by every copy of this runtime (the op objects
    must stay alive: torch drops an op's kernels when its definition is garbage-collected)."""
    _loaded()  # makes the shared registry module
    import sys

    reg = sys.modules["_evoengineer_ops_loaded"]
    if not hasattr(reg, "ops"):
        reg.ops = {}  # type: ignore[attr-defined]
    return reg.ops  # type: ignore[attr-defined]


def _loaded() -> dict[str, Any]:
    """Extension modules built in this process, by module name, shared by every copy of this runtime (an exported
    package and evoengineer.load of the same kernel): an extension's name can be imported once per process."""
    import sys
    import types

    reg = sys.modules.get("_evoengineer_ops_loaded")
    if reg is None:
        reg = sys.modules.setdefault("_evoengineer_ops_loaded", types.ModuleType("_evoengineer_ops_loaded"))
        reg.modules = {}  # type: ignore[attr-defined]
    return reg.modules  # type: ignore[attr-defined]


def write_if_changed(path: Path, data: str | bytes) -> None:
    """Write a source atomically, and only when its content differs: a new mtime would make ninja rebuild what is
    up to date. (The builder's candidates use it too; it lives here because this file is copied into exported
    packages, which import nothing of EvoEngineer.)"""
    raw = data.encode() if isinstance(data, str) else data
    try:
        if path.read_bytes() == raw:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)


def build_module(folder: Path, kernel: dict[str, Any], build_root: Path | None = None) -> Any:
    """Compile the folder's kernel, binding and shim into one extension (cached by the content of the sources and the
    build settings) and import it (once per process)."""
    from torch.utils import cpp_extension

    build = kernel["build"]
    # an elite.json is a file like a space file: its flags reach /bin/sh through ninja, so they pass the same
    # whitelist before anything is compiled
    for key in ("flags", "cuda_flags", "ldflags"):
        for i, flag in enumerate(build.get(key) or []):
            why = flag_problem(flag)
            if why is not None:
                raise ValueError(f"kernel {kernel['hash'][:12]}: build.{key}[{i}]: flag {flag!r} refused: {why}")
    if build.get("arch") is not None and not ARCH.fullmatch(str(build["arch"])):
        raise ValueError(f"kernel {kernel['hash'][:12]}: build.arch {build['arch']!r} refused: expected sm_NN[a]")
    name = kernel["module"]
    if name in _loaded():
        return _loaded()[name]
    root = build_root or default_build_root()
    cuda = build["backend"] == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError(f"kernel {kernel['hash'][:12]} is a CUDA kernel ({build.get('arch')}) and this "
                               "machine has no usable GPU")
        arch = arch_list(build.get("arch"))
        if arch:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    flags = list(build.get("flags", [])) + (["-DEVO_WITH_CUDA"] if cuda else [])
    cuda_flags = (list(build.get("cuda_flags", [])) + ["-DEVO_WITH_CUDA"]) if cuda else None
    binding = _build_binding(folder, root, flags, cuda_flags, cuda)
    cubin = kernel.get("cubin") if cuda else None
    if cubin and (cubin.get("launched") or os.environ.get("EVOENGINEER_EXPORT_CUBIN", "1") != "0"):
        # device code exported as a cubin: the family binding loads it, nothing of the kernel is compiled here
        def load(device: int) -> Any:
            path = device_code.cubin_for(folder, kernel, root, device_code.device_arch(device))
            return device_code.load_cubin(binding, path, kernel, device)

        module = device_code.PerDeviceModule(load, torch.cuda.current_device())
        _loaded()[name] = module
        return module
    settings = json.dumps({k: build.get(k) for k in ("flags", "cuda_flags", "ldflags", "arch", "backend")},
                          sort_keys=True).encode()
    sources = [folder / kernel["source_file"], folder / "shim.cpp"]
    digest = hashlib.sha256()
    for p in sources:
        digest.update(p.read_bytes())
    digest.update(binding.name.encode())
    digest.update(settings)
    digest.update(torch.__version__.encode())
    out = root / f"{name}-{digest.hexdigest()[:12]}"
    out.mkdir(parents=True, exist_ok=True)
    # compiled from copies inside the (content-addressed) build folder: an installed package and evoengineer.load of
    # the same kernel then write the same ninja file and find each other's build up to date (ninja tracks paths)
    local = out / "src"
    local.mkdir(exist_ok=True)
    for p in sources:
        write_if_changed(local / p.name, p.read_bytes())
    sources = [local / p.name for p in sources]
    # the kernel and its shim only (no torch header is parsed here), linked to the family binding built once
    ldflags = [*build.get("ldflags", []), f"-L{binding.parent}", f"-l:{binding.name}", f"-Wl,-rpath,{binding.parent}"]
    with build_folder_lock(out):
        module = cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=flags,
                                    extra_cuda_cflags=cuda_flags, extra_ldflags=ldflags, build_directory=str(out),
                                    with_cuda=cuda, is_python_module=True, verbose=False)
    _loaded()[name] = module
    return module


def binding_flags(flags: list[str] | None) -> list[str] | None:
    """The build flags a family binding is compiled with (here and by the search's builder): those that can change
    what its headers declare (defines, include folders, the language standard), at -O2; not the kernel's
    optimization, target or OpenMP flags. One binding then serves every kernel of a family and signature, whatever
    its flags (it is the slow compile: torch's headers)."""
    if flags is None:
        return None
    return ["-O2", *(f for f in flags if f.startswith(("-D", "-U", "-I", "-isystem", "-std=", "--std=")))]


def _build_binding(folder: Path, root: Path, flags: list[str], cuda_flags: list[str] | None, cuda: bool) -> Path:
    """The family binding of an exported kernel as a shared library, built once per binding source, headers, build
    settings and torch (under `root`/bindings, shared by every exported kernel of that family and signature): the
    compile that parses torch's headers is paid once, not per op. Returns the library's path."""
    flags, cuda_flags = binding_flags(flags), binding_flags(cuda_flags)
    settings = json.dumps({"flags": flags, "cuda_flags": cuda_flags, "backend": "cuda" if cuda else "cpu"},
                          sort_keys=True).encode()
    files = [folder / "binding.cpp"] + [folder / h for h in BINDING_HEADERS
                                        if h == BINDING_HEADERS[0] or (folder / h).exists()]
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    digest.update(settings)
    digest.update(torch.__version__.encode())
    name = f"evo_opbinding_{digest.hexdigest()[:16]}"
    out = root / "bindings" / name
    so = out / f"{name}.so"
    with build_folder_lock(out):
        if not so.exists():
            local = out / "src"
            local.mkdir(exist_ok=True)
            for p in files:
                write_if_changed(local / p.name, p.read_bytes())
            # built in a child process: cpp_extension loads what it builds, and a binding loaded into this process
            # could lend its symbols to the kernels of another family's binding loaded later (every binding
            # defines evo_binding_make_module); linked as a kernel module's dependency, each stays its own
            job = {"name": name, "sources": [str(local / "binding.cpp")], "extra_cflags": flags,
                   "extra_include_paths": [str(local)], "extra_cuda_cflags": cuda_flags, "build_directory": str(out),
                   "with_cuda": cuda}
            code = ("import json, sys\nfrom torch.utils import cpp_extension\n"
                    "cpp_extension.load(**json.loads(sys.argv[1]), is_python_module=False, verbose=False)\n")
            r = subprocess.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True, text=True)
            if r.returncode != 0 or not so.exists():
                tail = (r.stderr or r.stdout).strip().splitlines()[-20:]
                raise RuntimeError(f"the family binding of this kernel failed to build ({out}):\n" + "\n".join(tail))
    return so


@contextlib.contextmanager
def build_folder_lock(out: Path) -> Iterator[None]:
    """Every build of this folder goes through one flock (released by the kernel when its process dies; not
    re-entrant: one per folder and process at a time). Holding it,
    a `lock` file of torch's (its FileBaton, made with O_EXCL and removed at the end of a build) can only be left by
    a build that was killed mid-way: torch would wait for it forever, so it is removed."""
    out.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(out / ".evo-build.lock", "a") as f:  # the name the candidate builds' folders use too
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            (out / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class OpAdapter:
    """Turns a built kernel into a PyTorch op: `register` defines the custom ops (forward with a fake
    implementation, and the reference's backward), `function` is what users call. `bind` is called first with the
    KernelOp (its `module`, `signature`, `op`, `outside`, `check_device`, `eager`). `call_features` /
    `spec_features` describe a call and a recorded shape for ShapeDispatch: (sizes compared on a log scale, a kind
    that must match)."""

    function_name = "forward"

    def bind(self, kop: "KernelOp") -> None:
        self.kop = kop

    def direct(self, prepare: Callable[[], tuple[torch.Tensor, list[Any]]]) -> torch.Tensor | None:
        """Run the kernel straight from its binding (an eager call that needs no autograd): `prepare` gives the
        output and the binding's arguments. None when an argument is refused or malformed (the caller's checks then
        say why, or fall back); a kernel failure raises."""
        try:
            out, args = prepare()
            rc = self.kop.module.forward(*args)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, StopIteration):
            return None
        if rc:
            raise RuntimeError(f"{self.function_name} kernel returned status {rc}")
        return out

    def unit_scales(self, n: int, device: torch.device) -> torch.Tensor:
        """float32 ones [n] on `device` (dequantization scales of a kernel called without them), kept per (n,
        device): one allocation, not one per call."""
        cache = self.__dict__.setdefault("_unit_scales", {})
        t = cache.get((n, device))
        if t is None:
            t = cache[(n, device)] = torch.ones(n, dtype=torch.float32, device=device)
        return t

    def register(self, name: str) -> tuple[Any, Any]:
        raise NotImplementedError

    def function(self, *args, **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def call_features(self, args: tuple, kwargs: dict) -> tuple[dict[str, int], tuple]:
        return {}, ()

    def spec_features(self, spec: dict[str, Any]) -> tuple[dict[str, int], tuple]:
        return {}, ()


class DeclaredOp(OpAdapter):
    """The op of a declared call: ``function(*inputs, *scalars)`` in declared order (keywords by name; inouts among
    the inputs, updated in place) returns the output, a tuple of the outputs when there are several, or None when
    the call only updates inouts; `reference(args by name)` is the fallback and, differentiated, the backward (not
    for a call with inouts: torch differentiates no op that mutates its inputs)."""

    def __init__(self, call: dict[str, Any], reference: Callable[[dict[str, Any]], Any], *,
                 name: str = "forward"):
        self.call = call
        self.reference = reference
        self.function_name = name
        self.params = [a for a in call["args"] if not (a["kind"] == "tensor" and a["output"])]
        self.names = [a["name"] for a in self.params]
        self.outs = [a for a in call["args"] if a["kind"] == "tensor" and a["output"]]
        self.inouts = [a["name"] for a in self.params if a["kind"] == "tensor" and a.get("inout")]
        self.written = [a["name"] for a in call["args"] if a["kind"] == "tensor" and (a["output"] or a.get("inout"))]
        self.single = len(self.outs) == 1 and not self.inouts  # the reference returns a tensor, not a dict
        self.out_dtypes = [DTYPES[a["dtype"]] for a in self.outs]
        self.out_dtype = self.out_dtypes[0] if self.outs else None
        # the float inputs have gradients (through the reference)
        self.grads = [a["name"] for a in self.params
                      if a["kind"] == "tensor" and DTYPES[a["dtype"]].is_floating_point]
        # the eager path's plan, made once: where the outputs go among the binding's arguments, which argument and
        # dimension gives each size symbol, the outputs' dims from them
        self._out_at = [call["args"].index(a) for a in self.outs]
        self._first = next(i for i, a in enumerate(self.params) if a["kind"] == "tensor")
        source = {k: (self.names.index(n), i) for k, (n, i) in size_sources(call).items()}
        self._out_dims = [[self._dim_getter(d, source, call["fixed"]) for d in a["dims"]] for a in self.outs]

    @staticmethod
    def _dim_getter(dim: Any, source: dict[str, tuple[int, int]], fixed: dict[str, int]) -> Callable[[tuple], Any]:
        const, parts = 1, []
        for f in ([dim] if isinstance(dim, int) else [x.strip() for x in str(dim).split("*")]):
            if isinstance(f, int) or f.isdigit():
                const *= int(f)
            elif f in fixed:
                const *= int(fixed[f])
            else:
                parts.append(source[f])
        if not parts:
            return lambda args: const
        if len(parts) == 1 and const == 1:
            (pi, i), = parts
            return lambda args: args[pi].shape[i]

        def value(args: tuple) -> Any:
            v = const
            for pi, i in parts:
                v = v * args[pi].shape[i]
            return v
        return value

    def _values(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if len(args) > len(self.names):
            raise TypeError(f"{self.function_name}() takes {len(self.names)} arguments ({', '.join(self.names)}), "
                            f"got {len(args)}")
        values = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k not in self.names:
                raise TypeError(f"{self.function_name}() got an unexpected keyword argument {k!r}")
            if k in values:
                raise TypeError(f"{self.function_name}() got multiple values for argument {k!r}")
            values[k] = v
        missing = [n for n in self.names if n not in values]
        if missing:
            raise TypeError(f"{self.function_name}() missing argument(s) {missing}")
        return values

    def out_shapes(self, values: dict[str, Any]) -> list[list[Any]]:
        sizes = resolve_sizes(self.call, values)
        return [[dim_value(d, sizes) for d in a["dims"]] for a in self.outs]

    def out_shape(self, values: dict[str, Any]) -> list[Any]:
        return self.out_shapes(values)[0]

    def _new_outs(self, values: dict[str, Any], device: Any) -> list[torch.Tensor]:
        return [torch.empty(shape, dtype=dt, device=device) for shape, dt in zip(self.out_shapes(values),
                                                                                  self.out_dtypes)]

    def _binding_args(self, values: dict[str, Any], outs: list[torch.Tensor]) -> list[Any]:
        by_name = {a["name"]: t for a, t in zip(self.outs, outs)}
        return [by_name[a["name"]] if (a["kind"] == "tensor" and a["output"]) else values[a["name"]]
                for a in self.call["args"]]

    def _result(self, outs: list[torch.Tensor]) -> Any:
        if len(outs) == 1:
            return outs[0]
        return tuple(outs) if outs else None

    def _ref_parts(self, values: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The reference's written tensors by name (a single output's under its name)."""
        ref = self.reference(dict(values))
        if self.single:
            return {self.outs[0]["name"]: ref}
        if isinstance(ref, (tuple, list)):
            ref = dict(zip(self.written, ref))
        return ref

    def _reference(self, values: dict[str, Any]) -> Any:
        """The fallback: the reference's outputs in their dtypes, and each inout updated with its value."""
        got = self._ref_parts(values)
        for n in self.inouts:
            values[n].copy_(got[n].to(values[n].dtype))
        return self._result([got[a["name"]].to(dt) for a, dt in zip(self.outs, self.out_dtypes)])

    def _schema(self) -> str:
        marks = iter("abcdefghijklmnopqrstuvwxyz")
        params = ", ".join((f"Tensor({next(marks)}!) {a['name']}" if a["name"] in self.inouts else
                            f"{_schema_type(a)} {a['name']}") for a in self.params)
        returns = "Tensor" if len(self.outs) == 1 else "(" + ", ".join("Tensor" for _ in self.outs) + ")"
        return f"({params}) -> {returns}"

    def register(self, name: str) -> tuple[Any, Any]:
        kop, adapter = self.kop, self

        def forward(*args):
            given = args
            args = tuple(adapter._aligned(a, v) for a, v in zip(adapter.params, args))
            values = dict(zip(adapter.names, args))
            first = next(v for v in args if isinstance(v, torch.Tensor))
            outs = adapter._new_outs(values, first.device)
            rc = kop.module.forward(*adapter._binding_args(values, outs))
            if rc:
                raise RuntimeError(f"{adapter.function_name} kernel returned status {rc}")
            adapter._copy_back(dict(zip(adapter.names, given)), values)
            return adapter._result(outs)

        op = torch.library.custom_op(f"{_NAMESPACE}::{name}", forward, mutates_args=tuple(self.inouts),
                                     schema=self._schema())

        @op.register_fake
        def _(*args):
            values = dict(zip(adapter.names, args))
            first = next(v for v in args if isinstance(v, torch.Tensor))
            return adapter._result([first.new_empty(shape, dtype=dt)
                                    for shape, dt in zip(adapter.out_shapes(values), adapter.out_dtypes)])

        if self.inouts or not self.outs:
            return op, None  # no autograd for an op that mutates its inputs
        grads = self.grads

        def backward_of(grad, *args):
            """Gradients of the reference (float64) at these arguments, for the float inputs (`grad`: the output's
            gradient, or a tuple, one per output). Not a custom op: a custom op's body runs below autograd, where
            the reference could not be differentiated."""
            values = dict(zip(adapter.names, args))
            grad_outs = list(grad) if isinstance(grad, (tuple, list)) else [grad]
            with torch.enable_grad():
                leaves = {n: values[n].detach().to(torch.float64).requires_grad_() for n in grads}
                ref = adapter._ref_parts({**values, **leaves})
                outs = [ref[a["name"]] for a in adapter.outs]
                pairs = [(o, g) for o, g in zip(outs, grad_outs) if g is not None and o.requires_grad]
                got = (torch.autograd.grad([o for o, _ in pairs], [leaves[n] for n in grads],
                                           [g.to(o.dtype) for o, g in pairs], allow_unused=True)
                       if pairs else [None] * len(grads))
            return [torch.zeros_like(values[n]) if g is None else g.to(values[n].dtype)
                    for n, g in zip(grads, got)]

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*[v for v in inputs if isinstance(v, torch.Tensor)])
            ctx.scalars = [v for v in inputs if not isinstance(v, torch.Tensor)]

        def backward(ctx, *grad):
            tensors, scalars = list(ctx.saved_tensors), list(ctx.scalars)
            args = [tensors.pop(0) if a["kind"] == "tensor" else scalars.pop(0) for a in adapter.params]
            got = dict(zip(grads, backward_of(grad if len(grad) > 1 else grad[0], *args)))
            return tuple(got.get(a["name"]) for a in adapter.params)

        op.register_autograd(backward, setup_context=setup_context)
        return op, backward_of

    def _copy_back(self, given: dict[str, Any], used: dict[str, Any]) -> None:
        """An inout the kernel updated in a copy (made contiguous or aligned for it): the update goes back."""
        for n in self.inouts:
            if used[n] is not given[n]:
                given[n].copy_(used[n])

    def function(self, *args, **kwargs) -> Any:
        kop = self.kop
        if not kwargs and len(args) == len(self.names) and kop.eager(*args):  # positional: the cheapest path
            def positional() -> tuple[tuple[Any], list[Any]]:
                first = args[self._first]
                outs = [first.new_empty([d(args) for d in dims], dtype=dt)
                        for dims, dt in zip(self._out_dims, self.out_dtypes)]
                binding = list(args)
                for at, out in zip(self._out_at, outs):  # in call order: each output's place among the arguments
                    binding.insert(at, out)
                return (self._result(outs),), binding

            done = self.direct(positional)
            if done is not None:
                return done[0]
        values = self._values(args, kwargs)
        ordered = [values[n] for n in self.names]
        tensors = [v for v in ordered if isinstance(v, torch.Tensor)]
        if kwargs and kop.eager(*tensors):
            def named() -> tuple[tuple[Any], list[Any]]:
                outs = self._new_outs(values, tensors[0].device)
                return (self._result(outs),), self._binding_args(values, outs)

            done = self.direct(named)
            if done is not None:
                return done[0]
        misfit = _call_misfit(self.call, values, kop.device_type)
        if misfit is not None:
            kop.outside(*misfit)
            return self._reference(values)
        prepared = {a["name"]: self._prepared(a, values[a["name"]]) for a in self.params}
        result = kop.op(*[prepared[n] for n in self.names])
        self._copy_back(values, prepared)
        return result

    @staticmethod
    def _prepared(a: dict[str, Any], v: Any) -> Any:
        """A tensor as the op takes it: contiguous unless declared strided (alignment is seen to inside the op, on
        real data; an inout made contiguous here is copied back after the call)."""
        return v.contiguous() if isinstance(v, torch.Tensor) and not a.get("strided") else v

    @staticmethod
    def _aligned(a: dict[str, Any], v: Any) -> Any:
        """Where the call declares an alignment: an offset view copied into fresh (aligned) memory."""
        align = a.get("align", 0)
        if align and isinstance(v, torch.Tensor) and v.numel() and v.data_ptr() % align:
            return v.clone()
        return v

    def call_features(self, args, kwargs):
        """The call's sizes, and its kind: the dtypes of its tensors (what tells signature variants apart)."""
        values = dict(zip(self.names, args))
        values.update({k: v for k, v in kwargs.items() if k in self.names})
        sizes = resolve_sizes(self.call, values)
        kind = tuple(dtype_name(values[a["name"]].dtype) for a in self.params
                     if a["kind"] == "tensor" and isinstance(values.get(a["name"]), torch.Tensor))
        return {k: int(v) for k, v in sizes.items() if k not in self.call["fixed"]}, kind

    def spec_features(self, spec):
        """A recorded shape's sizes, and its kind: the variant's input dtypes when the row records them."""
        kind = tuple(spec["dtypes"]) if isinstance(spec.get("dtypes"), list) else ()
        return {k: int(v) for k, v in spec.items() if isinstance(v, int) and not isinstance(v, bool)}, kind


class KernelOp:
    """One built kernel, registered as custom ops through its family's adapter, with the user-facing function
    (`function`). `adapter`: an OpAdapter, or a callable taking the kernel record (kernel.json) and returning one;
    default: the family's, found by its name among the shipped and installed families (needs EvoEngineer)."""

    def __init__(self, folder: str | Path, *, adapter: Any = None, fallback: str | None = None,
                 build_root: str | Path | None = None):
        if fallback not in (None, "reference"):
            raise ValueError(f"fallback: None or 'reference', got {fallback!r}")
        if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
            raise RuntimeError(f"torch {torch.__version__}: exported kernels need torch.library.custom_op "
                               "(torch >= 2.4)")
        self.folder = Path(folder)
        self.kernel = json.loads((self.folder / "kernel.json").read_text())
        self.build = self.kernel["build"]
        self.task = self.build["task"]
        self.signature = dict(self.build["signature"])
        self.fallback = fallback
        self._warned = False
        self.adapter = _adapter_for(self.kernel, adapter)
        self.module = build_module(self.folder, self.kernel, Path(build_root) if build_root else None)
        self.device_type = "cuda" if self.build["backend"] == "cuda" else "cpu"
        self.adapter.bind(self)
        key = self.kernel["hash"][:16]
        ops = _registered_ops()
        if key in ops:  # the same kernel loaded again in this process (by any copy of this runtime): share its ops
            self.op, self.backward_op = ops[key]
        else:
            # Registered once per process and never again: a second custom_op of the same name fails halfway, and
            # the half-made definition, once garbage-collected, takes kernels of the first one with it (seen as
            # intermittent crashes when an exported package and evoengineer.load held the same kernel).
            op_name = re.sub(r"\W", "_", f"{self.task}_{key}")
            self.op, self.backward_op = self.adapter.register(op_name)
            ops[key] = (self.op, self.backward_op)
        self.function: Callable[..., torch.Tensor] = self.adapter.function

    def eager(self, *tensors: Any) -> bool:
        """Whether a call may run the kernel straight from its binding: not traced by torch.compile and no
        gradient to record."""
        if torch.compiler.is_compiling():
            return False
        if torch.is_grad_enabled():
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    return False
        return True

    def outside(self, why: str, kind: type[Exception] = ValueError) -> None:
        """Inputs the kernel was not compiled for: raise, or (fallback="reference") warn once and let the caller
        use the reference."""
        if self.fallback != "reference":
            raise kind(why)
        if not self._warned:
            warnings.warn(f"kernel {self.kernel['hash'][:12]}: {why}; computing with the PyTorch reference "
                          "(fallback='reference'; warned once)", stacklevel=4)
            self._warned = True

    def check_device(self, name: str, t: torch.Tensor, device: torch.device) -> str | None:
        if t.device.type != self.device_type:
            return f"{name}: on {t.device}, this kernel runs on {self.device_type}"
        if t.device != device:
            return f"{name}: on {t.device}, expected {device} (the device of the first input)"
        return None


def _adapter_for(kernel: dict[str, Any], adapter: Any) -> OpAdapter:
    if adapter is None:  # the runtime knows no family: its caller names the adapter (export.py writes it)
        raise ValueError(f"kernel {kernel.get('hash', '?')[:12]}: no op adapter given (evoengineer.families."
                         "op_adapter_for(kernel) finds the family's)")
    if isinstance(adapter, OpAdapter):
        return copy.copy(adapter)  # bound to one KernelOp each
    return adapter(kernel)


# ---- several kernels, one per timed shape ----------------------------------------------------------------------------
def shape_distance(a: dict[str, int], b: dict[str, int]) -> float:
    """Sum of |log(a/b)| over the sizes both have."""
    return sum(abs(math.log(max(int(a[k]), 1) / max(int(b[k]), 1))) for k in a if k in b)


class ShapeDispatch:
    """Kernels of one family, each the fastest of its search on one timed shape: a call runs the kernel whose
    recorded shape is nearest to its inputs (`choose`), built on first use (`KernelOp`; its signature checks and
    fallback apply as they do alone). `table`: one row per shape (shape, shape_spec, hash, p50_us, folder).
    `adapter` as for KernelOp (one per kernel when a callable)."""

    def __init__(self, table: list[dict[str, Any]], *, adapter: Any = None, fallback: str | None = None,
                 build_root: str | Path | None = None):
        if not table:
            raise ValueError("ShapeDispatch: no kernels")
        self.table = [dict(row, folder=Path(row["folder"])) for row in table]
        self.fallback = fallback
        self.build_root = build_root
        self.adapter = adapter
        kernels = [json.loads((row["folder"] / "kernel.json").read_text()) for row in self.table]
        tasks = {k["build"]["task"] for k in kernels}
        if len(tasks) != 1:
            raise ValueError(f"ShapeDispatch: kernels of one family expected, got {sorted(tasks)}")
        self.task = tasks.pop()
        self.signature = dict(kernels[0]["build"]["signature"])
        self._features_of = _adapter_for(kernels[0], adapter)  # describes calls; builds nothing
        self.ops: dict[str, KernelOp] = {}  # by hash: the kernels built so far
        self.calls: dict[str, int] = {row["hash"]: 0 for row in self.table}
        self._features = [self._features_of.spec_features(row["shape_spec"]) for row in self.table]
        name = self._features_of.function_name

        def function(*args, **kwargs):
            row = self.choose(*args, **kwargs)
            self.calls[row["hash"]] += 1
            return self.op_for(row).function(*args, **kwargs)

        function.__name__ = function.__qualname__ = name
        function.__doc__ = type(self._features_of).function.__doc__
        self.function: Callable[..., torch.Tensor] = function

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "ShapeDispatch":
        """From a dispatch.json (an exported package's): `kernels` rows with folders relative to it."""
        path = Path(path)
        doc = json.loads(path.read_text())
        return cls([dict(row, folder=path.parent / row["folder"]) for row in doc["kernels"]], **kwargs)

    def choose(self, *args, **kwargs) -> dict[str, Any]:
        """The table row whose kernel a call with these arguments runs: among the recorded shapes of the call's kind
        (all, if none is), the nearest in sizes; ties to the first in the table."""
        if len(self.table) == 1:
            return self.table[0]
        try:
            sizes, kind = self._features_of.call_features(args, kwargs)
        except (AttributeError, IndexError, KeyError, TypeError):
            return self.table[0]  # not tensors of the family's layout: the first kernel's checks say what is wrong
        same_kind = any(k == kind for _, k in self._features)
        best, best_d = 0, math.inf
        for i, (recorded, k) in enumerate(self._features):  # a plain loop: torch.compile traces it
            if same_kind and k != kind:
                continue
            d = shape_distance(sizes, recorded)
            if d < best_d:
                best, best_d = i, d
        return self.table[best]

    def build(self) -> "ShapeDispatch":
        """Build every kernel now (before torch.compile or CUDA graph capture, which cannot build one mid-trace)."""
        for row in self.table:
            self.op_for(row)
        return self

    def op_for(self, row: dict[str, Any]) -> KernelOp:
        """The row's kernel, built and registered on first use."""
        op = self.ops.get(row["hash"])
        if op is None:
            op = self.ops[row["hash"]] = KernelOp(row["folder"], adapter=self.adapter, fallback=self.fallback,
                                                  build_root=self.build_root)
        return op
