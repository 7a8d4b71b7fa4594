"""How fast can this GPU read N bytes once: torch.amax over an fp16 tensor of N bytes (kernel-only, CUDA graph replay,
median), for the K/V byte counts of the issue's decode shapes (fp16 and FP8 caches). A bound for a decode kernel's
streaming part at that size: its launch, ramp and tail included, no split combine.

    python3 experiments/decode/stream_bound.py [--calls 20] [--repeats 50]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from experiments.decode.benchmark import SHAPES  # noqa: E402
from experiments.gpu_timing import graph_us  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    print("| (B, Hq, Hkv, Sq, Sk, D) | cache | K+V bytes | amax us | GB/s |")
    print("|---|---|---|---|---|")
    for b, _hq, hkv, _sq, sk, d in SHAPES:
        for name, elem in (("fp16", 2), ("fp8", 1)):
            nbytes = 2 * b * hkv * sk * d * elem
            x = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
            us = graph_us(lambda: torch.amax(x), args.calls, args.repeats)
            print(f"| {(b, _hq, hkv, _sq, sk, d)} | {name} | {nbytes / 1e6:.1f} MB | {us:.1f} "
                  f"| {nbytes / us / 1e3:.0f} |")
            del x
    return 0


if __name__ == "__main__":
    sys.exit(main())
