"""Timing of one callable: warm-up, many timed repeats, percentiles.

CPU: perf_counter around each call. CUDA: a pair of events around each call; with `flush_l2`, a buffer twice the
L2 size is written between calls so every call starts with a cold L2 (the result says which). The GPU never waits
on the host inside a timed call: each call is queued behind a GPU spin longer than the host took to queue it (a
busy host, e.g. compilers on every core, would otherwise add its launch delays to the kernel's time); a call the
host queued slower than its spin is timed again behind a longer one. Optional hooks run
outside the timed region around every call (warm-up included): `before(i)` ahead of the L2 flush, `after(i)` after
the end event, so what they do (poisoning or fingerprinting the output) is never timed and never leaves L2 warm.
"""

from __future__ import annotations

import statistics
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


def time_callable(fn: Callable[..., Any], *, device: str, warmup: int, repeats: int, flush_l2: bool = True,
                  before: Hook = None, after: Hook = None, keep_samples: bool = False,
                  numbered: bool = False) -> dict[str, Any]:
    """Time `fn()`; returns p50/p90/p99/min in microseconds, n, and the cache condition (and the samples with
    keep_samples). Calls are numbered 0 .. warmup + repeats - 1 for the hooks; only the last `repeats` are timed.
    `numbered`: `fn(i)` is given the call's number (a call timed again keeps its number)."""
    before, after = before or _noop, after or _noop
    if not numbered:
        plain = fn
        fn = lambda _i: plain()  # noqa: E731
    if device == "cuda":
        out = _time_cuda(fn, warmup, repeats, flush_l2, before, after)
        if not keep_samples:
            out.pop("samples")
        return out
    for i in range(warmup):
        before(i)
        fn(i)
        after(i)
    samples = []
    for i in range(warmup, warmup + repeats):
        before(i)
        t0 = time.perf_counter_ns()
        fn(i)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        after(i)
    return {**percentiles(samples), "cache": "warm (CPU, same inputs every call)",
            **({"samples": samples} if keep_samples else {})}


#: the GPU spin ahead of a timed call: this many times the host's time to queue one call (the warm-up's median;
#: without a warm-up, the last one measured on this device), within these bounds (microseconds)
SPIN_FACTOR, SPIN_MIN_US, SPIN_MAX_US, SPIN_DEFAULT_US = 2.0, 10.0, 1000.0, 200.0
#: passes over the calls the host queued after their spin had ended, behind a longer spin (twice the spin, or the
#: host's time for them); a pass stops them when more than half its calls were late again: such a call waits for
#: the device itself (it reads a result back), which no spin hides, and keeps its samples (counted in `host_late`).
#: Within a pass, a late call lengthens the spin of the calls after it (SPIN_FACTOR x the host's time for it): the
#: warm-up measures the call alone, not the events and the L2 flush queued between the spin and the call
RETAKES = 3
_cycles_per_us: dict[int, float] = {}
_last_queue_us: dict[int, float] = {}


def spin_cycles_per_us() -> float:
    """GPU clock cycles per microsecond of `torch.cuda._sleep` on this device, the fastest of a few tries (so a
    spin of n us lasts at least n us)."""
    dev = torch.cuda.current_device()
    if dev not in _cycles_per_us:
        cycles = 1 << 20
        torch.cuda._sleep(cycles)  # the first launch loads the kernel
        rates = []
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            rates.append(cycles / max(a.elapsed_time(b) * 1e3, 1e-3))
        _cycles_per_us[dev] = max(rates)
    return _cycles_per_us[dev]


def _time_cuda(fn: Callable[[int], Any], warmup: int, repeats: int, flush_l2: bool, before: Callable[[int], Any],
               after: Callable[[int], Any]) -> dict[str, Any]:
    dev = torch.cuda.current_device()
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    scratch = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device="cuda") if flush_l2 else None
    per_us = spin_cycles_per_us()
    # the stream the calls go to, looked up once: Event.record() without one asks torch for it on every record
    stream = torch.cuda.current_stream()
    queued = []
    for i in range(warmup):
        before(i)
        t0 = time.perf_counter()
        fn(i)
        queued.append((time.perf_counter() - t0) * 1e6)
        after(i)
    torch.cuda.synchronize()
    if queued:
        _last_queue_us[dev] = statistics.median(queued)
    spin_us = min(SPIN_MAX_US, max(SPIN_MIN_US, SPIN_FACTOR * _last_queue_us.get(dev, SPIN_DEFAULT_US)))
    samples: list[float] = [0.0] * repeats
    todo: list[int] = list(range(repeats))
    retimed = 0  # calls timed again behind a longer spin (each time one was)
    for attempt in range(RETAKES + 1):
        if attempt:
            retimed += len(todo)
        timed = []
        for k in todo:  # the k-th timed call is call warmup + k for the hooks however often it is timed
            before(warmup + k)
            start, end, spun = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                                torch.cuda.Event())
            torch.cuda._sleep(int(spin_us * per_us))
            spun.record(stream)
            t0 = time.perf_counter()
            if scratch is not None:
                scratch.zero_()
            start.record(stream)
            fn(warmup + k)
            end.record(stream)
            host_us = (time.perf_counter() - t0) * 1e6
            late = spun.query()  # the spin was over before the call was queued: the GPU may have waited for it
            if late:  # the calls after it in this pass get a spin long enough for what the host took here
                spin_us = min(4 * SPIN_MAX_US, max(spin_us, SPIN_FACTOR * host_us))
            after(warmup + k)
            timed.append((k, start, end, host_us if late else None))
        torch.cuda.synchronize()
        for k, start, end, _ in timed:
            samples[k] = start.elapsed_time(end) * 1e3
        late_calls = [(k, host_us) for k, _, _, host_us in timed if host_us is not None]
        if not late_calls or attempt == RETAKES or (attempt and 2 * len(late_calls) > len(timed)):
            break
        todo = [k for k, _ in late_calls]
        spin_us = min(4 * SPIN_MAX_US, max(2 * spin_us, 2 * max(h for _, h in late_calls)))
    cache = "L2 flushed before every call" if flush_l2 else "L2 warm (same inputs every call)"
    return {**percentiles(samples), "cache": cache, "samples": samples, "host_late": len(late_calls),
            "retimed": retimed}
