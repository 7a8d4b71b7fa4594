"""The task interface: what a template family computes, how to check it and what to time it against."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace
from evoengineer.tasks.settings import (EVALUATION_DEFAULTS, GENERIC_SHAPE_KEYS, SANITIZER_TOOLS,  # noqa: F401
                                        evaluation_settings)

Inputs = dict[str, torch.Tensor]

#: Tolerances (atol, rtol) for outputs of each dtype, compared with a float64 reference.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}


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


@dataclass(frozen=True)
class ShapeEntry:
    """A task shape plus how the evaluator uses it: `checks` input sets, timed or not, fresh inputs or cached."""

    shape: Any
    name: str
    checks: int
    time: bool
    fresh: bool


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
    from evoengineer.tasks.decode import DecodeTask
    from evoengineer.tasks.msda import MSDATask
    from evoengineer.tasks.sdpa import SDPATask

    tasks = {"msda": MSDATask, "sdpa": SDPATask, "decode": DecodeTask}
    if space.task not in tasks:
        raise UserError(f"{space.path or space.name}: task {space.task!r} is unknown (known: {', '.join(tasks)})")
    return tasks[space.task](space)
