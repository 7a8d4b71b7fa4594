"""Exported ops on the GPU: per-call eager overhead beside torch's own dispatch, and every misuse a Python error.

For each recorded elite (MSDA fp16, Hopper SDPA fp16 d64, decode fp16 d128; and, when given, a declared family's
elite) loaded with `evoengineer.load`:

* kernel time: CUDA-graph replay of 20 calls, median of 30 replays / 20 (L2 warm: the same small inputs);
* eager wall time: 2000 calls, synchronize at the end, per call;
* overhead = eager wall - kernel time, for our op and for the torch op it replaces (F.scaled_dot_product_attention;
  for decode its GQA form; for MSDA and the declared family, torch SDPA at (1, 1, 64, 64) as the dispatch yardstick);
* misuse: each wrong call must raise ValueError/TypeError (run in this process: a crash ends the script, rc != 0).

    python experiments/families/op_overhead.py OUT_DIR [rmsnorm_elite.json family.py:RMSNorm]
"""

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import evoengineer  # noqa: E402
from evoengineer.families.msda.task import MSDAShape, make_inputs  # noqa: E402

ELITES = {"msda": ROOT / "experiments/data/msda/elite_ga_fp16_v3.json",
          "sdpa": ROOT / "experiments/data/sdpa/hopper/elite_fp16_d64_seed1.json",
          "decode": ROOT / "experiments/data/decode/elite_decode_fp16_d128.json"}


