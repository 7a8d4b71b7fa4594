"""RMSNorm benchmark on a GPU host: the searched kernel of an elite.json against torch, in one process.

    python experiments/rmsnorm/benchmark.py elite.json [--rank 1] [--family FILE.py:Class]
                                            [--rows 1 128 2048 8192 32768] [--json results.json]

The kernel is loaded with `evoengineer.load` (built from the source recorded in elite.json; the family from
--family). Per row count (hidden and dtype from the elite's signature, fp16 x 4096 for the shipped space):

* its max abs error against the float64 reference;
* kernel-only time: a CUDA graph of 20 back-to-back calls replayed 50 times under CUDA events, per call = median
  replay / 20. L2 is NOT flushed: every call reads the same inputs, so row counts whose x fits in L2 (50 MB on an H100,
  up to ~6000 rows of 4096 fp16) are timed L2-warm. Ours, torch eager `F.rms_norm`, and `torch.compile(F.rms_norm)`;
* cold time: p50 of single calls with L2 flushed before each (evoengineer.evaluators.timing.time_callable, the
  search's own timer), ours and torch eager;
* eager wall time per call from Python: 2000 back-to-back calls, time.perf_counter, one synchronize at the end
  (includes launch and argument-check overhead), ours and torch eager.

Ratios are ours / torch (below 1: ours is faster). Prints a markdown table; --json also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evoengineer  # noqa: E402
from evoengineer.evaluators.timing import time_callable  # noqa: E402
from experiments.gpu_timing import graph_us, wall_us  # noqa: E402

ROWS = (1, 128, 2048, 8192, 32768)
FAMILY = "examples/families/rmsnorm_cuda/family.py:RMSNorm"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
EPS = 1e-6
GRAPH_CALLS, GRAPH_REPLAYS, WALL_CALLS, COLD_REPEATS = 20, 50, 2000, 200


def load_op(elite: Path, rank: int, family: str):
    """The searched op. A family file is named relative to the working folder (no absolute path): run the load from
    the family file's folder and name it by its file name."""
    file_part, _, cls = family.rpartition(":")
    if not file_part.endswith(".py"):
        return evoengineer.load(elite, rank, family=family)
    path = Path(file_part)
    path = path if path.is_absolute() else (Path.cwd() / path)
    here = Path.cwd()
    os.chdir(path.parent)
    try:
        return evoengineer.load(elite, rank, family=f"{path.name}:{cls}")
    finally:
        os.chdir(here)


def reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def measure(op, rows: int, hidden: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=g).to(dtype).cuda()
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).cuda()

    def ours():
        return op(x, w, EPS)

    def eager():
        return F.rms_norm(x, (hidden,), w, EPS)

    compiled_norm = torch.compile(lambda a, b: F.rms_norm(a, (hidden,), b, EPS), dynamic=False)

    def compiled():
        return compiled_norm(x, w)

    ref = reference(x, w, EPS)
    err = float((ours().double() - ref).abs().max())
    err_torch = float((eager().double() - ref).abs().max())
    out = {"rows": rows, "hidden": hidden, "max_abs_err": err, "max_abs_err_torch": err_torch}
    for name, fn in (("ours", ours), ("torch", eager), ("compiled", compiled)):
        out[f"graph_us_{name}"] = graph_us(fn, GRAPH_CALLS, GRAPH_REPLAYS)
    for name, fn in (("ours", ours), ("torch", eager)):
        out[f"cold_us_{name}"] = time_callable(fn, device="cuda", warmup=10, repeats=COLD_REPEATS)["p50"]
        out[f"wall_us_{name}"] = wall_us(fn, WALL_CALLS)
    return out


def table(results: list[dict], device: str, dtype: str) -> str:
    head = ("| rows | ours graph us | torch graph us | compiled graph us | ours/torch | ours/compiled | ours cold us "
            "| torch cold us | ours/torch cold | ours wall us | torch wall us | ours/torch wall | max abs err |")
    lines = [f"RMSNorm forward, {dtype}, hidden {results[0]['hidden']}, {device}. Graph: {GRAPH_CALLS} calls per "
             f"graph, median of {GRAPH_REPLAYS} replays, L2 warm. Cold: p50 of {COLD_REPEATS} calls, L2 flushed "
             f"before each. Wall: {WALL_CALLS} eager calls from Python.", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(
            f"| {r['rows']} | {r['graph_us_ours']:.2f} | {r['graph_us_torch']:.2f} | {r['graph_us_compiled']:.2f} "
            f"| {r['graph_us_ours'] / r['graph_us_torch']:.2f} | {r['graph_us_ours'] / r['graph_us_compiled']:.2f} "
            f"| {r['cold_us_ours']:.2f} | {r['cold_us_torch']:.2f} | {r['cold_us_ours'] / r['cold_us_torch']:.2f} "
            f"| {r['wall_us_ours']:.2f} | {r['wall_us_torch']:.2f} | {r['wall_us_ours'] / r['wall_us_torch']:.2f} "
            f"| {r['max_abs_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("elite", help="elite.json of an rmsnorm search")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--family", default=str(ROOT / FAMILY), help="FILE.py:Class or module:Class of the family")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    op = load_op(Path(args.elite).resolve(), args.rank, args.family)
    sig = op.kernel.signature
    hidden, dtype = int(sig["HIDDEN"]), str(sig["DTYPE"])
    results = [measure(op, rows, hidden, DTYPES[dtype]) for rows in args.rows]
    device = torch.cuda.get_device_name()
    print(table(results, device, dtype))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "dtype": dtype, "elite": str(args.elite),
                                               "params": op.kernel.kernel.get("params"), "results": results},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
