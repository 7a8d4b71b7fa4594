"""Issue 19 on a multi-GPU host: the Dask evaluator (`--cluster local`) on all GPUs against one GPU of the same host.

Each step is one command, resumable, so that it fits a device call of a few minutes (the store of every run lives
in --state, default experiments/scale/.multi_gpu_state/, and travels between calls; a step whose run is unfinished
resumes it for at most --limit seconds):

    python experiments/scale/multi_gpu.py grid --gpus all [--limit 520]    # the whole 2781-configuration grid
    python experiments/scale/multi_gpu.py grid --gpus one --budget 400    # a slice of it on the first GPU
    python experiments/scale/multi_gpu.py ga --gpus all                   # the default GA (seed 0)
    python experiments/scale/multi_gpu.py ga --gpus one
    python experiments/scale/multi_gpu.py replay     # determinism: a recorded landscape, cluster vs none
    python experiments/scale/multi_gpu.py report [--tag h200x2]   # anywhere: the tables, from the stores

Every run builds from its own cold candidate cache (the family binding, compiled once, is shared), so one-GPU and
all-GPU runs pay the same builds. The grid space is experiments/scale/cuda_msda_fp16_grid2781.toml (the fp16 grid
of the issue: today's template, the genes added since pinned off). Rates: candidates per minute over the search
commands' wall time (summed over a run's slices; each slice pays the cluster's start-up) and the progress line's
rate and busy shares (per GPU) of the last slice. `report` writes results/multi_gpu[_TAG].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.evaluators.cluster import visible_gpus  # noqa: E402  (after the path: run from a checkout)
RESULTS = ROOT / "experiments" / "scale" / "results"
GRID_SPACE = ROOT / "experiments" / "scale" / "cuda_msda_fp16_grid2781.toml"
REPLAY_LANDSCAPE = ROOT / "experiments" / "data" / "msda" / "landscape_cuda_msda_fp16.csv"
DONE = re.compile(r"^\s*done \|.*\| (?P<rate>\d+)/min \| GPU busy (?P<busy>\d+)% of (?P<gpus>\d+)"
                  r"(?: \| per GPU: (?P<per>[^|]*))?")


def evo(args: list[str], *, env: dict[str, str], log: Path, limit: float | None = None) -> tuple[int, float, str]:
    """python -m evoengineer ARGS, interrupted (SIGINT, as Ctrl-C: the run stays resumable) after `limit` seconds.
    Returns (exit code, wall seconds, stderr + stdout)."""
    cmd = [sys.executable, "-m", "evoengineer", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(2)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    wall = time.perf_counter() - t0
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n# exit {proc.returncode}, {wall:.1f} s\n{err}{out}\n")
    return proc.returncode, wall, err + out


def run_env(gpus: list[str], cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env["EVOENGINEER_CACHE"] = str(cache)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # nothing here uses NCCL; keep multicast off as the host guide says
    return env


def cold_cache(state: Path, name: str, gpus: list[str]) -> Path:
    """The run's own candidate cache, with the family binding compiled once (shared by every run) copied in."""
    work = Path(os.environ.get("MULTI_GPU_WORK", "/tmp/evo-multi-gpu"))
    warm, cache = work / "warm-cache", work / f"cache-{name}"
    work.mkdir(parents=True, exist_ok=True)
    if not (warm / "bindings").is_dir():
        db = work / "warmup.db"
        db.unlink(missing_ok=True)
        rc, _, text = evo(["search", "--space", str(GRID_SPACE), "--strategy", "random", "--budget", "1", "--quiet",
                           "--db", f"sqlite:///{db}", "--out", str(work / "warmup.json"), "--force"],
                          env=run_env(gpus[:1], warm), log=state / "warmup.log")
        if rc != 0 or not (warm / "bindings").is_dir():
            raise SystemExit(f"warm-up search failed (exit {rc}): {text.strip().splitlines()[-1:]}")
    if not (cache / "bindings").is_dir():
        shutil.copytree(warm / "bindings", cache / "bindings", dirs_exist_ok=True)
    return cache


