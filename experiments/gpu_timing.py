"""Kernel-only GPU timing and candidate builds shared by the experiments' benchmarks (run on a GPU host, same process
as the baselines)."""

from __future__ import annotations

import statistics
import time

import torch


def graph_us(fn, calls: int, repeats: int, settle_s: float = 0.2) -> float:
    """Per-call microseconds: a CUDA graph of `calls` back-to-back calls of fn, median over `repeats` replays, timed
    after `settle_s` seconds of replays. Why the settling: for a few tens of milliseconds after the process allocates
    or frees several GB of device memory (a long sequence's float64 reference), a memory-bound kernel ran 14% slower
    on the H100 (experiments/decode/probes/after_reference.py); every kernel and baseline is timed past that."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (lazy initialisations, workspaces)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t_end = time.perf_counter() + settle_s
    while time.perf_counter() < t_end:
        g.replay()
        torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for s, e in zip(starts, ends):
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    per_call = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3 / calls
    del g
    return per_call


def first_line(x) -> str:
    text = str(x).strip()
    return text.splitlines()[0][:160] if text else type(x).__name__


def wall_us(fn, n: int = 200) -> float:
    """Per-call wall time of n back-to-back calls from Python (includes launch overhead), after one warm call."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def build_modules(space, params_list, cache_dir) -> tuple[object, list[tuple[dict, object | None, str]]]:
    """(task, [(params, loaded module or None, why not)]) for configurations of `space`, built in parallel through the
    product's Builder (its cache: a configuration built before is not built again)."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder
    from evoengineer.compiler.steps import load_module
    from evoengineer.families import get_task

    task = get_task(space)
    factory = CandidateFactory(space)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(), cache_dir=cache_dir)
    try:
        futures = [(params, b.submit(factory.make(params))) for params in params_list]
        results = [(params, f.result()) for params, f in futures]
    finally:
        b.close()
    return task, [(params, load_module(r.so, r.module) if r.status == "ok" else None,
                   "" if r.status == "ok" else f"{r.status}: {r.reason}") for params, r in results]
