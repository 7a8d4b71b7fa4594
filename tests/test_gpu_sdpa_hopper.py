"""GPU tests (skipped without CUDA) of the Hopper-native SDPA family (templates/cuda/sdpa_hopper.cu.j2): sampled
genomes of every sdpa_hopper space through the real pipeline (ragged tails, causal, Sq != Sk, B = H = 1), a
persistent kernel called again and again (eagerly, on other shapes, from a CUDA graph), and a planted expect-tx
mistake that deadlocks the kernel and must end as `timeout` with the next candidate measured normally."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from conftest import assert_right_call_after_call, build_candidate  # noqa: E402
from evoengineer import SPACES_DIR  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.space import load_space  # noqa: E402

SPACES = sorted(p for p in SPACES_DIR.glob("sdpa_hopper_*.toml") if not p.stem.endswith("_large"))
BOOLS = ("PINGPONG", "INTRA_WG_OVERLAP", "PERSISTENT", "Q_PREFETCH", "FAST_EXP")


def _picks(space, n: int = 4, seed: int = 1) -> list:
    """First and last valid genomes, n random ones, one with each boolean gene on, one per consumer-warpgroup count,
    per BLOCK_N and per cluster size, and a persistent 2-CTA cluster."""
    valid = space.valid_genomes()
    rnd = random.Random(seed)
    picks = {valid[0], valid[-1], *rnd.sample(valid, min(n, len(valid)))}
    params = {g: space.genome_to_params(g) for g in valid}
    for gene in BOOLS:
        picks.add(rnd.choice([g for g in valid if params[g][gene]]))
    picks.add(rnd.choice([g for g in valid if params[g]["PERSISTENT"] and params[g]["CLUSTER_SIZE"] == 2]))
    for gene in ("NUM_CONSUMER_WARPGROUPS", "BLOCK_N", "CLUSTER_SIZE"):
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
    atol = 4e-3 if space.signature["Q_DTYPE"] == "float16" else 3e-2
    for m in ok:
        assert m.metrics["rmse"] < atol
        assert m.metrics["speedup_vs"]["sdpa"] > 0 and m.metrics["time_us"] > 0


PERSISTENT_GENOMES = {
    # ping-pong, Q prefetch, one CTA per SM
    "pingpong": {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
                 "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": True, "FAST_EXP": True,
                 "CLUSTER_SIZE": 1},
    # 2-CTA clusters with K/V multicast: 192-row q-blocks give an odd block count at Sq = 500 (a cluster with a CTA
    # past the end) and causal pairs whose lighter CTA frees tiles it does not compute on
    "cluster": {"BLOCK_M": 192, "BLOCK_N": 96, "STAGES": 3, "NUM_CONSUMER_WARPGROUPS": 3, "PRODUCER_REGS": 24,
                "PINGPONG": False, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": True, "FAST_EXP": False,
                "CLUSTER_SIZE": 2},
}


@pytest.mark.parametrize("name", sorted(PERSISTENT_GENOMES))
def test_persistent_kernel_is_right_call_after_call(name: str, build_cache: Path):
    """A persistent kernel gives the right answer on every call: twice in a row, after a call on another shape
    (another grid and tile count), and from two replays of a CUDA graph."""
    from evoengineer.tasks.sdpa import SDPAShape

    space = load_space(SPACES_DIR / "sdpa_hopper_fp16_d64.toml")
    params = PERSISTENT_GENOMES[name]
    assert not space.violated(params)
    task, module = build_candidate(space, params, build_cache)
    big = task.make_inputs(SDPAShape("big", B=4, H=16, Sq=1024, Sk=1024), 11)  # 512 tiles: several per CTA
    small = task.make_inputs(SDPAShape("small", B=3, H=2, Sq=500, Sk=300, causal=True), 12)
    assert_right_call_after_call(task, module, big, small)


def test_a_deadlocking_hopper_genome_ends_as_timeout(tmp_path: Path, build_cache: Path):
    """With HANG_FOR_TESTS, persistent genomes arm a K slot's full barrier for 16 bytes more than TMA brings (an
    expect-tx mistake): the kernel deadlocks; the search records `timeout`, replaces the worker, and the next
    candidate (the same genes, not persistent) is measured normally."""
    from evoengineer.evaluators.local import LocalEvaluator

    text = (SPACES_DIR / "sdpa_hopper_fp16_d64.toml").read_text()
    text = text.replace('KV_DTYPE = "float16"', 'KV_DTYPE = "float16"\nHANG_FOR_TESTS = true')
    text = text.replace("timeout_s = 60", "timeout_s = 10")
    assert "HANG_FOR_TESTS" in text and "timeout_s = 10" in text
    (tmp_path / "hang.toml").write_text(text)
    space = load_space(tmp_path / "hang.toml")
    params = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
              "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False, "FAST_EXP": True,
              "CLUSTER_SIZE": 1}
    factory = CandidateFactory(space)
    hang, fine = factory.make(params), factory.make({**params, "PERSISTENT": False})
    assert "PLANTED FOR TESTS" in hang.source and "PLANTED FOR TESTS" not in fine.source
    with LocalEvaluator(space, cache_dir=build_cache) as ev:
        results = {c.params["PERSISTENT"]: m for c, m in ev.evaluate_many([hang, fine])}
    assert results[True].status == "timeout", (results[True].status, results[True].reason)
    assert results[False].status == "ok", (results[False].status, results[False].reason)
