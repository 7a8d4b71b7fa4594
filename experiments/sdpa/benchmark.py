"""SDPA benchmark on a GPU host: the GA elite against every torch SDPA backend, in one process.

    python experiments/sdpa/benchmark.py --elite elite.json [--elite-fp8 elite_fp8.json] [--repeats 50] [--json F]
    python experiments/sdpa/benchmark.py --elite elite.json --revalidate [--runs 500] [--json F]
    python experiments/sdpa/benchmark.py --grid --kernel NAME=elite.json[@SPACE] [--kernel ...] [--json F]
    python experiments/sdpa/benchmark.py --grid --config experiments/sdpa/grid.toml --table d64 [--json F]

Default mode, per shape (B, H, S, D = 64; fp16 non-causal and causal, plus FP8 KV at the mission shape when
--elite-fp8 is given): the elite's output is first compared with torch SDPA (max abs err; FP8 KV: fp16 SDPA on the
unquantized K/V), then kernel-only times: a CUDA graph of --graph-calls back-to-back calls is replayed --repeats
times under CUDA events, per-call time = median replay / calls (L2 warm: the same inputs every call). Each torch
backend (cuDNN, flash = FA2, memory-efficient) is timed the same way under `sdpa_kernel`; one that refuses the inputs
is skipped with the reason. Also: which backend the default dispatch picks, and a per-call wall time of the elite and
of default SDPA from Python (includes launch overhead).

--grid: the issue-13 table. Every --kernel (rank 1 of its elite.json; the head dim comes from its space) on every
shape of GRID_SHAPES with its head dim, causal and not, next to cuDNN, flash (FA2) and memory-efficient, all in this
process on the same inputs, kernel-only (CUDA graph replay as above, L2 warm); per kernel: us, TFLOPS, x cuDNN, and the
max abs error against torch SDPA. An elite.json of a space timing several shapes adds each shape's winner
(shape_elites) as NAME/SHAPE. A kernel given as NAME=elite.json@SPACE is the elite's genes rendered in SPACE (the
bf16 twin of an fp16 space, say); bf16 kernels get rows of their own, bf16 inputs against the bf16 backends. An FP8
attention kernel (sdpa_hopper_fp8_*) runs on the same draws quantized per head (e4m3 Q/K/V), against cuDNN on the
fp16 originals: x cuDNN is then the FP8 kernel against fp16 cuDNN. The best
kernel of each row is named with its ratio to cuDNN. --config FILE --table NAME adds the kernels of one table of a
TOML file (grid.toml: [[NAME.kernel]] entries of name, space and genes), before any --kernel.

--revalidate: the K elites of elite.json re-timed on the space's timed shapes with --runs timed calls each (CUDA
events, L2 flushed before every call: evoengineer.evaluators.timing.time_callable), p50/p90/p99 next to the
time_us recorded by the search.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from evoengineer import space_file  # noqa: E402
from evoengineer.compiler.builder import Builder  # noqa: E402
from evoengineer.compiler.steps import load_module  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.evaluators.timing import time_callable  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.families import get_task  # noqa: E402
from evoengineer.families.sdpa.task import SDPAShape, sdpa_fp16_original  # noqa: E402
from experiments.gpu_timing import first_line, graph_us, wall_us  # noqa: E402

#: (B, H, S, D): the mission shape, its ragged twin, then two larger ones.
SHAPES = [(2, 8, 512, 64), (2, 8, 500, 64), (16, 16, 1024, 64), (4, 16, 4096, 64)]
FP8_SHAPES = [(2, 8, 512, 64)]
#: (B, H, S, D) of the --grid table (issue 13): mission, ragged mission, two large d64, three d128.
GRID_SHAPES = [(2, 8, 512, 64), (2, 8, 500, 64), (16, 16, 1024, 64), (4, 16, 4096, 64), (4, 16, 4096, 128),
               (16, 16, 1024, 128), (2, 8, 512, 128)]
#: Hopper genes added after earlier elites were recorded, at the values that keep those kernels as they were
LATER_GENES = {"RESCALE": "always", "POLY_EXP2": 0, "DESC_OFFSETS": False, "SCHEDULER": "static"}


def with_later_genes(space, params: dict) -> dict:
    """`params` (an elite's or a genome file's) plus the genes `space` gained after they were written, at the values
    that render the kernel they named."""
    return {**{g: v for g, v in LATER_GENES.items() if g in space.names}, **params}
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def config_kernels(path: str, table: str) -> list[tuple[str, object, dict]]:
    """(name, space, genes) of every kernel of `table` in a TOML config (grid.toml): [[TABLE.kernel]] entries with
    `name`, `space` (a shipped space's name or a .toml file) and `genes` (recorded genes: `build` adds the genes the
    space gained since, `with_later_genes`)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    doc = tomllib.loads(Path(path).read_text())
    if table not in doc:
        raise SystemExit(f"{path}: no table {table!r} (tables: {', '.join(doc)})")
    out = []
    for k in doc[table].get("kernel", []):
        name = k["space"]
        out.append((k["name"], load_space(Path(name) if name.endswith(".toml") else space_file(f"{name}.toml")),
                    dict(k["genes"])))
    if not out:
        raise SystemExit(f"{path}: table {table!r} names no kernel")
    return out


