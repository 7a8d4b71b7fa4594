"""Timing of one callable: warm-up, many timed repeats, percentiles.

CPU: perf_counter around each call. CUDA: a pair of events around each call; with `flush_l2`, a buffer twice the
L2 size is written between calls so every call starts with a cold L2 (the result says which). Optional hooks run
outside the timed region around every call (warm-up included): `before(i)` ahead of the L2 flush, `after(i)` after
the end event, so what they do (poisoning or fingerprinting the output) is never timed and never leaves L2 warm.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np
import torch


def percentiles(samples_us: list[float]) -> dict[str, float]:
    a = np.asarray(samples_us, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "n": int(a.size)}


Hook = Optional[Callable[[int], Any]]


def _noop(_: int) -> None:
    return None


def time_samples(fn: Callable[[], Any], *, device: str, warmup: int, repeats: int, flush_l2: bool = True) -> list[float]:
    """The per-call samples (microseconds) that `time_callable` summarizes."""
    return time_callable(fn, device=device, warmup=warmup, repeats=repeats, flush_l2=flush_l2,
                         keep_samples=True)["samples"]


def time_callable(fn: Callable[[], Any], *, device: str, warmup: int, repeats: int, flush_l2: bool = True,
                  before: Hook = None, after: Hook = None, keep_samples: bool = False) -> dict[str, Any]:
    """Time `fn()`; returns p50/p90/p99/min in microseconds, n, and the cache condition (and the samples with
    keep_samples). Calls are numbered 0 .. warmup + repeats - 1 for the hooks; only the last `repeats` are timed."""
    before, after = before or _noop, after or _noop
    if device == "cuda":
        out = _time_cuda(fn, warmup, repeats, flush_l2, before, after)
        if not keep_samples:
            out.pop("samples")
        return out
    for i in range(warmup):
        before(i)
        fn()
        after(i)
    samples = []
    for i in range(warmup, warmup + repeats):
        before(i)
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        after(i)
    return {**percentiles(samples), "cache": "warm (CPU, same inputs every call)",
            **({"samples": samples} if keep_samples else {})}


def _time_cuda(fn: Callable[[], Any], warmup: int, repeats: int, flush_l2: bool, before: Callable[[int], Any],
               after: Callable[[int], Any]) -> dict[str, Any]:
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    scratch = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device="cuda") if flush_l2 else None
    for i in range(warmup):
        before(i)
        fn()
        after(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for k in range(repeats):
        before(warmup + k)
        if scratch is not None:
            scratch.zero_()
        starts[k].record()
        fn()
        ends[k].record()
        after(warmup + k)
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    cache = "L2 flushed before every call" if flush_l2 else "L2 warm (same inputs every call)"
    return {**percentiles(samples), "cache": cache, "samples": samples}
