"""Per kernel, the line time = overhead + bytes / rate fitted (least squares) to a benchmark.py JSON whose shapes differ
only in Sk: the rate is the kernel's streaming bandwidth, the overhead what a call costs besides streaming (launch,
first loads, tail, combine). Also for cuDNN (GQA) when an fp16
kernel is in the table (its bytes).

    python3 experiments/decode/overhead_fit.py benchmark_overhead_h100.json [--batch B]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept us, slope us per byte) of y over x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    args = ap.parse_args()
    doc = json.loads(Path(args.json).read_text())
    series: dict[tuple, dict[str, list]] = {}
    for row in doc["rows"]:
        B, Hq, Hkv, Sq, _sk, D = row["shape"]
        by = series.setdefault((B, Hq, Hkv, Sq, D), {})
        for label, k in row["kernels"].items():
            if "us" in k:
                by.setdefault(label, []).append((k["bytes"], k["us"], row["shape"][4]))
        # cuDNN (the fastest backend on every row measured) reads the fp16 cache: an fp16 kernel's bytes
        us = row.get("torch_us", {}).get("cudnn/gqa")
        fp16 = [k["bytes"] for k in row["kernels"].values() if "fp16" in k["space"] and "bytes" in k]
        if us and fp16:
            by.setdefault("cudnn/gqa", []).append((fp16[0], us, row["shape"][4]))
    print("| (B, Hq, Hkv, Sq, D) | kernel | Sk | overhead us | streaming GB/s | worst residual us |")
    print("|---|---|---|---|---|---|")
    for key, by in series.items():
        for label, pts in sorted(by.items()):
            if len(pts) < 3:
                continue
            a, b = fit([(x, y) for x, y, _ in pts])
            worst = max(abs(y - (a + b * x)) for x, y, _ in pts)
            sks = ",".join(str(s) for _, _, s in pts)
            print(f"| {key} | {label} | {sks} | {a:.1f} | {1e-3 / b:.0f} | {worst:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
