"""Tune the GA's defaults (population, crossover and mutation rates, per-gene rate, tournament size) on the tuning
landscapes (CPU MSDA and CUDA MSDA by default; SDPA stays held out), by coordinate descent over a small grid of
values per setting, 30 seeds per trial setting. Objective: the mean over the tuning landscapes of the median number
of evaluations to get within 2% of the optimum, as a fraction of the valid space (p90 breaks ties).

    python experiments/strategies/tune_ga.py [--seeds 30] [--rounds 2] [--landscapes cpu_msda,cuda_msda_fp16]

Runs stop once within 2% (or at 60% of the space). Writes experiments/strategies/results/ga_tuning.md (every setting tried, best first) and ga_tuning.json.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import LANDSCAPES, RESULTS, _json_safe, nearest_rank, run_job  # noqa: E402
from evoengineer.search.ga import GAParams  # noqa: E402

GRID = {
    # not below 12: a generation's children are built in parallel (population - K of them), and a GPU search with a
    # handful of children per generation leaves the build machine idle (population 4 evaluates one at a time)
    "population": [12, 16, 24],
    "tournsize": [2, 3, 4, 6],
    "mutpb": [0.5, 0.8, 1.0],
    "indpb": [0.1, 0.2, 0.3, 0.5],
    "cxpb": [0.0, 0.3, 0.6, 0.9],
    "plus_survival": [0, 1],  # 1: the next population is the best of parents + children (mu+lambda)
    "prescreen": [1, 2, 4, 8],  # children bred per slot, the best kept by the gene-value model
    "prescreen_bypass": [0.0, 0.125, 0.25],  # share of the kept children drawn at random, not by the model
    "immigrants": [0.0, 0.1, 0.25],  # share of each generation that is random unseen configurations
}


# the GA's defaults before tuning: where coordinate descent starts
START = {"population": 16, "tournsize": 3, "mutpb": 0.8, "indpb": 0.3, "cxpb": 0.6, "plus_survival": 0,
         "prescreen": 1, "prescreen_bypass": 0.0, "immigrants": 0.0}


def factorial(spec: str) -> list[dict]:
    """'tournsize=2,3;indpb=0.1,0.15' around the current defaults -> every combination."""
    import itertools

    d = GAParams()
    base = {"population": 12, **{k: type(GRID[k][0])(getattr(d, k)) for k in GRID if k != "population"}}
    axes = []
    for part in spec.split(";"):
        name, _, values = part.partition("=")
        if name not in GRID:
            raise SystemExit(f"--factorial: unknown setting {name!r} (known: {', '.join(GRID)})")
        axes.append([(name, float(v) if "." in v else int(v)) for v in values.split(",")])
    return [{**base, **dict(combo)} for combo in itertools.product(*axes)]


def key(setting: dict) -> str:
    return ",".join(f"{k}={setting[k]}" for k in GRID)


def score(setting: dict, lands: list[str], seeds: list[int], work: str, pool) -> dict:
    jobs = [{"landscape": land, "strategy": "ga", "seeds": seeds, "work": work,
             "tag": "_tune_" + key(setting).replace(",", "_").replace("=", ""), "cap": 0.6,
             "stop_within": 0.02, "min_evals": 0,  # only evaluations-to-2% matter here
             "population": setting["population"],
             "ga": {k: v for k, v in setting.items() if k != "population"}} for land in lands]
    per = {}
    for runs in pool.imap_unordered(run_job, jobs):
        land = runs[0]["landscape"]
        n = runs[0]["n_valid"]
        row = {}
        for x in (2, 5):
            vals = [r[f"evals_to_{x}pct"] if r[f"evals_to_{x}pct"] is not None else math.inf for r in runs]
            row[f"to{x}"] = (nearest_rank(vals, 0.5) / n, nearest_rank(vals, 0.9) / n)
        per[land] = row
        for db in {r["db"] for r in runs}:  # tuning databases are not kept
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
    obj = sum(per[land]["to2"][0] for land in lands) / len(lands)
    tie = sum(per[land]["to2"][1] for land in lands) / len(lands)
    return {"setting": dict(setting), "objective": obj, "p90": tie, "per": per}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", default="cpu_msda,cuda_msda_fp16")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--seed-base", type=int, default=1000,
                    help="first seed; tuning seeds differ from the benchmark's 0..29, so its numbers are not tuned on")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", default="/tmp/evo-ga-tuning")
    ap.add_argument("--factorial", help="instead of coordinate descent: every combination, e.g. "
                                        "'tournsize=2,3,4;indpb=0.1,0.15' (other settings: the current defaults)")
    ap.add_argument("--tag", default="", help="suffix of the output names")
    a = ap.parse_args(argv)
    lands = a.landscapes.split(",")
    for land in lands:
        if land not in LANDSCAPES:
            raise SystemExit(f"--landscapes: unknown {land!r}")
    Path(a.work).mkdir(parents=True, exist_ok=True)
    best = dict(START)
    tried: dict[str, dict] = {}
    t0 = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(max(1, a.jobs)) as pool:
        def evaluate(setting: dict) -> dict:
            k = key(setting)
            if k not in tried:
                tried[k] = score(setting, lands, list(range(a.seed_base, a.seed_base + a.seeds)), a.work, pool)
                r = tried[k]
                print(f"{k}: objective {r['objective']:.4f} (p90 {r['p90']:.4f}) "
                      + " ".join(f"{land} {r['per'][land]['to2'][0] * 100:.1f}%" for land in lands), flush=True)
            return tried[k]

        if a.factorial:
            for setting in factorial(a.factorial):
                evaluate(setting)
        current = evaluate(best) if not a.factorial else None
        for _ in range(a.rounds if not a.factorial else 0):
            changed = False
            for name, values in GRID.items():
                for v in values:
                    trial = {**best, name: v}
                    r = evaluate(trial)
                    if (r["objective"], r["p90"]) < (current["objective"], current["p90"]):
                        best, current, changed = trial, r, True
            if not changed:
                break
    ranked = sorted(tried.values(), key=lambda r: (r["objective"], r["p90"]))
    how = f"full factorial {a.factorial}" if a.factorial else "coordinate descent from the pre-tuning defaults"
    lines = [f"# GA tuning ({how})", "",
             f"Command: `python experiments/strategies/tune_ga.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             f"Tuning landscapes: {', '.join(lands)}; {a.seeds} seeds per setting ({a.seed_base}..{a.seed_base + a.seeds - 1}); elite K=3 throughout; "
             f"{len(tried)} settings in {time.monotonic() - t0:.0f} s.", "",
             "Objective: mean over the landscapes of median evaluations-to-2% / valid space (lower is better).", "",
             "| rank | setting | objective | p90 | " + " | ".join(f"{land} to 2% median / p90, to 5% median (% of space)"
                                                         for land in lands) + " |",
             "|---|---|---|---|" + "---|" * len(lands)]
    for i, r in enumerate(ranked, 1):
        cells = [" / ".join(f"{100 * r['per'][land][f'to{x}'][i]:.1f}" if math.isfinite(r['per'][land][f'to{x}'][i])
                            else "-" for x, i in ((2, 0), (2, 1), (5, 0))) for land in lands]
        lines.append(f"| {i} | {key(r['setting'])} | {r['objective']:.4f} | {r['p90']:.4f} | " + " | ".join(cells)
                     + " |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"_{a.tag}" if a.tag else ""
    (RESULTS / f"ga_tuning{tag}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"ga_tuning{tag}.json").write_text(json.dumps(
        _json_safe({"landscapes": lands, "seeds": a.seeds, "ranked": ranked}), indent=1))
    print("\n".join(lines))
    print(f"\nbest: {key(ranked[0]['setting'])}  (pre-tuning defaults: {key(START)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
