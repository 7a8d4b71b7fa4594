"""GPU tests (skipped without CUDA) of the decode-attention family (evoengineer/families/decode/cuda/decode.cu.j2): sampled genomes of
every decode space through the real pipeline (ragged lengths 1 / 7 / 1000 / Sk with NaN past them, G = 1 and 8,
Sq = 1, 4 and 5, many splits; the paged spaces with pages in random order, shared prefix pages and page sizes 16, 32
and 64), bf16 and bf16-with-FP8 signatures (contiguous and paged), the split workspace across calls and CUDA-graph
replays, and paged kernels giving the contiguous kernel's bits on the same caches. The binding's refusals are tested without a GPU (tests/families/test_decode_binding.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from conftest import assert_right, assert_right_call_after_call, build_candidate, build_result  # noqa: E402
from evoengineer import space_file, shipped_space_files  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.space import load_space  # noqa: E402

SPACES = sorted(shipped_space_files("decode_*.toml"))
CHOICE_GENES = ("LOAD_PATH", "COMBINE", "DEQUANT", "M_TILES", "Q_IN_REGISTERS", "MIN_BLOCKS", "MMA_ROWS")


def _picks(space, seed: int = 1) -> list:
    """First and last valid genomes plus a few random ones that together cover every value of each choice gene
    (greedy: each next pick, of 200 random draws, covers the most values not yet covered)."""
    valid = space.valid_genomes()
    rnd = random.Random(seed)
    params = {g: space.genome_to_params(g) for g in valid}
    genes = [g for g in CHOICE_GENES if g in space.names]
    todo = {(gene, value) for p in params.values() for gene in genes for value in [p[gene]]}
    picks = [valid[0], valid[-1]]
    todo -= {(gene, params[g][gene]) for g in picks for gene in genes}
    while todo:
        best = max(rnd.sample(valid, min(200, len(valid))),
                   key=lambda g: len(todo & {(gene, params[g][gene]) for gene in genes}))
        picks.append(best)
        todo -= {(gene, params[best][gene]) for gene in genes}
    return sorted(set(picks))


def _evaluate(space, genomes_or_params, cache_dir: Path):
    from evoengineer.evaluators.local import LocalEvaluator

    factory = CandidateFactory(space)
    cands = [factory.make(x) if isinstance(x, dict) else factory.from_genome(x) for x in genomes_or_params]
    with LocalEvaluator(space, cache_dir=cache_dir) as ev:
        return list(ev.evaluate_many(cands))


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_sampled_genomes_are_correct(space_file: Path, build_cache: Path):
    """Every sampled genome passes the checks on every shape (FP8: also against fp16 attention at the decode shape)
    or is turned away by the static gate for spilling."""
    space = load_space(space_file)
    results = _evaluate(space, _picks(space), build_cache)
    # the static gate may turn genomes away (register caps that spill), nothing else may go wrong
    bad = [(c.params, m.status, m.reason) for c, m in results
           if m.status != "ok" and not (m.status == "gate_failed" and "spill" in m.reason)]
    assert not bad, bad
    ok = [m for _, m in results if m.status == "ok"]
    assert ok, [(c.params, m.status, m.reason) for c, m in results]
    for m in ok:
        assert m.metrics["rmse"] < 4e-3
        assert m.metrics["speedup_vs"]["sdpa"] > 0 and m.metrics["time_us"] > 0


@pytest.mark.parametrize("name", ["decode_fp16_d128", "decode_fp8kv_d128_paged", "decode_fp8kv_d64"])
def test_keys_on_m_kernels_are_correct(name: str, build_cache: Path):
    """MMA_ROWS = keys (S^T = K Q^T, O^T = V^T P^T, P^T through movmatrix): the sampled genomes' genes with keys on
    M (FP8 dequantized in registers, in shared memory with two buffers or one, or K in registers and V in shared
    memory, in turn) pass every check of the space (ragged lengths with NaN past them, G = 1 and 8, Sq 1 to 5, many
    splits; paged pages in random order, shared prefixes)."""
    space = load_space(space_file(f"{name}.toml"))
    dequant = ("registers", "shared", "shared_single", "k_registers")
    keys = [{**p, "MMA_ROWS": "keys", **({"DEQUANT": dequant[i % len(dequant)]} if "DEQUANT" in p else {})}
            for i, p in enumerate(space.genome_to_params(g) for g in _picks(space))]
    genomes = [q for q in {json.dumps(p, sort_keys=True): None for p in keys} if not space.violated(json.loads(q))]
    results = _evaluate(space, [json.loads(q) for q in genomes], build_cache)
    bad = [(c.params, m.status, m.reason) for c, m in results
           if m.status != "ok" and not (m.status == "gate_failed" and "spill" in m.reason)]
    assert not bad, bad
    assert any(m.status == "ok" for _, m in results)


@pytest.mark.parametrize("q_dtype,kv_dtype,paged", [("bfloat16", "bfloat16", False), ("bfloat16", "float8_e4m3", False),
                                                    ("bfloat16", "float8_e4m3", True)])
def test_bf16_signatures(q_dtype: str, kv_dtype: str, paged: bool, tmp_path: Path, build_cache: Path):
    """The template serves bf16 Q (with bf16 or FP8 K/V, FP8 dequantized to bf16 either way) on the same shapes,
    paged too, with the query rows on either side of the MMAs."""
    text = (space_file("decode_fp8kv_d64.toml")).read_text()
    if paged:
        text = text.replace('KV_DTYPE = "float8_e4m3"', 'KV_LAYOUT = "paged"\nKV_DTYPE = "float8_e4m3"')
        text = text.replace("[[shapes]]\n", "[[shapes]]\npage_size = 32\n")
    text = text.replace('Q_DTYPE = "float16"', f'Q_DTYPE = "{q_dtype}"').replace(
        'KV_DTYPE = "float8_e4m3"', f'KV_DTYPE = "{kv_dtype}"')
    if kv_dtype != "float8_e4m3":
        text = text.replace("\nfp16_max_abs_err = 0.06", "")
        text = text.replace("  \"MMA_ROWS == 'queries' or DEQUANT != 'registers'\",\n", "")  # no DEQUANT without FP8
        text = text.replace("((DEQUANT == 'shared') * 2 + (DEQUANT == 'shared_single') + (DEQUANT == 'k_registers'))",
                            "0").replace('DEQUANT = { values = ["registers", "shared", "shared_single", "k_registers"], '
                                         'ordered = false }', "")
        assert "DEQUANT =" not in text and "DEQUANT !=" not in text, "the space edit left a DEQUANT gene behind"
    (tmp_path / "bf16.toml").write_text(text)
    space = load_space(tmp_path / "bf16.toml")
    base = {"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 3, "LOAD_PATH": "bulk", "COPY_BYTES": 16, "M_TILES": 2,
            "Q_IN_REGISTERS": True, "SPLIT_WAVES": 2, "COMBINE": "in_kernel", "FAST_EXP": True, "MIN_BLOCKS": 1}
    genomes = [base, {**base, "LOAD_PATH": "cp_async", "M_TILES": 1, "COMBINE": "separate"}]
    if kv_dtype == "float8_e4m3":
        genomes = [{**g, "DEQUANT": d} for g in genomes for d in ("registers", "shared")]
    # keys on M: bf16 P^T, FP8 bytes to bf16 fragments; one conversion buffer (V over K, or V with K from bytes) on
    # the shared genomes
    single = {1: "shared_single", 3: "k_registers"}
    genomes += [{**g, "MMA_ROWS": "keys", **({"DEQUANT": single[i]} if i in single and "DEQUANT" in g else {})}
                for i, g in enumerate(genomes)]
    results = _evaluate(space, genomes, build_cache)
    bad = [(c.params, m.status, m.reason) for c, m in results if m.status != "ok"]
    assert not bad, bad


@pytest.mark.parametrize("combine", ["in_kernel", "separate", "dependent", "cluster"])
def test_split_kernel_is_right_call_after_call(combine: str, build_cache: Path):
    """Split-KV partials and the in-kernel combine's counters live in a per-call workspace: the answer is right
    twice in a row, after a call on another shape (other split count), and from two CUDA-graph replays."""
    from evoengineer.families.decode.task import DecodeShape

    space = load_space(space_file("decode_fp8kv_d128.toml"))
    params = {"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 4, "LOAD_PATH": "bulk", "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": True, "SPLIT_WAVES": 2, "COMBINE": combine, "FAST_EXP": True, "DEQUANT": "registers",
              "MIN_BLOCKS": 1}
    assert not space.violated(params)
    task, module = build_candidate(space, params, build_cache)
    big = task.make_inputs(DecodeShape("big", B=2, Hq=16, Hkv=2, Sq=3, Sk=9000, seq_lens=(9000, 4097)), 21)
    small = task.make_inputs(DecodeShape("small", B=3, Hq=8, Hkv=8, Sk=300, seq_lens=(1, 300, 129)), 22)
    assert_right_call_after_call(task, module, big, small)


@pytest.mark.parametrize("name", ["decode_fp16_d128", "decode_fp8kv_d128_paged"])
def test_cluster_combine_where_the_clusters_fit(name: str, build_cache: Path):
    """COMBINE = cluster: a launch whose groups' splits the device holds as clusters (4 splits of 2 groups) reduces
    them in shared memory and launches no combine kernel; one with more splits than a cluster holds (64) falls back
    to the combine kernel. Both right on ragged lengths (ranks without keys in the cluster), call after call and from
    CUDA graphs."""
    from torch.profiler import ProfilerActivity, profile

    from evoengineer.families.decode.task import DecodeShape

    space = load_space(space_file(f"{name}.toml"))
    params = {"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": False, "SPLIT_WAVES": 1, "COMBINE": "cluster", "FAST_EXP": True, "MIN_BLOCKS": 1,
              "MMA_ROWS": "keys", **({"DEQUANT": "k_registers"} if "DEQUANT" in space.names else {})}
    assert not space.violated(params)
    task, module = build_candidate(space, params, build_cache)
    page = {"page_size": 64} if "paged" in name else {}
    fits = task.make_inputs(DecodeShape("fits", B=2, Hq=8, Hkv=1, Sk=512, seq_lens=(512, 130), **page), 31)
    falls_back = task.make_inputs(DecodeShape("falls_back", B=1, Hq=16, Hkv=2, Sq=2, Sk=8192, **page), 32)
    for inputs, combine_kernels in ((fits, 0), (falls_back, 1)):
        out = task.new_output(inputs)
        task.launch(module, inputs, out)  # first call: the cluster occupancy queries, outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out.fill_(float("nan"))
            task.launch(module, inputs, out)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        assert sum("decode_kernel" in n for n in names) == 1, names
        assert sum("combine_kernel" in n for n in names) == combine_kernels, names
        assert_right(task, inputs, out)
    assert_right_call_after_call(task, module, falls_back, fits)
    assert_right_call_after_call(task, module, fits, falls_back)


def test_cluster_combine_is_sanitizer_clean(tmp_path: Path, build_cache: Path):
    """memcheck, racecheck and synccheck find nothing in a cluster-combine kernel (peers' shared memory read after
    the cluster barrier, held until the second), run as the search's certification runs a candidate: on a space
    whose smallest checked shape is one where the clusters fit (2 groups of 4 splits, one sequence shorter than a
    split) and hold no partials in global memory."""
    from evoengineer.evaluators.sanitizer import certify, find_tool

    if find_tool() is None:
        pytest.skip("compute-sanitizer not found")
    text = (space_file("decode_fp8kv_d128.toml")).read_text()
    small = '[[shapes]]\nname = "clusters"\nB = 2\nHq = 8\nHkv = 1\nSk = 512\nseq_lens = [512, 100]\nfresh = true\n\n'
    first = text.index("[[shapes]]")
    (tmp_path / "cluster.toml").write_text(text[:first] + small + text[first:])
    space = load_space(tmp_path / "cluster.toml")
    params = {"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": False, "SPLIT_WAVES": 1, "COMBINE": "cluster", "FAST_EXP": True, "MIN_BLOCKS": 2,
              "MMA_ROWS": "keys", "DEQUANT": "k_registers"}
    assert not space.violated(params)
    _, cand, r = build_result(space, params, build_cache)
    verdict = certify([{"hash": cand.hash, "so": r.so, "module": r.module}], space_text=space.text,
                      space_path=str(space.path), tools=["memcheck", "racecheck", "synccheck"],
                      timeout_s=120)[cand.hash]
    assert verdict["status"] == "clean", verdict["reason"]


def test_recorded_elite_as_a_pytorch_op(tmp_path: Path):
    """The FP8 elite recorded in experiments/decode/results, loaded as a custom op (built from its recorded source):
    right on a ragged GQA batch, under torch.compile(fullgraph=True) and inside a CUDA graph."""
    import evoengineer
    from evoengineer.families.decode.task import DecodeShape, make_inputs, reference

    elite = Path(__file__).resolve().parents[2] / "experiments" / "decode" / "results" / "elite_decode_fp8kv_d128.json"
    decode = evoengineer.load(elite, build_root=tmp_path)
    x = make_inputs(DecodeShape("x", B=3, Hq=16, Hkv=2, Sq=2, Sk=5000, seq_lens=(5000, 1, 2049)), 3, head_dim=128,
                    kv_dtype=torch.float8_e4m3fn, device="cuda")
    args = (x["q"], x["k"], x["v"], x["seq_lens"])
    kw = {"k_scale": x["k_scale"], "v_scale": x["v_scale"]}
    got = decode(*args, **kw)
    want = reference(x)
    assert torch.isfinite(got).all() and (got.double() - want).abs().max() < 4e-3
    compiled = torch.compile(lambda q, k, v, lens, ks, vs: decode(q, k, v, lens, k_scale=ks, v_scale=vs),
                             fullgraph=True)
    assert torch.equal(compiled(*args, x["k_scale"], x["v_scale"]), got)
    out = decode(*args, **kw)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode(*args, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


def _paged_twins(name: str, params: dict, build_cache: Path):
    """(task, module) of `params` in the paged space and in its contiguous twin."""
    paged = build_candidate(load_space(space_file(f"{name}_paged.toml")), params, build_cache)
    flat = build_candidate(load_space(space_file(f"{name}.toml")), params, build_cache)
    return paged, flat


@pytest.mark.parametrize("name", ["decode_fp16_d128", "decode_fp8kv_d128"])
@pytest.mark.parametrize("load_path", ["bulk", "cp_async", "tma"])
def test_paged_kernel_gives_the_contiguous_kernels_bits(name: str, load_path: str, build_cache: Path):
    """A paged kernel reading pages in random order (shared prefixes, page sizes 1 to 128, lengths 1 and Sk) returns
    exactly what its contiguous twin returns on the same caches laid out contiguously, and the float64 reference's
    answer; the split workspace survives call after call and CUDA-graph replays. tma: boxes of one page's rows (pages
    below 8 rows put boxes at 128-byte, not 1024-byte, offsets of the swizzled slot; a page of 128 holds 4 slices)."""
    from evoengineer.families.decode.task import DecodeShape, gather_pages

    params = {"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 3, "LOAD_PATH": load_path, "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": True, "SPLIT_WAVES": 2, "COMBINE": "in_kernel", "FAST_EXP": True, "MIN_BLOCKS": 1}
    if "fp8" in name:
        params["DEQUANT"] = "registers"
    (task, module), (flat_task, flat) = _paged_twins(name, params, build_cache)
    for page in (1, 2, 4, 8, 16, 64, 128):
        x = task.make_inputs(DecodeShape("p", B=4, Hq=16, Hkv=4, Sq=2, Sk=3000, seq_lens=(3000, 2900, 1, 777),
                                         page_size=page), page)
        out = task.new_output(x)
        task.launch(module, x, out)
        flat_x = {**x, "k": gather_pages(x["k"], x["block_table"]).contiguous(),
                  "v": gather_pages(x["v"], x["block_table"]).contiguous()}
        del flat_x["block_table"]
        want = flat_task.new_output(flat_x)
        flat_task.launch(flat, flat_x, want)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.equal(out, want), page
        ref = task.reference(x)
        assert (out.double() - ref).abs().max() < 4e-3
    big = task.make_inputs(DecodeShape("big", B=2, Hq=16, Hkv=2, Sq=3, Sk=9000, seq_lens=(9000, 4097), page_size=16),
                           21)
    small = task.make_inputs(DecodeShape("small", B=3, Hq=8, Hkv=8, Sk=300, seq_lens=(1, 300, 129), page_size=64), 22)
    assert_right_call_after_call(task, module, big, small)


def _assert_same_bits(task, module, twin, seed: int):
    """`module` and `twin` return the same bits, right ones (finite, within tolerance of the reference), on ragged
    lengths 1 / Sk / mid-tile with NaN past them, Sk not a multiple of a slice, one head with many splits and short
    sequences; then `module` is right call after call and from CUDA-graph replays."""
    from evoengineer.families.decode.task import DecodeShape

    shapes = [DecodeShape("ragged", B=3, Hq=16, Hkv=2, Sq=3, Sk=1037, seq_lens=(1, 1037, 517)),
              DecodeShape("one_head_long", B=1, Hq=4, Hkv=1, Sk=20011),
              DecodeShape("short", B=4, Hq=8, Hkv=8, Sk=40, seq_lens=(40, 3, 33, 17))]
    for i, shape in enumerate(shapes):
        inputs = task.make_inputs(shape, seed + i)
        outs = []
        for m in (module, twin):
            out = task.new_output(inputs)
            task.launch(m, inputs, out)
            outs.append(out)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[1]), (shape.name, float((outs[0].double() - outs[1].double()).abs().max()))
        assert_right(task, inputs, outs[0])
    assert_right_call_after_call(task, module, task.make_inputs(shapes[1], seed + 10),
                                 task.make_inputs(shapes[0], seed + 11))


@pytest.mark.parametrize("name,q_dtype,dequant", [("decode_fp16_d128", "float16", None),
                                                   ("decode_fp16_d128", "bfloat16", None),
                                                   ("decode_fp8kv_d128", "float16", "registers"),
                                                   ("decode_fp8kv_d128", "float16", "shared"),
                                                   ("decode_fp8kv_d128", "bfloat16", "shared")])
def test_tma_loads_give_the_cp_async_kernels_bits(name: str, q_dtype: str, dequant: str | None, tmp_path: Path,
                                                  build_cache: Path):
    """LOAD_PATH = tma (tensor-map boxes of whole slices, 128-byte swizzle) returns exactly what the cp.async kernel
    with the same genes returns: ragged lengths 1 / Sk / mid-tile with NaN past them (a box brings those rows in),
    Sk not a multiple of a slice (rows past Sk read as zeros, not the next head's), one head and many splits; right
    call after call and from CUDA-graph replays."""
    text = (space_file(f"{name}.toml")).read_text().replace('Q_DTYPE = "float16"', f'Q_DTYPE = "{q_dtype}"')
    if "fp8" not in name:
        text = text.replace('KV_DTYPE = "float16"', f'KV_DTYPE = "{q_dtype}"')
    (tmp_path / "space.toml").write_text(text)
    space = load_space(tmp_path / "space.toml")
    params = {"BLOCK_N": 64, "NUM_WARPS": 2, "STAGES": 3, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": True, "SPLIT_WAVES": 2, "COMBINE": "in_kernel", "FAST_EXP": True, "MIN_BLOCKS": 1}
    if dequant:
        params["DEQUANT"] = dequant
    assert not space.violated(params), space.violated(params)
    task, tma = build_candidate(space, params, build_cache)
    _, cp = build_candidate(space, {**params, "LOAD_PATH": "cp_async"}, build_cache)
    _assert_same_bits(task, tma, cp, seed=40)


@pytest.mark.parametrize("mma_rows", ["queries", "keys"])
def test_one_conversion_buffer_gives_the_two_buffer_kernels_bits(mma_rows: str, build_cache: Path):
    """DEQUANT = shared_single (V converted over K's fp16 rows once the scores are in registers) computes what
    DEQUANT = shared computes, bit for bit: ragged lengths with NaN past them (V's tail rows zeroed in the one
    buffer), a last slice shorter than a tile, many splits; right call after call and from graph replays."""
    space = load_space(space_file("decode_fp8kv_d128.toml"))
    params = {"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1,
              "Q_IN_REGISTERS": mma_rows == "keys", "SPLIT_WAVES": 1,
              "COMBINE": "separate" if mma_rows == "queries" else "dependent", "FAST_EXP": True,
              "MIN_BLOCKS": 1, "DEQUANT": "shared_single", "MMA_ROWS": mma_rows}
    assert not space.violated(params), space.violated(params)
    task, single = build_candidate(space, params, build_cache)
    _, double = build_candidate(space, {**params, "DEQUANT": "shared"}, build_cache)
    _assert_same_bits(task, single, double, seed=60)