def config_kernel(spec: str) -> tuple[object, dict]:
    """FILE:TABLE/NAME -> (space, genes) of that kernel of a config."""
    path, _, rest = spec.rpartition(":")
    table, _, name = rest.partition("/")
    for kname, space, genes in config_kernels(path, table):
        if kname == name:
            return space, genes
    raise SystemExit(f"{path}: table {table!r} has no kernel {name!r}")


def load_doc(path: str) -> tuple[dict, object]:
    """An elite.json and its space (the shipped one of that name, else the recorded space_file)."""
    doc = json.loads(Path(path).read_text())
    shipped = space_file(f"{doc['space']}.toml")
    space = load_space(shipped if shipped.exists() else doc["space_file"])
    return doc, space


def elite_params(doc: dict, shape: str = "") -> dict:
    """Rank 1's genes of an elite.json, or with `shape` that shape's winner (shape_elites of a several-shape space)."""
    if not shape:
        return doc["elites"][0]["params"]
    for e in doc.get("shape_elites") or []:
        if e["shape"] == shape:
            return e["params"]
    raise SystemExit(f"elite of {doc['space']}: no shape winner {shape!r} "
                     f"(it has {[e['shape'] for e in doc.get('shape_elites') or []]})")


def build(space, params_list: list[dict], cache: Path) -> tuple[object, list]:
    """The task and a loaded module per parameter set (recorded elites and genome files get the genes the space
    gained since: `with_later_genes`); exits naming the first that fails to build."""
    task = get_task(space)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(), cache_dir=cache)
    factory = CandidateFactory(space)
    params_list = [with_later_genes(space, p) for p in params_list]
    try:
        results = [f.result() for f in [b.submit(factory.make(p)) for p in params_list]]
    finally:
        b.close()
    for p, r in zip(params_list, results):
        if r.status != "ok":
            raise SystemExit(f"elite {p} failed to build: {r.status}: {r.reason}")
    return task, [load_module(r.so, r.module) for r in results]


def default_choice(q, k, v, causal: bool) -> str:
    """The backend the default SDPA dispatch picks for these inputs (torch._fused_sdp_choice), or 'unknown'."""
    try:
        choice = SDPBackend(int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal)))
        names = {SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.FLASH_ATTENTION: "flash",
                 SDPBackend.EFFICIENT_ATTENTION: "efficient"}
        return names.get(choice, choice.name.lower())
    except Exception:  # private API: absent or changed
        return "unknown"