def slices_of(state: Path, name: str) -> list[dict]:
    path = state / f"{name}.slices.json"
    return json.loads(path.read_text()) if path.is_file() else []


def _run(db: Path):
    """(store, newest run) of `db`, or (None, None) when it holds none yet."""
    if not db.is_file():
        return None, None
    from evoengineer.store import Store

    store = Store(f"sqlite:///{db}")
    runs = store.runs()
    if not runs:
        store.close()
        return None, None
    return store, runs[-1]


def stored_count(db: Path) -> tuple[int, str | None]:
    """(evaluations stored, run status) of the run in `db` (none yet: (0, None))."""
    store, run = _run(db)
    if store is None:
        return 0, None
    try:
        return store.count_candidates(run.id), run.status
    finally:
        store.close()


def blank_sources(db: Path, keep: int = 20) -> None:
    """Empty the kernel sources of all but the `keep` fastest candidates (a grid's store then travels between
    device calls in a few MB; resuming needs only the measurements, elite.json takes the elites' sources)."""
    con = sqlite3.connect(db)
    try:
        con.execute("update candidates set source = '' where id not in (select id from candidates "
                    "where status = 'ok' order by time_us limit ?)", (keep,))
        con.commit()
        con.execute("vacuum")
    finally:
        con.close()


def search_step(a: argparse.Namespace, kind: str) -> int:
    gpus = visible_gpus()
    if not gpus:
        raise SystemExit("no GPU on this host (nvidia-smi shows none)")
    gpus = gpus if a.gpus == "all" else gpus[:1]
    name = f"{kind}_{'all' if a.gpus == 'all' else 'one'}"
    state = a.state
    state.mkdir(parents=True, exist_ok=True)
    db = state / f"{name}.db"
    before, status = stored_count(db)
    if status == "finished":
        print(f"{name}: finished already ({before} evaluations)")
        return 0
    cache = cold_cache(state, name, gpus)
    env = run_env(gpus, cache)
    if status is None:
        args = ["search", "--space", str(GRID_SPACE if kind == "grid" else a.space), "--cluster", "local",
                "--db", f"sqlite:///{db}", "--out", str(state / f"{name}.json"), "--force", "--seed", str(a.seed)]
        if kind == "grid":
            args += ["--strategy", "grid", "--population", "64", "--budget", str(a.budget or 100000)]
        elif a.budget:
            args += ["--budget", str(a.budget)]
    else:
        args = ["resume", "--db", f"sqlite:///{db}", "--cluster", "local"]
    rc, wall, text = evo(args, env=env, log=state / f"{name}.log", limit=a.limit)
    after, status = stored_count(db)
    done = [m for m in map(DONE.match, text.splitlines()) if m]
    entry = {"gpus": len(gpus), "command_s": round(wall, 1), "exit": rc, "evaluated_before": before,
             "evaluated_after": after, "status": status}
    if done:
        m = done[-1]
        entry.update(progress_rate_per_min=int(m["rate"]), gpu_busy=int(m["busy"]) / 100,
                     per_gpu=(m["per"] or "").strip() or None)
    slices = [*slices_of(state, name), entry]
    (state / f"{name}.slices.json").write_text(json.dumps(slices, indent=1) + "\n")
    blank_sources(db)
    print(json.dumps({"run": name, **entry}))
    return 0 if rc in (0, 130, -2) else 1


def pinned_landscape(out: Path) -> Path:
    """The recorded grid (REPLAY_LANDSCAPE) with a column for each gene the grid space pins (one value each)."""
    import csv

    from evoengineer.space import load_space

    space = load_space(GRID_SPACE)
    with REPLAY_LANDSCAPE.open() as f:
        reader = csv.DictReader(f)
        fields, rows = list(reader.fieldnames or []), list(reader)
    pinned = {p.name: p.values[0] for p in space.parameters if p.name not in fields and len(p.values) == 1}
    params = [n for n in space.names if n in fields or n in pinned]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*params, *(c for c in fields if c not in params)])
        w.writeheader()
        for r in rows:
            w.writerow({**r, **{k: str(v).lower() if isinstance(v, bool) else v for k, v in pinned.items()}})
    return out


