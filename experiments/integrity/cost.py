"""What the integrity checks cost: the default search run with this tree's evaluator and with a baseline tree's
(e.g. the commit before the checks), on the same machine, one after the other, same seed and budget.

    python experiments/integrity/cost.py --baseline DIR [--budget N] [--space NAME] [--json OUT.json]

Each tree runs `python -m evoengineer search` in a fresh folder with a cold candidate cache: what a user's search
costs end to end (builds, checks, timing and, in this tree, the compute-sanitizer run of the final elites). The two
searches take different paths (timing noise steers the GA), so the checks' own cost is measured apart: the first
search's candidates, in its order, through each tree's evaluator with every build cached (seconds per evaluation;
this tree runs twice, its spread is the noise). The family binding is built once, outside every timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def search(tree: Path, work: Path, cache: Path, space: str, budget: int, tag: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
               EVOENGINEER_CACHE=str(cache), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "evoengineer", "search", "--space", space, "--budget", str(budget), "--seed", "0",
           "--db", f"sqlite:///{work / 'store.db'}", "--out", str(work / "elite.json"), "--force", "--quiet"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (work / "search.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"{tag}: search exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    con = sqlite3.connect(work / "store.db")
    rows = [(s, json.loads(m)) for s, m in con.execute("select status, metrics from candidates order by seq")]
    measure = [m["measure_s"] for _, m in rows if "measure_s" in m]
    # the final elites are certified side by side: the wall time is the slowest one (a replacement adds a round)
    sanitizer = [m["sanitizer"].get("seconds", 0.0) for _, m in rows if isinstance(m.get("sanitizer"), dict)]
    ok = [m["time_us"] for s, m in rows if s == "ok"]
    statuses: dict[str, int] = {}
    for s, _ in rows:
        statuses[s] = statuses.get(s, 0) + 1
    elite = json.loads((work / "elite.json").read_text())
    # the worker's seconds per phase (median over the candidates measured ok; a worker's first candidate aside)
    phases: dict[str, list[float]] = {}
    for s, m in rows:
        w = m.get("worker_s") or {}
        if s == "ok" and "start" not in w:
            for k, v in w.items():
                phases.setdefault(k, []).append(v)
    worker_s = {k: round(statistics.median(v), 4) for k, v in phases.items()}
    # the honesty phase by check (summed over the timed shapes)
    parts: dict[str, list[float]] = {}
    for s, m in rows:
        if s == "ok" and "start" not in (m.get("worker_s") or {}):
            for part in ("novel_s", "graph_s", "novel_rounds", "novel_late", "novel_retimed"):
                parts.setdefault(part, []).append(sum(sh.get(part, 0.0) for sh in (m.get("shapes") or {}).values()))
    honesty_s = {k: round(statistics.median(v), 4) for k, v in parts.items()}
    return {"tag": tag, "wall_s": round(wall, 2), "candidates": len(rows),
            "s_per_candidate": round(wall / len(rows), 4),
            "statuses": statuses, "best_us": min(ok) if ok else None,
            "measure_s_median": round(statistics.median(measure), 4) if measure else None,
            "sanitizer_wall_s": round(max(sanitizer, default=0.0), 2),
            "sanitized": len(sanitizer), "certified": [e.get("certified") for e in elite["elites"]],
            "worker_s_median": worker_s, "worker_s_total_median": round(sum(worker_s.values()), 4),
            "honesty_s_median": honesty_s,
            "remeasured_after_sentinel_drift": sum(1 for _, m in rows if "remeasured" in m or "sentinel_drifts" in m)}


def measure_list(tree: Path, cache: Path, space: str, params_file: Path, tag: str) -> dict:
    """The same candidates, in the same order, through `tree`'s LocalEvaluator with every build cached: the time of
    each evaluation is the worker's checks and timing alone (the first one also starts the worker)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, __file__, "--measure-list", str(params_file), "--space", space,
                        "--cache", str(cache)], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{tag}: list measurement exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    times = json.loads(p.stdout.strip().splitlines()[-1])
    rest = times[1:]
    return {"tag": tag, "candidates": len(times), "first_s": round(times[0], 3),
            "median_s": round(statistics.median(rest), 4), "total_after_first_s": round(sum(rest), 2)}