def graph_us(fn, calls: int = 20, replays: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return sorted(times)[len(times) // 2]


def eager_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def refused(name: str, fn, *args, **kwargs) -> str:
    print(f"misuse: {name}", file=sys.stderr, flush=True)
    try:
        fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        return f"ok   {name}: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
    torch.cuda.synchronize()
    return f"FAIL {name}: no error"


def msda_case(fn):
    shape = MSDAShape("q10", N=1, Lq=10, M=8, D=32, P=4, levels=((25, 42), (13, 21), (7, 11), (4, 6)))
    x = make_inputs(shape, 0, dtype=torch.float16, device="cuda")
    args = [x[k] for k in ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")]
    v, ss, st, loc, at = args
    misuse = [("spatial_shapes disagree with value", (v, torch.tensor([[25, 42], [13, 21], [7, 11], [4, 7]],
                                                                          device="cuda"), st, loc, at)),
              ("level_start_index past the end", (v, ss, st + torch.tensor([0, 0, 0, 5000], device="cuda"), loc, at)),
              ("negative level start", (v, ss, st - 1, loc, at)),
              ("value fp32", (v.float(), ss, st, loc, at)),
              ("value on CPU", (v.cpu(), ss, st, loc, at)),
              ("D = 64", (torch.zeros(1, v.shape[1], 4, 64, dtype=v.dtype, device="cuda"), ss, st, loc[:, :, :4],
                          at[:, :, :4])),
              ("P = 3", (v, ss, st, loc[:, :, :, :, :3].contiguous(), at[:, :, :, :, :3].contiguous())),
              ("int32 shapes", (v, ss.int(), st, loc, at)),
              ("not a tensor", (v, ss.tolist(), st, loc, at)),
              ("locations of another batch", (v, ss, st, loc.repeat(2, 1, 1, 1, 1, 1), at))]
    return (lambda: fn(*args)), misuse


def sdpa_case(fn, shape):
    q, k, v = (torch.randn(*shape, dtype=torch.float16, device="cuda") for _ in range(3))
    misuse = [("fp32 q", (q.float(), k, v)), ("head dim 128", (torch.randn(2, 8, 64, 128, device="cuda").half(),) * 3),
              ("k of another head count", (q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1))), ("mask", (q, k, v, torch.ones(1, device="cuda"))),
              ("CPU q", (q.cpu(), k, v)), ("3-D q", (q[0], k[0], v[0])), ("string", ("q", k, v))]
    return (lambda: fn(q, k, v)), (lambda: F.scaled_dot_product_attention(q, k, v)), misuse


def decode_case(fn):
    q = torch.randn(1, 32, 1, 128, dtype=torch.float16, device="cuda")
    k, v = (torch.randn(1, 8, 64, 128, dtype=torch.float16, device="cuda") for _ in range(2))
    lens = torch.full((1,), 64, dtype=torch.int32, device="cuda")
    misuse = [("fp32 q", (q.float(), k, v, lens)), ("KV heads not dividing", (q, k[:, :3], v[:, :3], lens)),
              ("17 query rows", (q.repeat(1, 1, 17, 1), k, v, lens)), ("lens of 2", (q, k, v, lens.repeat(2))),
              ("CPU cache", (q, k.cpu(), v.cpu(), lens)), ("float lens", (q, k, v, lens.float())),
              ("v of another length", (q, k, v[:, :, :3], lens))]
    return (lambda: fn(q, k, v, lens)), (lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1),
                                                                               v.repeat_interleave(4, 1))), misuse


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lines, rows, failed = [], [], 0
    q, k, v = (torch.randn(1, 1, 64, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    yard = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731

    def record(name, ours, theirs, theirs_name):
        print(f"timing: {name}", file=sys.stderr, flush=True)
        g_o, e_o = graph_us(ours), eager_us(ours)
        g_t, e_t = graph_us(theirs), eager_us(theirs)
        rows.append({"op": name, "ours_kernel_us": g_o, "ours_eager_us": e_o, "ours_overhead_us": e_o - g_o,
                     "torch": theirs_name, "torch_kernel_us": g_t, "torch_eager_us": e_t,
                     "torch_overhead_us": e_t - g_t})

    fns = {name: evoengineer.load(path) for name, path in ELITES.items()}
    call, misuse = msda_case(fns["msda"])
    record("msda fp16 Lq=10", call, yard, "torch SDPA (1,1,64,64)")
    lines += [refused(f"msda: {n}", fns["msda"], *a) for n, a in misuse]
    for shape in ((2, 8, 512, 64), (1, 1, 64, 64)):
        call, theirs, misuse = sdpa_case(fns["sdpa"], shape)
        record(f"sdpa fp16 {shape}", call, theirs, f"torch SDPA {shape}")
    lines += [refused(f"sdpa: {n}", fns["sdpa"], *a) for n, a in misuse]
    call, theirs, misuse = decode_case(fns["decode"])
    record("decode fp16 (1,32,8,1,64,128)", call, theirs, "torch SDPA GQA (expanded K/V)")
    lines += [refused(f"decode: {n}", fns["decode"], *a) for n, a in misuse]
    if len(sys.argv) > 3:
        fn = evoengineer.load(sys.argv[2], family=sys.argv[3])
        x = torch.randn(128, 4096, dtype=torch.float16, device="cuda")
        w = torch.ones(4096, dtype=torch.float16, device="cuda")
        record("rmsnorm (128, 4096)", lambda: fn(x, w, 1e-6),
               lambda: F.rms_norm(x, (4096,), w, 1e-6), "torch F.rms_norm")
        lines += [refused(f"rmsnorm: {n}", fn, *a) for n, a in [
            ("fp32 x", (x.float(), w, 1e-6)), ("hidden 1024", (x[:, :1024].contiguous(), w[:1024], 1e-6)),
            ("weight too short", (x, w[:100], 1e-6)), ("CPU x", (x.cpu(), w, 1e-6)), ("eps str", (x, w, "e")),
            ("1-D x", (x[0], w, 1e-6))]]
    failed = sum(1 for ln in lines if ln.startswith("FAIL"))
    table = ["| op | ours: kernel us | ours: eager us/call | ours: overhead us | torch op | torch: kernel us | "
             "torch: eager us/call | torch: overhead us |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['op']} | {r['ours_kernel_us']:.1f} | {r['ours_eager_us']:.1f} | "
                     f"{r['ours_overhead_us']:.1f} | {r['torch']} | {r['torch_kernel_us']:.1f} | "
                     f"{r['torch_eager_us']:.1f} | {r['torch_overhead_us']:.1f} |")
    text = "\n".join(table + [""] + lines) + f"\n\nmisuse refused: {len(lines) - failed}/{len(lines)}\n"
    print(text)
    (out / "op_overhead.md").write_text(text)
    (out / "op_overhead.json").write_text(json.dumps({"rows": rows, "misuse": lines}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
