"""What each planted poisoner does to an honest kernel timed after it in the same process, with nothing undone (how
the search measured before issue 50) and after StateGuard.check() (what the worker does after every candidate).

    python experiments/integrity/poison_effect.py [--backend cuda|cpu] [--json OUT.json]

CUDA: tests/data/cheats_cuda (elementwise map, 16 MB in and out, L2 warm, CUDA events, median of 200 calls).
CPU: tests/data/cheats_cpu (row softmax with OpenMP, 256 x 2048, perf_counter, median of 30 calls). Each poisoner
runs once; its own answer is not checked here (the tests do that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

POISONERS = {"cuda": ["persist_l2", "limits"], "cpu": ["omp_threads", "ftz_team", "affinity", "setenv", "rounding"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder, default_cache_dir
    from evoengineer.compiler.steps import load_module
    from evoengineer.evaluators.process_state import StateGuard
    from evoengineer.evaluators.sentinel import CpuProbe
    from evoengineer.space import load_space
    from evoengineer.families import get_task

    folder = ROOT / "tests" / "data" / f"cheats_{args.backend}"
    space = load_space(folder / "cheats_space.toml")
    task = get_task(space)
    f = CandidateFactory(space)
    extra = {"THREADS": 256} if args.backend == "cuda" else {"WORK": 2}
    builder = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                      cache_dir=default_cache_dir())
    modules = {}
    for cheat in ["none", *POISONERS[args.backend]]:
        r = builder.submit(f.make({"CHEAT": cheat, **extra})).result()
        assert r.status == "ok", (cheat, r.status, r.reason)
        modules[cheat] = load_module(r.so, r.module)
    builder.close()
    entry = next(e for e in task.entries if e.time)
    inputs = task.make_inputs(entry.shape, 1)
    out = task.new_output(inputs)
    cuda = args.backend == "cuda"

    def honest_us() -> float:
        fn = lambda: task.launch(modules["none"], inputs, out)  # noqa: E731
        for _ in range(5):
            fn()
        if cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(200)]
            for a, b in ev:
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    honest_us()
    probe = None if cuda else CpuProbe.build(default_cache_dir())  # the worker's: the OpenMP team's FP environment
    guard = StateGuard(args.backend, probe)
    rows = []
    print(f"{'poisoner':14s} {'before us':>10s} {'after, kept':>12s} {'after, undone':>14s}  what the guard undid")
    for cheat in POISONERS[args.backend]:
        before = honest_us()
        if cuda:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                task.launch(modules[cheat], inputs, out)
            torch.cuda.synchronize()
        else:
            task.launch(modules[cheat], inputs, out)
        kept = honest_us()
        changes = guard.check((s.cuda_stream,) if cuda else ())
        undone = honest_us()
        rows.append({"poisoner": cheat, "before_us": round(before, 2), "after_kept_us": round(kept, 2),
                     "after_undone_us": round(undone, 2), "changes": [str(c) for c in changes]})
        print(f"{cheat:14s} {before:10.2f} {kept:8.2f} ({kept / before:4.2f}x) {undone:8.2f} ({undone / before:4.2f}x)"
              f"  {'; '.join(str(c) for c in changes)[:160]}", flush=True)
    doc = {"backend": args.backend, "device": torch.cuda.get_device_name() if cuda else "cpu", "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
