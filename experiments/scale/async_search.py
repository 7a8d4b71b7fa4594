"""Issue 51's benchmark, on one GPU host in one call: the asynchronous search on one GPU and on every GPU of the host
(`--cluster local`), the default search (GA) and random, each run from an empty build cache.

Per run: candidates per minute (the whole command, and the progress line's rate), the GPU busy share (per GPU on a
cluster), the share of the run the GPU waited on builds, builds per candidate, and the seconds from the command's
start to the first stored candidate. Ratios all-GPUs / one-GPU are taken per strategy and seed on the same host.

    python experiments/scale/async_search.py [--space cuda_msda_fp16] [--budget 200] [--seeds 0,1,2]
        [--strategies ga,random] [--gpus 1,4] [--tag h100x4]

`--gpus 1@16,1,4`: a count `G@C` runs on G GPUs pinned to the host's first C CPUs (sched_setaffinity), e.g. one GPU
with the 16 cores of a one-GPU host, measured on a bigger one. Ratios use the unpinned runs.

Writes experiments/scale/results/async_search[_TAG].json and .md (the runs' logs stay in a temporary folder,
named in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "scale" / "results"
DONE = re.compile(r"^\s*done \|.*\| (?P<rate>\d+)/min \| GPU busy (?P<busy>\d+)% of (?P<gpus>\d+)")
WAITED = re.compile(r"GPU waited on builds (?P<wait>\d+)%")
PER_GPU = re.compile(r"\| per GPU: (?P<per>[^|]+)\|")
BUILDS = re.compile(r"builds (?P<b>[\d.]+) s/candidate")
START = re.compile(r"\| start: (?P<marks>[^|]+)")  # the evaluator's start, step by step (seconds)
MARK = re.compile(r"(?P<what>[a-zA-Z :]+?) (?P<s>-?[\d.]+) s")


def visible_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


#: what a candidate ends as before it reaches a GPU (the first candidate "measured" is none of these)
HOST_ONLY = ("compile_error", "gate_failed", "build_error", "link_error", "skipped")


def first_candidate_s(db: Path, started: float, *, measured: bool = True) -> float | None:
    """Seconds from the command's start to the first candidate a GPU measured (`measured`: its status is not one of
    the host's, HOST_ONLY), or to the first stored at all (the store's UTC timestamp)."""
    con = sqlite3.connect(db)
    try:
        where = f"where status not in ({', '.join('?' * len(HOST_ONLY))})" if measured else ""
        row = con.execute(f"select min(finished_at) from candidates {where}", HOST_ONLY if measured else ()).fetchone()
    finally:
        con.close()
    if not row or not row[0]:
        return None
    t = datetime.fromisoformat(str(row[0]).replace(" ", "T"))
    if t.tzinfo is None:  # SQLite keeps the UTC time without its zone
        t = t.replace(tzinfo=timezone.utc)
    return round(t.timestamp() - started, 2)


def run(space: str, strategy: str, seed: int, budget: int, gpus: int, work: Path, cpus: int | None = None) -> dict:
    name = f"{strategy}_s{seed}_g{gpus}" + (f"_c{cpus}" if cpus else "")
    cache = work / f"cache_{name}"  # empty: every build (the family binding too) from scratch
    db = work / f"{name}.db"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "evoengineer", "search", "--space", space, "--strategy", strategy, "--seed",
           str(seed), "--budget", str(budget), "--db", f"sqlite:///{db}", "--out", str(work / f"{name}.json"),
           "--cache-dir", str(cache)]
    if gpus > 1:
        cmd += ["--cluster", "local", "--cluster-workers", str(gpus)]
    started = time.time()
    t0 = time.perf_counter()
    pin = sorted(os.sched_getaffinity(0))[:cpus] if cpus else None
    log = work / f"{name}.log"  # written as the run goes: a run cut short still leaves its log
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        r = subprocess.run(cmd, cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None)
    wall = time.perf_counter() - t0
    text = log.read_text()
    out: dict = {"strategy": strategy, "seed": seed, "gpus": gpus, "rc": r.returncode, "wall_s": round(wall, 1)}
    if cpus:
        out["cpus"] = len(pin)
    if r.returncode != 0:
        out["error"] = (text.strip().splitlines() or ["?"])[-1][:300]
        return out
    con = sqlite3.connect(db)
    n = con.execute("select count(*) from candidates").fetchone()[0]
    metrics = [json.loads(m) for (m,) in con.execute("select metrics from candidates where status = 'ok'")
               if m]
    con.close()
    out.update(evaluations=n, per_min_command=round(60 * n / wall, 1), first_candidate_s=first_candidate_s(db, started),
               first_stored_s=first_candidate_s(db, started, measured=False))
    # where a measured candidate's GPU-worker time goes (median seconds per phase, and in all), and its build
    phases: dict[str, list[float]] = {}
    for m in metrics:
        for k, v in (m.get("worker_s") or {}).items():
            phases.setdefault(k, []).append(float(v))
        for k in ("measure_s", "build_s"):
            if isinstance(m.get(k), (int, float)):
                phases.setdefault(k, []).append(float(m[k]))
    out["median_s"] = {k: round(statistics.median(v), 4) for k, v in sorted(phases.items())}
    # timed calls the host queued after their GPU spin had ended (its launch delay may be in them), in all
    late = [int(sh.get("host_late", 0)) for m in metrics for sh in (m.get("shapes") or {}).values()]
    out["host_late_calls"] = {"calls": sum(late), "shapes_timed": len(late)}
    # the search's time of each re-timed finalist over its re-timing at the end (builds no longer running)
    out["search_over_retimed"] = sorted(round(m["time_us"] / m["retime"]["p50_us"], 3) for m in metrics
                                        if isinstance(m.get("retime"), dict) and m["retime"].get("p50_us"))
    for line in text.splitlines():
        m = DONE.match(line)
        if m:
            out.update(per_min_progress=int(m["rate"]), gpu_busy=int(m["busy"]) / 100)
            for rx, key in ((WAITED, "waited_on_builds"), (BUILDS, "build_s_per_candidate")):
                mm = rx.search(line)
                if mm:
                    out[key] = float(mm.group(1)) / (100 if key == "waited_on_builds" else 1)
            pg = PER_GPU.search(line)
            if pg:
                out["per_gpu"] = pg["per"].strip()
            st = START.search(line)
            if st:
                out["start_s"] = {mk["what"].strip(): float(mk["s"]) for mk in MARK.finditer(st["marks"])}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="cuda_msda_fp16")
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--strategies", default="ga,random")
    ap.add_argument("--gpus", help="GPU counts to compare (default: 1 and all of this host)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    n_gpus = visible_gpus()
    runs = [(int(g), int(c) if c else None) for g, _, c in (x.partition("@") for x in a.gpus.split(","))] \
        if a.gpus else [(g, None) for g in sorted({1, max(1, n_gpus)})]
    counts = [g for g, c in runs if c is None]
    work = Path(tempfile.mkdtemp(prefix="evo-async-"))
    rows = []
    for strategy in a.strategies.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            for g, cpus in runs:
                row = run(a.space, strategy, seed, a.budget, g, work, cpus)
                rows.append(row)
                print(json.dumps(row), flush=True)
    ratios = []
    for strategy in a.strategies.split(","):
        for g in (c for c in counts if c != 1):
            per = []
            for seed in (int(s) for s in a.seeds.split(",")):
                one = next((r for r in rows if r["strategy"] == strategy and r["seed"] == seed and r["gpus"] == 1
                            and "cpus" not in r and "per_min_command" in r), None)
                many = next((r for r in rows if r["strategy"] == strategy and r["seed"] == seed and r["gpus"] == g
                             and "cpus" not in r and "per_min_command" in r), None)
                if one and many:
                    per.append(many["per_min_command"] / one["per_min_command"])
            if per:
                med = statistics.median(per)
                ratios.append({"strategy": strategy, "gpus": g, "speedup_median": round(med, 2),
                               "efficiency": round(med / g, 2), "per_seed": [round(x, 2) for x in per]})
    tag = f"_{a.tag}" if a.tag else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"space": a.space, "budget": a.budget, "gpus_on_host": n_gpus, "runs": rows, "ratios": ratios,
           "logs": str(work)}
    (RESULTS / f"async_search{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# Asynchronous search on one host ({a.space}, budget {a.budget}{', ' + a.tag if a.tag else ''})", "",
             "| strategy | seed | GPUs (CPUs) | cand/min (command) | cand/min (progress) | GPU busy | waited on builds | "
             "first candidate s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gpus = f"{r['gpus']} ({r['cpus']})" if "cpus" in r else str(r["gpus"])
        lines.append(f"| {r['strategy']} | {r['seed']} | {gpus} | {r.get('per_min_command', r.get('error'))} | "
                     f"{r.get('per_min_progress', '')} | {r.get('gpu_busy', '')} | {r.get('waited_on_builds', '')} | "
                     f"{r.get('first_candidate_s', '')} |")
    lines += ["", "| strategy | GPUs | speedup vs 1 GPU (median) | efficiency |", "|---|---|---|---|"]
    lines += [f"| {x['strategy']} | {x['gpus']} | {x['speedup_median']} | {x['efficiency']} |" for x in ratios]
    (RESULTS / f"async_search{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
