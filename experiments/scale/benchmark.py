"""Scale-out benchmark on CPU: the replay evaluator with a per-measurement delay on a local Dask cluster of 1, 2, 4
and 8 simulated GPU workers (the resource GPU=1, no device), for the random, grid and GA strategies.

Per strategy and worker count: the search's wall time (the cluster started and every worker's landscape loaded by
one warm-up measurement each; the time of `strategy.run`, so
checkpoints, elite.json and the store's commits count), the evaluations, the parallel efficiency
T(1) / (W x T(W)), the busy share of the workers (simulated measuring time / (wall x W)), and whether the evaluated
set and the elites are those of the same search without a cluster (and so the same for every W).

    python experiments/scale/benchmark.py                         # delay 0.25 s, workers 1 2 4 8, random grid ga
    python experiments/scale/benchmark.py --delay 0.1 --workers 1 8 --strategies ga --ga-population 35 --tag ga35

Writes experiments/scale/results/benchmark[_TAG].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.evaluators.cluster import ClusterEvaluator  # noqa: E402
from evoengineer.evaluators.replay import ReplayEvaluator  # noqa: E402
from evoengineer.search import STRATEGIES, Runner, SearchSettings  # noqa: E402
from evoengineer.space.spec import load_space  # noqa: E402
from evoengineer.store import Store  # noqa: E402

RESULTS = ROOT / "experiments" / "scale" / "results"
SPACE = ROOT / "experiments" / "data" / "msda" / "cuda_msda_fp16_v1.toml"  # the space the landscape was recorded in
LANDSCAPE = ROOT / "experiments" / "data" / "msda" / "landscape_cuda_msda_fp16.csv"
# GA: 3 elites + 16 children per generation (the cluster default population at 8 workers: cluster_population);
# random and grid: batches of 16. Both fill whole rounds of 1, 2, 4 and 8 workers.
SETTINGS = {
    "ga": dict(population=19, generations=10, elite=3, budget=None, seed=0),
    "random": dict(population=16, generations=10, elite=3, budget=176, seed=0),
    "grid": dict(population=16, generations=10, elite=3, budget=176, seed=0),
}


def one_search(strategy: str, evaluator: Any, work: Path) -> dict[str, Any]:
    """One search through the product's runner, store and strategy; returns its timing and what it found."""
    space = load_space(SPACE)
    settings = SearchSettings(strategy=strategy, **SETTINGS[strategy])
    db = work / f"{strategy}_{time.monotonic_ns()}.db"
    store = Store(f"sqlite:///{db}")
    rid = store.create_run(space_name=space.name, space_path=str(SPACE), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": evaluator.describe()}, seed=settings.seed,
                           fingerprint={})
    runner = Runner(space=space, evaluator=evaluator, store=store, run=store.get_run(rid), settings=settings,
                    out=db.with_suffix(".json"))
    t0 = time.perf_counter()
    reason = STRATEGIES[strategy](runner).run(None)
    wall = time.perf_counter() - t0
    recs = store.candidates(rid)
    busy, devices = evaluator.utilization() if evaluator.utilization() else (0.0, 1)
    out = {"strategy": strategy, "stop": reason, "evaluations": len(recs), "wall_s": round(wall, 3),
           "busy_share": round(busy / (wall * devices), 4) if wall else None,
           "evaluated": sorted(f"{r.generation}:{r.hash}" for r in recs),
           "elites": [e.hash for e in store.elites(rid)]}
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay", type=float, default=0.25, help="seconds per simulated measurement (default 0.25)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--strategies", nargs="+", default=["random", "grid", "ga"], choices=sorted(SETTINGS))
    ap.add_argument("--ga-population", type=int, help="the GA's population instead of 19 (3 elites + children)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    if a.ga_population:
        SETTINGS["ga"] = {**SETTINGS["ga"], "population": a.ga_population}
    RESULTS.mkdir(parents=True, exist_ok=True)
    space = load_space(SPACE)
    with ReplayEvaluator(LANDSCAPE, space) as ev:
        inner = ev.describe()
    work = Path(tempfile.mkdtemp(prefix="evo-scale-"))
    rows: list[dict[str, Any]] = []
    reference = {}
    for strategy in a.strategies:  # without a cluster and without the delay: what every W must find
        reference[strategy] = one_search(strategy, ReplayEvaluator(LANDSCAPE, space), work)
    for w in a.workers:
        t0 = time.perf_counter()
        ev = ClusterEvaluator(space, inner, address="local", workers=w, extras={"delay_s": a.delay})
        # each worker loads the landscape once, at its first task: done here, so no strategy pays it in its time
        from evoengineer.candidate import CandidateFactory

        factory = CandidateFactory(space)
        list(ev.evaluate_many([factory.from_genome(g) for g in space.valid_genomes()[:w]]))
        startup = time.perf_counter() - t0
        try:
            for strategy in a.strategies:
                ev.busy_s = 0.0
                r = one_search(strategy, ev, work)
                ref = reference[strategy]
                r.update(workers=w, startup_s=round(startup, 2),
                         ideal_s=round(r["evaluations"] * a.delay / w, 3),
                         same_as_without_cluster=r["evaluated"] == ref["evaluated"] and r["elites"] == ref["elites"])
                rows.append(r)
                print(f"{strategy:>6} W={w}: {r['evaluations']} evaluations in {r['wall_s']:.2f} s "
                      f"(ideal {r['ideal_s']:.2f} s), busy {r['busy_share']:.1%}, "
                      f"same as without a cluster: {r['same_as_without_cluster']}", flush=True)
        finally:
            ev.close()
    for r in rows:
        base = next(x for x in rows if x["strategy"] == r["strategy"] and x["workers"] == min(a.workers))
        r["speedup"] = round(base["wall_s"] / r["wall_s"], 3)
        r["efficiency"] = round(base["wall_s"] * base["workers"] / (r["workers"] * r["wall_s"]), 3)
    lines = [f"Replay of {LANDSCAPE.relative_to(ROOT)} ({space.name}), {a.delay:g} s per measurement, local Dask "
             f"cluster of simulated GPU workers; {platform.node()}, {os.cpu_count()} cores, Python "
             f"{platform.python_version()}.", "",
             "| strategy | workers | evaluations | wall s | ideal s | speedup | efficiency | busy share | same set and "
             "elites as without a cluster |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['workers']} | {r['evaluations']} | {r['wall_s']:.2f} | "
                     f"{r['ideal_s']:.2f} | {r['speedup']:.2f} | {r['efficiency']:.3f} | {r['busy_share']:.1%} | "
                     f"{'yes' if r['same_as_without_cluster'] else 'NO'} |")
    table = "\n".join(lines)
    print("\n" + table)
    suffix = f"_{a.tag}" if a.tag else ""
    for r in rows:
        r.pop("evaluated")
    (RESULTS / f"benchmark{suffix}.json").write_text(json.dumps(
        {"delay_s": a.delay, "settings": SETTINGS, "space": space.name, "landscape": str(LANDSCAPE.relative_to(ROOT)),
         "cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    (RESULTS / f"benchmark{suffix}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
