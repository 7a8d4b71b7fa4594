"""Decode-attention benchmark on a GPU host (issue 16): kernels of the decode family against every torch SDPA backend
and against the read bandwidth of the same GPU, all in one process.

    python experiments/decode/benchmark.py --kernel fp16=elite_fp16.json --kernel fp8=elite_fp8.json \
        [--kernel fp8_d64=elite_fp8_d64.json] [--shapes all|decode] [--json F] [--md F]
    python experiments/decode/benchmark.py --kernel x='decode_fp8kv_d128:{"BLOCK_N": 128, ...}' --shapes decode
    python experiments/decode/benchmark.py --kernel fp8=elite_fp8.json --paged 16,64
    python experiments/decode/benchmark.py --config experiments/decode/tables.toml --table final

--config FILE --table NAME: the kernels, shapes and page sizes of one table of a TOML file (tables.toml says how);
--kernel adds kernels to it, --shapes and --paged replace the table's.

A --kernel is LABEL=elite.json (its rank-1 genome and space) or LABEL='SPACE:{params as JSON}' (SPACE: a shipped
space's name or a .toml path). Per shape
(B, Hq, Hkv, Sq, Sk, D) of SHAPES (every sequence holds Sk keys) and per kernel of that head dim:

* torch SDPA on the fp16 q, k, v, per backend (cuDNN, flash = FA2, memory-efficient, math) with GQA two ways:
  `enable_gqa=True` on the [B, Hkv, Sk, D] cache, and K/V expanded to Hq heads beforehand (the expansion not
  timed); a backend that refuses is listed with its reason. "fastest" is the fastest of all of these.
* each kernel on the same q and K/V (FP8 kernels: the K/V quantized per KV head with the task's quantizer);
  its max abs error against the float64 reference of what it was given and, for FP8, against fp16 attention on the
  unquantized K/V (what it replaces).
* the read bandwidth a plain reduction reaches over a 1 GiB fp16 tensor (torch.sum and torch.amax, the better), and
  each kernel's effective bandwidth: the bytes it must move once (K/V + q + out, evoengineer.families.decode.task.min_bytes)
  over its time.

Paged KV (--paged SIZES): every kernel of a contiguous space whose paged twin ships (SPACE_paged.toml) is also built
in that space with the same genes and timed at each page size (label LABEL@pN) on the same shapes, its caches in pages
of random order (the task's paged inputs without shared prefix pages: every sequence reads its own pages, so paged
and contiguous kernels move the same bytes); a kernel of a paged space is timed at each page size. "vs contiguous"
is the contiguous twin's time over the paged kernel's.

Times are kernel-only: a CUDA graph of --graph-calls back-to-back calls replayed --repeats times under CUDA events,
median per call. L2 is not flushed, but every shape's K/V (>= 134 MB) is larger than the 50 MB L2, so each call
streams its cache from HBM.
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
from evoengineer.space import load_space  # noqa: E402
from evoengineer.families.decode.task import DecodeShape, reference  # noqa: E402
from experiments.gpu_timing import build_modules, first_line, graph_us  # noqa: E402

# (B, Hq, Hkv, Sq, Sk, D): the issue's table; the first is the spaces' timed shape
SHAPES = [(8, 32, 8, 1, 8192, 128), (1, 32, 8, 1, 32768, 128), (32, 32, 8, 1, 2048, 128), (8, 32, 8, 4, 8192, 128),
          (8, 16, 16, 1, 4096, 64)]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def parse_kernel(text: str) -> tuple[str, object, dict]:
    """LABEL=elite.json or LABEL=SPACE:{json}: (label, space, params)."""
    label, _, what = text.partition("=")
    if not label or not what:
        raise SystemExit(f"--kernel {text!r}: expected LABEL=elite.json or LABEL='SPACE:{{params}}'")
    if what.endswith(".json") and Path(what).exists():
        doc = json.loads(Path(what).read_text())
        shipped = space_file(f"{doc['space']}.toml")
        space = load_space(shipped if shipped.exists() else doc["space_file"])
        return label, space, dict(doc["elites"][0]["params"])
    name, _, params = what.partition(":")
    space = load_space(Path(name) if name.endswith(".toml") else space_file(f"{name}.toml"))
    return label, space, json.loads(params)


def config_table(path: str, table: str) -> tuple[list[tuple[str, object, dict]], dict]:
    """The kernels (label, space, params) of `table` in a TOML file of tables (tables.toml), and the table."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    doc = tomllib.loads(Path(path).read_text())
    if table not in doc:
        raise SystemExit(f"{path}: no table {table!r} (tables: {', '.join(doc)})")
    t = doc[table]
    common = t.get("genes", {})
    kernels = []
    for label, k in t.get("kernels", {}).items():
        name = k["space"]
        space = load_space(Path(name) if name.endswith(".toml") else space_file(f"{name}.toml"))
        kernels.append((label, space, {**common, **k.get("genes", {})}))
    if not kernels:
        raise SystemExit(f"{path}: table {table!r} names no kernel")
    return kernels, t


