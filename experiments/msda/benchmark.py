"""MSDA benchmark on a GPU host: elites against the classic kernel, the PyTorch reference and the branch-free gather
floor, in one process.

    python experiments/msda/benchmark.py --elite elite_fp16.json [--elite-fp32 elite_fp32.json] [--repeats 100]

Per shape (encoder N=1, encoder N=2, decoder) and value dtype (fp16, fp32):
- the rank-1 elite and, when elite.json holds per-shape elites (`shape_elites`), the one for that shape (the encoder's
  for encoder N=2), each as p50 and x classic;
- the rank-1 kernel with HEAD_MAJOR, and with HEAD_MAJOR + PAIR_LOADS, twice each: as searched (value [N, S, M, D],
  the layout copy timed with the kernel) and on value that is already head-major (`forward_head_major`: what a model
  gets that writes value so from its value projection); the difference is the layout copy's cost;
- the branch-free gather floor (experiments/msda/gather_floor.py: every sample's 4 corner rows from precomputed
  metadata, no coordinate math) and the elite's time over it; corner rows read per output row (in-map rows) and
  time per million in-map rows;
- ATTENTION = "logits": the elite's configuration built with the fused softmax on logits, against torch.softmax
  followed by the elite on the weights.
Timing: CUDA events per call, L2 flushed before every call, median of --repeats; all rows of one dtype in one
process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evoengineer import space_file  # noqa: E402
from evoengineer.candidate import CandidateFactory, fixed_candidate  # noqa: E402
from evoengineer.compiler.builder import Builder  # noqa: E402
from evoengineer.compiler.steps import load_module  # noqa: E402
from evoengineer.evaluators.timing import time_callable  # noqa: E402
from evoengineer.space import SearchSpace, load_space  # noqa: E402
from evoengineer.families import get_task  # noqa: E402
from evoengineer.families.msda.task import DECODER, ENCODER, INPUT_KEYS, MSDAShape  # noqa: E402

SHAPES = [ENCODER, MSDAShape("encoder_n2", N=2, Lq=ENCODER.Lq, M=8, D=32, P=4, levels=ENCODER.levels, ref="pixels"),
          DECODER]
#: which timed shape's per-shape elite serves a benchmark shape
SHAPE_ELITE_FOR = {"encoder": "encoder", "encoder_n2": "encoder", "decoder": "decoder"}


def logits_space(space: SearchSpace) -> SearchSpace:
    """The same space with the signature option ATTENTION = "logits"."""
    text = space.text.replace(f'VALUE_DTYPE = "{space.signature["VALUE_DTYPE"]}"',
                              f'VALUE_DTYPE = "{space.signature["VALUE_DTYPE"]}"\nATTENTION = "logits"', 1)
    return SearchSpace.from_text(text, space.path)


def build_all(space: SearchSpace, configs: dict[str, dict], cache: Path, optional: tuple[str, ...] = ()
              ) -> dict[str, object]:
    """Modules by label: the named configurations of `space` and its classic kernel, built in parallel (an
    `optional` one that fails, e.g. at the ptxas gate, is left out and said so)."""
    task = get_task(space)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(), cache_dir=cache)
    factory = CandidateFactory(space)
    try:
        futures = {label: b.submit(factory.make(params)) for label, params in configs.items()}
        classic = "cuda/msda_classic.cu.j2"
        futures["classic"] = b.submit(fixed_candidate(space, classic, "classic", task.template_path(classic)))
        results = {label: f.result() for label, f in futures.items()}
    finally:
        b.close()
    bad = {k: f"{r.status}: {r.reason}" for k, r in results.items() if r.status != "ok"}
    for k in [k for k in bad if k in optional]:
        print(f"{space.name}: {k} left out ({bad.pop(k)[:160]})", flush=True)
        del results[k]
    if bad:
        raise SystemExit(f"build failed: {bad}")
    return {k: load_module(r.so, r.module) for k, r in results.items()}


def timer(repeats: int):
    return lambda fn: time_callable(fn, device="cuda", warmup=10, repeats=repeats, flush_l2=True)["p50"]


def bench_dtype(dtype_name: str, doc: dict, a) -> list[dict]:
    space = load_space(space_file(f"cuda_msda_{'fp16' if dtype_name == 'float16' else 'fp32'}.toml"))
    task = get_task(space)
    rank1 = doc["elites"][0]["params"]
    per_shape = {e["shape"]: e["params"] for e in doc.get("shape_elites", [])}
    configs = {"rank1": rank1, **{f"shape:{k}": v for k, v in per_shape.items()}}
    # the layout gene on the rank-1 kernel, and corner-pair loads on it (plain corners, fp32 sums), each at fewer
    # blocks per SM where it does not fit the registers otherwise
    variants = {"head_major": {"HEAD_MAJOR": True},
                "pairs": {"HEAD_MAJOR": True, "PAIR_LOADS": True, "HALF2": False, "BRANCH_FREE": False}}
    tries = {}
    for name, change in variants.items():
        if rank1.get("HEAD_MAJOR"):
            continue
        for b in sorted({rank1["MIN_BLOCKS_PER_SM"], 2, 1}, reverse=True):
            tries.setdefault(name, []).append(f"{name}@{b}")
            configs[f"{name}@{b}"] = {**rank1, **change, "MIN_BLOCKS_PER_SM": b}
    configs = {k: v for k, v in configs.items() if not space.violated(v)}
    mods = build_all(space, configs, Path(a.cache_dir), optional=tuple(x for t in tries.values() for x in t))
    for name, labels in tries.items():  # the first that built
        for label in labels:
            if label in mods:
                mods[name], configs[name] = mods[label], configs[label]
                break
    lspace = logits_space(space)
    ltask = get_task(lspace)
    lmods = build_all(lspace, {"rank1": rank1}, Path(a.cache_dir))
    t = timer(a.repeats)
    rows = []
    for shape in SHAPES:
        inputs = task.make_inputs(shape, seed=1234)
        want = task.reference(inputs)
        items = shape.N * shape.Lq * shape.M
        out = task.new_output(inputs)

        def run(mod, inp=inputs, o=out, head_major=False):
            args = [inp[k] for k in INPUT_KEYS]
            fn = mod.forward_head_major if head_major else mod.forward
            return lambda: fn(*args, o)

        def err_of(fn):
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            return float((out.double() - want).abs().max())

        row = {"shape": shape.name, "dtype": dtype_name, "N": shape.N, "Lq": shape.Lq, "items": items}
        row["classic_us"] = t(run(mods["classic"]))
        row["reference_us"] = t(lambda: task.baselines()["reference"](inputs))
        kernels = [("rank1", "rank1", rank1)]
        key = f"shape:{SHAPE_ELITE_FOR[shape.name]}"
        if key in mods:
            kernels.append(("shape", key, per_shape[SHAPE_ELITE_FOR[shape.name]]))
        for name in ("head_major", "pairs"):
            if name in mods:
                kernels.append((name, name, configs[name]))
        for label, mkey, params in kernels:
            mod = mods[mkey]
            row[f"{label}_us"] = t(run(mod))
            row[f"{label}_err"] = err_of(run(mod))
            row[f"{label}_x_classic"] = row["classic_us"] / row[f"{label}_us"]
            row[f"{label}_params"] = params
            if params.get("HEAD_MAJOR"):
                hm = {**inputs, "value": inputs["value"].transpose(1, 2).contiguous()}
                row[f"{label}_head_major_input_us"] = t(run(mod, hm, head_major=True))
                row[f"{label}_layout_copy_us"] = row[f"{label}_us"] - row[f"{label}_head_major_input_us"]
        # the floor: every sample's 4 corner rows from precomputed metadata
        if not a.no_floor:
            from experiments.msda.gather_floor import VARIANTS, GatherFloor

            floor_t = {}
            for vec, per_block in VARIANTS[task.value_dtype]:  # the floor at its best launch setting
                floor = GatherFloor(inputs, task.value_dtype, Path(a.cache_dir), vec=vec, items_per_block=per_block)
                floor_t[(vec, per_block)] = t(lambda: floor.run(out))
            setting = min(floor_t, key=floor_t.get)
            row["floor_us"], row["floor_setting"] = floor_t[setting], list(setting)
            out.fill_(float("nan"))
            floor.run(out)
            torch.cuda.synchronize()
            row["floor_err"] = float((out.double() - want).abs().max())
            row["rows_read"] = floor.rows_read
            row["in_map_rows"] = floor.in_map_rows
            row["in_map_rows_per_output"] = floor.in_map_rows / items
            best = min(row.get("shape_us", float("inf")), row["rank1_us"])
            row["best_over_floor"] = best / row["floor_us"]
            row["best_us_per_m_rows"] = best / (floor.in_map_rows / 1e6)
            row["floor_us_per_m_rows"] = row["floor_us"] / (floor.rows_read / 1e6)
            del floor
        # fused softmax of logits vs softmax + the elite
        linputs = ltask.make_inputs(shape, seed=1234)
        lwant = ltask.reference(linputs)
        lout = ltask.new_output(linputs)
        row["logits_fused_us"] = t(run(lmods["rank1"], linputs, lout))
        lout.fill_(float("nan"))
        run(lmods["rank1"], linputs, lout)()
        torch.cuda.synchronize()
        row["logits_fused_err"] = float((lout.double() - lwant).abs().max())
        a_shape = linputs["attention_weights"].shape

        def unfused():
            w = torch.softmax(linputs["attention_weights"].flatten(-2), dim=-1).view(a_shape)
            mods["rank1"].forward(*(linputs[k] for k in INPUT_KEYS[:4]), w, lout)

        row["logits_unfused_us"] = t(unfused)
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                          if not k.endswith("params")}), flush=True)
        del inputs, out, want, linputs, lout, lwant
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'shape':<11}{'dtype':<8}{'rank1 us':>9}{'shape us':>9}{'classic':>9}{'x classic':>10}{'floor us':>9}"
            f"{'best/floor':>11}{'rows/out':>9}{'us/Mrow':>8}{'HM us':>7}{'HM-in us':>9}{'copy us':>8}"
            f"{'pairs-in':>9}{'fused':>7}{'unfused':>8}")
    print(head)
    for r in rows:
        best = min(r.get("shape_us", float("inf")), r["rank1_us"])
        hm = r.get("head_major_head_major_input_us")
        cp = r.get("head_major_layout_copy_us")
        f = lambda v, w, p=1: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
        print(f"{r['shape']:<11}{r['dtype']:<8}{f(r['rank1_us'], 9)}{f(r.get('shape_us'), 9)}{f(r['classic_us'], 9)}"
              f"{f(r['classic_us'] / best, 10, 2)}{f(r.get('floor_us'), 9)}{f(r.get('best_over_floor'), 11, 2)}"
              f"{f(r.get('in_map_rows_per_output'), 9)}{f(r.get('best_us_per_m_rows'), 8, 2)}"
              f"{f(r.get('head_major_us'), 7)}{f(hm, 9)}{f(cp, 8)}{f(r.get('pairs_head_major_input_us'), 9)}"
              f"{f(r['logits_fused_us'], 7)}{f(r['logits_unfused_us'], 8)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elite", required=True, help="elite.json of the fp16 CUDA MSDA space")
    ap.add_argument("--elite-fp32", help="elite.json of the fp32 space (default: the fp16 elites' params)")
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--no-floor", action="store_true", help="skip the gather-floor rows")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    docs = {"float16": json.loads(Path(a.elite).read_text())}
    docs["float32"] = json.loads(Path(a.elite_fp32).read_text()) if a.elite_fp32 else docs["float16"]
    print(f"device {torch.cuda.get_device_name()} | L2 flushed before every call | median of {a.repeats}")
    rows = []
    for dtype_name in a.dtypes.split(","):
        rows += bench_dtype(dtype_name, docs[dtype_name], a)
    print_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
