"""Launch one CUDA MSDA configuration on one shape a few times, for a profiler (ncu / nsys) to attach to.

    ncu --kernel-name regex:msda_ --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python experiments/msda/profile_one.py --params cfg.json [--shape encoder] [--calls 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="cuda_msda_fp16")
    ap.add_argument("--params", required=True, help="JSON file: a configuration, or an elite.json")
    ap.add_argument("--merge", default="{}", help="JSON object merged over --params")
    ap.add_argument("--shape", default="encoder", help="a shape name of the space")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    a = ap.parse_args()
    import torch

    from evoengineer import space_file
    from evoengineer.space import load_space
    from experiments.gpu_timing import build_modules

    space = load_space(space_file(f"{a.space}.toml"))
    doc = json.loads(Path(a.params).read_text())
    params = {**(doc["elites"][0]["params"] if "elites" in doc else doc), **json.loads(a.merge)}
    task, [(_, module, why)] = build_modules(space, [params], Path(a.cache_dir))
    if module is None:
        raise SystemExit(f"build failed: {why}")
    shape = next(e.shape for e in task.entries if e.name == a.shape)
    inputs = task.make_inputs(shape, seed=1)
    out = task.new_output(inputs)
    for _ in range(a.calls):
        task.launch(module, inputs, out)
    torch.cuda.synchronize()
    err = float((out.double() - task.reference(inputs)).abs().max())
    print(f"{a.shape}: max abs err {err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
