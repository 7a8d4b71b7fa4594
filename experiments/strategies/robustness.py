"""Robustness of the strategies on synthetic landscapes that no tuning saw (issue 14).

Landscape families over the parameter structure (valid configurations) of shipped spaces, each drawn from a seed:

* smooth     a separable bowl: per gene a random centre and weight (ordinal genes), a random cost per value
             (categorical genes);
* rugged     smooth times (1 + 0.3 u), u uniform per configuration;
* deceptive  the bowl, plus an isolated optimum far from its centre (20% below the bowl's best) whose neighbours at
             Hamming distance 1 are the worst configurations of the space;
* needle     every configuration uniform in [100, 120], one at 70;
* failures   smooth with 30% of the configurations failing (status runtime_error), the optimum among the rest;
* plateaus   smooth rounded to 8 levels: ties everywhere, several configurations share the optimum.

Every run replays a landscape through the product's runner and strategies (benchmark.run_job) until the optimum is
found or the whole space is spent, so a prefix of a run is the run with that budget. Reported per family, space,
strategy and budget (share of the valid space): how many seeds found the optimum, and the median gap of the best found
(best / optimum - 1).

    python experiments/strategies/robustness.py [--spaces sdpa_fp16_d64] [--families all] [--seeds 20]
        [--seed-base 0] [--strategies ga,random,optuna-tpe] [--jobs 2] [--work DIR] [--out DIR] [--tag TAG]
        [--cap 1.0] [--reuse] [--ga immigrants=0.1,...] [--surrogate stall=3,...]

Tune with one --seed-base (e.g. 1000) and report with another (0). Runs of the strategies other than the GA do not
depend on the GA: with --reuse, their results from an earlier invocation (kept under WORK/cache/, keyed by space,
family, seed, strategy and population; a run with a larger --cap serves a smaller one) are read back instead of
replayed. The target check compares, per family, space and budget, the GA's seeds that found the optimum with the
better of random and TPE: met when the GA is at most 2 seeds behind.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import run_job  # noqa: E402
from evoengineer.paths import space_file as shipped_space  # noqa: E402
from evoengineer.space.spec import load_space  # noqa: E402

FAMILIES = ("smooth", "rugged", "deceptive", "needle", "failures", "plateaus")
BUDGETS = (0.10, 0.25, 0.50, 1.00)


def _bowl(space, rng: random.Random):
    """Cost function of the smooth family, and the bowl's centre (genome)."""
    terms, centre = [], []
    for p in space.parameters:
        n = len(p.values)
        if p.ordinal and n > 1:
            c, w = rng.randrange(n), rng.uniform(0.2, 1.0)
            terms.append(lambda g, i=len(terms), c=c, w=w, n=n: w * ((g[i] - c) / (n - 1)) ** 2)
            centre.append(c)
        else:
            costs = [rng.uniform(0.0, 0.5) for _ in range(n)]
            terms.append(lambda g, i=len(terms), costs=costs: costs[g[i]])
            centre.append(min(range(n), key=costs.__getitem__))
    return (lambda g: 100.0 * (1.0 + sum(t(g) for t in terms))), tuple(centre)