def _measure_list_here(params_file: str, space_name: str, cache: str) -> None:
    """Inside a tree's Python: evaluate the listed params one by one, print the seconds each took (JSON)."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.space import load_space
    from evoengineer import space_file

    space = load_space(space_file(f"{space_name}.toml"))
    factory = CandidateFactory(space)
    times = []
    with LocalEvaluator(space, cache_dir=cache) as ev:
        for params in json.loads(Path(params_file).read_text()):
            c = factory.make(params)
            t0 = time.perf_counter()
            ev.evaluate(c)
            times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="a checkout of the tree to compare with")
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--space", default="cuda_msda_fp16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="one cold search with this tree only (its worker phases), then "
                    "with --baseline its candidates "
                    "through both trees' evaluators (cached builds)")
    ap.add_argument("--measure-list", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure_list:
        return _measure_list_here(args.measure_list, args.space, args.cache)
    if args.quick:  # without --baseline: the search's worker phases only
        return quick(args)
    if not args.baseline:
        ap.error("--baseline is required (or --quick)")
    work = Path(args.work or tempfile.mkdtemp(prefix="evo-cost-"))
    trees = {"checks": HERE, "baseline": Path(args.baseline).resolve()}
    caches = {k: work / f"cache_{k}" for k in trees}
    # the family binding, untimed: built once (a one-candidate search), then copied into the baseline's cache
    search(trees["checks"], work / "binding", caches["checks"], args.space, 1, "binding")
    shutil.rmtree(caches["checks"] / "candidates", ignore_errors=True)
    shutil.copytree(caches["checks"] / "bindings", caches["baseline"] / "bindings")
    out: dict = {"space": args.space, "budget": args.budget, "searches": [], "lists": []}

    def save() -> None:
        if args.json:  # after every step, so a cut-off call still leaves what finished
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")

    print(f"{'search':24s} {'wall s':>8s} {'cands':>6s} {'s/cand':>8s} {'sanit s':>8s} best us", flush=True)
    for tree in ("checks", "baseline"):
        r = search(trees[tree], work / f"{tree}_cold", caches[tree], args.space, args.budget, f"{tree}, cold cache")
        out["searches"].append(r)
        print(f"{r['tag']:24s} {r['wall_s']:8.1f} {r['candidates']:6d} {r['s_per_candidate']:8.3f} "
              f"{r['sanitizer_wall_s']:8.1f} {r['best_us']}", flush=True)
        print(f"  worker s per ok candidate (median by phase): {r['worker_s_median']}", flush=True)
        print(f"  honesty phase by check (median, summed over shapes): {r.get('honesty_s_median')}", flush=True)
        save()
    con = sqlite3.connect(work / "checks_cold" / "store.db")
    params = [json.loads(p) for (p,) in con.execute("select params from candidates order by seq")]
    params_file = work / "params.json"
    params_file.write_text(json.dumps(params))
    print(f"{'same candidates, cached':24s} {'first s':>8s} {'median s':>9s} {'total s':>8s}", flush=True)
    for tree in ("checks", "baseline", "checks"):  # this tree twice: its spread is the noise floor
        r = measure_list(trees[tree], caches["checks"], args.space, params_file, tree)
        out["lists"].append(r)
        print(f"{r['tag']:24s} {r['first_s']:8.2f} {r['median_s']:9.4f} {r['total_after_first_s']:8.2f}", flush=True)
        save()
    s_new, s_old = out["searches"][0], out["searches"][1]
    lists = {r["tag"]: r for r in out["lists"]}
    out["ratios"] = {
        "search_wall_per_candidate": round(s_new["s_per_candidate"] / s_old["s_per_candidate"], 3),
        "search_wall_without_sanitizer": round((s_new["wall_s"] - s_new["sanitizer_wall_s"]) / s_old["wall_s"], 3),
        "measurement_per_candidate_median": round(lists["checks"]["median_s"] / lists["baseline"]["median_s"], 3),
    }
    save()
    print("ratios, checks / baseline:", out["ratios"])


def quick(args) -> None:
    """The default search once with this tree (its worker's seconds per phase), then its candidates through this
    tree's and the baseline's evaluators with every build cached (seconds per evaluation, this tree twice)."""
    work = Path(args.work or tempfile.mkdtemp(prefix="evo-cost-"))
    cache = work / "cache"
    out: dict = {"space": args.space, "budget": args.budget, "mode": "quick"}
    r = search(HERE, work / "checks_cold", cache, args.space, args.budget, "checks, cold cache")
    out["search"] = r
    print(json.dumps(r), flush=True)
    if not args.baseline:  # the worker's phases only (what the 10% is measured on)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        return
    con = sqlite3.connect(work / "checks_cold" / "store.db")
    params_file = work / "params.json"
    params_file.write_text(json.dumps([json.loads(p) for (p,) in con.execute(
        "select params from candidates order by seq")]))
    out["lists"] = []
    for tag, tree in (("checks", HERE), ("baseline", Path(args.baseline).resolve()), ("checks", HERE)):
        lr = measure_list(tree, cache, args.space, params_file, tag)
        out["lists"].append(lr)
        print(json.dumps(lr), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    base = next(x for x in out["lists"] if x["tag"] == "baseline")["median_s"]
    out["measurement_per_candidate_median_ratio"] = [round(x["median_s"] / base, 3) for x in out["lists"]
                                                      if x["tag"] == "checks"]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print("per evaluation, checks / baseline:", out["measurement_per_candidate_median_ratio"], flush=True)


if __name__ == "__main__":
    main()
