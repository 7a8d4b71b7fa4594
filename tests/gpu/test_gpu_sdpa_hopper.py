"""GPU tests (skipped without CUDA) of the Hopper-native SDPA family (evoengineer/families/sdpa/cuda/sdpa_hopper.cu.j2): sampled
genomes of every sdpa_hopper space through the real pipeline (ragged tails, causal, Sq != Sk, B = H = 1), a
persistent kernel called again and again (eagerly, on other shapes, from a CUDA graph), FP8 attention (e4m3 Q/K/V,
V transposed in shared memory) against float64 attention on the dequantized inputs and fp16 SDPA on the unquantized
ones, its exported op, and a planted expect-tx mistake that deadlocks the kernel and must end as `timeout` with the
next candidate measured normally."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from conftest import assert_right, assert_right_call_after_call, build_candidate, build_result  # noqa: E402
from evoengineer import shipped_space_files, space_file  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.space import load_space  # noqa: E402

SPACES = sorted(p for p in shipped_space_files("sdpa_hopper_*.toml") if not p.stem.endswith("_large"))
BOOLS = ("PINGPONG", "INTRA_WG_OVERLAP", "PERSISTENT", "Q_PREFETCH", "FAST_EXP")


def _picks(space, n: int = 4, seed: int = 1) -> list:
    """First and last valid genomes, n random ones, one with each boolean gene on, one per consumer-warpgroup count,
    per BLOCK_N, per cluster size, per RESCALE, POLY_EXP2, DESC_OFFSETS and SCHEDULER value, and persistent 2-CTA
    clusters (static and dynamic scheduler)."""
    valid = space.valid_genomes()
    rnd = random.Random(seed)
    picks = {valid[0], valid[-1], *rnd.sample(valid, min(n, len(valid)))}
    params = {g: space.genome_to_params(g) for g in valid}
    for gene in BOOLS:
        picks.add(rnd.choice([g for g in valid if params[g][gene]]))
    for sched in ("static", "dynamic"):
        picks.add(rnd.choice([g for g in valid if params[g]["PERSISTENT"] and params[g]["CLUSTER_SIZE"] == 2
                              and params[g]["SCHEDULER"] == sched]))
    for gene in ("NUM_CONSUMER_WARPGROUPS", "BLOCK_N", "CLUSTER_SIZE", "RESCALE", "POLY_EXP2", "DESC_OFFSETS",
                 "SCHEDULER"):
        for value in sorted({p[gene] for p in params.values()}):
            picks.add(rnd.choice([g for g in valid if params[g][gene] == value]))
    return sorted(picks)


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_sampled_genomes_are_correct(space_file: Path, build_cache: Path):
    """Every sampled genome passes the checks on every shape or is turned away by the static gate; most build."""
    from evoengineer.evaluators.local import LocalEvaluator

    space = load_space(space_file)
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in _picks(space)]
    with LocalEvaluator(space, cache_dir=build_cache) as ev:
        results = list(ev.evaluate_many(cands))
    bad = [(c.params, m.status, m.reason) for c, m in results if m.status not in ("ok", "gate_failed")]
    assert not bad, bad
    ok = [m for _, m in results if m.status == "ok"]
    assert len(ok) >= len(results) // 2, [(c.params, m.status, m.reason) for c, m in results]
    atol = {"float16": 4e-3, "bfloat16": 3e-2, "float8_e4m3": 0.015}[space.signature["Q_DTYPE"]]
    for m in ok:
        assert m.metrics["rmse"] < atol
        assert m.metrics["speedup_vs"]["sdpa"] > 0 and m.metrics["time_us"] > 0


PERSISTENT_GENOMES = {
    # ping-pong, Q prefetch, one CTA per SM
    "pingpong": {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
                 "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": True, "FAST_EXP": True,
                 "CLUSTER_SIZE": 1, "RESCALE": "lazy", "POLY_EXP2": 25, "DESC_OFFSETS": True, "SCHEDULER": "static"},
    # 2-CTA clusters with K/V multicast: 192-row q-blocks give an odd block count at Sq = 500 (a cluster with a CTA
    # past the end) and causal pairs whose lighter CTA frees tiles it does not compute on
    "cluster": {"BLOCK_M": 192, "BLOCK_N": 96, "STAGES": 3, "NUM_CONSUMER_WARPGROUPS": 3, "PRODUCER_REGS": 24,
                "PINGPONG": False, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": True, "FAST_EXP": False,
                "CLUSTER_SIZE": 2, "RESCALE": "when_moved", "POLY_EXP2": 50, "DESC_OFFSETS": False,
                "SCHEDULER": "static"},
}
# the same with tiles taken from the global counter (in a cluster, handed from the first CTA to the other)
PERSISTENT_GENOMES.update({k + "_dynamic": {**v, "SCHEDULER": "dynamic"} for k, v in list(PERSISTENT_GENOMES.items())})


FP8_PERSISTENT = {"fp8_" + k: {**v, "PRODUCER_REGS": 40} for k, v in PERSISTENT_GENOMES.items()}


@pytest.mark.parametrize("name", sorted(PERSISTENT_GENOMES) + sorted(FP8_PERSISTENT))
def test_persistent_kernel_is_right_call_after_call(name: str, build_cache: Path):
    """A persistent kernel gives the right answer on every call: twice in a row, after a call on another shape
    (another grid and tile count), and from two replays of a CUDA graph."""
    from evoengineer.families.sdpa.task import SDPAShape

    fp8 = name.startswith("fp8_")
    space = load_space(space_file("sdpa_hopper_fp8_d128.toml" if fp8 else "sdpa_hopper_fp16_d64.toml"))
    params = {**PERSISTENT_GENOMES, **FP8_PERSISTENT}[name]
    assert not space.violated(params)
    task, module = build_candidate(space, params, build_cache)
    big = task.make_inputs(SDPAShape("big", B=4, H=16, Sq=1024, Sk=1024), 11)  # 512 tiles: several per CTA
    small = task.make_inputs(SDPAShape("small", B=3, H=2, Sq=500, Sk=300, causal=True), 12)
    assert_right_call_after_call(task, module, big, small)
    # causal with several tiles per CTA, of 1 to 8 K/V tiles each (and, with clusters, CTAs freeing tiles loaded for
    # their heavier neighbour), ragged in rows and keys
    big_causal = task.make_inputs(SDPAShape("big_causal", B=4, H=16, Sq=1000, Sk=1000, causal=True), 13)
    assert_right_call_after_call(task, module, big_causal, small)


@pytest.mark.parametrize("name", ["pingpong_dynamic", "cluster_dynamic", "fp8_cluster_dynamic"])
def test_dynamic_scheduler_counters_across_launches_and_streams(name: str, build_cache: Path):
    """The dynamic scheduler's counter slots: after more launches than there are slots (each slot drawn again, so
    every launch's last unit must have zeroed its slot) the answer is still right; launches in flight at once on
    two streams (two slots) each get every tile; and so do replays, at once on two streams, of two graphs captured
    1024 eager launches apart (a rotation of the eager slots: graphs draw slots of their own)."""
    from evoengineer.families.sdpa.task import SDPAShape

    fp8 = name.startswith("fp8_")
    space = load_space(space_file("sdpa_hopper_fp8_d128.toml" if fp8 else "sdpa_hopper_fp16_d64.toml"))
    task, module = build_candidate(space, {**PERSISTENT_GENOMES, **FP8_PERSISTENT}[name], build_cache)
    tiny = task.make_inputs(SDPAShape("tiny", B=2, H=2, Sq=130, Sk=200, causal=True), 21)
    out = task.new_output(tiny)
    for _ in range(1100):  # > the template's 1024 counter slots
        task.launch(module, tiny, out)
    assert_right(task, tiny, out)
    big = [task.make_inputs(SDPAShape(f"b{i}", B=4, H=16, Sq=1000, Sk=1000, causal=True), 30 + i) for i in range(2)]
    outs = [task.new_output(x) for x in big]
    streams = [torch.cuda.Stream() for _ in big]
    torch.cuda.synchronize()
    for _ in range(3):
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        for x, o, st in zip(big, outs, streams):
            with torch.cuda.stream(st):
                task.launch(module, x, o)
        for x, o in zip(big, outs):
            assert_right(task, x, o)
    graphs = []
    for x, o in zip(big, outs):
        graphs.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(graphs[-1]):
            task.launch(module, x, o)
        for _ in range(1023):  # were graphs to share the eager rotation, the next graph would draw this slot
            task.launch(module, tiny, out)
    torch.cuda.synchronize()
    for _ in range(3):
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        for g, st in zip(graphs, streams):
            with torch.cuda.stream(st):
                g.replay()
        for x, o in zip(big, outs):
            assert_right(task, x, o)


# dynamic-scheduler genomes with one Q buffer, so the producer rewrites the tile index beside it every tile (the
# search's racecheck caught the first version's every-lane read of it: tests below must stay clean)
SANITIZED = [
    ("sdpa_hopper_fp16_d128_mixed_large", {"BLOCK_M": 192, "BLOCK_N": 64, "STAGES": 4, "NUM_CONSUMER_WARPGROUPS": 3,
     "PRODUCER_REGS": 56, "PINGPONG": False, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False,
     "FAST_EXP": True, "CLUSTER_SIZE": 2, "RESCALE": "lazy", "POLY_EXP2": 0, "DESC_OFFSETS": True,
     "SCHEDULER": "dynamic"}),
    ("sdpa_hopper_fp16_d128_mixed_large", {"BLOCK_M": 128, "BLOCK_N": 96, "STAGES": 4, "NUM_CONSUMER_WARPGROUPS": 2,
     "PRODUCER_REGS": 24, "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False,
     "FAST_EXP": True, "CLUSTER_SIZE": 1, "RESCALE": "lazy", "POLY_EXP2": 0, "DESC_OFFSETS": False,
     "SCHEDULER": "dynamic"}),
    ("sdpa_hopper_fp8_d128", {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2,
     "PRODUCER_REGS": 40, "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False,
     "FAST_EXP": True, "CLUSTER_SIZE": 2, "RESCALE": "always", "POLY_EXP2": 0, "DESC_OFFSETS": False,
     "SCHEDULER": "dynamic"}),
]


def test_dynamic_scheduler_kernels_are_sanitizer_clean(build_cache: Path):
    """memcheck, racecheck and synccheck find nothing in dynamic-scheduler kernels (tile hand-over in shared memory,
    across a cluster by st.async, the counter slot) on the space's smallest checked shape, as the search's
    certification runs them."""
    from evoengineer.evaluators.sanitizer import certify, find_tool

    if find_tool() is None:
        pytest.skip("compute-sanitizer not found")
    for space_name, params in SANITIZED:
        space = load_space(space_file(f"{space_name}.toml"))
        assert not space.violated(params)
        _, cand, r = build_result(space, params, build_cache)
        verdict = certify([{"hash": cand.hash, "so": r.so, "module": r.module}], space_text=space.text,
                          space_path=str(space.path), tools=["memcheck", "racecheck", "synccheck"],
                          timeout_s=120)[cand.hash]
        assert verdict["status"] == "clean", (space_name, params, verdict["reason"])


def test_a_deadlocking_hopper_genome_ends_as_timeout(tmp_path: Path, build_cache: Path):
    """With HANG_FOR_TESTS, persistent genomes arm a K slot's full barrier for 16 bytes more than TMA brings (an
    expect-tx mistake): the kernel deadlocks; the search records `timeout`, replaces the worker, and the next
    candidate (the same genes, not persistent) is measured normally."""
    from evoengineer.evaluators.local import LocalEvaluator

    text = (space_file("sdpa_hopper_fp16_d64.toml")).read_text()
    text = text.replace('KV_DTYPE = "float16"', 'KV_DTYPE = "float16"\nHANG_FOR_TESTS = true')
    text = text.replace("timeout_s = 60", "timeout_s = 10")
    assert "HANG_FOR_TESTS" in text and "timeout_s = 10" in text
    (tmp_path / "hang.toml").write_text(text)
    space = load_space(tmp_path / "hang.toml")
    params = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
              "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False, "FAST_EXP": True,
              "CLUSTER_SIZE": 1, "RESCALE": "always", "POLY_EXP2": 0, "DESC_OFFSETS": False, "SCHEDULER": "static"}
    factory = CandidateFactory(space)
    hang, fine = factory.make(params), factory.make({**params, "PERSISTENT": False})
    assert "PLANTED FOR TESTS" in hang.source and "PLANTED FOR TESTS" not in fine.source
    with LocalEvaluator(space, cache_dir=build_cache) as ev:
        results = {c.params["PERSISTENT"]: m for c, m in ev.evaluate_many([hang, fine])}
    assert results[True].status == "timeout", (results[True].status, results[True].reason)
    assert results[False].status == "ok", (results[False].status, results[False].reason)


FP8_GENOME = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 40,
              "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": False, "Q_PREFETCH": False, "FAST_EXP": True,
              "CLUSTER_SIZE": 1, "RESCALE": "lazy", "POLY_EXP2": 25, "DESC_OFFSETS": True, "SCHEDULER": "static"}


@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_fp8_attention_against_fp16_sdpa_and_its_op(out_dtype: str, tmp_path: Path, build_cache: Path):
    """FP8 attention: within the FP8 tolerance of float64 attention on the dequantized inputs on ragged, causal,
    Sq != Sk and one-key shapes (every key order the transpose writes is checked: a wrong one moves whole rows);
    within 0.06 of fp16 SDPA on the unquantized inputs at (2, 8, 1024, 128); inputs untouched; the output in
    OUT_DTYPE. The exported op takes q_scale / k_scale / v_scale, refuses misuse with one clear error, and matches
    the kernel."""
    import evoengineer
    from evoengineer.families.sdpa.task import SDPAShape, sdpa_fp16_original

    text = (space_file("sdpa_hopper_fp8_d128.toml")).read_text().replace('OUT_DTYPE = "float16"',
                                                                         f'OUT_DTYPE = "{out_dtype}"')
    (tmp_path / "fp8.toml").write_text(text)
    space = load_space(tmp_path / "fp8.toml")
    task, module = build_candidate(space, FP8_GENOME, build_cache)
    atol, rtol = task.tolerance()
    for shape in (SDPAShape("one", B=1, H=1, Sq=1, Sk=1), SDPAShape("s77c", B=1, H=2, Sq=77, Sk=77, causal=True),
                  SDPAShape("ragged", B=2, H=3, Sq=300, Sk=333), SDPAShape("sq_lt_sk", B=1, H=2, Sq=130, Sk=700,
                                                                               causal=True)):
        inputs = task.make_inputs(shape, 5)
        before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        out = task.new_output(inputs)
        task.launch(module, inputs, out)
        torch.cuda.synchronize()
        assert out.dtype == getattr(torch, out_dtype) and torch.isfinite(out).all(), shape
        ref = task.reference(inputs)
        err = (out.double() - ref).abs()
        assert (err <= atol + rtol * ref.abs()).all(), (shape, float(err.max()))
        assert all(torch.equal(before[k].view(torch.uint8) if before[k].dtype == torch.float8_e4m3fn else before[k],
                               inputs[k].view(torch.uint8) if inputs[k].dtype == torch.float8_e4m3fn else inputs[k])
                   for k in before), shape
    gate = task.make_inputs(SDPAShape("gate", B=2, H=8, Sq=1024, Sk=1024), 6)
    out = task.new_output(gate)
    task.launch(module, gate, out)
    fp16 = sdpa_fp16_original(gate).double()
    assert float((out.double() - fp16).abs().max()) <= 0.06

    # the exported op, from a real one-genome search's elite.json
    import json
    import re

    from evoengineer.cli import main

    # two genomes (FAST_EXP on and off): the smallest space a search runs on
    fixed = "\n".join(f"{k} = [{json.dumps(v)}]" for k, v in FP8_GENOME.items() if k != "FAST_EXP")
    text = re.sub(r"\[parameters\]\n(.*?)\n\n", f"[parameters]\n{fixed}\nFAST_EXP = [true, false]\n\n", text,
                  count=1, flags=re.S)
    (tmp_path / "one.toml").write_text(text.replace("repeats = 100", "repeats = 5"))
    assert main(["search", "--space", str(tmp_path / "one.toml"), "--budget", "2", "--population", "2", "--elite",
                 "1", "--db", f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "elite.json"),
                 "--cache-dir", str(build_cache), "--quiet"]) == 0
    sdpa = evoengineer.load(tmp_path / "elite.json")  # the op: scaled_dot_product_attention's signature
    x = task.make_inputs(SDPAShape("op", B=2, H=4, Sq=200, Sk=260, causal=True), 7)
    got = sdpa(x["q"], x["k"], x["v"], is_causal=True, q_scale=x["q_scale"], k_scale=x["k_scale"],
               v_scale=x["v_scale"])
    want = task.reference(x)
    assert got.dtype == getattr(torch, out_dtype) and ((got.double() - want).abs() <= atol + rtol * want.abs()).all()
    best = json.loads((tmp_path / "elite.json").read_text())["elites"][0]["params"]
    _, best_module = build_candidate(space, best, build_cache)
    out = task.new_output(x)
    task.launch(best_module, x, out)
    assert torch.equal(got, out)  # the op is the kernel (q_scale folded into k_scale the same way)
    with pytest.raises(TypeError, match="query: dtype float16, but this kernel was compiled for float8_e4m3"):
        sdpa(x["q_orig"], x["k"], x["v"])
    with pytest.raises(ValueError, match="q_scale: expected a float32 tensor \\[H\\] = \\[4\\]"):
        sdpa(x["q"], x["k"], x["v"], q_scale=x["q_scale"][:2])
    with pytest.raises(ValueError, match="q_scale: on cpu"):
        sdpa(x["q"], x["k"], x["v"], q_scale=x["q_scale"].cpu())
