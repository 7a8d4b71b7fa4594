"""The task interface: what a template family computes, how to check it and what to time it against."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace

Inputs = dict[str, torch.Tensor]

#: Tolerances (atol, rtol) for outputs of each dtype, compared with a float64 reference.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}

GENERIC_SHAPE_KEYS = ("checks", "time", "fresh")
EVALUATION_DEFAULTS = {"warmup": 20, "repeats": 100, "timeout_s": 120.0, "init_timeout_s": 900.0,
                       "l2_flush": True, "build_jobs": 0,
                       # integrity (evaluators/integrity.py): runs per check set that must agree, timed calls
                       # whose output is checked against the reference (the last one and random others), whether
                       # runs of the same inputs must agree bitwise (else within the tolerance)
                       "check_runs": 2, "check_calls": 4, "deterministic": True,
                       # compute-sanitizer tools each elite runs under before it is published (CUDA; [] = none)
                       "sanitizer": ["memcheck", "racecheck", "synccheck"], "sanitizer_timeout_s": 300.0}
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


@dataclass(frozen=True)
class ShapeEntry:
    """A task shape plus how the evaluator uses it: `checks` input sets, timed or not, fresh inputs or cached."""

    shape: Any
    name: str
    checks: int
    time: bool
    fresh: bool


def evaluation_settings(space: SearchSpace) -> dict[str, Any]:
    """The space's [evaluation] table over the defaults; unknown keys and bad values are UserErrors."""
    where = f"{space.path or space.name}: evaluation"
    out = dict(EVALUATION_DEFAULTS)
    for k, v in space.evaluation.items():
        if k not in EVALUATION_DEFAULTS:
            raise UserError(f"{where}.{k}: unknown key (known: {', '.join(EVALUATION_DEFAULTS)})")
        default = EVALUATION_DEFAULTS[k]
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise UserError(f"{where}.{k}: must be true or false")
        elif isinstance(default, list):
            if not isinstance(v, list) or any(t not in SANITIZER_TOOLS for t in v) or len(set(v)) != len(v):
                raise UserError(f"{where}.{k}: a list of distinct tools among {', '.join(SANITIZER_TOOLS)}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise UserError(f"{where}.{k}: must be a non-negative number")
        out[k] = v
    for k in ("repeats", "check_runs", "check_calls"):
        if out[k] < 1 or out[k] != int(out[k]):
            raise UserError(f"{where}.{k}: must be a whole number, at least 1")
    return out


class Task(ABC):
    """One problem (e.g. MSDA forward). Instances are made per space: shapes and signature come from it."""

    name: str = "abstract"
    entry: str = ""  # extern "C" symbol every template of the family exports
    binding: str = ""  # binding source under templates/, compiled once per family

    def __init__(self, space: SearchSpace):
        self.space = space
        self.settings = evaluation_settings(space)
        self.device = "cuda" if space.backend == "cuda" else "cpu"
        self.entries = [self._entry(i, d) for i, d in enumerate(space.shapes)]
        if not any(e.checks for e in self.entries):
            raise UserError(f"{space.path or space.name}: shapes: no shape is checked for correctness")
        if not any(e.time for e in self.entries):
            raise UserError(f"{space.path or space.name}: shapes: no shape has time = true")

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

    # ---- what each task provides ----------------------------------------------------------------------------------
    @abstractmethod
    def parse_shape(self, d: Mapping[str, Any]) -> Any:
        """A shape from its TOML table; ValueError (with the reason) if it does not fit the signature."""

    @abstractmethod
    def make_inputs(self, shape: Any, seed: int) -> Inputs:
        """Fresh random inputs on the task's device, fully determined by `seed`."""

    @abstractmethod
    def reference(self, inputs: Inputs) -> torch.Tensor:
        """The exact answer in float64 (or the highest precision available)."""

    @abstractmethod
    def new_output(self, inputs: Inputs) -> torch.Tensor:
        """An output buffer for the candidate, filled with NaN so unwritten elements fail."""

    @abstractmethod
    def launch(self, module: Any, inputs: Inputs, out: torch.Tensor) -> None:
        """Run the candidate once (asynchronously on GPU); raise RuntimeError on a non-zero status."""

    def binding_signature(self) -> str:
        """What the family binding checks every call against: "KEY=VALUE;..." of the signature constants that fix
        the inputs a kernel accepts (shapes, dtypes)."""
        return ""

    def output_dtype(self) -> torch.dtype:
        return torch.float32

    def tolerance(self) -> tuple[float, float]:
        return TOLERANCES[self.output_dtype()]

    def extra_check(self, shape: Any, inputs: Inputs, out: torch.Tensor, ref: torch.Tensor
                    ) -> tuple[bool, str, dict[str, float]]:
        """A further check of an output that passed the tolerance check on one input set (e.g. against a
        lower-precision baseline): (ok, reason, metrics). Metrics are larger-is-worse; the worker records the worst
        over the input sets."""
        return True, "", {}

    def baselines(self) -> dict[str, Callable[[Inputs], Any]]:
        """Callables timed beside each candidate (same worker, same inputs)."""
        return {}

    def baseline_kernels(self) -> dict[str, str]:
        """Baseline kernels of the family (name -> template under templates/), built once and timed beside each
        candidate with `launch`."""
        return {}

    def flops(self, shape: Any) -> int:
        return 0

    def min_bytes(self, shape: Any) -> int:
        return 0


def get_task(space: SearchSpace) -> Task:
    """The task named by the space."""
    from evoengineer.tasks.msda import MSDATask
    from evoengineer.tasks.sdpa import SDPATask

    tasks = {"msda": MSDATask, "sdpa": SDPATask}
    if space.task not in tasks:
        raise UserError(f"{space.path or space.name}: task {space.task!r} is unknown (known: {', '.join(tasks)})")
    return tasks[space.task](space)
