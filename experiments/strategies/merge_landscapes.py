"""Merge several recorded passes of one space's landscape (same configurations) into one: per configuration the median
time of the passes (and of their p90s); a configuration that failed in any pass keeps the first failure.

    python experiments/strategies/merge_landscapes.py --space cpu_msda --out merged.csv pass1.csv pass2.csv ...

A single pass on a shared 2-core machine carries outliers (a lucky or a disturbed measurement) that would become a
false optimum; the median of three passes is the landscape the strategy benchmark replays.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.evaluators.replay import Landscape  # noqa: E402
from evoengineer.space.spec import canonical_text, load_space, resolve_space_arg  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("passes", nargs="+")
    a = ap.parse_args(argv)
    space = load_space(resolve_space_arg(a.space))
    lands = [Landscape(p, space) for p in a.passes]
    for land in lands:
        land.check_covers()
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp")
    spread = []
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*space.names, "status", "time_us", "time_p90_us", "passes_us", "reason"])
        for g in space.valid_genomes():
            params = space.genome_to_params(g)
            ms = [land.lookup(params) for land in lands]
            cells = [canonical_text(params[n]) for n in space.names]
            bad = next((m for m in ms if m.status != "ok"), None)
            if bad is not None:
                w.writerow([*cells, bad.status, "", "", "", bad.reason])
                continue
            times = [m.metrics["time_us"] for m in ms]
            p90 = [m.metrics["time_p90_us"] for m in ms if "time_p90_us" in m.metrics]
            spread.append(max(times) / min(times))
            w.writerow([*cells, "ok", f"{statistics.median(times):.4f}",
                        f"{statistics.median(p90):.4f}" if p90 else "", " ".join(f"{t:.1f}" for t in times), ""])
    tmp.replace(out)
    spread.sort()
    print(f"{out}: {len(spread)} ok configurations from {len(lands)} passes; max/min time across passes: "
          f"median {statistics.median(spread):.3f}, p90 {spread[int(0.9 * (len(spread) - 1))]:.3f}, "
          f"max {spread[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