def replay_step(a: argparse.Namespace) -> int:
    """The recorded grid replayed through --cluster local (a worker per GPU) and without a cluster: elite.json must
    be the same but for the evaluator's description (replayed measurements are deterministic)."""
    state = a.state
    state.mkdir(parents=True, exist_ok=True)
    env = run_env(visible_gpus() or ["0"], state / "replay-cache")
    landscape = pinned_landscape(state / "landscape_grid2781.csv")
    docs = {}
    for name, extra in (("replay_plain", []), ("replay_cluster", ["--cluster", "local"])):
        db = state / f"{name}.db"
        db.unlink(missing_ok=True)
        rc, wall, text = evo(["search", "--space", str(GRID_SPACE), "--landscape", str(landscape),
                              "--budget", "200", "--seed", "0", "--quiet", "--db", f"sqlite:///{db}",
                              "--out", str(state / f"{name}.json"), "--force", *extra],
                             env=env, log=state / "replay.log")
        if rc != 0:
            raise SystemExit(f"{name}: exit {rc}: {text.strip().splitlines()[-1:]}")
        docs[name] = {k: v for k, v in json.loads((state / f"{name}.json").read_text()).items() if k != "evaluator"}
    same = docs["replay_plain"] == docs["replay_cluster"]
    (state / "replay.result.json").write_text(json.dumps({"identical_but_evaluator": same}) + "\n")
    print(f"replay: elite.json identical but for the evaluator: {same}")
    return 0 if same else 1


