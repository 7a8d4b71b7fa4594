"""What keeps a candidate from harming its inputs, its neighbours' memory, or passing by luck.

* `Guarded`: a tensor placed inside a larger allocation whose bytes before and after it hold a random canary
  pattern; a write past either end changes the pattern and is reported with its distance in elements.
* `ProtectedInputs`: an input set whose tensors live in guarded allocations, with a pristine copy of every one; after
  a candidate ran, `verify` says which input it changed (or wrote past) and `restore` puts the pristine bytes back,
  so nothing one candidate does carries over to the next.
* `checksum`: a bitwise fingerprint of an output, cheap enough to take after every timed call (outside the timed
  region), so runs of the same inputs can be compared without keeping every output.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

import torch

#: Canary bytes on each side of a guarded tensor (a multiple of 256, so the tensor keeps the allocator's alignment).
GUARD_BYTES = 64 * 1024
#: random canary patterns made once per device and guard size; each allocation takes one at random
#: (drawing 2 x 64 KiB on the CPU and copying them to the GPU per allocation was ~0.5 ms: tens per candidate)
CANARY_PATTERNS = 32
_patterns: dict[tuple[str, int], torch.Tensor] = {}

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """`t` reinterpreted as integers of its element size (flat), for bitwise comparisons; NaN == NaN there."""
    flat = t.reshape(-1)
    return flat.view(_INT_VIEW[flat.element_size()]) if flat.dtype != torch.bool else flat.view(torch.uint8)


def checksum(t: torch.Tensor) -> torch.Tensor:
    """A 0-d int64 tensor on `t`'s device: the sum of its elements' bit patterns (any single change moves it).
    Computed asynchronously on a GPU; nothing is read back until the caller asks."""
    return as_bits(t).sum(dtype=torch.int64)


def mismatch(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None if every output is finite and within atol + rtol x |ref| of the float64 reference; else what is off."""
    got = got.to(torch.float64)
    ref = ref.to(torch.float64).to(got.device)
    bad = ~torch.isfinite(got)
    if bad.any():
        return f"{int(bad.sum())} of {got.numel()} outputs NaN/Inf (unwritten or invalid)"
    err = (got - ref).abs()
    over = err > atol + rtol * ref.abs()
    if over.any():
        max_abs = float(err.max())
        max_rel = float((err / ref.abs().clamp_min(atol)).max())
        return (f"max abs err {max_abs:.3e} (rel {max_rel:.3e}) > tol (atol {atol:g}, rtol {rtol:g}), "
                f"{int(over.sum())} elements off, worst at flat index {int(torch.argmax(err.flatten()))}")
    return None


class Guarded:
    """A tensor of `shape`/`dtype` inside an allocation with `guard` canary bytes before and after it.

    `tensor` is an ordinary contiguous tensor (a view into the allocation) that kernels receive as usual.
    """

    def __init__(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                 generator: torch.Generator, guard: int = GUARD_BYTES):
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = math.prod(shape) * itemsize
        self.itemsize = itemsize
        self.guard = guard
        self.buf = torch.empty(2 * guard + self.nbytes, dtype=torch.uint8, device=device)
        # random canaries (a pattern of the pool, picked at random per allocation): no kernel writes these exact
        # bytes by accident
        pattern = _canary_pattern(torch.device(device), guard, generator)
        self.front, self.back = pattern[:guard], pattern[guard:]
        self.tensor = self.buf[guard:guard + self.nbytes].view(dtype).view(shape)
        self.reset_guards()

    @classmethod
    def holding(cls, t: torch.Tensor, generator: torch.Generator, guard: int = GUARD_BYTES) -> "Guarded":
        """A guarded copy of `t`."""
        g = cls(t.shape, t.dtype, t.device, generator, guard)
        g.tensor.copy_(t)
        return g

    def reset_guards(self) -> None:
        self.buf[:self.guard].copy_(self.front)
        self.buf[self.guard + self.nbytes:].copy_(self.back)

    def changed(self) -> torch.Tensor:
        """A 0-d bool tensor on the device, True if either canary changed (no host sync: callers gather many)."""
        return (self.buf[:self.guard] != self.front).any() | (self.buf[self.guard + self.nbytes:] != self.back).any()

    def damage(self, what: str) -> str | None:
        """None if both canaries are intact; else how far outside `what` the furthest changed byte lies."""
        g, n = self.guard, self.nbytes
        after = self.buf[g + n:]
        if not torch.equal(after, self.back):
            last = int(torch.nonzero(after != self.back).max())
            k = last // self.itemsize + 1
            return f"wrote past {what} by {_elements(k)} (up to {_bytes(last + 1)} after its end)"
        before = self.buf[:g]
        if not torch.equal(before, self.front):
            first = int(torch.nonzero(before != self.front).min())
            k = (g - first + self.itemsize - 1) // self.itemsize
            return (f"wrote before {what} by {_elements(k)} (up to {_bytes(g - first)} ahead of its start; a write more "
                    f"than {g} bytes past the end of another tensor can land there too)")
        return None