def bench_shape(task, module, dims: tuple, causal: bool, kind: str, a) -> dict:
    B, H, S, D = dims
    shape = SDPAShape(f"b{B}h{H}s{S}", B=B, H=H, Sq=S, Sk=S, causal=causal)
    inputs = task.make_inputs(shape, seed=1234)
    q, causal_t = inputs["q"], inputs["causal"]
    k, v = inputs.get("k_orig", inputs["k"]), inputs.get("v_orig", inputs["v"])  # what SDPA runs on
    out = task.new_output(inputs)
    task.launch(module, inputs, out)
    torch.cuda.synchronize()
    want = sdpa_fp16_original(inputs)
    row = {"shape": [B, H, S, D], "causal": causal, "kind": kind, "tflop": task.flops(shape) / 1e12,
           "max_abs_err": float((out.double() - want.double()).abs().max()),
           "default_backend": default_choice(q, k, v, bool(causal_t)), "backends_us": {}, "refused": {}}
    try:
        row["elite_us"] = graph_us(lambda: task.launch(module, inputs, out), a.graph_calls, a.repeats)
        row["elite_timing"] = "graph"
    except RuntimeError as exc:  # not capturable: CUDA events around single calls instead (says so in the table)
        row["elite_timing"] = f"events, graph capture failed: {first_line(exc)}"
        row["elite_us"] = time_callable(lambda: task.launch(module, inputs, out), device="cuda", warmup=20,
                                        repeats=a.repeats * a.graph_calls, flush_l2=False)["p50"]
    for name, backend in BACKENDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch.cuda.synchronize()
                    row["backends_us"][name] = graph_us(
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), a.graph_calls, a.repeats)
            except RuntimeError as exc:  # the backend refuses these inputs; its warnings say why
                why = [first_line(w.message) for w in caught if "because" in str(w.message) or "not" in str(w.message)]
                row["refused"][name] = "; ".join([first_line(exc), *why[:2]])
    row["elite_py_us"] = wall_us(lambda: task.launch(module, inputs, out))
    row["sdpa_py_us"] = wall_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    if row["backends_us"]:
        best = min(row["backends_us"], key=row["backends_us"].get)
        row.update(best_backend=best, best_us=row["backends_us"][best],
                   speedup_vs_best=row["backends_us"][best] / row["elite_us"],
                   best_tflops=row["tflop"] / (row["backends_us"][best] * 1e-6))
    if "flash" in row["backends_us"]:
        row["speedup_vs_fa2"] = row["backends_us"]["flash"] / row["elite_us"]
    row["elite_tflops"] = row["tflop"] / (row["elite_us"] * 1e-6)
    del inputs, out, want
    torch.cuda.empty_cache()
    return row


def print_rows(rows: list[dict]) -> None:
    def us(x):
        return f"{x:9.1f}" if x is not None else f"{'-':>9}"

    def num(x, fmt):
        return format(x, fmt) if x is not None else "-"

    head = (f"{'kind':<6}{'B,H,S,D':<16}{'causal':<8}{'elite us':>9}" + "".join(f"{n + ' us':>13}" for n in BACKENDS)
            + f"{'x best':>8}{'x FA2':>7}{'elite TF':>10}{'best TF':>9}{'max err':>9}  default  "
            "per-call (Python, includes launch overhead): elite / sdpa us")
    print(head)
    for r in rows:
        b = r["backends_us"]
        print(f"{r['kind']:<6}{','.join(map(str, r['shape'])):<16}{str(r['causal']):<8}{us(r['elite_us'])}"
              + "".join(f"{us(b.get(n)):>13}" for n in BACKENDS)
              + f"{num(r.get('speedup_vs_best'), '.2f'):>8}{num(r.get('speedup_vs_fa2'), '.2f'):>7}"
                f"{r['elite_tflops']:>10.1f}{num(r.get('best_tflops'), '.1f'):>9}{r['max_abs_err']:>9.1e}  "
                f"{r['default_backend']:<9}{r['elite_py_us']:.1f} / {r['sdpa_py_us']:.1f}")
        if r["elite_timing"] != "graph":
            print(f"      elite timed by {r['elite_timing']}")
        for n, why in r["refused"].items():
            print(f"      {n} refused: {why}")


