"""The kernel-family contract: what a template family computes, how to call and check it, what to time it against.

A family is a subclass of `Family`. It declares

* ``name`` and ``version`` (elite.json records both; `export`/`load` find the family by them),
* ``entry``: the ``extern "C"`` function every template of the family defines,
* its call as data: `call_signature(constants)` returns a `Signature` (tensors with dtype and dims, scalars, optional
  workspace) from the space's [signature] table; the core generates and builds the binding from it, checks every
  call against it before the launch, allocates the output and registers the exported op,
* ``make_inputs(shape, seed)`` and a float64 ``reference(inputs)``;

and may override the tolerances, `extra_check`, `baselines`, `flops`/`min_bytes` and `parse_shape`. A family that
brings its own binding (the shipped ones, whose bindings predate this contract) names it in ``binding_file``, next
to its module, and overrides what derives from the signature.

The entry point of a declared signature, in this order (pointers to tensors may be typed any way in the kernel)::

    int ENTRY(<one pointer per tensor, in declared order (const for inputs)>,
              <const int64_t* per strided tensor: its element strides, in declared order>,
              <int64_t per size symbol in Signature.size_order(): not the fixed ones>,
              <one value per scalar, in declared order: float, double, int64_t, int32_t or int (bool)>,
              [void* workspace, int64_t* workspace_bytes,]   // Signature.workspace
              void* stream);                                 // cudaStream_t on CUDA, nullptr on the CPU

It returns 0, or a status the binding turns into a RuntimeError. With a workspace it is first called with
``workspace == nullptr``: a kernel that needs scratch memory writes the bytes to ``*workspace_bytes``, launches
nothing and returns 6; it is then called again with that much memory.

A CUDA family may instead write device code only and declare its launch (``Signature(launch=Launch(items))``): the
template defines ``extern "C" __global__ void ENTRY(...)`` with the same arguments up to the scalars (no
strides, workspace or stream) and exports four launch traits; candidates compile to a cubin alone and the generated
binding launches it (`Launch`). Such a template needs no host code at all.
"""

from __future__ import annotations

import inspect
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Union

import torch

from evoengineer.compiler.binding_source import BindingSource
from evoengineer.errors import UserError
from evoengineer.ops.runtime import DTYPES, dim_value, resolve_sizes
from evoengineer.space.backend import backend_of
from evoengineer.space.spec import SearchSpace
from evoengineer.settings import GENERIC_SHAPE_KEYS, evaluation_settings

__all__ = ["Family", "Signature", "Tensor", "Scalar", "Launch", "Shape", "ShapeEntry", "BindingSource", "TOLERANCES",
           "check_shape_keys", "Inputs"]

Inputs = dict[str, Any]

#: Tolerances (atol, rtol) for outputs of each dtype, compared with a float64 reference.
TOLERANCES = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3),
              torch.bfloat16: (3e-2, 3e-2)}
#: Scalar dtypes and the C type the entry point takes them as.
SCALAR_CTYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "bool": "int"}
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


# ---- the call, declared ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tensor:
    """A tensor argument. ``dims``: per dimension an int, a size symbol (``"rows"``; every use of one symbol must
    agree) or a product of them (``"M*D"``). ``output``: the kernel writes it (a family may have several).
    ``inout``: an input the kernel updates in place (its dims give sizes as an input's do; the reference returns its
    updated value, checked as an output's is; the exported op mutates it).
    ``bounds``: an integer tensor's values must lie in ``[lo, hi)`` (ints or size expressions); the binding reads it
    before the launch (once per unchanged tensor). ``align``: the bytes its data pointer must be a multiple of (e.g.
    16 for 128-bit loads; a view at an odd offset is refused by the binding and copied by the exported op).
    ``strided``: any strides are taken (no copy to contiguous): the entry point also receives the tensor's element
    strides (``const int64_t* NAME_strides``, one per dimension, after the tensor pointers); an output must still
    not overlap itself."""

    name: str
    dtype: str
    dims: tuple[Union[int, str], ...]
    output: bool = False
    inout: bool = False
    bounds: tuple[Union[int, str], Union[int, str]] | None = None
    align: int = 0
    strided: bool = False


