"""Why one long sequence streams slower than a batch with the same per-CTA work (issue 34, cluster/same_work): one
kernel's time at two shapes of equal bytes and equal CTA work, measured four ways in one process: one launch alone
(CUDA events around it, synchronized before), a graph of one call, a graph of `calls` calls (benchmark.py's
timing), and `calls` eager launches back to back. Medians of `repeats`.

    python3 experiments/decode/probes/back_to_back.py --kernel 'SPACE:{params}' [--shapes 'B,Hq,Hkv,Sk,D;...']
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evoengineer.tasks.decode import DecodeShape, reference  # noqa: E402
from experiments.decode.benchmark import build_all, parse_kernel, parse_shapes  # noqa: E402
from experiments.gpu_timing import graph_us  # noqa: E402


def events_us(fn, n: int, repeats: int) -> float:
    """Median per-call time of n eager calls between two events (synchronized before each)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / n)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="append", required=True)
    ap.add_argument("--shapes", default="1,32,8,131072,128;8,32,8,16384,128")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--cache-dir", default=str(ROOT / ".evo_cache"))
    ap.add_argument("--references", action="store_true",
                    help="as benchmark.py does, compute the float64 reference (and FP8's fp16 attention) before timing")
    a = ap.parse_args()
    built = build_all([parse_kernel(f"k{i}={k}") for i, k in enumerate(a.kernel)], Path(a.cache_dir).absolute())
    print("| kernel | shape | alone | graph of 1 | graph of N | N eager |")
    print("|---|---|---|---|---|---|")
    for label, (task, module, space, params) in built.items():
        for B, Hq, Hkv, Sq, Sk, _D in parse_shapes(a.shapes):
            inputs = task.make_inputs(DecodeShape("probe", B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, shared_prefix=False), 0)
            out = task.new_output(inputs)
            fn = lambda: task.launch(module, inputs, out)  # noqa: E731
            fn()
            if a.references:  # computed and dropped, as benchmark.py computes them before it times a kernel
                reference(inputs)
                if task.fp8:
                    task.fp16_attention(inputs)
            # graph_us without its settling replays: the timing these recorded tables used
            t = [events_us(fn, 1, a.repeats), graph_us(fn, 1, a.repeats, 0), graph_us(fn, a.calls, a.repeats, 0),
                 events_us(fn, a.calls, a.repeats)]
            print(f"| {label} {space.name} {params} | {(B, Hq, Hkv, Sq, Sk)} | " + " | ".join(f"{x:.1f}" for x in t)
                  + " |", flush=True)
            del inputs, out
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