def revalidate(doc: dict, space, a) -> list[dict]:
    """Re-time the K elites on the space's timed shapes: a.runs calls each, L2 flushed, p50/p90/p99."""
    elites = doc["elites"]
    task, modules = build(space, [e["params"] for e in elites], Path(a.cache_dir))
    timed = [e for e in task.entries if e.time]
    print(f"revalidate {doc['space']}: K={len(elites)} elites, {a.runs} timed calls each per shape "
          f"({', '.join(e.name for e in timed)}), CUDA events, L2 flushed before every call")
    print(f"{'rank':<6}{'recorded us':>12}{'p50 us':>9}{'p90 us':>9}{'p99 us':>9}{'p50/rec':>9}{'max err':>10}  params")
    rows = []
    for e, module in zip(elites, modules):
        p = {"p50": 0.0, "p90": 0.0, "p99": 0.0}
        err = 0.0
        for entry in timed:
            inputs = task.make_inputs(entry.shape, seed=4321)
            out = task.new_output(inputs)
            task.launch(module, inputs, out)
            torch.cuda.synchronize()
            err = max(err, float((out.double() - task.reference(inputs)).abs().max()))
            t = time_callable(lambda: task.launch(module, inputs, out), device="cuda", warmup=20, repeats=a.runs,
                              flush_l2=True)
            for q in p:
                p[q] += t[q]
        rec = e["metrics"]["time_us"]
        rows.append({"rank": e["rank"], "params": e["params"], "recorded_time_us": rec, "p50_us": p["p50"],
                     "p90_us": p["p90"], "p99_us": p["p99"], "max_abs_err": err, "runs": a.runs})
        print(f"{e['rank']:<6}{rec:>12.2f}{p['p50']:>9.2f}{p['p90']:>9.2f}{p['p99']:>9.2f}{p['p50'] / rec:>9.3f}"
              f"{err:>10.1e}  {json.dumps(e['params'], separators=(',', ':'))}")
    return rows