@dataclass(frozen=True)
class Scalar:
    """A scalar argument (``float32``, ``float64``, ``int64``, ``int32`` or ``bool``)."""

    name: str
    dtype: str


@dataclass(frozen=True)
class Launch:
    """How the generated binding launches a CUDA kernel written as device code only (issue 52): the template defines
    the family's ``entry`` as ``extern "C" __global__ void ENTRY(...)``, taking the entry point's arguments without
    the stream (one pointer per tensor, the sizes, the scalars: `Signature.kernel_prototype`), and no host code;
    candidates compile to a cubin alone and the binding, built once, launches it: a 1-D grid over ``items`` (a size
    symbol or a product of them, e.g. ``"rows"`` or ``"B*H"``) from four launch traits the kernel exports (EVO_TRAIT,
    templates/cuda/common/launch_traits.cuh.j2): ``threads`` (the block size), ``smem_bytes`` (dynamic shared
    memory), ``items_per_block`` and ``persistent`` (1: the grid is capped at the blocks the GPU holds at once and
    the kernel strides over the items by gridDim.x)."""

    items: str


def launched(family: Any) -> bool:
    """Whether a family (instance) writes its kernels as device code its generated binding launches (its declared
    Signature has a Launch): its candidates build device code only, always."""
    if getattr(family, "binding_file", ""):
        return False
    try:
        signature = family.signature
    except Exception:  # no declared call (a family with its own binding), or constants it refuses
        return False
    return getattr(signature, "launch", None) is not None


