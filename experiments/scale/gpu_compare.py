"""On a GPU host: the default search (cuda_msda_fp16, budget 200, seed 0) through today's local evaluator and through
`--cluster local`, each from a cold candidate cache (the family binding, compiled once per toolchain, shared), one
after the other on the same machine. Reports candidates per minute (whole command, and the progress line's rate,
which leaves out the cluster's start-up) and the GPU busy share of each.

    python experiments/scale/gpu_compare.py [--budget 200] [--seed 0] [--space cuda_msda_fp16] [--tag h100]

Writes experiments/scale/results/gpu_compare[_TAG].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "scale" / "results"
LINE = re.compile(r"^\s*done \|.*\| (?P<rate>\d+)/min \| GPU busy (?P<busy>\d+)% of (?P<gpus>\d+)")


def search(args: list[str], cache: Path, work: Path, name: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "evoengineer", "search", "--db", f"sqlite:///{work / name}.db", "--out",
           str(work / f"{name}.json"), "--cache-dir", str(cache), *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (RESULTS / f"gpu_compare_{name}.log").write_text(" ".join(cmd) + "\n\n" + r.stderr + r.stdout)
    if r.returncode != 0:
        raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    done = [m for m in map(LINE.match, r.stderr.splitlines()) if m]
    out = {"mode": name, "command_s": round(wall, 1), "exit": r.returncode}
    if done:
        out.update(progress_rate_per_min=int(done[-1]["rate"]), gpu_busy=int(done[-1]["busy"]) / 100,
                   gpus=int(done[-1]["gpus"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="cuda_msda_fp16")
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="evo-gpu-compare-"))
    warm = work / "warm-cache"
    common = ["--space", a.space, "--seed", str(a.seed), "--quiet"]
    search([*common, "--budget", "1", "--strategy", "random"], warm, work, "warmup")  # compiles the binding once
    rows = []
    for name, extra in (("local", []), ("cluster_local", ["--cluster", "local"])):
        cache = work / f"cache-{name}"
        shutil.copytree(warm / "bindings", cache / "bindings")  # cold for candidates, binding shared
        r = search([*[x for x in common if x != "--quiet"], "--budget", str(a.budget), *extra], cache, work, name)
        r["candidates_per_min"] = round(60 * a.budget / r["command_s"], 1)
        rows.append(r)
        print(json.dumps(r), flush=True)
    lines = ["| mode | command s | candidates/min (command) | candidates/min (progress line) | GPU busy | GPUs |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['command_s']} | {r['candidates_per_min']} | "
                     f"{r.get('progress_rate_per_min', '-')} | {r.get('gpu_busy', '-')} | {r.get('gpus', '-')} |")
    suffix = f"_{a.tag}" if a.tag else ""
    (RESULTS / f"gpu_compare{suffix}.json").write_text(json.dumps({"space": a.space, "budget": a.budget,
                                                                    "seed": a.seed, "rows": rows}, indent=1) + "\n")
    (RESULTS / f"gpu_compare{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