def make_landscape(space, family: str, seed: int) -> list[tuple[tuple[int, ...], str, float | None]]:
    """(genome, status, time_us) for every valid configuration of `space`."""
    rng = random.Random(f"{family}/{space.name}/{seed}")
    valid = space.valid_genomes()
    f, centre = _bowl(space, rng)
    t = {g: f(g) for g in valid}
    status = {g: "ok" for g in valid}
    if family == "rugged":
        t = {g: v * (1 + 0.3 * rng.random()) for g, v in t.items()}
    elif family == "deceptive":
        def dist(g):
            return sum(a != b for a, b in zip(g, centre))
        far = max(dist(g) for g in valid)
        opt = rng.choice([g for g in valid if dist(g) == far])
        worst = max(t.values())
        for g in valid:
            if sum(a != b for a, b in zip(g, opt)) == 1:
                t[g] = worst * 1.5
        t[opt] = min(t.values()) * 0.8
    elif family == "needle":
        t = {g: rng.uniform(100.0, 120.0) for g in valid}
        t[rng.choice(valid)] = 70.0
    elif family == "failures":
        for g in valid:
            if rng.random() < 0.3:
                status[g] = "runtime_error"
        if all(s != "ok" for s in status.values()):
            status[valid[0]] = "ok"
    elif family == "plateaus":
        lo, hi = min(t.values()), max(t.values())
        t = {g: lo + round(7 * (v - lo) / (hi - lo or 1)) * (hi - lo) / 7 for g, v in t.items()}
    elif family != "smooth":
        raise SystemExit(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    return [(g, status[g], t[g] if status[g] == "ok" else None) for g in valid]


def write_landscape(space, rows, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*space.names, "status", "time_us"])
        for g, status, t in rows:
            params = space.genome_to_params(g)
            cells = [("true" if v else "false") if isinstance(v, bool) else v for v in params.values()]
            w.writerow([*cells, status, "" if t is None else round(t, 6)])


def target_checks(rows: list[dict], budgets) -> list[str]:
    """'family / space: ga a / b / c vs best of random, TPE x / y / z: met' (or MISSED at the budgets it misses)."""
    by = {(r["family"], r["space"], r["strategy"]): r for r in rows}
    out = []
    for fam, sp in sorted({(r["family"], r["space"]) for r in rows}):
        ga = by.get((fam, sp, "ga"))
        others = [by[k] for k in ((fam, sp, "random"), (fam, sp, "optuna-tpe")) if k in by]
        if ga is None or not others:
            continue
        keys = [f"found@{round(b * 100)}%" for b in budgets]
        ref = [max(o[k] for o in others) for k in keys]
        miss = [f"{round(b * 100)}%" for b, k, x in zip(budgets, keys, ref) if ga[k] < x - 2]
        out.append(f"{fam} / {sp}: ga {' / '.join(str(ga[k]) for k in keys)} vs {' / '.join(map(str, ref))}: "
                   + (f"MISSED at {', '.join(miss)}" if miss else "met"))
    return out


