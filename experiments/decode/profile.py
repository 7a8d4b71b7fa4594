"""Decode kernels and cuDNN under Nsight Compute, one shape, one process (issue 34): what bounds each kernel.

    ncu --profile-from-start off --set full -o report python experiments/decode/profile.py \
        --kernel fp8=experiments/decode/results/elite_decode_fp8kv_d128.json --shape 8,32,8,1,8192,128 [--paged 16] \
        [--cudnn]
    ncu ... python experiments/decode/profile.py --config experiments/decode/tables.toml --table final --cudnn

Builds the kernels as benchmark.py does (LABEL=elite.json or LABEL='SPACE:{params}'; --paged SIZES adds each
kernel's paged twin at those page sizes), makes every kernel's inputs, warms each up outside the profiled range,
then, inside torch.cuda.profiler.start()/stop(), launches each kernel once and (--cudnn) torch SDPA on cuDNN with
enable_gqa once, each in an NVTX range named by its label. Without ncu it prints each launch's CUDA-event time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from evoengineer.families.decode.task import DecodeShape  # noqa: E402
from experiments.decode.benchmark import build_all, config_table, paged_twins, parse_kernel  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="a TOML file of tables (tables.toml): the kernels of --table")
    ap.add_argument("--table")
    ap.add_argument("--kernel", action="append", default=[])
    ap.add_argument("--shape", default="8,32,8,1,8192,128", help="B,Hq,Hkv,Sq,Sk,D")
    ap.add_argument("--paged", default="", help="page sizes of the paged twins")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--cache-dir", default=str(ROOT / ".evo_cache"))
    a = ap.parse_args()
    B, Hq, Hkv, Sq, Sk, D = (int(x) for x in a.shape.split(","))
    if bool(a.config) != bool(a.table):
        ap.error("--config and --table go together")
    kernels = config_table(a.config, a.table)[0] if a.config else []
    kernels += [parse_kernel(k) for k in a.kernel]
    if not kernels:
        ap.error("no kernel: give --config FILE --table NAME or --kernel")
    pages = [int(x) for x in a.paged.split(",") if x]
    if pages:
        kernels += paged_twins(kernels)
    built = build_all(kernels, Path(a.cache_dir).absolute())
    runs = []  # (label, fn)
    fp16 = None
    for label, (task, module, _space, _params) in built.items():
        for ps in (pages if getattr(task, "paged", False) else [None]):
            shape = DecodeShape("profile", B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, page_size=ps)
            inputs = task.make_inputs(shape, 0)
            if fp16 is None:
                fp16 = {k: inputs.get(f"{k}_orig", inputs[k]) for k in ("q", "k", "v")} if not task.paged else None
            out = task.new_output(inputs)
            runs.append((label if ps is None else f"{label}@p{ps}",
                         lambda t=task, m=module, i=inputs, o=out: t.launch(m, i, o)))
    if a.cudnn:
        if fp16 is None:
            g = torch.Generator(device="cuda").manual_seed(0)
            fp16 = {"q": torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.float16, generator=g),
                    "k": torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16, generator=g),
                    "v": torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16, generator=g)}

        def cudnn(x=fp16):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(x["q"], x["k"], x["v"], enable_gqa=True)
        runs.append(("cudnn", cudnn))
    for _, fn in runs:  # warm-up: lazy initialisation, workspaces, module loads
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, fn in runs:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.nvtx.range_push(label)
        start.record()
        fn()
        end.record()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"{label}: {start.elapsed_time(end) * 1e3:.1f} us (one launch)", flush=True)
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