def grid(a) -> list[dict]:
    """Every --kernel on every GRID_SHAPES row of its head dim, causal and not, next to the torch backends. Rows come
    per input dtype: fp16 (the fp16 kernels; FP8 kernels on the same draws quantized, against the fp16 backends) and
    bf16 (the bf16 kernels, against the bf16 backends)."""
    kernels = []  # (name, head dim, dtype of the row, task, module, params)
    groups: list[tuple[object, list]] = []  # the config's kernels, runs of one space built together
    for name, space, params in (config_kernels(a.config, a.table) if a.config else []):
        if groups and groups[-1][0].name == space.name:
            groups[-1][1].append((name, params))
        else:
            groups.append((space, [(name, params)]))
    for space, picks in groups:
        task, modules = build(space, [p for _, p in picks], Path(a.cache_dir))
        row_dtype = torch.float16 if task.fp8 else task.q_dtype
        for (kname, params), module in zip(picks, modules):
            kernels.append((kname, space.signature["HEAD_DIM"], row_dtype, task, module, params))
            print(f"kernel {kname}: {space.name} (from {a.config}) {json.dumps(params, separators=(',', ':'))}")
    for spec in a.kernel:
        name, _, path = spec.partition("=")
        path, _, space_name = path.partition("@")
        if not path:
            raise SystemExit(f"--kernel {spec!r}: expected NAME=elite.json[@SPACE]")
        doc, space = load_doc(path)
        if space_name:  # the elite's genes rendered in another space of the family (a bf16 twin, say)
            space = load_space(space_file(f"{space_name}.toml"))
        # rank 1, and for a space timing several shapes each shape's winner (shape_elites) as NAME/SHAPE
        picks = [(name, elite_params(doc))]
        for e in doc.get("shape_elites") or []:
            if all(e["params"] != p for _, p in picks):
                picks.append((f"{name}/{e['shape']}", e["params"]))
        task, modules = build(space, [p for _, p in picks], Path(a.cache_dir))
        row_dtype = torch.float16 if task.fp8 else task.q_dtype
        for (kname, params), module in zip(picks, modules):
            kernels.append((kname, space.signature["HEAD_DIM"], row_dtype, task, module, params))
            print(f"kernel {kname}: {space.name} (from {doc['space']}) {json.dumps(params, separators=(',', ':'))}")
    print(f"kernel-only: CUDA graph of {a.graph_calls} back-to-back calls, median of {a.repeats} replays / "
          f"{a.graph_calls}, L2 warm (same inputs every call); x = cuDNN time / kernel time")
    rows = []
    dtypes = [d for d in (torch.float16, torch.bfloat16) if any(k[2] == d for k in kernels)]
    for dtype in dtypes:
        for B, H, S, D in GRID_SHAPES:
            mine = [k for k in kernels if k[1] == D and k[2] == dtype]
            if not mine:
                continue
            for causal in (False, True):
                rows.append(grid_row(a, mine, (B, H, S, D), causal, dtype))
                torch.cuda.empty_cache()
    names = [k[0] for k in kernels]
    print(f"{'dtype':<6}{'B,H,S,D':<16}{'causal':<7}" + "".join(f"{n + ' us':>12}" for n in BACKENDS)
          + "".join(f"{n + ' us':>16}{'TF':>6}{'x cuDNN':>8}" for n in names) + "  best")
    for r in rows:
        b = r["backends_us"]
        line = f"{r['dtype']:<6}{','.join(map(str, r['shape'])):<16}{str(r['causal']):<7}" + "".join(
            f"{b[n]:>12.1f}" if n in b else f"{'-':>12}" for n in BACKENDS)
        for n in names:
            k = r["kernels"].get(n)
            line += (f"{k['us']:>16.1f}{k['tflops']:>6.0f}{k.get('x_cudnn', float('nan')):>8.2f}" if k
                     else f"{'':>16}{'':>6}{'':>8}")
        kb = r["kernels"][r["best"]]
        print(line + f"  {r['best']} {kb.get('x_cudnn', float('nan')):.2f}x (err {kb['max_abs_err']:.1e})")
        for n, why in r["refused"].items():
            print(f"      {n} refused: {why}")
    return rows


