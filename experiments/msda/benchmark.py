"""MSDA benchmark on a GPU host: an elite against the classic kernel and the PyTorch reference, in one process.

    python experiments/msda/benchmark.py --elite elite.json [--elite-fp32 elite_fp32.json] [--repeats 100]

Per shape and value dtype: elite p50, classic p50, reference p50, elite/classic and elite/reference speedups, and
HBM floor / elite (minimum bytes: value, locations, weights read once, output written once, over the device's
measured copy bandwidth). Timing: CUDA events per call, L2 flushed before every call, median of --repeats.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evoengineer import SPACES_DIR  # noqa: E402
from evoengineer.compiler.builder import Builder  # noqa: E402
from evoengineer.compiler.steps import load_module  # noqa: E402
from evoengineer.candidate import CandidateFactory, fixed_candidate  # noqa: E402
from evoengineer.evaluators.timing import time_callable  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.tasks.base import get_task  # noqa: E402
from evoengineer.tasks.msda import DECODER, ENCODER, MSDAShape  # noqa: E402

SHAPES = [ENCODER, MSDAShape("encoder_n2", N=2, Lq=ENCODER.Lq, M=8, D=32, P=4, levels=ENCODER.levels, ref="pixels"), DECODER]


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 20)."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = time_callable(lambda: b.copy_(a), device="cuda", warmup=3, repeats=20, flush_l2=False)
    return 2 * a.numel() / (t["p50"] * 1e-6)


def build(space, params: dict, cache: Path):
    task = get_task(space)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(), cache_dir=cache)
    try:
        elite = b.submit(CandidateFactory(space).make(params)).result()
        classic = b.submit(fixed_candidate(space, "cuda/msda_classic.cu.j2", "classic")).result()
    finally:
        b.close()
    for name, r in (("elite", elite), ("classic", classic)):
        if r.status != "ok":
            raise SystemExit(f"{name} failed to build: {r.status}: {r.reason}")
    return task, load_module(elite.so, elite.module), load_module(classic.so, classic.module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--elite", required=True, help="elite.json of the fp16 (or any) CUDA MSDA space")
    ap.add_argument("--elite-fp32", help="elite.json of the fp32 space (default: the same params, if valid there)")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    docs = {"float16": json.loads(Path(a.elite).read_text())}
    docs["float32"] = json.loads(Path(a.elite_fp32).read_text()) if a.elite_fp32 else docs["float16"]
    bw = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()} | copy bandwidth {bw / 1e12:.2f} TB/s (read + write) | "
          f"L2 flushed before every call | median of {a.repeats}")
    rows = []
    for dtype_name, space_file in (("float16", "cuda_msda_fp16.toml"), ("float32", "cuda_msda_fp32.toml")):
        space = load_space(SPACES_DIR / space_file)
        params = docs[dtype_name]["elites"][0]["params"]
        task, elite, classic = build(space, params, Path(a.cache_dir))
        for shape in SHAPES:
            inputs = task.make_inputs(shape, seed=1234)
            out = task.new_output(inputs)
            task.launch(elite, inputs, out)
            torch.cuda.synchronize()
            err = float((out.double() - task.reference(inputs)).abs().max())
            t = {}
            for name, fn in (("elite", lambda: task.launch(elite, inputs, out)),
                             ("classic", lambda: task.launch(classic, inputs, out)),
                             ("reference", lambda: task.baselines()["reference"](inputs))):
                t[name] = time_callable(fn, device="cuda", warmup=10, repeats=a.repeats, flush_l2=True)["p50"]
            floor_us = task.min_bytes(shape) / bw * 1e6
            rows.append({"shape": shape.name, "dtype": dtype_name, "elite_us": t["elite"], "classic_us": t["classic"],
                         "reference_us": t["reference"], "elite_vs_classic": t["classic"] / t["elite"],
                         "elite_vs_reference": t["reference"] / t["elite"], "floor_over_elite": floor_us / t["elite"],
                         "floor_us": floor_us, "max_abs_err": err, "params": params})
            del inputs, out
    head = f"{'shape':<12}{'dtype':<9}{'elite us':>10}{'classic us':>12}{'ref us':>10}{'x classic':>11}" \
           f"{'x ref':>9}{'floor/elite':>13}{'max err':>10}"
    print(head)
    for r in rows:
        print(f"{r['shape']:<12}{r['dtype']:<9}{r['elite_us']:>10.1f}{r['classic_us']:>12.1f}{r['reference_us']:>10.1f}"
              f"{r['elite_vs_classic']:>11.2f}{r['elite_vs_reference']:>9.2f}{r['floor_over_elite']:>13.2f}"
              f"{r['max_abs_err']:>10.1e}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
