"""What a candidate writes, handled alike for one output (a tensor) and for several (a dict by name of every output
and every inout: an input the kernel updates in place, handed to it as a copy).

A family's `new_output`, `reference` and `launch(..., out)` use the tensor form when its call has one output and no
inout (`Family.single_output`), the dict form otherwise; these helpers take either ("values").
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from evoengineer.evaluators.integrity import Guarded, any_true, checksum


def parts(value: Any) -> dict[str, torch.Tensor]:
    """The written tensors by name (`""` for a single output)."""
    return {"": value} if isinstance(value, torch.Tensor) else dict(value)


def clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else {k: v.clone() for k, v in value.items()}


def reference_value(ref: Any, names: list[str]) -> Any:
    """A reference in the form the outputs take: the tensor of a single output; else a dict with exactly the written
    tensors' names (a tuple or list is taken in declared order). ValueError saying what is off."""
    if names == [""]:
        if isinstance(ref, (tuple, list)) and len(ref) == 1:
            ref = ref[0]
        if not isinstance(ref, torch.Tensor):
            raise ValueError(f"reference() returned {type(ref).__name__}, expected a tensor")
        return ref
    if isinstance(ref, (tuple, list)):
        if len(ref) != len(names):
            raise ValueError(f"reference() returned {len(ref)} tensors, expected {len(names)} ({', '.join(names)})")
        ref = dict(zip(names, ref))
    if not isinstance(ref, dict) or set(ref) != set(names):
        got = sorted(ref) if isinstance(ref, dict) else type(ref).__name__
        raise ValueError(f"reference() returned {got}, expected a dict of {', '.join(names)} (the outputs and the "
                         "inouts' updated values)")
    bad = [k for k, v in ref.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"reference(): {bad[0]} is not a tensor")
    return {k: ref[k] for k in names}


def fingerprint(value: Any) -> torch.Tensor:
    """A 0-d int64 tensor: the bitwise checksums of every written tensor, summed (integrity.checksum)."""
    ps = list(parts(value).values())
    total = checksum(ps[0])
    for p in ps[1:]:
        total = total + checksum(p)
    return total


def weighted_sum(value: Any, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """A 0-d float64 tensor: every written tensor weighted by its random weights, summed."""
    total = None
    for k, p in parts(value).items():
        s = (p.to(torch.float64) * weights[k]).sum()
        total = s if total is None else total + s
    return total


def unwritten(value: Any, skip: Iterable[str] = ()) -> int:
    """Elements still NaN/Inf (the poison) after a call, over every floating output (not those in `skip`)."""
    skip = set(skip)
    return sum(int((~torch.isfinite(p)).sum()) for k, p in parts(value).items()
               if k not in skip and p.is_floating_point())


def numel(value: Any) -> int:
    return sum(p.numel() for p in parts(value).values())


class GuardedOutputs:
    """The written tensors of one call, each in a guarded allocation (integrity.Guarded); `value` is what the family's
    `launch` takes as `out` (a tensor, or a dict by name)."""

    def __init__(self, made: Any, generator: torch.Generator):
        self.single = isinstance(made, torch.Tensor)
        self.guarded = {k: Guarded.holding(v, generator) for k, v in parts(made).items()}
        self.value = (self.guarded[""].tensor if self.single else
                      {k: g.tensor for k, g in self.guarded.items()})

    @property
    def tensor(self) -> Any:  # the name the worker has always used
        return self.value

    def flags(self) -> list[torch.Tensor]:
        """0-d bool tensors, one per output, True where a guard band changed (nothing read back)."""
        return [g.changed() for g in self.guarded.values()]

    def damage(self) -> str | None:
        """None if every guard band is intact; else which output was written past, and how far. One host sync
        when nothing changed."""
        if not any_true(self.flags()):
            return None
        for k, g in self.guarded.items():
            bad = g.damage("output" if self.single else f"output {k}")
            if bad:
                return bad
        return None