@dataclass(frozen=True)
class Signature:
    """A family's call: ``args`` in call order; ``sizes``: the size symbols the entry point receives, in order
    (default: every symbol some input has as a whole dimension, in order of first use, fixed ones left out: the
    kernel is compiled for those); ``fixed``: symbols the kernel is compiled for (a call of another
    size is refused, naming it); ``workspace``: the entry point takes the workspace pair; ``launch``: the kernel is
    device code the binding launches (`Launch`) instead of a host entry point."""

    args: tuple[Union[Tensor, Scalar], ...]
    sizes: tuple[str, ...] | None = None
    fixed: Mapping[str, int] = field(default_factory=dict)
    workspace: bool = False
    launch: Launch | None = None

    def __post_init__(self):
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"signature: repeated argument names in {names}")
        for a in self.args:
            if not _NAME.fullmatch(a.name):
                raise ValueError(f"signature: argument name {a.name!r}: lower-case letters, digits and _")
            if isinstance(a, Tensor):
                if isinstance(a.align, bool) or not isinstance(a.align, int) or a.align < 0 or \
                        (a.align & (a.align - 1)):
                    raise ValueError(f"signature: {a.name}: align {a.align!r}: 0 or a power of two (bytes)")
                if a.dtype not in DTYPES:
                    raise ValueError(f"signature: {a.name}: dtype {a.dtype!r} (known: {', '.join(DTYPES)})")
                for d in a.dims:
                    for f in _factors(d):
                        if not (isinstance(f, int) and f >= 0) and not _SYMBOL.fullmatch(str(f)):
                            raise ValueError(f"signature: {a.name}: dim {d!r}: ints and size names joined by '*'")
            elif isinstance(a, Scalar):
                if a.dtype not in SCALAR_CTYPES:
                    raise ValueError(f"signature: {a.name}: scalar dtype {a.dtype!r} "
                                     f"(known: {', '.join(SCALAR_CTYPES)})")
            else:
                raise ValueError(f"signature: {a!r} is neither a Tensor nor a Scalar")
        for t in self.tensors:
            if t.output and t.inout:
                raise ValueError(f"signature: {t.name}: output or inout, not both (an inout is an input the kernel "
                                 "updates)")
            if t.inout and t.bounds:
                raise ValueError(f"signature: {t.name}: an inout tensor cannot have bounds (the kernel changes it)")
        if not self.written:
            raise ValueError("signature: no tensor is written: declare at least one output=True or inout=True")
        if not self.inputs:
            raise ValueError("signature: no input tensor (sizes and the device come from the inputs)")
        bound = self.bound_symbols()
        for a in self.args:
            if isinstance(a, Tensor):
                for d in a.dims:
                    for f in _factors(d):
                        if isinstance(f, str) and f not in bound and f not in self.fixed:
                            raise ValueError(f"signature: {a.name}: size {f!r} is not a whole dimension of any "
                                             "input (nor fixed): nothing gives its value")
        for s in self.sizes or ():
            if s not in bound and s not in self.fixed:
                raise ValueError(f"signature: sizes: {s!r} is no input's dimension")
        if self.launch is not None:
            self._check_launch(bound)

    def _check_launch(self, bound: list[str]) -> None:
        launch = self.launch
        if not isinstance(launch, Launch):
            raise ValueError(f"signature: launch: a Launch(items=...), got {launch!r}")
        for f in _factors(launch.items) if isinstance(launch.items, str) else [launch.items]:
            if not (isinstance(f, str) and (f in bound or f in self.fixed)):
                raise ValueError(f"signature: launch: items {launch.items!r}: {f!r} is no size of the call (size "
                                 "symbols joined by '*')")
        if self.workspace:
            raise ValueError("signature: launch: a launched kernel takes no workspace (write a host entry point)")
        if any(t.strided for t in self.tensors):
            raise ValueError("signature: launch: strided tensors pass their strides as host memory: write a host "
                             "entry point for them")

    @property
    def tensors(self) -> list[Tensor]:
        return [a for a in self.args if isinstance(a, Tensor)]

    @property
    def inputs(self) -> list[Tensor]:
        """What the caller passes: every tensor but the outputs (inouts included)."""
        return [a for a in self.tensors if not a.output]

    @property
    def outputs(self) -> list[Tensor]:
        return [a for a in self.tensors if a.output]

    @property
    def written(self) -> list[Tensor]:
        """What the kernel writes, in declared order: the outputs and the inouts."""
        return [a for a in self.tensors if a.output or a.inout]

    @property
    def single(self) -> bool:
        """One output and no inout: outputs and references are plain tensors (else dicts by name)."""
        return len(self.outputs) == 1 and not any(t.inout for t in self.tensors)

    @property
    def output(self) -> Tensor:
        """The output of a single-output call (ValueError otherwise)."""
        if not self.single:
            raise ValueError("signature: several written tensors: use outputs / written")
        return self.outputs[0]

    @property
    def scalars(self) -> list[Scalar]:
        return [a for a in self.args if isinstance(a, Scalar)]

    def bound_symbols(self) -> list[str]:
        """Symbols that some input has as a whole dimension, in order of first use (their values come from there)."""
        out: list[str] = []
        for t in self.inputs:
            for d in t.dims:
                if isinstance(d, str) and _SYMBOL.fullmatch(d) and d not in out and d not in self.fixed:
                    out.append(d)
        return out

    def size_order(self) -> list[str]:
        return list(self.sizes) if self.sizes is not None else self.bound_symbols()

    def to_json(self) -> dict[str, Any]:
        """The declaration as data (kernel.json of an exported kernel; the op runtime reads it)."""
        args = []
        for a in self.args:
            if isinstance(a, Tensor):
                args.append({"kind": "tensor", "name": a.name, "dtype": a.dtype, "dims": list(a.dims),
                             "output": a.output, **({"inout": True} if a.inout else {}),
                             **({"bounds": list(a.bounds)} if a.bounds else {}),
                             **({"align": a.align} if a.align else {}), **({"strided": True} if a.strided else {})})
            else:
                args.append({"kind": "scalar", "name": a.name, "dtype": a.dtype})
        launch = {"launch": {"items": self.launch.items}} if self.launch else {}
        return {"args": args, "sizes": self.size_order(), "fixed": dict(self.fixed), "workspace": self.workspace,
                **launch}

    def _c_params(self) -> list[str]:
        """The entry point's parameters up to the scalars: tensor pointers, strides, sizes, scalars."""
        params = [f"{'void' if a.output or a.inout else 'const void'}* {a.name}" for a in self.tensors]
        params += [f"const int64_t* {a.name}_strides" for a in self.tensors if a.strided]
        params += [f"int64_t {s}" for s in self.size_order()]
        return params + [f"{SCALAR_CTYPES[s.dtype]} {s.name}" for s in self.scalars]

    def c_prototype(self, entry: str) -> str:
        """The entry point's C declaration (for a template's author); a launched kernel's (`kernel_prototype`) when
        the call declares a launch."""
        if self.launch is not None:
            return self.kernel_prototype(entry)
        workspace = ["void* workspace", "int64_t* workspace_bytes"] if self.workspace else []
        return f'extern "C" int {entry}({", ".join([*self._c_params(), *workspace, "void* stream"])})'

    def kernel_prototype(self, entry: str) -> str:
        """A launched kernel's C declaration (`launch`): the entry point's arguments without the stream (a launch
        takes no strided tensor and no workspace)."""
        return f'extern "C" __global__ void {entry}({", ".join(self._c_params())})'