def summarize(results: list[dict], cap: float = 1.0) -> list[dict]:
    rows = []
    keys = sorted({(r["family"], r["space"], r["strategy"]) for r in results})
    for fam, sp, strat in keys:
        runs = [r for r in results if (r["family"], r["space"], r["strategy"]) == (fam, sp, strat)]
        row = {"family": fam, "space": sp, "strategy": strat, "seeds": len(runs)}
        for b in (b for b in BUDGETS if b <= cap + 1e-9):
            found, gaps = 0, []
            for r in runs:
                k = math.ceil(b * r["n_valid"])
                ok = [t for t in r["times"][:k] if math.isfinite(t)]
                best = min(ok) if ok else math.inf
                found += best <= r["optimum_us"] * (1 + 1e-9)
                gaps.append(best / r["optimum_us"] - 1)
            row[f"found@{round(b * 100)}%"] = found
            row[f"gap@{round(b * 100)}%"] = statistics.median(gaps)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default="sdpa_fp16_d64")
    ap.add_argument("--families", default="all")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--strategies", default="ga,random,optuna-tpe")
    ap.add_argument("--population", type=int, default=12)
    ap.add_argument("--ga", default="", help="GA settings under test, e.g. immigrants=0.1,prescreen=8")
    ap.add_argument("--surrogate", default="", help="surrogate settings under test, e.g. stall=3,explore=8")
    ap.add_argument("--pipeline", help="SLOTSxBUILD_S:MEASURE_S: results arrive as from such a host, in simulated "
                    "time (benchmark.py --pipeline); default: one at a time")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--work", default="/tmp/evo-robustness")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--cap", type=float, default=1.0, help="most evaluations per run, as a share of the space "
                    "(budgets above it are not reported)")
    ap.add_argument("--reuse", action="store_true", help="read back cached runs of the strategies other than ga")
    a = ap.parse_args()
    from benchmark import parse_ga, parse_surrogate

    families = FAMILIES if a.families == "all" else tuple(a.families.split(","))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for sp_name in a.spaces.split(","):
        space_file = shipped_space(f"{sp_name}.toml")
        space = load_space(space_file)
        for fam in families:
            for seed in range(a.seed_base, a.seed_base + a.seeds):
                land = work / f"{sp_name}__{fam}__{seed}.csv"
                write_landscape(space, make_landscape(space, fam, seed), land)
                for strat in a.strategies.split(","):
                    jobs.append({"landscape": f"{sp_name}__{fam}__{seed}", "paths": (str(space_file), str(land)),
                                 "strategy": strat, "seeds": [seed], "work": str(work), "tag": a.tag,
                                 "ga": parse_ga(a.ga), "surrogate": parse_surrogate(a.surrogate),
                                 "cap": a.cap, "population": a.population, "pipeline": a.pipeline,
                                 "stop_within": 0.0, "min_evals": 0, "keep_times": True,
                                 "meta": {"family": fam, "space": sp_name}})
    t0 = time.monotonic()
    cache = work / "cache"
    cache.mkdir(exist_ok=True)

    def cached(job) -> Path | None:
        if job["strategy"] == "ga":
            return None
        pipe = f"__{job['pipeline']}" if job.get("pipeline") else ""
        return cache / f"{job['landscape']}__{job['strategy']}__p{job['population']}{pipe}.json"

    outs: list = [None] * len(jobs)
    todo = []
    for i, job in enumerate(jobs):
        c = cached(job)
        kept = json.loads(c.read_text()) if a.reuse and c is not None and c.exists() else None
        if kept is not None and kept["cap"] >= job["cap"]:  # a longer run's prefix is the shorter run
            outs[i] = [{**r, "times": r["times"][:max(1, math.ceil(job["cap"] * r["n_valid"]))]}
                       for r in kept["runs"]]
        else:
            todo.append(i)
    with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
        for i, out in zip(todo, pool.map(run_job, [jobs[i] for i in todo])):
            outs[i] = out
            c = cached(jobs[i])
            if c is not None:
                c.write_text(json.dumps({"cap": jobs[i]["cap"], "runs": [
                    {k: r[k] for k in ("seed", "n_valid", "optimum_us", "times")} for r in out]}))
    results = []
    for job, out in zip(jobs, outs):
        for r in out:
            results.append({**job["meta"], "strategy": job["strategy"], "seed": r["seed"], "n_valid": r["n_valid"],
                            "optimum_us": r["optimum_us"],
                            "times": [t if t is not None and math.isfinite(t) else math.inf for t in r["times"]]})
    rows = summarize(results, a.cap)
    budgets = [b for b in BUDGETS if b <= a.cap + 1e-9]
    head = ["family", "space", "strategy", "seeds"] + [f"found@{round(b * 100)}%" for b in budgets] + \
        [f"gap@{round(b * 100)}%" for b in budgets]
    lines = [f"Command: `python experiments/strategies/robustness.py {' '.join(sys.argv[1:])}`  ({len(jobs)} runs, "
             f"{len(todo)} replayed, {time.monotonic() - t0:.0f} s)", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[h]) if not h.startswith("gap") else f"{r[h]:.3f}" for h in head]
        lines.append("| " + " | ".join(cells) + " |")
    checks = target_checks(rows, budgets)
    if checks:
        lines += ["", "Target (GA found >= the better of random and optuna-tpe - 2 seeds), per family and space, "
                      "at " + " / ".join(f"{round(b * 100)}%" for b in budgets) + ":", ""]
        lines += [f"- {c}" for c in checks]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    (out / f"robustness{a.tag}.md").write_text(text)
    runs = [{k: r[k] for k in ("family", "space", "strategy", "seed", "n_valid")} |
            {"evals_to_optimum": next((i + 1 for i, t in enumerate(r["times"]) if t <= r["optimum_us"] * (1 + 1e-9)),
                                      None)} for r in results]
    (out / f"robustness{a.tag}.json").write_text(json.dumps({"command": sys.argv[1:], "rows": rows,
                                                            "targets": checks, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
