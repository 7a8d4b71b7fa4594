"""Issue 52's export target: how long an exported op takes from `import` to its first call's result, cold (empty
export cache: the family binding compiles) and warm (binding cached: a CUDA kernel's cubin is loaded, nothing
compiles; the warm process runs with no compiler reachable to show it).

Per space: a small random search (--budget candidates, its own store and cache), `export` of rank 1, then two fresh
processes, each importing the package and calling the kernel once on the space's first timed shape (inputs made
before the clock starts; the call through the family's launch of the imported module, synchronized):

    python experiments/scale/export_first_call.py [--spaces cuda_msda_fp16,sdpa_fp16_d64,decode_fp16_d128]
        [--budget 4] [--out DIR]

Writes DIR/export_first_call.json and .md (default: a temporary folder). Targets (issue 52): warm <= 2 s, cold <= 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROBE = r"""
import json, sys, time
import torch
from evoengineer.export import family_instance, family_of
from evoengineer.families import get_task
from evoengineer.space import load_space
pkg_dir, package, space_file = sys.argv[1:4]
space = load_space(space_file)
task = get_task(space)
entry = next(e for e in task.entries if e.time)
inputs = task.make_inputs(entry.shape, 0)
sys.path.insert(0, pkg_dir)
t0 = time.perf_counter()
mod = __import__(package)
t_import = time.perf_counter() - t0
out = task.new_output(inputs)
task.launch(mod.kernel.module, inputs, out)
if torch.cuda.is_available():
    torch.cuda.synchronize()
print(json.dumps({"import_s": round(t_import, 3), "first_call_s": round(time.perf_counter() - t0, 3),
                  "module": type(mod.kernel.module).__name__,
                  "cubin": (mod.kernel.kernel.get("cubin") or {}).get("arch")}))
"""


def run_probe(pkg: Path, package: str, space_file: str, env: dict[str, str]) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, str(pkg), package, space_file], capture_output=True, text=True,
                       env=env, timeout=900)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1][:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default="cuda_msda_fp16,sdpa_fp16_d64,decode_fp16_d128")
    ap.add_argument("--budget", type=int, default=4, help="random search of this many candidates per space")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    from evoengineer.cli import main as cli
    from evoengineer.space import resolve_space_arg

    out = Path(a.out or tempfile.mkdtemp(prefix="evo-export-first-call-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.spaces.split(","):
        d = out / name
        d.mkdir(exist_ok=True)
        space_file = str(resolve_space_arg(name))
        rc = cli(["search", "--space", space_file, "--budget", str(a.budget), "--strategy", "random",
                  "--db", f"sqlite:///{d / 's.db'}", "--out", str(d / "elite.json"), "--cache-dir", str(d / "cache"),
                  "--quiet", "--force"])
        if rc != 0:
            rows.append({"space": name, "error": f"search exited {rc}"})
            continue
        t0 = time.perf_counter()
        rc = cli(["export", str(d / "elite.json"), "--out", str(d / "pkg"), "--force"])
        export_s = time.perf_counter() - t0
        (pkg,) = [p for p in (d / "pkg").iterdir() if p.is_dir()]
        cache = d / "ops"
        env = {**os.environ, "EVOENGINEER_EXPORT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
        cold = run_probe(d / "pkg", pkg.name, space_file, env)
        # warm: the binding is cached; nothing may compile (no compiler on PATH, no CUDA_HOME)
        bare = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
        bare["PATH"] = str(Path(sys.executable).parent)
        warm = run_probe(d / "pkg", pkg.name, space_file, bare)
        rows.append({"space": name, "export_s": round(export_s, 2), "cold": cold, "warm": warm})
        print(json.dumps(rows[-1]), flush=True)
    (out / "export_first_call.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| space | export s | cold: import / first call s | warm (no compiler): import / first call s | module |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['space']} | {r['error']} | | | |")
            continue
        cells = [f"{p.get('import_s', '-')} / {p.get('first_call_s', p.get('error', '-'))}" for p in (r["cold"], r["warm"])]
        lines.append(f"| {r['space']} | {r['export_s']} | {cells[0]} | {cells[1]} | "
                     f"{r['warm'].get('module', '-')} {r['warm'].get('cubin') or ''} |")
    (out / "export_first_call.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