# ---- report (no GPU needed) ---------------------------------------------------------------------------------------
def measured(db: Path) -> dict[str, tuple[str, float]]:
    """hash -> (status, time_us) of the run in `db` (same space file: same hashes for the same configuration)."""
    store, run = _run(db)
    if store is None:
        return {}
    try:
        return {r.hash: (r.status, r.time_us) for r in store.candidates(run.id)}
    finally:
        store.close()


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / ((sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5 or 1.0)


def agreement(all_db: Path, one_db: Path) -> dict:
    a, o = measured(all_db), measured(one_db)
    both = [k for k in o if k in a and a[k][0] == "ok" and o[k][0] == "ok"]
    if len(both) < 3:
        return {"configurations": len(both)}
    ta = [a[k][1] for k in both]
    to = [o[k][1] for k in both]
    ratio = sorted(x / y for x, y in zip(ta, to))
    q = statistics.quantiles(ratio, n=20)
    top = max(1, min(10, len(both) // 10))
    best_a = {k for _, k in sorted(zip(ta, both))[:top]}
    best_o = {k for _, k in sorted(zip(to, both))[:top]}
    verdicts = sum(1 for k in o if k in a and a[k][0] != o[k][0])
    return {"configurations": len(both), "median_ratio_all_over_one": round(statistics.median(ratio), 4),
            "p5_ratio": round(q[0], 4), "p95_ratio": round(q[-1], 4), "spearman": round(spearman(ta, to), 4),
            f"top{top}_overlap": len(best_a & best_o), "status_disagreements": verdicts}


def time_to(db: Path, target: float) -> dict:
    """Seconds from the run's creation to its first correct evaluation at or below `target` us, and how many
    evaluations it took (a run resumed over several slices counts the gaps between them too)."""
    store, run = _run(db)
    if store is None:
        return {}
    try:
        recs = sorted(store.candidates(run.id), key=lambda r: (r.finished_at, r.seq))
    finally:
        store.close()
    for i, r in enumerate(recs, 1):
        if r.time_us <= target * (1 + 1e-9):
            return {"seconds": round((r.finished_at - run.created_at).total_seconds(), 1), "evaluations": i}
    return {}


def best_of(db: Path) -> float | None:
    store, run = _run(db)
    if store is None:
        return None
    try:
        t = min((r.time_us for r in store.candidates(run.id)), default=float("inf"))
    finally:
        store.close()
    return t if t != float("inf") else None


def totals(state: Path, name: str) -> dict:
    sl = slices_of(state, name)
    if not sl:
        return {}
    wall = sum(s["command_s"] for s in sl)
    n = sl[-1]["evaluated_after"]
    return {"run": name, "gpus": sl[-1]["gpus"], "slices": len(sl), "evaluations": n, "command_s": round(wall, 1),
            "candidates_per_min": round(60 * n / wall, 1) if wall else None, "finished": sl[-1]["status"],
            "last_slice_progress_rate": sl[-1].get("progress_rate_per_min"),
            "last_slice_gpu_busy": sl[-1].get("gpu_busy"), "last_slice_per_gpu": sl[-1].get("per_gpu")}


def report_step(a: argparse.Namespace) -> int:
    state = a.state
    out: dict = {"grid": {}, "ga": {}}
    for kind in ("grid", "ga"):
        for who in ("all", "one"):
            t = totals(state, f"{kind}_{who}")
            if t:
                out[kind][who] = t
    g = out["grid"]
    if "all" in g and "one" in g and g["one"]["candidates_per_min"]:
        g["parallel_efficiency"] = round(g["all"]["candidates_per_min"]
                                         / (g["all"]["gpus"] * g["one"]["candidates_per_min"]), 3)
    if (state / "grid_all.db").is_file() and (state / "grid_one.db").is_file():
        out["timing_agreement"] = agreement(state / "grid_all.db", state / "grid_one.db")
    if (state / "ga_all.db").is_file() and (state / "ga_one.db").is_file():
        bests = {w: best_of(state / f"ga_{w}.db") for w in ("all", "one")}
        if all(bests.values()):
            target = max(bests.values())
            out["ga"]["final_best_us"] = bests
            out["ga"]["time_to_common_best"] = {"target_us": target,
                                                **{w: time_to(state / f"ga_{w}.db", target) for w in ("all", "one")}}
    if (state / "replay.result.json").is_file():
        out["replay"] = json.loads((state / "replay.result.json").read_text())
    lines = ["| run | GPUs | evaluations | slices | command s | candidates/min | progress /min (last slice) | "
             "GPU busy (last slice) | per GPU |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for kind in ("grid", "ga"):
        for who in ("all", "one"):
            t = out[kind].get(who)
            if t:
                lines.append(f"| {t['run']} | {t['gpus']} | {t['evaluations']} | {t['slices']} | {t['command_s']} | "
                             f"{t['candidates_per_min']} | {t['last_slice_progress_rate']} | "
                             f"{t['last_slice_gpu_busy']} | {t['last_slice_per_gpu'] or '-'} |")
    for key in ("parallel_efficiency",):
        if key in g:
            lines.append(f"\ngrid parallel efficiency (all / (GPUs x one)): {g[key]}")
    for key in ("timing_agreement", "replay"):
        if key in out:
            lines.append(f"\n{key}: {json.dumps(out[key])}")
    if "time_to_common_best" in out["ga"]:
        lines.append(f"\nGA time to the common best: {json.dumps(out['ga']['time_to_common_best'])}")
    suffix = f"_{a.tag}" if a.tag else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"multi_gpu{suffix}.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS / f"multi_gpu{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["grid", "ga", "replay", "report"])
    ap.add_argument("--gpus", choices=["all", "one"], default="all")
    ap.add_argument("--budget", type=int, help="grid: configurations (default all); ga: the space's default")
    ap.add_argument("--space", default="cuda_msda_fp16", help="ga: the space (default the shipped fp16 MSDA space)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=float, default=520, help="seconds one search command may run before it is "
                                                             "interrupted (resumable)")
    ap.add_argument("--state", type=Path, default=ROOT / "experiments" / "scale" / ".multi_gpu_state")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    if a.step in ("grid", "ga"):
        return search_step(a, a.step)
    return replay_step(a) if a.step == "replay" else report_step(a)


if __name__ == "__main__":
    raise SystemExit(main())
