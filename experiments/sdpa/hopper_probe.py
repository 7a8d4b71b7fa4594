"""Quick probe of hand-picked Hopper-family genomes on a GPU host: build, check against the float64 reference on
ragged / causal / Sq != Sk shapes, then kernel-only time (CUDA graph replay, L2 warm) next to cuDNN and FA2.

    python experiments/sdpa/hopper_probe.py [--space sdpa_hopper_fp16_d64] [--genomes FILE.json] [--json OUT]

Without --genomes: a fixed spread over consumer warpgroups, BLOCK_N, overlap / ping-pong / persistence. FP8 spaces
(sdpa_hopper_fp8_*): the kernel on e4m3 Q/K/V, cuDNN and FA2 on the fp16 draws they were quantized from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "sdpa"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmark import graph_us, with_later_genes  # noqa: E402
from evoengineer import space_file  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.compiler.builder import Builder  # noqa: E402
from evoengineer.compiler.steps import load_module  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.families import get_task  # noqa: E402
from evoengineer.families.sdpa.task import SDPAShape  # noqa: E402

BASE = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
        "PINGPONG": False, "INTRA_WG_OVERLAP": False, "PERSISTENT": False, "Q_PREFETCH": False, "FAST_EXP": True,
        "CLUSTER_SIZE": 1}
SPREAD = [
    {"NUM_CONSUMER_WARPGROUPS": 1, "BLOCK_M": 64},
    {},
    {"INTRA_WG_OVERLAP": True},
    {"INTRA_WG_OVERLAP": True, "PINGPONG": True},
    {"INTRA_WG_OVERLAP": True, "PINGPONG": True, "PERSISTENT": True, "Q_PREFETCH": True},
    {"INTRA_WG_OVERLAP": True, "BLOCK_N": 176, "STAGES": 3},
    {"NUM_CONSUMER_WARPGROUPS": 3, "BLOCK_M": 192, "INTRA_WG_OVERLAP": True},
    {"BLOCK_M": 256, "BLOCK_N": 64, "INTRA_WG_OVERLAP": True, "PERSISTENT": True},
    {"NUM_CONSUMER_WARPGROUPS": 3, "BLOCK_M": 192, "INTRA_WG_OVERLAP": True, "CLUSTER_SIZE": 2},
    {"INTRA_WG_OVERLAP": True, "PINGPONG": True, "PERSISTENT": True, "Q_PREFETCH": True, "CLUSTER_SIZE": 2},
]
CHECKS = [dict(B=1, H=2, Sq=77, Sk=77, causal=False), dict(B=3, H=2, Sq=500, Sk=500, causal=True),
          dict(B=2, H=3, Sq=300, Sk=77, causal=True), dict(B=1, H=1, Sq=77, Sk=1000, causal=False)]


def check_modules(task, modules: dict) -> dict:
    """Every module of `modules` (label -> module) on the CHECKS shapes (ragged, causal, Sq != Sk) against the float64
    reference, output NaN-poisoned first; inputs and reference drawn once per shape for all of them. Prints a WRONG
    line per failing module and shape; returns label -> max abs error per shape."""
    atol, rtol = task.tolerance()
    errs = {label: [] for label in modules}
    for i, c in enumerate(CHECKS):
        inputs = task.make_inputs(SDPAShape(f"c{i}", **c), 100 + i)
        ref = task.reference(inputs)
        for label, mod in modules.items():
            out = task.new_output(inputs)
            out.fill_(float("nan"))
            task.launch(mod, inputs, out)
            torch.cuda.synchronize()
            err = (out.double() - ref).abs()
            bad = ~(err <= atol + rtol * ref.abs())
            errs[label].append(float(err.nan_to_num(1e9).max()))
            if bad.any():
                idx = bad.nonzero()
                print(f"   WRONG {label} on {c}: {int(bad.sum())} of {bad.numel()} bad, max err {errs[label][-1]:.3g}; "
                      f"first bad (b,h,row,col) {idx[:4].tolist()}; rows bad {sorted(set(idx[:, 2].tolist()))[:12]}",
                      flush=True)
    return errs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", default="sdpa_hopper_fp16_d64")
    ap.add_argument("--genomes", help="JSON list of parameter dicts (default: a fixed spread)")
    ap.add_argument("--shapes", default="2,8,512;4,16,4096;16,16,1024", help="B,H,S;... timed (D from the space)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--json")
    a = ap.parse_args()
    space = load_space(space_file(f"{a.space}.toml"))
    task = get_task(space)
    D = space.signature["HEAD_DIM"]
    # FP8: producer warps 1-3 transpose V and need 40 registers or more (the space's constraint)
    base = {**BASE, "PRODUCER_REGS": 40} if space.signature["Q_DTYPE"] == "float8_e4m3" else BASE
    genomes = json.loads(Path(a.genomes).read_text()) if a.genomes else [{**base, **d} for d in SPREAD]
    genomes = [with_later_genes(space, g) for g in genomes]
    genomes = [g for g in genomes if not space.violated(g)]
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                cache_dir=Path(a.cache_dir))
    f = CandidateFactory(space)
    try:
        built = [fut.result() for fut in [b.submit(f.make(g)) for g in genomes]]
    finally:
        b.close()
    mods = {f"g{i}": load_module(r.so, r.module) for i, r in enumerate(built) if r.status == "ok"}
    errs = check_modules(task, mods)  # (WRONG lines name a genome by its position in the list: g0, g1, ...)
    rows = []
    for i, (g, r) in enumerate(zip(genomes, built)):
        row = {"params": g, "status": r.status}
        print(json.dumps(g, separators=(",", ":")), r.status, (r.reason or "")[:300], f"(g{i})", flush=True)
        if r.status != "ok":
            rows.append(row)
            continue
        mod = mods[f"g{i}"]
        row["max_err"] = errs[f"g{i}"]
        row["times"] = {}
        for spec in a.shapes.split(";"):
            B, H, S = map(int, spec.split(","))
            for causal in (False, True):
                inputs = task.make_inputs(SDPAShape("t", B=B, H=H, Sq=S, Sk=S, causal=causal), 7)
                out = task.new_output(inputs)
                us = graph_us(lambda: task.launch(mod, inputs, out), 20, 30)
                # FP8 kernels: the torch backends run fp16 on the unquantized draws
                q, k, v = (inputs.get(f"{n}_orig", inputs[n]) for n in ("q", "k", "v"))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cu = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 20, 30)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    fa = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 20, 30)
                fl = task.flops(SDPAShape("t", B=B, H=H, Sq=S, Sk=S, causal=causal))
                row["times"][f"{B},{H},{S},{D},{'c' if causal else 'n'}"] = [us, cu, fa]
                print(f"   {B},{H},{S},{D} causal={causal}: {us:8.1f} us ({fl / us / 1e6:6.1f} TF)  cuDNN {cu:8.1f}"
                      f"  FA2 {fa:8.1f}  x cuDNN {cu / us:5.2f}", flush=True)
                del inputs, out
        rows.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