def _factors(d: Union[int, str]) -> list[Union[int, str]]:
    if isinstance(d, int):
        return [d]
    return [int(f) if f.strip().isdigit() else f.strip() for f in str(d).split("*")]


# ---- shapes ----------------------------------------------------------------------------------------------------------
def check_shape_keys(d: Any, required: tuple[str, ...], optional: tuple[str, ...], what: str,
                     also: str = "") -> None:
    """A shape table of family `what`: a mapping with every required key and no key outside required + optional,
    else ValueError naming them (`also`: more about what is required)."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} shape: expected a table, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{what} shape is missing key(s) {missing}; required keys are {list(required)}{also}")
    unknown = sorted(set(d) - set(required) - set(optional))
    if unknown:
        raise ValueError(f"{what} shape has unknown key(s) {unknown}; allowed keys are {list(required + optional)}")


class Shape(Mapping):
    """A shape of a declared family: its name and its sizes (``shape["rows"]`` or ``shape.rows``)."""

    def __init__(self, name: str, sizes: Mapping[str, Any]):
        self.name = name
        self._sizes = dict(sizes)

    def __getitem__(self, key: str) -> Any:
        return self._sizes[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_sizes"][key]
        except KeyError:
            raise AttributeError(key) from None

    def __repr__(self) -> str:
        return f"Shape({self.name!r}, {self._sizes})"


@dataclass(frozen=True)
class ShapeEntry:
    """A task shape plus how the evaluator uses it: `checks` input sets, timed or not, fresh inputs or cached."""

    shape: Any
    name: str
    checks: int
    time: bool
    fresh: bool


# ---- the family ------------------------------------------------------------------------------------------------------
class Family(ABC):
    """One kernel family (e.g. RMSNorm forward). Instances are made per space: constants, shapes and settings come
    from it. Subclass it, set the class attributes, declare `call_signature`, write `make_inputs` and `reference`."""

    #: the family's name: what elite.json records and `export`/`load` look it up by
    name: str = "abstract"
    #: bump when the call or the meaning of the signature constants changes: an elite of another version is refused
    version: str = "1"
    #: extern "C" symbol every template of the family exports
    entry: str = ""
    #: the exported function's name (default: the family's name)
    function: str = ""
    #: a binding of the family's own, relative to the family's module (default: generated from the signature)
    binding_file: str = ""
    #: CUDA: the binding loads and launches device-only builds (`evo_binding_load_cubin`): candidates compile to a
    #: cubin alone, no host code, no link (issue 52; EVOENGINEER_DEVICE_ONLY=0 builds host code instead)
    device_only: bool = False
    #: with device_only: build device code only by default (False: only with EVOENGINEER_DEVICE_ONLY=1, e.g. while
    #: the binding's launcher has not run on a GPU)
    device_only_default: bool = True
    #: shape-table keys beyond the signature's sizes (values kept on the Shape), with no default
    shape_keys: tuple[str, ...] = ()
    #: an op adapter of the family's own (torch only, relative to the family's module; class name; other files it
    #: imports): copied into an exported package, which then needs no EvoEngineer. Default: `op_adapter`'s
    #: DeclaredOp, and the package imports the family
    op_module: str = ""
    op_class: str = ""
    op_files: tuple[str, ...] = ()
    #: CUDA: the family's kernels must run inside CUDA graphs (exported ops do, under torch.compile and graph
    #: capture): each candidate is also captured, replayed, checked and timed in one (evaluators/worker.py)
    cuda_graphs: bool = True
    #: the templates the family's kernels are written in, relative to the family's module folder or to the shipped
    #: templates folder (listed by `evoengineer families`; a space may render another one of its own)
    templates: tuple[str, ...] = ()

    def __init__(self, space: SearchSpace | None = None, *, constants: Mapping[str, Any] | None = None,
                 backend: str | None = None):
        """For a search: from `space`. For an exported op (no shapes): from the recorded `constants` and `backend`."""
        self.space = space
        self.constants = dict(space.signature if space is not None else constants or {})
        backend = space.backend if space is not None else (backend or "cpu")
        self.device = backend_of(backend).device
        self.setup()
        if space is None:
            self.settings: dict[str, Any] = {}
            self.entries: list[ShapeEntry] = []
            return
        if launched(self) and not backend_of(space.backend).device_compiler:
            raise UserError(f"{space.path or space.name}: family {self.name!r} launches device code "
                            f"(Signature.launch): a CUDA space's, not a {space.backend} one's")
        self.settings = evaluation_settings(space)
        self.entries = [self._entry(i, d) for i, d in enumerate(space.shapes)]
        if not any(e.checks for e in self.entries):
            raise UserError(f"{space.path or space.name}: shapes: no shape is checked for correctness")
        if not any(e.time for e in self.entries):
            raise UserError(f"{space.path or space.name}: shapes: no shape has time = true")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.function:
            cls.function = cls.name

    def _entry(self, i: int, d: Mapping[str, Any]) -> ShapeEntry:
        where = f"{self.space.path or self.space.name}: shapes[{i}]"
        checks, timed, fresh = d.get("checks", 1), d.get("time", False), d.get("fresh", False)
        if type(checks) is not int or checks < 0:
            raise UserError(f"{where}.checks: must be a non-negative integer")
        if not isinstance(timed, bool) or not isinstance(fresh, bool):
            raise UserError(f"{where}: time and fresh must be true or false")
        try:
            shape = self.parse_shape({k: v for k, v in d.items() if k not in GENERIC_SHAPE_KEYS})
        except ValueError as exc:
            raise UserError(f"{where}: {exc}") from None
        return ShapeEntry(shape=shape, name=d["name"], checks=checks, time=timed, fresh=fresh)

    def where(self) -> str:
        return f"{self.space.path or self.space.name}: signature" if self.space is not None else "signature"

    # ---- what each family provides --------------------------------------------------------------------------------
    def setup(self) -> None:
        """Read and check the signature constants (`self.constants`); UserError naming a bad one."""

    @classmethod
    def call_signature(cls, constants: Mapping[str, Any]) -> Signature:
        """The call the kernels of these signature constants take. Required unless the family has its own binding."""
        raise NotImplementedError(f"family {cls.name!r} declares no call signature")

    @abstractmethod
    def make_inputs(self, shape: Any, seed: int) -> Inputs:
        """Fresh random inputs on the family's device (`self.device`), fully determined by `seed`: a tensor per
        declared input (a number or a 0-d tensor per scalar), by name."""

    @abstractmethod
    def reference(self, inputs: Inputs) -> Any:
        """The exact answer in float64 (or the highest precision available), from the inputs by name: a tensor, or
        with several written tensors a dict (or tuple, in declared order) of every output and the updated value of
        every inout. It must not change its inputs. Exported ops fall back on it and differentiate it (so write it
        with differentiable torch operations)."""

    # ---- derived from the declared signature (override when bringing a binding of your own) ------------------------
    @property
    def signature(self) -> Signature:
        sig = self.__dict__.get("_signature")
        if sig is None:
            try:
                sig = type(self).call_signature(self.constants)
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{self.where()}: family {self.name!r}: {exc}") from None
            self.__dict__["_signature"] = sig
        return sig

    @property
    def binding(self) -> BindingSource:
        """The binding the builder compiles once (per source and toolchain) and links every candidate against."""
        if self.binding_file:
            path = Path(inspect.getfile(type(self))).resolve().parent / self.binding_file
            return BindingSource(name=f"{self.name}_binding", text=path.read_text(), origin=str(path))
        from evoengineer.compiler.generic_binding import generate_binding

        return BindingSource(name=f"{self.name}_generic", text=generate_binding(self.signature, self.entry,
                                                                                 f"EvoEngineer {self.name} candidate"),
                             origin=f"generated from the {self.name} signature",
                             launches=self.signature.launch is not None)

    @classmethod
    def signature_text(cls, constants: Mapping[str, Any]) -> str:
        """What the binding receives as the signature it was compiled for ("KEY=VALUE;..."): the constants."""
        return ";".join(f"{k}={_text(v)}" for k, v in sorted(constants.items()))

    def binding_signature(self) -> str:
        return self.signature_text(self.constants)

    def parse_shape(self, d: Mapping[str, Any]) -> Any:
        """A shape from its TOML table: ``name``, one positive int per size symbol of the signature's inputs and
        the family's `shape_keys`; ValueError (with the reason) otherwise."""
        sizes = self.signature.bound_symbols()
        check_shape_keys(d, ("name", *sizes), tuple(self.shape_keys), self.name)
        name = d["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.name} shape 'name' must be a non-empty string, got {name!r}")
        for k in sizes:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{self.name} shape {name!r}: {k!r} must be a positive integer, got {v!r}")
        return Shape(name, {k: v for k, v in d.items() if k != "name"})

    def output_dtype(self) -> torch.dtype:
        return DTYPES[self.signature.output.dtype]

    def tolerance(self) -> tuple[float, float]:
        """(atol, rtol) of the output against the float64 reference (by its dtype: `TOLERANCES`)."""
        return TOLERANCES.get(self.output_dtype(), (0.0, 0.0))

    def tolerance_of(self, name: str) -> tuple[float, float]:
        """(atol, rtol) of one written tensor (`""`: the output of a single-output family). Default: `tolerance()`
        where the family overrides it, else by the tensor's dtype."""
        if not name or type(self).tolerance is not Family.tolerance:
            return self.tolerance()
        t = next(t for t in self.signature.written if t.name == name)
        return TOLERANCES.get(DTYPES[t.dtype], (0.0, 0.0))

    def single_output(self) -> bool:
        """Outputs, references and `launch`'s `out` are one tensor (else dicts by the written tensors' names)."""
        try:
            return self.signature.single
        except NotImplementedError:  # a binding of its own and no declared call: one output
            return True

    def inout_names(self) -> list[str]:
        """The inputs the kernel updates in place (it is handed a copy of each, in `out`, never the input itself)."""
        if self.single_output():
            return []
        return [t.name for t in self.signature.written if t.inout]

    def sizes_of(self, inputs: Inputs) -> dict[str, int]:
        """The size symbols' values in these inputs."""
        call = self.__dict__.get("_call")
        if call is None:
            call = self.__dict__["_call"] = self.signature.to_json()
        return resolve_sizes(call, {t.name: inputs[t.name] for t in self.signature.inputs})

    def new_output(self, inputs: Inputs) -> Any:
        """What the candidate writes, made for these inputs: an output filled with NaN (integers: their minimum) so
        unwritten elements fail; with several written tensors a dict by name, an inout a copy of its input."""
        sig = self.signature
        sizes = {**self.sizes_of(inputs), **sig.fixed}
        device = next((t.device for t in (inputs[a.name] for a in sig.inputs) if isinstance(t, torch.Tensor)),
                      self.device)

        def poisoned(t: Tensor) -> torch.Tensor:
            dtype = DTYPES[t.dtype]
            fill = float("nan") if dtype.is_floating_point else (False if dtype == torch.bool else
                                                                   torch.iinfo(dtype).min)
            return torch.full([dim_value(d, sizes) for d in t.dims], fill, dtype=dtype, device=device)

        if sig.single:
            return poisoned(sig.output)
        return {t.name: inputs[t.name].detach().clone() if t.inout else poisoned(t) for t in sig.written}

    def call_args(self, inputs: Inputs, out: Any) -> list[Any]:
        """The binding's positional arguments: the declared order, `out` for the output (several written tensors:
        `out[name]` for each output and inout)."""
        args = []
        single = self.signature.single
        for a in self.signature.args:
            if isinstance(a, Tensor):
                if single:
                    args.append(out if a.output else inputs[a.name])
                else:
                    args.append(out[a.name] if a.output or a.inout else inputs[a.name])
            else:
                v = inputs[a.name]
                v = v.item() if isinstance(v, torch.Tensor) else v
                args.append(bool(v) if a.dtype == "bool" else v)
        return args

    def launch(self, module: Any, inputs: Inputs, out: torch.Tensor) -> None:
        """Run the candidate once (asynchronously on GPU); RuntimeError on a non-zero status."""
        rc = module.forward(*self.call_args(inputs, out))
        if rc:
            raise RuntimeError(f"kernel returned status {rc}")

    def extra_check(self, shape: Any, inputs: Inputs, out: torch.Tensor, ref: torch.Tensor
                    ) -> tuple[bool, str, dict[str, float]]:
        """A further check of an output that passed the tolerance check on one input set (e.g. against a
        lower-precision baseline): (ok, reason, metrics). Metrics are larger-is-worse; the worker records the worst
        over the input sets."""
        return True, "", {}

    def baselines(self) -> dict[str, Callable[[Inputs], Any]]:
        """Callables timed beside each candidate (same worker, same inputs)."""
        return {}

    def baseline_reference(self, name: str, inputs: Inputs) -> Any:
        """The answer baseline `name` is held to when it is checked against the reference at a worker's start, where
        it is not the family's reference (e.g. a baseline that runs on the unquantized tensors a quantized kernel
        replaces); None (default): `reference(inputs)`."""
        return None

    def baseline_kernels(self) -> dict[str, str]:
        """Baseline kernels of the family (name -> template under templates/), built once and timed beside each
        candidate with `launch`."""
        return {}

    def flops(self, shape: Any) -> int:
        return 0

    def min_bytes(self, shape: Any) -> int:
        return 0

    # ---- the exported op ----------------------------------------------------------------------------------------------
    def op_adapter(self) -> Any:
        """What turns a built kernel into a PyTorch op (evoengineer/ops/runtime.py: `OpAdapter`). Default: the
        declared signature's op, `function(*inputs, *scalars) -> output`, falling back on and differentiating
        `reference`."""
        if self.op_module:
            return type(self).own_op_adapter()
        from evoengineer.ops.runtime import DeclaredOp

        def reference(args: dict[str, Any]) -> torch.Tensor:
            return self.reference(args)

        return DeclaredOp(self.signature.to_json(), reference, name=self.function)

    @classmethod
    def template_paths(cls) -> list[Path]:
        """The declared `templates`, found beside the family's module first, then among the shipped templates."""
        return [cls.template_path(t) for t in cls.templates]

    @classmethod
    def template_path(cls, template: str) -> Path:
        """A template of the family's (a declared one, a baseline kernel's): beside the family's module first, then
        among the shipped templates."""
        from evoengineer.paths import TEMPLATES_DIR

        here = Path(inspect.getfile(cls)).resolve().parent
        return (here / template) if (here / template).is_file() else (TEMPLATES_DIR / template)

    @classmethod
    def own_op_adapter(cls) -> Any:
        """The adapter of `op_module` (a module beside the family's), made without the signature constants: it
        reads them from the kernel it is bound to."""
        import importlib

        package = cls.__module__.rpartition(".")[0]
        module = importlib.import_module(f"{package}.{Path(cls.op_module).stem}" if package else
                                         Path(cls.op_module).stem)
        return getattr(module, cls.op_class)()

    @classmethod
    def describe(cls) -> str:
        return f"{cls.name} (version {cls.version}, {cls.__module__}.{cls.__qualname__})"


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return repr(v)
    return str(v)
