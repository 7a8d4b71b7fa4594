"""`evoengineer.tune`: tune one kernel from one Python call, on the same contract, store and checks as a family.

    import torch, evoengineer

    x = torch.randn(512, 1024)
    tuned = evoengineer.tune(
        KERNEL,                                   # template text (Jinja2: the knobs are its variables) or a file
        entry="evo_scale",                         # the extern "C" function it defines (see Signature.c_prototype)
        args={"x": x, "alpha": 0.5},               # example inputs, in call order (tensors and scalars)
        outputs={"out": x},                        # outputs: an example (or (dtype, shape)) each
        reference=lambda a: a["x"].double() * a["alpha"],
        knobs={"VEC": [1, 4, 8], "THREADS": [1, 0]},
    )
    out = tuned.function(x, 0.5)                   # the fastest correct kernel, as a PyTorch op

What it writes (`workdir`, default ``evo_tune/<entry>``): the template, a family (family.py, generated: the call
declared from the examples), a space file, a pool of input sets per shape with their references (computed here by
`reference`, stored as raw bytes beside a JSON description: nothing is unpickled), the store (run.db) and
elite.json. A call again with the same kernel, knobs, call (the examples' dtypes, shapes and scalars) and settings
reuses the finished run (or resumes an interrupted one); anything changed starts a new run.

Inputs: every candidate is checked on input sets drawn from the pool (``pool`` sets per shape: the example's, then
random ones like it: floats with its mean and spread, integers within its range; or `make_inputs(sizes, g)`), so a
kernel cannot learn one answer. Sizes: by default each tensor's dims are fixed to the example's (the kernel is
compiled for them and receives no sizes); name them with `dims` (``{"x": ("rows", "cols")}``) to pass them to the
kernel as ``int64_t`` after the pointers, and add `shapes` (``[{"rows": 7, "cols": 37}]``) to check and time more.

Scripts that call it must do so under ``if __name__ == "__main__":`` (builds run in worker processes).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from evoengineer.errors import UserError

#: scalar dtypes by Python type (a (dtype, value) pair picks another: ("float64", 0.5))
_SCALAR_OF = {bool: "bool", int: "int64", float: "float32"}
_FAMILY_FILE = "family.py"
_FAMILY_CLASS = "TunedKernel"


@dataclass
class Tuned:
    """What `tune` found: the elites (rank, params, time_us, speedup, hash) best first, where they are written,
    and the fastest as a PyTorch op (`function`, built on first use)."""

    elites: list[dict[str, Any]]
    elite_json: Path
    workdir: Path
    reused: bool = False
    _reference: Callable[[dict[str, Any]], Any] | None = field(default=None, repr=False)
    _function: Any = field(default=None, repr=False)

    @property
    def best(self) -> dict[str, Any]:
        return self.elites[0]

    @property
    def function(self) -> Callable[..., Any]:
        """The rank-1 kernel as the op an exported package gives (declared call, checks, torch.compile); its
        fallback and autograd use the `reference` given to `tune`."""
        if self._function is None:
            from evoengineer.export import load

            fn = load(self.elite_json, family=f"{(self.workdir / _FAMILY_FILE).resolve()}:{_FAMILY_CLASS}",
                      build_root=self.workdir / "ops")
            if self._reference is not None:
                fn.kernel.adapter.reference = self._reference
            self._function = fn
        return self._function


# ---- the call, from the examples ------------------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    from evoengineer.ops.runtime import DTYPES

    for k, v in DTYPES.items():
        if v == dtype:
            return k
    raise UserError(f"tune: dtype {dtype} is not one a kernel can take (known: {', '.join(DTYPES)})")


def _example_tensor(name: str, v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, tuple) and len(v) == 2:
        from evoengineer.ops.runtime import DTYPES

        dtype, shape = v
        dtype = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(dtype, torch.dtype):
            raise UserError(f"tune: outputs[{name!r}]: (dtype, shape) with a torch dtype or its name")
        return torch.empty(tuple(shape), dtype=dtype)
    raise UserError(f"tune: outputs[{name!r}]: an example tensor or (dtype, shape), got {type(v).__name__}")


def _call(args: Mapping[str, Any], outputs: Mapping[str, Any], dims: Mapping[str, Sequence[Any]],
          inout: Sequence[str]) -> list[dict[str, Any]]:
    """The declared call as data (Signature.to_json's `args`): the args in order, then the outputs."""
    call = []
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            d = list(dims.get(name, v.shape))
            if len(d) != v.dim():
                raise UserError(f"tune: dims[{name!r}]: {len(d)} names for a tensor of {v.dim()} dimensions")
            call.append({"kind": "tensor", "name": name, "dtype": _dtype_name(v.dtype), "dims": d, "output": False,
                         **({"inout": True} if name in inout else {})})
        else:
            dtype, _ = _scalar(name, v)
            call.append({"kind": "scalar", "name": name, "dtype": dtype})
    for name, v in outputs.items():
        t = _example_tensor(name, v)
        d = list(dims.get(name, t.shape))
        if len(d) != t.dim():
            raise UserError(f"tune: dims[{name!r}]: {len(d)} names for a tensor of {t.dim()} dimensions")
        call.append({"kind": "tensor", "name": name, "dtype": _dtype_name(t.dtype), "dims": d, "output": True})
    missing = [n for n in inout if n not in args]
    if missing:
        raise UserError(f"tune: inout {missing}: not among args")
    return call


def _scalar(name: str, v: Any) -> tuple[str, Any]:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        return v[0], v[1]
    for t, dtype in _SCALAR_OF.items():
        if type(v) is t:
            return dtype, v
    raise UserError(f"tune: args[{name!r}]: a tensor, a bool/int/float or (dtype, value), got {type(v).__name__}")


def _scalar_value(v: Any) -> Any:
    return v[1] if isinstance(v, tuple) else v


# ---- input sets ----------------------------------------------------------------------------------------------------
def _like(example: torch.Tensor, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
    """A random tensor of `shape` drawn like `example`: floats with its mean and spread, integers within its range."""
    if example.dtype == torch.bool:
        return torch.rand(tuple(shape), generator=g) < float(example.float().mean()) if example.numel() else \
            torch.zeros(tuple(shape), dtype=torch.bool)
    if example.dtype.is_floating_point:
        e = example.detach().to(torch.float64).cpu()
        mean, std = (float(e.mean()), float(e.std())) if e.numel() > 1 else (0.0, 1.0)
        std = std if math.isfinite(std) and std > 0 else 1.0
        return (torch.randn(tuple(shape), generator=g, dtype=torch.float64) * std + mean).to(example.dtype)
    lo, hi = (int(example.min()), int(example.max())) if example.numel() else (0, 1)
    return torch.randint(lo, hi + 1, tuple(shape), generator=g, dtype=torch.int64).to(example.dtype)


def _tensor_shape(a: dict[str, Any], sizes: Mapping[str, int]) -> list[int]:
    from evoengineer.ops.runtime import dim_value

    return [int(dim_value(d, sizes)) for d in a["dims"]]


def _write_tensor(path: Path, t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().cpu().contiguous()
    path.write_bytes(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return {"file": path.name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape)}


def input_digest(values: Mapping[str, Any], names: Sequence[str]) -> str:
    """What identifies an input set: the bytes of its tensors and its scalars, in call order (the pool records it;
    the generated family's reference finds a set by it)."""
    h = hashlib.sha256()
    for n in names:
        v = values[n]
        if isinstance(v, torch.Tensor):
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def _write_pool(folder: Path, call: list[dict[str, Any]], shape_sizes: dict[str, dict[str, int]],
                example: dict[str, Any], reference: Callable, make_inputs: Callable | None, pool: int,
                seed: int) -> None:
    """`pool` input sets per shape, each with its reference, as raw bytes + sets.json (what family.py reads)."""
    inputs = [a for a in call if not a.get("output")]
    written = [a["name"] for a in call if a.get("output") or a.get("inout")]
    single = len(written) == 1 and not any(a.get("inout") for a in call)
    folder.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {}
    for shape, sizes in shape_sizes.items():
        sets = []
        for k in range(pool):
            g = torch.Generator().manual_seed(int(hashlib.sha256(f"{seed}/{shape}/{k}".encode()).hexdigest()[:12],
                                                  16))
            if k == 0 and shape == "example":
                values = dict(example)
            elif make_inputs is not None:
                values = dict(make_inputs(dict(sizes), g))
            else:
                values = {}
                for a in inputs:
                    ex = example[a["name"]]
                    values[a["name"]] = (_like(ex, _tensor_shape(a, sizes), g) if a["kind"] == "tensor"
                                         else _scalar_value(ex))
            values = {a["name"]: (values[a["name"]].detach().cpu() if a["kind"] == "tensor"
                                  else _scalar_value(values[a["name"]])) for a in inputs}
            with torch.no_grad():
                ref = reference({k2: (v.clone() if isinstance(v, torch.Tensor) else v) for k2, v in values.items()})
            from evoengineer.evaluators.outputs import reference_value

            try:
                ref = reference_value(ref, [""] if single else written)
            except ValueError as exc:
                raise UserError(f"tune: {exc}") from None
            refs = {"": ref} if single else ref
            d = folder / shape / str(k)
            d.mkdir(parents=True, exist_ok=True)
            entry = {"digest": input_digest(values, [a["name"] for a in inputs]), "inputs": {}, "reference": {}}
            for a in inputs:
                v = values[a["name"]]
                entry["inputs"][a["name"]] = (_write_tensor(d / f"in_{a['name']}.bin", v) if a["kind"] == "tensor"
                                              else {"value": v})
            for name, r in refs.items():
                entry["reference"][name] = _write_tensor(d / f"ref_{name or 'out'}.bin", r.to(torch.float64)
                                                         if r.is_floating_point() else r)
            sets.append(entry)
        index[shape] = sets
    (folder / "sets.json").write_text(json.dumps(index))


FAMILY_SOURCE = '''"""Generated by evoengineer.tune: the call declared from the examples, inputs and references from the pool beside
this file (raw bytes described by pool/sets.json; computed by the reference given to tune()). Do not edit."""

import json
from pathlib import Path

import numpy as np
import torch

from evoengineer.family import Family, Scalar, Signature, Tensor
from evoengineer.ops.runtime import DTYPES
from evoengineer.tuning import input_digest

HERE = Path(__file__).resolve().parent
SPEC = json.loads((HERE / "call.json").read_text())


def _read(folder, rec):
    raw = np.fromfile(folder / rec["file"], dtype=np.uint8)
    return torch.from_numpy(raw.copy()).view(DTYPES[rec["dtype"]]).reshape(rec["shape"])


class TunedKernel(Family):
    name = SPEC["name"]
    version = SPEC["version"]
    entry = SPEC["entry"]
    function = SPEC["entry"]
    templates = (SPEC["template"],)
    cuda_graphs = SPEC["backend"] == "cuda"

    @classmethod
    def call_signature(cls, constants):
        args = []
        for a in SPEC["call"]:
            if a["kind"] == "tensor":
                args.append(Tensor(a["name"], a["dtype"], tuple(a["dims"]), output=a["output"],
                                   inout=bool(a.get("inout"))))
            else:
                args.append(Scalar(a["name"], a["dtype"]))
        return Signature(args=tuple(args))

    def _sets(self):
        if "_pool" not in self.__dict__:
            self.__dict__["_pool"] = json.loads((HERE / "pool" / "sets.json").read_text())
        return self.__dict__["_pool"]

    def make_inputs(self, shape, seed):
        sets = self._sets()[shape.name]
        k = int(seed) % len(sets)
        folder = HERE / "pool" / shape.name / str(k)
        out = {}
        for name, rec in sets[k]["inputs"].items():
            out[name] = _read(folder, rec).to(self.device) if "file" in rec else rec["value"]
        return out

    def reference(self, inputs):
        digest = input_digest(inputs, [a["name"] for a in SPEC["call"] if not a.get("output")])
        for shape, sets in self._sets().items():
            for k, s in enumerate(sets):
                if s["digest"] == digest:
                    folder = HERE / "pool" / shape / str(k)
                    refs = {n: _read(folder, r) for n, r in s["reference"].items()}
                    return refs[""] if list(refs) == [""] else refs
        raise NotImplementedError("a tuned kernel's reference is the callable given to evoengineer.tune(); these "
                                  "inputs are not in its pool")
'''


# ---- the space ------------------------------------------------------------------------------------------------------
def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise UserError(f"tune: {v!r}: knob values are bools, ints, floats or strings")


def _space_text(name: str, template: str, backend: str, arch: str | None, knobs: Mapping[str, Sequence[Any]],
                constraints: Sequence[str], flags: Sequence[str], cuda_flags: Sequence[str],
                ldflags: Sequence[str], shapes: dict[str, dict[str, int]], budget: int,
                evaluation: Mapping[str, Any]) -> str:
    lines = ["# Generated by evoengineer.tune", f"name = {_toml(name)}", f"template = {_toml(template)}",
             f'task = "{_FAMILY_FILE}:{_FAMILY_CLASS}"', f"backend = {_toml(backend)}"]
    if arch:
        lines.append(f"arch = {_toml(arch)}")
    if constraints:
        lines.append(f"constraints = {_toml(list(constraints))}")
    lines += ["", "[parameters]"]
    for k, values in knobs.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise UserError(f"tune: knobs[{k!r}]: a non-empty list of values")
        ordered = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        lines.append(f"{k} = {_toml(list(values))}" if ordered else
                     f"{k} = {{ values = {_toml(list(values))}, ordered = false }}")
    lines += ["", "[build]", f"flags = {_toml(list(flags))}"]
    if cuda_flags:
        lines.append(f"cuda_flags = {_toml(list(cuda_flags))}")
    if ldflags:
        lines.append(f"ldflags = {_toml(list(ldflags))}")
    lines += ["", "[search]", f"budget = {budget}", "", "[evaluation]"]
    lines += [f"{k} = {_toml(v)}" for k, v in evaluation.items()]
    for shape, sizes in shapes.items():
        lines += ["", "[[shapes]]", f"name = {_toml(shape)}", *[f"{k} = {v}" for k, v in sizes.items()],
                  "checks = 2", "fresh = true", "time = true"]
    return "\n".join(lines) + "\n"


def _sizes_of(call: list[dict[str, Any]], example: Mapping[str, Any]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for a in call:
        if a["kind"] != "tensor" or a["output"]:
            continue
        for i, d in enumerate(a["dims"]):
            if isinstance(d, str) and d.isidentifier():
                got = int(example[a["name"]].shape[i])
                if sizes.setdefault(d, got) != got:
                    raise UserError(f"tune: size {d!r} is {sizes[d]} and {got} in the examples")
    return sizes


# ---- tune ----------------------------------------------------------------------------------------------------------
def _search_settings(space_file: Path, strategy: str | None, seed: int, budget: int) -> dict[str, Any]:
    """Every configuration when they fit the budget (grid), else the GA; a GA population no larger than the space."""
    from evoengineer.space.spec import load_space

    n = load_space(space_file).count_valid()
    strategy = strategy or ("grid" if n <= budget else "ga")
    settings: dict[str, Any] = {"strategy": strategy, "seed": seed, "budget": budget}
    if strategy == "ga" and n < 12:
        settings["population"] = max(2, n)
    return settings


def tune(kernel: str | Path, *, entry: str, args: Mapping[str, Any], outputs: Mapping[str, Any],
         reference: Callable[[dict[str, Any]], Any], knobs: Mapping[str, Sequence[Any]],
         backend: str | None = None, arch: str | None = None, dims: Mapping[str, Sequence[Any]] | None = None,
         inout: Sequence[str] = (), shapes: Sequence[Mapping[str, int]] = (), constraints: Sequence[str] = (),
         flags: Sequence[str] | None = None, cuda_flags: Sequence[str] | None = None,
         ldflags: Sequence[str] | None = None, make_inputs: Callable | None = None, budget: int = 32,
         strategy: str | None = None, seed: int = 0, pool: int = 6, workdir: str | Path | None = None,
         warmup: int = 3, repeats: int = 20, quiet: bool = False) -> Tuned:
    """Search `knobs` of `kernel` (Jinja2 template text, or a template file) for the fastest correct variant of
    `entry` on the calls the examples describe (`strategy`: default every configuration when they fit `budget`, else
    the GA); returns a `Tuned` (elites, elite.json, the op). `reference(args)`
    gives the exact answer (a tensor, or a dict of the outputs and inouts' new values). See the module docstring for
    sizes, shapes, inputs and where things are written. Raises UserError on bad arguments; a search in which no
    candidate is correct raises too, naming the failures."""
    from evoengineer.search.driver import open_store, resume_search, start_search

    if not isinstance(entry, str) or not entry.isidentifier():
        raise UserError(f"tune: entry {entry!r}: a C identifier")
    text = Path(kernel).read_text() if isinstance(kernel, Path) or (
        isinstance(kernel, str) and "\n" not in kernel and kernel.endswith(".j2") and Path(kernel).is_file()) \
        else str(kernel)
    tensors = [v for v in args.values() if isinstance(v, torch.Tensor)]
    if not tensors:
        raise UserError("tune: args holds no tensor")
    from evoengineer.space.backend import BACKENDS

    backend = backend or ("cuda" if tensors[0].is_cuda else "cpu")
    if backend not in BACKENDS:
        raise UserError(f"tune: backend {backend!r}: {' or '.join(BACKENDS)}")
    target = BACKENDS[backend]
    if target.needs_arch and arch is None:
        arch = "sm_{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else "sm_90"
    dims = dict(dims or {})
    call = _call(args, outputs, dims, inout)
    from evoengineer.family import Scalar, Signature, Tensor

    try:  # checked as a family's would be
        Signature(args=tuple(Tensor(a["name"], a["dtype"], tuple(a["dims"]), output=a["output"],
                                    inout=bool(a.get("inout"))) if a["kind"] == "tensor" else
                             Scalar(a["name"], a["dtype"]) for a in call))
    except ValueError as exc:
        raise UserError(f"tune: {exc}") from None
    cpu_args = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    shape_sizes = {"example": _sizes_of(call, cpu_args)}
    for i, s in enumerate(shapes):
        shape_sizes[f"shape{i + 1}"] = {k: int(v) for k, v in dict(s).items()}
        missing = set(shape_sizes["example"]) - set(shape_sizes[f"shape{i + 1}"])
        if missing:
            raise UserError(f"tune: shapes[{i}]: sizes {sorted(missing)} missing")
    if len(shape_sizes) > 1 and not shape_sizes["example"]:
        raise UserError("tune: shapes given but no dims named: name the sizes that vary with dims=")
    if not target.device_compiler:
        flags = list(flags if flags is not None else ["-O3", "-march=native", "-fopenmp", "-fvisibility=hidden"])
        ldflags = list(ldflags if ldflags is not None else (["-fopenmp"] if "-fopenmp" in flags else []))
        cuda_flags = []
    else:
        flags = list(flags if flags is not None else ["-O3"])
        cuda_flags = list(cuda_flags if cuda_flags is not None else
                          ["-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}"])
        ldflags = list(ldflags or [])
    ident = hashlib.sha256(json.dumps({"kernel": text, "call": call, "knobs": {k: list(v) for k, v in knobs.items()},
                                       "shapes": shape_sizes, "backend": backend, "arch": arch, "flags": flags,
                                       "cuda_flags": cuda_flags, "ldflags": ldflags, "constraints": list(constraints),
                                       "seed": seed, "pool": pool,
                                       # the examples' layout and scalars (not their random values: a script that
                                       # draws new ones each time still finds its run)
                                       "example": {k: ([str(v.dtype), list(v.shape)] if isinstance(v, torch.Tensor)
                                                       else _scalar_value(v)) for k, v in cpu_args.items()}},
                                      sort_keys=True, default=str).encode()).hexdigest()[:12]
    work = Path(workdir) if workdir is not None else Path("evo_tune") / entry
    work.mkdir(parents=True, exist_ok=True)
    template = f"{entry}{target.source_suffix}.j2"
    space = work / "space.toml"
    space_text = _space_text(f"tune_{entry}", template, backend, arch, knobs, constraints, flags, cuda_flags,
                             ldflags, shape_sizes, budget, {"warmup": warmup, "repeats": repeats})
    marker = work / "tuned.json"
    out = work / "elite.json"
    db = f"sqlite:///{(work / 'run.db').resolve()}"
    previous = json.loads(marker.read_text()) if marker.is_file() else {}
    if previous.get("ident") != ident:  # anything changed: everything written again, a new run
        (work / template).write_text(text)
        (work / "call.json").write_text(json.dumps({"name": f"tune_{entry}", "version": ident, "entry": entry,
                                                    "template": template, "backend": backend, "call": call}))
        (work / _FAMILY_FILE).write_text(FAMILY_SOURCE)
        _write_pool(work / "pool", call, shape_sizes, cpu_args, reference, make_inputs, max(1, pool), seed)
        space.write_text(space_text)
        marker.write_text(json.dumps({"ident": ident, "status": "started"}))
        code = start_search(space_path=space, db=db, out=str(out), force=True, quiet=quiet,
                            **_search_settings(space, strategy, seed, budget))
        reused = False
    elif previous.get("status") == "finished" and out.is_file():
        code, reused = 0, True
    else:
        store = open_store(db, create=False)
        unfinished = store.latest_unfinished_run()
        if unfinished is not None:
            code = resume_search(db=db, quiet=quiet)
        else:
            code = start_search(space_path=space, db=db, out=str(out), force=True, quiet=quiet,
                                **_search_settings(space, strategy, seed, budget))
        reused = False
    if code != 0:
        raise UserError(f"tune: the search of {entry} ended with exit code {code} (its store: {db})")
    marker.write_text(json.dumps({"ident": ident, "status": "finished"}))
    doc = json.loads(out.read_text())
    elites = [{"rank": e["rank"], "params": e["params"], "time_us": (e.get("metrics") or {}).get("time_us"),
               "speedup": (e.get("metrics") or {}).get("speedup"), "hash": e["hash"]} for e in doc["elites"]]
    if not elites:
        raise UserError(f"tune: no correct kernel of {entry} was found (see {out} and the store {db})")

    def user_reference(values: dict[str, Any]) -> Any:
        return reference(values)

    return Tuned(elites=elites, elite_json=out, workdir=work, reused=reused, _reference=user_reference)


__all__ = ["tune", "Tuned"]