def build_all(kernels: list[tuple[str, object, dict]], cache: Path) -> dict[str, tuple]:
    """label -> (task, module, space, params); the builds of one space run in parallel."""
    out, by_space = {}, {}
    for label, space, params in kernels:
        by_space.setdefault(space.name, (space, []))[1].append((label, params))
    for space, items in by_space.values():
        task, built = build_modules(space, [params for _, params in items], cache)
        for (label, params), (_, module, why) in zip(items, built):
            if module is None:
                print(f"{label}: {params} failed to build: {why}", file=sys.stderr)
                continue
            out[label] = (task, module, space, params)
    return out


def read_bandwidth(a) -> dict:
    """GB/s of a plain reduction over a 1 GiB fp16 tensor (the better of sum and amax)."""
    x = torch.randn(1 << 29, device="cuda", dtype=torch.float16)
    res = {}
    for name, fn in (("sum", lambda: torch.sum(x, dtype=torch.float32)), ("amax", lambda: torch.amax(x))):
        us = graph_us(fn, 4, a.repeats, a.settle_s)
        res[name] = {"us": us, "GBps": x.numel() * 2 / us / 1e3}
    del x
    torch.cuda.empty_cache()
    res["best_GBps"] = max(v["GBps"] for v in res.values() if isinstance(v, dict))
    return res