def grid_row(a, mine: list, dims: tuple, causal: bool, dtype: torch.dtype) -> dict:
    """One row of the grid: the torch backends and every kernel of `mine` on one set of inputs."""
    B, H, S, D = dims
    shape = SDPAShape(f"b{B}h{H}s{S}d{D}", B=B, H=H, Sq=S, Sk=S, causal=causal)
    # 16-bit inputs for the torch backends (a 16-bit kernel's own); an FP8 kernel gets the same draws quantized (its
    # task's make_inputs with the same seed: q_orig / k_orig / v_orig are these tensors)
    fp8_inputs = {}  # FP8 kernels' draws by task (a row of FP8 kernels only takes its 16-bit inputs from the first's)
    task0 = next((k[3] for k in mine if not k[3].fp8), None)
    if task0 is None:
        drawn = fp8_inputs[id(mine[0][3])] = mine[0][3].make_inputs(shape, seed=1234)
        inputs = {"q": drawn["q_orig"], "k": drawn["k_orig"], "v": drawn["v_orig"], "causal": drawn["causal"]}
    else:
        inputs = task0.make_inputs(shape, seed=1234)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal).double()
    row = {"dtype": {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype],
           "shape": [B, H, S, D], "causal": causal, "tflop": mine[0][3].flops(shape) / 1e12, "backends_us": {},
           "refused": {}, "kernels": {}}
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                row["backends_us"][name] = graph_us(
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), a.graph_calls, a.repeats)
        except RuntimeError as exc:
            row["refused"][name] = first_line(exc)
    for name, _, _, task, module, _ in mine:
        if task.fp8 and id(task) not in fp8_inputs:
            fp8_inputs[id(task)] = task.make_inputs(shape, seed=1234)
        kin = fp8_inputs[id(task)] if task.fp8 else inputs
        out = task.new_output(kin)
        task.launch(module, kin, out)
        torch.cuda.synchronize()
        us = graph_us(lambda: task.launch(module, kin, out), a.graph_calls, a.repeats)
        row["kernels"][name] = {"us": us, "tflops": row["tflop"] / (us * 1e-6),
                                "max_abs_err": float((out.double() - want).abs().max())}
        if "cudnn" in row["backends_us"]:
            row["kernels"][name]["x_cudnn"] = row["backends_us"]["cudnn"] / us
        del out, kin
    del fp8_inputs
    row["best"] = min(row["kernels"], key=lambda n: row["kernels"][n]["us"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elite", help="elite.json of sdpa_fp16_d64 (or another D = 64 fp16 space)")
    ap.add_argument("--grid", action="store_true", help="the issue-13 table over GRID_SHAPES (needs --kernel)")
    ap.add_argument("--kernel", action="append", default=[],
                    help="--grid: NAME=elite.json or NAME=elite.json@SPACE (repeatable)")
    ap.add_argument("--config", help="--grid: a TOML file of kernel tables (grid.toml)")
    ap.add_argument("--table", help="--grid: the table of --config")
    ap.add_argument("--elite-fp8", help="elite.json of sdpa_fp8kv_d64: adds FP8-KV rows")
    ap.add_argument("--repeats", type=int, default=50, help="graph replays per measurement (default 50)")
    ap.add_argument("--graph-calls", type=int, default=20, help="calls captured in one graph (default 20)")
    ap.add_argument("--revalidate", action="store_true", help="re-time the K elites of --elite instead")
    ap.add_argument("--runs", type=int, default=500, help="--revalidate: timed calls per elite (default 500)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    if (a.config or a.table) and not a.grid:
        ap.error("--config and --table are for --grid")
    if a.grid:
        if bool(a.config) != bool(a.table):
            ap.error("--config and --table go together")
        if not a.kernel and not a.config:
            ap.error("--grid needs --config FILE --table NAME or at least one --kernel NAME=elite.json")
        print(f"device {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN "
              f"{torch.backends.cudnn.version()}")
        rows = grid(a)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=2))
        return 0
    if not a.elite:
        ap.error("--elite is required (or --grid with --kernel)")
    doc, space = load_doc(a.elite)
    print(f"device {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN "
          f"{torch.backends.cudnn.version()} | elite {doc['space']} rank 1 {json.dumps(doc['elites'][0]['params'])}")
    if a.revalidate:
        rows = revalidate(doc, space, a)
    else:
        print(f"kernel-only: CUDA graph of {a.graph_calls} back-to-back calls, median of {a.repeats} replays / "
              f"{a.graph_calls}, L2 warm (same inputs every call)")
        task, (module,) = build(space, [doc["elites"][0]["params"]], Path(a.cache_dir))
        rows = [bench_shape(task, module, dims, causal, "fp16", a) for dims in SHAPES for causal in (False, True)]
        if a.elite_fp8:
            doc8, space8 = load_doc(a.elite_fp8)
            print(f"fp8 elite {doc8['space']} rank 1 {json.dumps(doc8['elites'][0]['params'])}; FP8 rows: backends "
                  "run fp16 on the unquantized K/V, max err against that")
            task8, (module8,) = build(space8, [doc8["elites"][0]["params"]], Path(a.cache_dir))
            rows += [bench_shape(task8, module8, dims, False, "fp8kv", a) for dims in FP8_SHAPES]
        print_rows(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
