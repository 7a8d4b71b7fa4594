"""The Hopper-native SDPA spaces (evoengineer/families/sdpa/spaces/sdpa_hopper_*.toml) and their template, without a GPU: every space
loads, its constraints keep every valid genome inside shared memory and the consumers' setmaxnreg budget as the
template computes it, rendered genomes carry the wgmma operand lists their tiles need, and the planted hang exists
only where a test asks for it."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from evoengineer import space_file, shipped_space_files
from evoengineer.candidate import CandidateFactory
from evoengineer.space import load_space

SPACES = sorted(shipped_space_files("sdpa_hopper_*.toml"))
SMEM_LIMIT = 232448  # 227 KB per block on sm_90


def test_the_eleven_spaces_ship():
    assert [p.stem for p in SPACES] == ["sdpa_hopper_bf16_d128", "sdpa_hopper_bf16_d64", "sdpa_hopper_fp16_d128",
                                        "sdpa_hopper_fp16_d128_large", "sdpa_hopper_fp16_d128_mixed_large",
                                        "sdpa_hopper_fp16_d64", "sdpa_hopper_fp16_d64_large",
                                        "sdpa_hopper_fp16_d64_mixed_large", "sdpa_hopper_fp8_d128",
                                        "sdpa_hopper_fp8_d128_large", "sdpa_hopper_fp8_d128_mixed_large"]


def test_the_mixed_spaces_time_the_four_large_grid_rows_and_share_the_large_genes():
    """A mixed space is its _large twin (genes, constraints, correctness shapes) timed on (16, 16, 1024) and
    (4, 16, 4096), non-causal and causal."""
    for kind in ("fp16_d64", "fp16_d128", "fp8_d128"):
        mixed = load_space(space_file(f"sdpa_hopper_{kind}_mixed_large.toml"))
        large = load_space(space_file(f"sdpa_hopper_{kind}_large.toml"))
        assert mixed.names == large.names and mixed.count_valid() == large.count_valid()
        assert mixed.signature == large.signature
        untimed = lambda s: [x for x in s.shapes if not x.get("time")]  # noqa: E731
        assert untimed(mixed) == untimed(large)
        timed = {(x["B"], x["H"], x["S"], bool(x.get("causal"))) for x in mixed.shapes if x.get("time")}
        assert timed == {(16, 16, 1024, False), (16, 16, 1024, True), (4, 16, 4096, False), (4, 16, 4096, True)}


def _traits(source: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"static constexpr int (k\w+) = (\d+);", source)}


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_space_constraints_match_the_template(space_file: Path):
    space = load_space(space_file)
    assert space.task == "sdpa" and space.template == "cuda/sdpa_hopper.cu.j2" and space.arch == "sm_90a"
    assert "-gencode=arch=compute_90a,code=sm_90a" in space.cuda_flags
    assert space.gates["max_spill_bytes"] == 0 and space.gates["max_registers"] == 255
    sig = space.signature
    assert sig["Q_DTYPE"] == sig["KV_DTYPE"] and sig["HEAD_DIM"] in (64, 128)
    fp8 = sig["Q_DTYPE"] == "float8_e4m3"
    elem, kstep = (1, 32) if fp8 else (2, 16)
    names = {s["name"] for s in space.shapes}
    timed = [s for s in space.shapes if s.get("time")]
    assert len(timed) == (4 if space.name.endswith("_mixed_large") else 1)
    assert {"s77", "s77_causal", "s500_b3", "s1000_causal", "sq300_sk77", "sq77_sk1000"} <= names
    valid = space.valid_genomes()
    assert len(valid) > 100
    factory = CandidateFactory(space)
    for g in random.Random(0).sample(valid, 12):
        p = space.genome_to_params(g)
        src = factory.make(p).source
        t = _traits(src)  # the literal knobs; the rest the test derives as the template does
        assert (t["kBlockM"], t["kBlockN"], t["kStages"], t["kConsumerWGs"]) == (
            p["BLOCK_M"], p["BLOCK_N"], p["STAGES"], p["NUM_CONSUMER_WARPGROUPS"])
        nc, mt = p["NUM_CONSUMER_WARPGROUPS"], p["BLOCK_M"] // (64 * p["NUM_CONSUMER_WARPGROUPS"])
        threads, d = 128 * (nc + 1), sig["HEAD_DIM"]
        assert mt in (1, 2)
        vt = -(-p["BLOCK_N"] // 128) * 128 * d if fp8 else 0  # FP8: a transposed V slot per stage
        smem = ((1 + p["Q_PREFETCH"]) * p["BLOCK_M"] * d * elem + p["STAGES"] * (2 * p["BLOCK_N"] * d * elem + vt)
                + 1024)
        assert smem + 8 * (4 + (6 if fp8 else 4) * p["STAGES"]) <= SMEM_LIMIT
        # the register budget the constraint assumed is the one the template hands setmaxnreg
        launch = min(65536 // threads // 8 * 8, 248)
        assert t["kConsumerRegs"] == min(240, (launch * (nc + 1) - p["PRODUCER_REGS"]) // nc // 8 * 8)
        assert mt * (p["BLOCK_N"] // 2 + p["BLOCK_N"] // (8 if fp8 else 4) + d // 2) + 28 <= t["kConsumerRegs"]
        assert nc == 1 or 128 * p["PRODUCER_REGS"] + 128 * nc * t["kConsumerRegs"] <= launch * threads
        # wgmma shapes and operand lists: S is m64 x BLOCK_N (BLOCK_N / 2 fp32 registers), O is m64 x HEAD_DIM
        ab = {"bfloat16": "bf16", "float16": "f16", "float8_e4m3": "e4m3"}[sig["Q_DTYPE"]]
        assert f"wgmma.mma_async.sync.aligned.m64n{p['BLOCK_N']}k{kstep}.f32.{ab}.{ab}" in src
        assert f"wgmma.mma_async.sync.aligned.m64n{sig['HEAD_DIM']}k{kstep}.f32.{ab}.{ab}" in src
        qk = src[src.index("void wgmma_qk("):src.index("void wgmma_pv(")]
        pv = src[src.index("void wgmma_pv("):src.index("float exp2_(")]
        n_s, n_o = p["BLOCK_N"] // 2, d // 2
        # FP8 wgmma has no transpose immediates (both operands K-major); 16-bit reads V MN-major (trans-b = 1)
        qk_tail, pv_tail = ("p, 1, 1;", "p, 1, 1;") if fp8 else ("p, 1, 1, 0, 0;", "p, 1, 1, 1;")
        assert qk.count('"+f"(d[') == n_s and f"}}, %{n_s}, %{n_s + 1}, {qk_tail}" in qk
        a_regs = f"{{ %{n_o}, %{n_o + 1}, %{n_o + 2}, %{n_o + 3} }}, "
        assert pv.count('"+f"(d[') == n_o and f'{a_regs}"\n        "%{n_o + 4}, {pv_tail}' in pv
        assert ("kFp8 = true" in src) == fp8 and ("transpose_v(p, pipe" in src)
        if fp8:  # e4m3 tensor maps, V transposed by the producer warpgroup, P packed as e4m3
            assert "kElemBytes = kFp8 ? 1 : 2;" in src and t["kTransposeWarps"] == 3
            assert p["NUM_CONSUMER_WARPGROUPS"] == 1 or p["PRODUCER_REGS"] >= 32
            # 16-byte transpose units, 8-byte ones where setmaxnreg leaves the producer fewer than 40 registers
            assert "kTransposeChunk = (kConsumerWGs > 1 && kProducerRegs < 40) ? 8 : 16;" in src
        assert "cp.async.bulk.tensor.3d" in src and "setmaxnreg" in src
        assert ("setmaxnreg_dec<Tr::kProducerRegs>" in src) and ("kSetMaxNReg = kConsumerWGs > 1" in src)
        assert "PLANTED FOR TESTS" not in src
        # 2-CTA clusters: compiled-in cluster shape, K/V multicast of half-tiles, cluster-wide "empty" arrivals
        clustered = p["CLUSTER_SIZE"] == 2
        assert t["kCluster"] == p["CLUSTER_SIZE"] and (" __cluster_dims__(2, 1, 1)" in src) == clustered
        assert t["kBlockN"] // t["kCluster"] % 8 == 0


def test_constraints_turn_away_what_the_template_refuses():
    space = load_space(space_file("sdpa_hopper_fp16_d64.toml"))
    base = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
            "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": True, "FAST_EXP": True,
            "CLUSTER_SIZE": 1, "SCHEDULER": "static"}
    assert not space.violated(base) and not space.violated({**base, "CLUSTER_SIZE": 2})
    assert not space.violated({**base, "SCHEDULER": "dynamic"})
    for bad in ({"INTRA_WG_OVERLAP": False},                    # ping-pong turns are S and P V issued together
                {"NUM_CONSUMER_WARPGROUPS": 1, "BLOCK_M": 64},  # ping-pong needs two consumer warpgroups
                {"PERSISTENT": False},                          # Q prefetch needs a next tile
                {"BLOCK_M": 192},                               # 1.5 m64 tiles per warpgroup
                {"PINGPONG": False, "NUM_CONSUMER_WARPGROUPS": 1, "BLOCK_M": 64, "PRODUCER_REGS": 40},  # moot split
                {"BLOCK_M": 256, "BLOCK_N": 176},               # two m64 tiles of S, P and O exceed 240 registers
                {"SCHEDULER": "dynamic", "PERSISTENT": False, "Q_PREFETCH": False}):  # a grid of one CTA per tile
        assert space.violated({**base, **bad}), bad
    d128 = load_space(space_file("sdpa_hopper_fp16_d128.toml"))
    # Q (two buffers) and four stages of 176-key K and V tiles at head dim 128: over 227 KB
    assert d128.violated({**base, "BLOCK_N": 176, "STAGES": 4})


def test_the_planted_hang_needs_the_test_flag_and_a_persistent_genome(tmp_path: Path):
    text = (space_file("sdpa_hopper_fp16_d64.toml")).read_text()
    (tmp_path / "hang.toml").write_text(text.replace('KV_DTYPE = "float16"', 'KV_DTYPE = "float16"\nHANG_FOR_TESTS = true'))
    space = load_space(tmp_path / "hang.toml")
    p = space.genome_to_params(next(g for g in space.valid_genomes() if space.genome_to_params(g)["PERSISTENT"]))
    factory = CandidateFactory(space)
    assert "Tr::kKVBytes + 16" in factory.make(p).source
    assert "PLANTED FOR TESTS" not in factory.make({**p, "PERSISTENT": False, "Q_PREFETCH": False}).source


def test_cluster_genomes_render_multicast_and_cluster_wide_release():
    space = load_space(space_file("sdpa_hopper_bf16_d128.toml"))
    factory = CandidateFactory(space)
    valid = [space.genome_to_params(g) for g in space.valid_genomes()]
    assert {p["CLUSTER_SIZE"] for p in valid} == {1, 2}
    one = next(p for p in valid if p["CLUSTER_SIZE"] == 1)
    two = factory.make({**one, "CLUSTER_SIZE": 2}).source
    assert "__cluster_dims__(2, 1, 1)" in two and "__cluster_dims__" not in factory.make(one).source
    assert ".multicast::cluster" in two and "mapa.shared::cluster" in two and "barrier.cluster.arrive" in two
    # a CTA may not exit while the other one can still arrive on its barriers: the producer's tail is compiled in
    assert "if constexpr (Tr::kCluster > 1)" in two and "kKVRowsPerCTA = kBlockN / kCluster" in two
    # BLOCK_N whose half is not a whole swizzle atom is refused for clusters (a custom space could offer it)
    assert "BLOCK_N % (8 * CLUSTER_SIZE) == 0" in [c.text for c in space.constraints]


def test_fp8_spaces_and_the_template_refusals(tmp_path: Path):
    """FP8 attention: the spaces' signature (e4m3 Q/K/V, fp16 out) and gate shape; the template refuses what its FP8
    path does not do (head dim 64, BLOCK_N not a multiple of 32, an FP8 output, mixed dtypes) with #error."""
    space = load_space(space_file("sdpa_hopper_fp8_d128.toml"))
    assert space.signature == {"HEAD_DIM": 128, "Q_DTYPE": "float8_e4m3", "KV_DTYPE": "float8_e4m3",
                               "OUT_DTYPE": "float16"}
    gate = next(s for s in space.shapes if s["name"] == "gate")
    assert gate["fp16_max_abs_err"] == 0.06 and not gate.get("causal", False)
    valid = [space.genome_to_params(g) for g in space.valid_genomes()]
    assert all(p["BLOCK_N"] % 32 == 0 for p in valid) and {p["CLUSTER_SIZE"] for p in valid} == {1, 2}
    # the transposing warps spill at 24 registers: refused by the constraint, not by a wasted build
    assert not any(p["NUM_CONSUMER_WARPGROUPS"] > 1 and p["PRODUCER_REGS"] == 24 for p in valid)
    assert {p["PRODUCER_REGS"] for p in valid if p["NUM_CONSUMER_WARPGROUPS"] > 1} == {32, 40, 56}
    base = next(p for p in valid if p["BLOCK_N"] == 128)
    ok = CandidateFactory(space).make(base).source
    assert "__nv_cvt_float2_to_fp8x2" in ok and "fence.proxy.async.shared::cta" in ok
    assert "CU_TENSOR_MAP_DATA_TYPE_UINT8" in ok and "OutElem = __half;" in ok

    def errors(src: str) -> list[str]:
        return re.findall(r'^#error "([^"]*)"', src, re.M)

    assert errors(ok) == []
    text = (space_file("sdpa_hopper_fp8_d128.toml")).read_text()
    variants = (('OUT_DTYPE = "float16"', 'OUT_DTYPE = "bfloat16"', None),
                ('HEAD_DIM = 128', 'HEAD_DIM = 64', "HEAD_DIM must be 64 or 128 (FP8: 128"),
                ('OUT_DTYPE = "float16"', 'OUT_DTYPE = "float8_e4m3"', "OUT_DTYPE"),
                ('KV_DTYPE = "float8_e4m3"', 'KV_DTYPE = "float16"', "float8_e4m3 Q/K/V of one dtype"))
    for i, (old, new, why) in enumerate(variants):
        (tmp_path / f"v{i}.toml").write_text(text.replace(old, new))
        src = CandidateFactory(load_space(tmp_path / f"v{i}.toml")).make(base).source
        if why is None:
            assert errors(src) == [] and "OutElem = __nv_bfloat16;" in src
        else:
            assert any(why in e for e in errors(src)), (old, errors(src))
    (tmp_path / "n48.toml").write_text(text.replace("BLOCK_N = [64,", "BLOCK_N = [48, 64,"))
    src = CandidateFactory(load_space(tmp_path / "n48.toml")).make({**base, "BLOCK_N": 48}).source
    assert any("multiple of 32" in e for e in errors(src))


