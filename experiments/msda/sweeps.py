"""The seeds' MSDA experiments, read off a full grid of the space (every valid configuration measured once).

    python experiments/msda/sweeps.py experiments/data/msda/landscape_cuda_msda_fp16.csv \
        [--ga ga_evals_cuda_msda_fp16.csv] [--png convergence.png] [--md sweeps.md]

For each axis of the seeds' studies (producer warps 0..4 of 8 warps, STAGES 1..4, queries per block, shared
metadata, persistent grid, and the other genes) it prints two views:
  best over the rest   - the fastest configuration having that value (a grid search with that axis fixed)
  from the optimum     - the grid optimum with only that gene changed (blank where the space forbids the change)
With --ga it also plots a GA run's best-so-far against evaluations (the run's evaluations in order, replay format),
with the grid optimum as the reference line.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.report import best_so_far, plot_convergence  # noqa: E402

METRIC_COLUMNS = {"status", "time_us", "time_p90_us", "time_p99_us", "baseline_us", "speedup", "max_abs_err",
                  "max_rel_err", "registers", "smem_bytes", "spill_bytes", "stack_bytes", "build_s", "reason"}
def _any(p: dict) -> bool:
    return True


# (title, gene, which configurations the study looks at)
STUDIES = [
    ("producer warps of 8 warps (0 = no warp specialization)", "NUM_PRODUCER_WARPS", lambda p: p["NUM_WARPS"] == 8),
    ("pipeline STAGES, shared-metadata paths (SHARED_META or producer warps)", "STAGES",
     lambda p: p["SHARED_META"] or p["NUM_PRODUCER_WARPS"] > 0),
    ("queries per block", "QUERIES_PER_BLOCK", _any),
    ("shared metadata, no producer warps", "SHARED_META", lambda p: p["NUM_PRODUCER_WARPS"] == 0),
    ("persistent grid", "PERSISTENT", _any),
    ("producers stage the value corners (STAGE_VALUES), producer warps", "STAGE_VALUES",
     lambda p: p["NUM_PRODUCER_WARPS"] > 0),
    ("smallest level cached in shared memory, persistent", "CACHE_SMALL_LEVEL", lambda p: p["PERSISTENT"]),
    ("prefetch of the next locations/weights", "PREFETCH", _any),
    ("channels per thread (D_STRIDE)", "D_STRIDE", _any),
    ("warps per block", "NUM_WARPS", _any),
    ("__launch_bounds__ min blocks per SM", "MIN_BLOCKS_PER_SM", _any),
]


def _value(text: str):
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        genes = [c for c in reader.fieldnames or [] if c not in METRIC_COLUMNS]
        rows = []
        for r in reader:
            t = float(r["time_us"]) if r["status"] == "ok" and r["time_us"] else math.inf
            rows.append({"params": {g: _value(r[g]) for g in genes}, "status": r["status"], "time_us": t})
    return genes, rows


def _fmt(t: float) -> str:
    return f"{t:8.1f}" if math.isfinite(t) else "       -"


def _short(params: dict, skip: str) -> str:
    abbrev = {"NUM_WARPS": "W", "NUM_PRODUCER_WARPS": "PW", "STAGES": "S", "QUERIES_PER_BLOCK": "Q", "D_STRIDE": "DS",
              "SHARED_META": "SM", "PERSISTENT": "PER", "PREFETCH": "PF", "MIN_BLOCKS_PER_SM": "MB",
              "STAGE_VALUES": "SV", "CACHE_SMALL_LEVEL": "CL"}
    parts = []
    for k, v in params.items():
        if k == skip:
            continue
        parts.append(f"{abbrev.get(k, k)}={int(v) if isinstance(v, bool) else v}")
    return " ".join(parts)


def sweeps(genes: list[str], rows: list[dict]) -> str:
    ok = [r for r in rows if math.isfinite(r["time_us"])]
    best = min(ok, key=lambda r: r["time_us"])
    by_params = {tuple(r["params"][g] for g in genes): r for r in rows}
    out = [f"{len(rows)} configurations, {len(ok)} ok; optimum {best['time_us']:.1f} us: "
           f"{_short(best['params'], '')}", ""]
    for title, gene, where in STUDIES:
        if gene not in genes:
            continue
        sel = [r for r in ok if where(r["params"])]
        values = sorted({r["params"][gene] for r in rows})
        out.append(f"## {title}")
        out.append(f"{'value':>6} {'n':>5} {'best us':>8} {'median':>8} {'from opt':>8}  best configuration (other genes)")
        for v in values:
            ts = [r for r in sel if r["params"][gene] == v]
            b = min(ts, key=lambda r: r["time_us"]) if ts else None
            med = statistics.median(r["time_us"] for r in ts) if ts else math.inf
            neighbour = dict(best["params"], **{gene: v})
            nb = by_params.get(tuple(neighbour[g] for g in genes))
            nt = nb["time_us"] if nb else math.inf
            label = int(v) if isinstance(v, bool) else v
            out.append(f"{label!s:>6} {len(ts):>5} {_fmt(b['time_us'] if b else math.inf)} {_fmt(med)} {_fmt(nt)}  "
                       + (_short(b["params"], gene) if b else "(none valid)"))
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("landscape", type=Path, help="full-grid landscape CSV (replay format)")
    ap.add_argument("--ga", type=Path, help="a GA run's evaluations in order (replay format) for the convergence PNG")
    ap.add_argument("--png", type=Path, help="where the convergence PNG goes (with --ga)")
    ap.add_argument("--md", type=Path, help="also write the tables to this file")
    a = ap.parse_args(argv)
    genes, rows = read_rows(a.landscape)
    text = sweeps(genes, rows)
    print(text)
    if a.md:
        a.md.write_text(f"Sweeps read off {a.landscape.name} (p50 us, L2 flushed before every timed call)\n\n```\n"
                        f"{text}\n```\n", encoding="utf-8")
    if a.ga:
        optimum = min(r["time_us"] for r in rows)
        _, ga_rows = read_rows(a.ga)
        curve = best_so_far(r["time_us"] for r in ga_rows)
        png = a.png or a.ga.with_suffix(".png")
        plot_convergence({f"GA ({len(ga_rows)} evaluations)": curve}, png, optimum=optimum,
                         title=f"GA on {a.landscape.stem.removeprefix('landscape_')}: best p50 vs evaluations")
        reached = []
        for pct in (10, 5, 2):
            first = next((i + 1 for i, t in enumerate(curve) if t <= optimum * (1 + pct / 100)), None)
            reached.append(f"within {pct}%: " + (f"after {first} evaluations" if first else f"not in {len(curve)}"))
        print(f"GA: best {curve[-1]:.1f} us after {len(curve)} evaluations ({curve[-1] / optimum:.3f}x the grid "
              f"optimum {optimum:.1f}); {'; '.join(reached)}; PNG {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
