"""Does the float64 reference slow the next timing? (issue 34, the one-sequence rows of benchmark.py.)

benchmark.py computes a kernel's float64 reference (at one sequence of 131072 keys: K and V repeated for the query
heads, ~4.3 GB at once) right before it times that kernel, and times cuDNN later. This probe times one kernel on
inputs that never change, in this order: fresh; right after the reference; then every ~0.1 s for a few seconds;
after empty_cache(); after a fresh 10 GiB allocation that is dropped (untouched, then zeroed). Each line is the
CUDA-graph time (`graph_us` without its settling replays, as benchmark.py timed before them), seconds since the
memory event and the allocator's reserved bytes.

    python3 experiments/decode/probes/after_reference.py --kernel 'SPACE:{params}' [--shapes 'B,Hq,Hkv,Sk,D;...']
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evoengineer.tasks.decode import DecodeShape, reference  # noqa: E402
from experiments.decode.benchmark import build_all, parse_kernel, parse_shapes  # noqa: E402
from experiments.gpu_timing import graph_us  # noqa: E402


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="append", required=True)
    ap.add_argument("--shapes", default="1,32,8,131072,128;8,32,8,16384,128;1,32,8,32768,128")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--series", type=float, default=3.0, help="seconds of timings after the reference")
    ap.add_argument("--cache-dir", default=str(ROOT / ".evo_cache"))
    a = ap.parse_args()
    built = build_all([parse_kernel(f"k{i}={k}") for i, k in enumerate(a.kernel)], Path(a.cache_dir).absolute())
    for label, (task, module, space, params) in built.items():
        for B, Hq, Hkv, Sq, Sk, _D in parse_shapes(a.shapes):
            torch.cuda.empty_cache()
            inputs = task.make_inputs(DecodeShape("probe", B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, shared_prefix=False), 0)
            out = task.new_output(inputs)
            fn = lambda: task.launch(module, inputs, out)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            print(f"\n## {label} {space.name} {params} at {(B, Hq, Hkv, Sq, Sk)}; k at {inputs['k'].data_ptr():#x}",
                  flush=True)

            def line(what: str, t0: float | None = None) -> None:
                us = graph_us(fn, a.calls, a.repeats, settle_s=0)
                since = f"{time.perf_counter() - t0:6.2f} s" if t0 is not None else "      -"
                print(f"{what:<34} {since}  {us:7.1f} us   reserved {gib(torch.cuda.memory_reserved())}", flush=True)

            line("fresh")
            line("fresh, again")
            ref = reference(inputs)
            torch.cuda.synchronize()
            del ref
            t0 = time.perf_counter()
            line("after the reference (freed)", t0)
            while time.perf_counter() - t0 < a.series:
                time.sleep(0.1)
                line("  later", t0)
            torch.cuda.empty_cache()
            t0 = time.perf_counter()
            line("after empty_cache()", t0)
            for how in ("empty", "zeros"):
                x = getattr(torch, how)(10 * 2**30, dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                del x
                t0 = time.perf_counter()
                line(f"after 10 GiB torch.{how}, freed", t0)
                line("  later", t0)
                torch.cuda.empty_cache()
                t0 = time.perf_counter()
                line("  after empty_cache()", t0)
                time.sleep(1.0)
                line("  later", t0)
            del inputs, out
    return 0


if __name__ == "__main__":
    sys.exit(main())