def test_desc_offsets_switches_only_the_descriptor_path():
    """DESC_OFFSETS (wgmma descriptors as a base plus constants, or rebuilt per wgmma) changes one trait of the
    rendered kernel and nothing else: off, a genome renders the kernel that earlier landscapes measured."""
    space = load_space(space_file("sdpa_hopper_fp16_d128_large.toml"))
    factory = CandidateFactory(space)
    g = space.genome_to_params(random.Random(3).choice(space.valid_genomes()))
    on = factory.make({**g, "DESC_OFFSETS": True}).source.splitlines()
    off = factory.make({**g, "DESC_OFFSETS": False}).source.splitlines()
    changed = [(a, b) for a, b in zip(on, off) if a != b]
    assert len(on) == len(off) and len(changed) == 2, changed
    assert any("kDescOffsets = true" in a and "kDescOffsets = false" in b for a, b in changed)
    assert any("DESC_OFFSETS=True" in a and "DESC_OFFSETS=False" in b for a, b in changed)


def test_scheduler_dynamic_adds_the_counter_and_static_renders_no_trace_of_it():
    """SCHEDULER = dynamic: a counter slot per launch, the tile handed over in shared memory (and across a cluster by
    st.async); static renders no counter, hand-over or extra barriers (the kernel earlier landscapes measured)."""
    space = load_space(space_file("sdpa_hopper_fp16_d128_mixed_large.toml"))
    factory = CandidateFactory(space)
    g = {"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 3, "NUM_CONSUMER_WARPGROUPS": 2, "PRODUCER_REGS": 24,
         "PINGPONG": True, "INTRA_WG_OVERLAP": True, "PERSISTENT": True, "Q_PREFETCH": False, "FAST_EXP": True,
         "CLUSTER_SIZE": 2, "RESCALE": "always", "POLY_EXP2": 0, "DESC_OFFSETS": False}
    dyn = factory.make({**g, "SCHEDULER": "dynamic"}).source
    static = factory.make({**g, "SCHEDULER": "static"}).source
    assert "kDynamic = true" in dyn and "kDynamic = false" in static
    for piece in ("evo_sdpa_tile_counters", "next_tile(p, pipe, rank, clusters, taken++)", "finish_schedule(p, clusters)",
                  "st.async.shared::cluster.mbarrier::complete_tx::bytes", "unsigned int* sched;"):
        assert piece in dyn and piece not in static, piece
    assert "for (int64_t t = cluster; t < p.num_tiles; t += clusters)" in static
