"""Issue 31 on a GPU host: what one candidate's build costs against a device-only compile, and how busy the default
search keeps the GPU.

    python experiments/scale/keep_busy.py compile [--random 20] [--tag T]
    python experiments/scale/keep_busy.py search [--seeds 0 1 2] [--tag T]

compile: for the rank-1 elites of cuda_msda_fp16, sdpa_hopper_fp16_d64 and decode_fp8kv_d128 and `--random` random
valid genomes of each space, the builder's CPU seconds per candidate (its one `nvcc -c`, the shim, the link and
cpp_extension's own work in the builder process; metrics.build_cpu_s) against `nvcc -cubin` of the same source with
the space's flags (device code only; CPU seconds of nvcc and its children). Both run 16 at a time on a fresh cache.

search: `python -m evoengineer search --seed S` (the default space and settings) with an empty build cache (the
family binding included) per seed: the command's wall time, when the first generation's progress line appeared,
the final line's rate, GPU busy share, build seconds per candidate and the share the GPU waited on builds, and from
the store where the measuring worker's time per candidate went (metrics.worker_s) and the builds' CPU seconds.

Writes experiments/scale/results/keep_busy_{compile,search}[_TAG].json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "scale" / "results"
ELITES = {"cuda_msda_fp16": "experiments/data/msda/elite_ga_fp16.json",
          "sdpa_hopper_fp16_d64": "experiments/data/sdpa/hopper/elite_fp16_d64_seed1.json",
          "decode_fp8kv_d128": "experiments/decode/results/elite_decode_fp8kv_d128.json"}


def _cubin_cpu(source: Path, flags: list[str], arch: str) -> float:
    """CPU seconds of `nvcc -cubin` (device code only) of `source`, measured around the child alone."""
    from evoengineer.compiler.gate import nvcc_flags

    cmd = ["nvcc", "-cubin", *nvcc_flags(flags, arch), str(source), "-o", str(source.with_suffix(".cubin"))]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}")
    return ru.ru_utime + ru.ru_stime


def compile_costs(a: argparse.Namespace) -> int:
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder
    from evoengineer.families import get_task
    from evoengineer.space import load_space
    from evoengineer import space_file

    work = Path(tempfile.mkdtemp(prefix="evo-keep-busy-"))
    rows = []
    for space_name, elite_file in ELITES.items():
        space = load_space(space_file(f"{space_name}.toml"))
        task = get_task(space)
        factory = CandidateFactory(space)
        elite = json.loads((ROOT / elite_file).read_text())["elites"][0]
        # the recorded elite's own source (it may predate genes the space has gained since)
        like = factory.from_genome(tuple(space.random_valid_genome(random.Random(1))))
        cands = [("elite", dataclasses.replace(like, source=elite["source"], params=elite["params"],
                                               hash=hashlib.sha256(elite["source"].encode()).hexdigest()))]
        rng = random.Random(0)
        for k in range(a.random):
            cands.append((f"random{k}", factory.from_genome(tuple(space.random_valid_genome(rng)))))
        src_dir = work / space_name
        src_dir.mkdir()
        paths = []
        for name, c in cands:
            p = src_dir / f"{name}.cu"
            p.write_text(c.source)
            paths.append(p)
        with ThreadPoolExecutor(16) as ex:
            cubin = list(ex.map(lambda p: _cubin_cpu(p, list(space.cuda_flags), space.arch), paths))
        builder = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                          cache_dir=work / "cache", jobs=16)
        builder.binding()  # once per toolchain: not a candidate's cost
        t0 = time.perf_counter()
        builds = [f.result() for f in [builder.submit(c) for _, c in cands]]
        wall = time.perf_counter() - t0
        builder.close()
        for (name, _), cu, b in zip(cands, cubin, builds):
            rows.append({"space": space_name, "candidate": name, "status": b.status,
                         "build_cpu_s": b.metrics.get("build_cpu_s"), "nvcc_c_cpu_s": b.metrics.get("compile_cpu_s"),
                         "cubin_cpu_s": round(cu, 3), "build_wall_s": round(b.build_s, 3),
                         "ratio": round(b.metrics["build_cpu_s"] / cu, 3) if b.metrics.get("build_cpu_s") else None})
        print(f"{space_name}: {len(cands)} builds in {wall:.1f} s wall", flush=True)
    lines = ["| space | candidates | elite: build CPU s / cubin CPU s (ratio) | random: median ratio (min-max) | "
             "random: mean build CPU s / mean cubin CPU s | nvcc -c share of the build |",
             "| --- | --- | --- | --- | --- | --- |"]
    for space_name in ELITES:
        rs = [r for r in rows if r["space"] == space_name and r["ratio"] is not None]
        el = next(r for r in rs if r["candidate"] == "elite")
        rnd = [r for r in rs if r["candidate"] != "elite"]
        ratios = [r["ratio"] for r in rnd]
        mb, mc = statistics.mean(r["build_cpu_s"] for r in rnd), statistics.mean(r["cubin_cpu_s"] for r in rnd)
        share = statistics.mean(r["nvcc_c_cpu_s"] / r["build_cpu_s"] for r in rs if r["nvcc_c_cpu_s"])
        lines.append(f"| {space_name} | {len(rs)} | {el['build_cpu_s']} / {el['cubin_cpu_s']} ({el['ratio']}) | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
                     f"{mb:.2f} / {mc:.2f} ({mb / mc:.2f}) | {share:.0%} |")
    _write(f"keep_busy_compile{a.suffix}", {"rows": rows}, lines)
    return 0


PROGRESS = re.compile(r"^\s*(?P<head>gen \d+|done) \|.*\| (?P<t>[\d.]+)s(?: \| (?P<rate>\d+)/min \| GPU busy "
                      r"(?P<busy>\d+)% of \d+)?")
FINISH = re.compile(r"finishing: re-timing (?P<retime>[\d.]+) s, sanitizer (?P<san>[\d.]+) s")
BUILDS = re.compile(r"builds (?P<per>[\d.]+) s/candidate(?:, (?P<ahead>\d+) started ahead)? \| "
                    r"GPU waited on builds (?P<wait>\d+)%")


def one_search(seed: int, work: Path) -> dict:
    cache = work / f"cache-{seed}"  # empty: the binding is built too, as on a fresh machine
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "evoengineer", "search", "--seed", str(seed), "--db",
           f"sqlite:///{work / f's{seed}.db'}", "--out", str(work / f"s{seed}.json"), "--cache-dir", str(cache)]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def drain():
        for line in p.stderr:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))

    th = threading.Thread(target=drain)
    th.start()
    out = p.stdout.read()
    p.wait()
    th.join()
    wall = time.perf_counter() - t0
    (RESULTS / f"keep_busy_search_s{seed}.log").write_text(" ".join(cmd) + "\n\n" + "\n".join(
        f"[{t:7.1f}s] {ln}" for t, ln in lines) + "\n" + out)
    if p.returncode != 0:
        raise SystemExit(f"seed {seed}: exit {p.returncode}: {lines[-1:] }")
    first = next(t for t, ln in lines if re.match(r"^\s*gen 0 \|", ln))
    done = next(PROGRESS.match(ln) for t, ln in lines if re.match(r"^\s*done \|", ln))
    b = next((BUILDS.search(ln) for _, ln in lines if BUILDS.search(ln)), None)
    fin = next((FINISH.search(ln) for _, ln in lines if FINISH.search(ln)), None)
    # the start (command to the run line: imports, space, store) and the end (last generation to the done line:
    # re-timing and sanitizer)
    started = next((t for t, ln in lines if re.match(r"^run \d+:", ln)), None)
    last_gen = max((t for t, ln in lines if re.match(r"^\s*gen \d+ \|", ln)), default=None)
    done_t = next((t for t, ln in lines if re.match(r"^\s*done \|", ln)), None)
    con = sqlite3.connect(work / f"s{seed}.db")
    try:
        metrics = [json.loads(m) if m else {} for (m,) in con.execute("SELECT metrics FROM candidates")]
        statuses = [s for (s,) in con.execute("SELECT status FROM candidates")]
    finally:
        con.close()
    phases: dict[str, list[float]] = {}
    for m in metrics:
        for k, v in (m.get("worker_s") or {}).items():
            phases.setdefault(k, []).append(v)
    measure = [m["measure_s"] for m in metrics if "measure_s" in m]
    cpu = [m["build_cpu_s"] for m in metrics if "build_cpu_s" in m and not m.get("build_cached")]
    return {"seed": seed, "command_s": round(wall, 1), "evaluations": len(metrics),
            "per_min_command": round(60 * len(metrics) / wall, 1), "first_generation_s": round(first, 1),
            "progress_per_min": int(done["rate"]) if done and done["rate"] else None,
            "gpu_busy": int(done["busy"]) / 100 if done and done["busy"] else None,
            "build_s_per_candidate": float(b["per"]) if b else None,
            "gpu_waited_on_builds": int(b["wait"]) / 100 if b else None,
            "built_ahead": int(b["ahead"]) if b and b["ahead"] else 0,
            "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
            "measure_s_mean": round(statistics.mean(measure), 4) if measure else None,
            "worker_s_mean": {k: round(statistics.mean(v), 4) for k, v in phases.items()},
            "build_cpu_s_mean": round(statistics.mean(cpu), 3) if cpu else None,
            "run_line_s": round(started, 1) if started is not None else None,
            "finish_s": round(done_t - last_gen, 1) if done_t is not None and last_gen is not None else None,
            "finish_retime_s": float(fin["retime"]) if fin else None,
            "finish_sanitizer_s": float(fin["san"]) if fin else None}


def searches(a: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="evo-keep-busy-search-"))
    rows = []
    for seed in a.seeds:
        r = one_search(seed, work)
        rows.append(r)
        print(json.dumps(r), flush=True)
    lines = ["| seed | command s | evaluations | /min (command) | /min (progress) | GPU busy | first generation s | "
             "build s/candidate (wall) | build CPU s/candidate | built ahead | GPU waited on builds | worker s per candidate "
             "(load / check / timing / baselines) | measure s (parent) | run line s | finishing s (re-timing / sanitizer) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        w = r["worker_s_mean"]
        lines.append(f"| {r['seed']} | {r['command_s']} | {r['evaluations']} | {r['per_min_command']} | "
                     f"{r['progress_per_min']} | {r['gpu_busy']} | {r['first_generation_s']} | "
                     f"{r['build_s_per_candidate']} | {r['build_cpu_s_mean']} | {r['built_ahead']} | "
                     f"{r['gpu_waited_on_builds']} | "
                     f"{w.get('load', '-')} / {w.get('check', '-')} / {w.get('timing', '-')} / "
                     f"{w.get('baselines', '-')} | {r['measure_s_mean']} | {r.get('run_line_s')} | "
                     f"{r.get('finish_s')} ({r.get('finish_retime_s')} / {r.get('finish_sanitizer_s')}) |")
    _write(f"keep_busy_search{a.suffix}", {"rows": rows}, lines)
    return 0


def _write(name: str, doc: dict, lines: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--random", type=int, default=20)
    c.add_argument("--tag", default="")
    s = sub.add_parser("search")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    s.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    a.suffix = f"_{a.tag}" if a.tag else ""
    return compile_costs(a) if a.what == "compile" else searches(a)


if __name__ == "__main__":
    raise SystemExit(main())