def _canary_pattern(device: torch.device, guard: int, generator: torch.Generator) -> torch.Tensor:
    """One of CANARY_PATTERNS random patterns of 2 x `guard` bytes on `device` (read-only: a guard band is compared
    with it and reset from it), picked with `generator`; the pool is drawn from the generator of its first use."""
    key = (str(device), guard)
    pool = _patterns.get(key)
    if pool is None:
        pool = torch.randint(0, 256, (CANARY_PATTERNS, 2 * guard), generator=generator, dtype=torch.uint8)
        pool = _patterns[key] = pool.to(device)
    return pool[int(torch.randint(0, CANARY_PATTERNS, (1,), generator=generator))]


def any_true(flags: list[torch.Tensor]) -> bool:
    """Whether any of these 0-d bool tensors is True, read back in one transfer per device (one sync on a GPU). An
    input set may hold tensors on the CPU beside the device's (sizes, scales): each device's flags are gathered on
    that device, the CPU's first (no sync)."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for f in flags:
        by_device.setdefault(f.device, []).append(f)
    for device in sorted(by_device, key=lambda d: d.type != "cpu"):
        if bool(torch.stack(by_device[device]).any()):
            return True
    return False


def _elements(k: int) -> str:
    return f"{k} element" if k == 1 else f"{k} elements"


def _bytes(k: int) -> str:
    return f"{k} byte" if k == 1 else f"{k} bytes"


class ProtectedInputs(Mapping[str, Any]):
    """An input set as the kernel sees it (guarded tensors), with a pristine copy to verify and restore from.

    Behaves as the read-only dict of inputs the task made; non-tensor values pass through unchanged.
    """

    def __init__(self, inputs: Mapping[str, Any], generator: torch.Generator, guard: int = GUARD_BYTES):
        self._guarded: dict[str, Guarded] = {}
        self._pristine: dict[str, torch.Tensor] = {}
        self._live: dict[str, Any] = {}
        for name, v in inputs.items():
            if isinstance(v, torch.Tensor):
                g = Guarded.holding(v.contiguous(), generator, guard)
                self._guarded[name] = g
                self._pristine[name] = v.detach().clone().contiguous()
                self._live[name] = g.tensor
            else:
                self._live[name] = v

    def __getitem__(self, key: str) -> Any:
        return self._live[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def __len__(self) -> int:
        return len(self._live)

    @property
    def pristine(self) -> dict[str, Any]:
        """The inputs as made (never handed to a candidate): what references are computed from."""
        return {k: self._pristine.get(k, v) for k, v in self._live.items()}

    def flags(self) -> list[torch.Tensor]:
        """0-d bool tensors, one per canary pair and per input, True where it changed (nothing read back)."""
        return ([g.changed() for g in self._guarded.values()] +
                [(as_bits(g.tensor) != as_bits(self._pristine[n])).any() for n, g in self._guarded.items()])

    def verify(self) -> str | None:
        """None if every input and its canaries are as made; else what changed (first problem found). One host
        sync when nothing changed: the comparisons are gathered on the device and read back together."""
        if not any_true(self.flags()):
            return None
        for name, g in self._guarded.items():
            bad = g.damage(f"input {name}")
            if bad:
                return bad
            live, orig = as_bits(g.tensor), as_bits(self._pristine[name])
            if not torch.equal(live, orig):
                n = int((live != orig).sum())
                return f"modified input {name} ({n} of {live.numel()} elements changed)"
        return None

    def restore(self) -> None:
        """Put the pristine bytes and canaries back (cheap to call when nothing changed)."""
        for name, g in self._guarded.items():
            g.tensor.copy_(self._pristine[name])
            g.reset_guards()

    def verify_and_restore(self) -> str | None:
        bad = self.verify()
        if bad:
            self.restore()
        return bad


def verify_and_restore_all(input_sets: list[ProtectedInputs]) -> str | None:
    """`verify_and_restore` of every set, with one host sync when nothing changed (all sets' comparisons read back
    together); else the first problem found, every changed set restored."""
    if not any_true([f for p in input_sets for f in p.flags()]):
        return None
    bad = None
    for p in input_sets:
        found = p.verify_and_restore()  # every set: each changed one is restored
        bad = bad or found
    return bad