def torch_backends(q, k, v, a) -> tuple[dict, dict]:
    """{backend/gqa|expanded: us} and {...: why refused} for fp16 SDPA on these inputs."""
    G = q.shape[1] // k.shape[1]
    k_exp, v_exp = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    times, refused = {}, {}
    for name, backend in BACKENDS.items():
        for how, fn in (("gqa", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
                        ("expanded", lambda: F.scaled_dot_product_attention(q, k_exp, v_exp))):
            key = f"{name}/{how}"
            try:
                with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
                    warnings.simplefilter("always")
                    times[key] = graph_us(fn, a.graph_calls, a.repeats, a.settle_s)
            except Exception as exc:  # refused for these inputs (or graph capture unsupported)
                why = [first_line(w.message) for w in caught if "because" in str(w.message)]
                refused[key] = "; ".join([first_line(exc), *why[:1]])
    del k_exp, v_exp
    return times, refused


def paged_twins(kernels: list[tuple[str, object, dict]]) -> list[tuple[str, object, dict]]:
    """The paged twin (same genes) of every kernel of a contiguous space that has one."""
    out = []
    for label, space, params in kernels:
        twin = space_file(f"{space.name}_paged.toml")
        if space.signature.get("KV_LAYOUT", "contiguous") == "contiguous" and twin.exists():
            paged = load_space(twin)
            broken = paged.violated(params)
            if broken:  # a gene value the paged space does not search
                print(f"{label}: no paged twin ({space.name}_paged forbids it: {broken[0]})", file=sys.stderr)
                continue
            out.append((f"{label}_paged", paged, params))
    return out


def bench_shape(dims: tuple, built: dict, a) -> dict:
    B, Hq, Hkv, Sq, Sk, D = dims
    row = {"shape": dims, "kernels": {}}
    mine = [(label, v) for label, v in built.items() if v[0].head_dim == D and not getattr(v[0], "paged", False)]
    for label, v in built.items():  # paged kernels: one run per page size
        if v[0].head_dim == D and getattr(v[0], "paged", False):
            mine += [(f"{label.removesuffix('_paged')}@p{ps}", (*v, ps)) for ps in a.page_sizes]
    fp16_inputs = None
    for label, (task, module, space, params, *page) in mine:
        # paged: no prefix pages shared between sequences, so that the paged kernel moves the contiguous one's bytes
        shape = DecodeShape("bench", B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, page_size=page[0] if page else None,
                            shared_prefix=False)
        inputs = task.make_inputs(shape, a.seed)  # same seed: FP8 kernels get this cache quantized
        if fp16_inputs is None or not task.fp8:
            fp16_inputs = {k: inputs.get(f"{k}_orig", inputs[k]) for k in ("q", "k", "v")}
        out = task.new_output(inputs)
        task.launch(module, inputs, out)
        torch.cuda.synchronize()
        ref = reference(inputs).to(out.device)
        rec = {"space": space.name, "params": params, "max_abs_err": float((out.double() - ref).abs().max()),
               "finite": bool(torch.isfinite(out).all())}
        if task.fp8:
            ref16 = task.fp16_attention(inputs).to(out.device)
            rec["max_abs_err_vs_fp16"] = float((out.double() - ref16).abs().max())
            del ref16
        del ref
        rec["us"] = graph_us(lambda: task.launch(module, inputs, out), a.graph_calls, a.repeats, a.settle_s)
        rec["bytes"] = task.min_bytes(shape)
        rec["GBps"] = rec["bytes"] / rec["us"] / 1e3
        if page:
            rec["page_size"] = page[0]
            flat = row["kernels"].get(label.split("@")[0])
            if flat:
                rec["x_contiguous"] = flat["us"] / rec["us"]
        row["kernels"][label] = rec
        del inputs, out
        torch.cuda.empty_cache()
    if fp16_inputs is None:
        return row
    row["torch_us"], row["torch_refused"] = torch_backends(fp16_inputs["q"], fp16_inputs["k"], fp16_inputs["v"], a)
    if row["torch_us"]:
        best = min(row["torch_us"], key=row["torch_us"].get)
        row["fastest"] = {"backend": best, "us": row["torch_us"][best]}
        for rec in row["kernels"].values():
            rec["x_fastest"] = row["fastest"]["us"] / rec["us"]
    del fp16_inputs
    torch.cuda.empty_cache()
    return row


def markdown(doc: dict) -> str:
    bw = doc["read_bandwidth"]["best_GBps"]
    labels = sorted({lab for r in doc["rows"] for lab in r["kernels"]})
    lines = [f"read bandwidth (1 GiB reduction): {bw:.0f} GB/s; times in us, kernel-only (CUDA graph replay); "
             f"x = fastest torch backend / kernel; % = kernel's bytes-moved-once bandwidth / read bandwidth", "",
             "| (B, Hq, Hkv, Sq, Sk, D) | cudnn gqa / exp | flash gqa / exp | efficient gqa / exp | fastest | "
             + " | ".join(f"{lab}: us, x, %bw, err" for lab in labels) + " |",
             "|---" * (5 + len(labels)) + "|"]
    for r in doc["rows"]:
        t = r.get("torch_us", {})
        cells = [str(tuple(r["shape"]))]
        for name in ("cudnn", "flash", "efficient"):
            cells.append(" / ".join(f"{t[f'{name}/{h}']:.1f}" if f"{name}/{h}" in t else "-" for h in ("gqa", "expanded")))
        f = r.get("fastest")
        cells.append(f"{f['backend']} {f['us']:.1f}" if f else "-")
        for lab in labels:
            k = r["kernels"].get(lab)
            if not k:
                cells.append("")
                continue
            err = k.get("max_abs_err_vs_fp16", k["max_abs_err"])
            vs_flat = f", {k['x_contiguous']:.3f}x contiguous" if "x_contiguous" in k else ""
            cells.append(f"{k['us']:.1f}, {k.get('x_fastest', float('nan')):.2f}x, {100 * k['GBps'] / bw:.0f}%, "
                         f"{err:.3g}{vs_flat}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """--shapes: "all", "decode" or B,Hq,Hkv,Sq,Sk,D tuples separated by ';'."""
    if text in ("all", "decode"):
        return SHAPES[:1] if text == "decode" else SHAPES
    shapes = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        try:
            dims = tuple(int(x) for x in item.split(","))
        except ValueError:
            dims = ()
        if len(dims) not in (5, 6) or min(dims) < 1:
            raise SystemExit(f"--shapes {item!r}: expected B,Hq,Hkv,Sq,Sk,D (positive integers)")
        shapes.append(dims if len(dims) == 6 else dims[:3] + (1,) + dims[3:])
    if not shapes:
        raise SystemExit(f"--shapes {text!r}: no shape")
    return shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="a TOML file of tables (tables.toml); needs --table")
    ap.add_argument("--table", help="the table of --config: its kernels, shapes and page sizes")
    ap.add_argument("--kernel", action="append", default=[], help="LABEL=elite.json or LABEL='SPACE:{params}'")
    ap.add_argument("--shapes", default=None,
                    help="all (the issue's table), decode (its first row) or 'B,Hq,Hkv,Sq,Sk,D;...' "
                         "(Sq = 1 may be left out); default: the table's, else all")
    ap.add_argument("--graph-calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settle-s", type=float, default=0.2,
                    help="seconds of graph replays before each timing (0: time at once, as before issue 34's eighth part)")
    ap.add_argument("--paged", default=None, help="page sizes (e.g. 16,64): time the paged twins at each")
    ap.add_argument("--cache-dir", default=str(ROOT / ".evo_cache"))
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    if bool(a.config) != bool(a.table):
        ap.error("--config and --table go together")
    kernels, table = config_table(a.config, a.table) if a.config else ([], {})
    kernels += [parse_kernel(k) for k in a.kernel]
    if not kernels:
        ap.error("no kernel: give --config FILE --table NAME or --kernel")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    a.paged = a.paged if a.paged is not None else str(table.get("paged", ""))
    a.page_sizes = [int(x) for x in a.paged.split(",") if x]
    shapes = parse_shapes(a.shapes or table.get("shapes", "all"))
    if a.page_sizes:
        kernels += paged_twins(kernels)
    elif any(space.signature.get("KV_LAYOUT") == "paged" for _, space, _ in kernels):
        raise SystemExit("a paged kernel needs --paged SIZES")
    built = build_all(kernels, Path(a.cache_dir).absolute())
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "read_bandwidth": read_bandwidth(a),
           "graph_calls": a.graph_calls, "repeats": a.repeats, "settle_s": a.settle_s, "rows": []}
    for dims in shapes:
        doc["rows"].append(bench_shape(dims, built, a))
        print(json.dumps(doc["rows"][-1]), flush=True)
    text = markdown(doc)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    if a.md:
        Path(a.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
