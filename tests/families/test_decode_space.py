"""The decode spaces (evoengineer/families/decode/spaces/decode_*.toml) and their template without a GPU: every space loads with the decode
task, its shared-memory constraint admits exactly the genomes whose layout (as evoengineer/families/decode/cuda/decode.cu.j2 computes
it) fits in 227 KB, rendered genomes carry their genes in the one traits struct, and the correctness shapes cover
what the issue asks (ragged lengths 1 / 7 / 1000 / Sk, G = 1 and 8, Sq = 1 and 5, the timed decode shape)."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from evoengineer import space_file, shipped_space_files
from evoengineer.candidate import CandidateFactory
from evoengineer.space import load_space
from evoengineer.families import get_task

SPACES = sorted(shipped_space_files("decode_*.toml"))
SMEM_LIMIT = 232448  # 227 KB per block on sm_90


def test_the_spaces_ship():
    assert [p.stem for p in SPACES] == ["decode_fp16_d128", "decode_fp16_d128_paged", "decode_fp8kv_d128",
                                        "decode_fp8kv_d128_paged", "decode_fp8kv_d64"]


def _template_smem(p: dict, head_dim: int, fp8: bool) -> int:
    """kSmemAlloc as the template's Traits compute it (tma: unpadded rows, 1024 bytes of slack for the swizzle
    atom's alignment)."""
    slice_ = p["BLOCK_N"] // p["NUM_WARPS"]
    tma = p["LOAD_PATH"] == "tma"
    pitch = head_dim * (1 if fp8 else 2) + (0 if tma else 16)
    half_pitch = head_dim * 2 + 16
    rows = (8 if p["MMA_ROWS"] == "keys" else 16) * p["M_TILES"]  # query rows of a row tile: N or M side
    ring = p["NUM_WARPS"] * p["STAGES"] * 2 * slice_ * pitch
    buffers = {"shared": 2, "shared_single": 1, "k_registers": 1}.get(p.get("DEQUANT"), 0) if fp8 else 0  # K, V
    conv = p["NUM_WARPS"] * buffers * slice_ * half_pitch
    q = 0 if p["Q_IN_REGISTERS"] else rows * half_pitch
    merge = rows * head_dim * 4 + 2 * p["NUM_WARPS"] * rows * 4 + 2 * rows * 4
    bar_offset = (max(ring + conv + q, merge) + 15) // 16 * 16
    return bar_offset + (p["NUM_WARPS"] * p["STAGES"] * 8 if p["LOAD_PATH"] in ("bulk", "tma") else 0) + 1024 * tma


def _traits(source: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"static constexpr (?:int|bool) (k\w+) = ([\w\"]+);", source)}


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_space_matches_the_template(space_file: Path):
    space = load_space(space_file)
    assert space.task == "decode" and space.template == "cuda/decode.cu.j2" and space.arch == "sm_90"
    assert space.gates["max_spill_bytes"] == 0 and get_task(space).entry == "evo_decode_forward"
    sig = space.signature
    fp8 = sig["KV_DTYPE"] == "float8_e4m3"
    assert ("DEQUANT" in space.names) == fp8
    assert space.parameters[-1].name == "MMA_ROWS" and space.parameters[-1].default == "queries"
    # every genome of the product: admitted by the constraints iff it fits (the constraint adds the barriers of the
    # TMA path to every genome, so it may turn away a few that would just fit)
    valid = set(space.valid_genomes())
    sizes = [len(p.values) for p in space.parameters]
    rnd = random.Random(0)
    for _ in range(3000):
        g = tuple(rnd.randrange(n) for n in sizes)
        p = space.genome_to_params(g)
        fits = _template_smem(p, sig["HEAD_DIM"], fp8) <= SMEM_LIMIT
        if g in valid:
            assert fits, p
    assert len(valid) > 1000
    factory = CandidateFactory(space)
    for g in rnd.sample(sorted(valid), 8):
        p = space.genome_to_params(g)
        src = factory.make(p).source
        t = _traits(src)
        assert (int(t["kBlockN"]), int(t["kWarps"]), int(t["kStages"]), int(t["kMTiles"]), int(t["kMinBlocks"])) == (
            p["BLOCK_N"], p["NUM_WARPS"], p["STAGES"], p["M_TILES"], p["MIN_BLOCKS"])
        assert t["kBulk"] == str(p["LOAD_PATH"] == "bulk").lower()
        assert t["kTma"] == str(p["LOAD_PATH"] == "tma").lower()
        assert ("cp.async.bulk.tensor.3d" in src) == (p["LOAD_PATH"] == "tma")
        assert t["kCombineInKernel"] == str(p["COMBINE"] == "in_kernel").lower()
        assert t["kCombineDependent"] == str(p["COMBINE"] in ("dependent", "cluster")).lower()
        assert t["kCombineCluster"] == str(p["COMBINE"] == "cluster").lower()
        assert ("barrier.cluster.arrive" in src) == (p["COMBINE"] == "cluster")
        assert t["kDequantInRegisters"] == str(fp8 and p["DEQUANT"] == "registers").lower()
        assert t["kConvertSingle"] == str(fp8 and p["DEQUANT"] == "shared_single").lower()
        assert t["kKRaw"] == str(fp8 and p["DEQUANT"] in ("registers", "k_registers")).lower()
        assert t["kKeysM"] == str(p["MMA_ROWS"] == "keys").lower()
        assert "__launch_bounds__(Tr::kThreads, Tr::kMinBlocks)" in src and "#error" not in src.split("#include")[0]
        assert ("cp.async.bulk.shared::cluster" in src) and ("cp.async.cg.shared.global" in src)
        assert t["kPaged"] == str(sig.get("KV_LAYOUT") == "paged").lower()


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_correctness_shapes_cover_the_issue(space_file: Path):
    space = load_space(space_file)
    timed = [s for s in space.shapes if s.get("time")]
    assert len(timed) == 1 and (timed[0]["B"], timed[0]["Hq"], timed[0]["Hkv"], timed[0]["Sk"]) == (8, 32, 8, 8192)
    assert timed[0].get("Sq", 1) == 1
    ragged = [s for s in space.shapes if s.get("seq_lens")]
    lens = {x for s in ragged for x in s["seq_lens"]}
    assert {1, 7, 1000} <= lens and any(s["Sk"] in s["seq_lens"] for s in ragged)
    groups = {s["Hq"] // s["Hkv"] for s in space.shapes}
    assert {1, 8} <= groups and {1, 5} <= {s.get("Sq", 1) for s in space.shapes}
    assert all(s.get("fresh") for s in space.shapes)
    if space.signature["KV_DTYPE"] == "float8_e4m3":
        assert timed[0]["fp16_max_abs_err"] == 0.06
    if space.signature.get("KV_LAYOUT") == "paged":  # page sizes 16, 32, 64; the timed shape at 16
        assert {16, 32, 64} <= {s["page_size"] for s in space.shapes} and timed[0]["page_size"] == 16
    else:
        assert not any("page_size" in s for s in space.shapes)


def test_paged_spaces_are_their_contiguous_spaces_with_pages():
    """A paged space searches the genes of its contiguous twin (same parameters and constraints: every load path,
    tensor-map boxes included, reads pages)."""
    for paged in SPACES:
        if not paged.stem.endswith("_paged"):
            continue
        a, b = load_space(paged), load_space(space_file(f"{paged.stem[:-len('_paged')]}.toml"))
        assert [(x.name, x.values) for x in a.parameters] == [(x.name, x.values) for x in b.parameters]
        assert [c.text for c in a.constraints] == [c.text for c in b.constraints] and a.gates == b.gates
        assert {k: v for k, v in a.signature.items() if k != "KV_LAYOUT"} == b.signature


def test_a_paged_space_needs_page_sizes(tmp_path: Path):
    from evoengineer.errors import UserError

    text = (space_file("decode_fp16_d128_paged.toml")).read_text()
    shutil.copy(space_file("decode_fp16_d128.toml"), tmp_path)  # the space it extends
    (tmp_path / "a.toml").write_text(text.replace("page_size = 64\n", ""))
    (tmp_path / "b.toml").write_text(text.replace('KV_LAYOUT = "paged"', 'KV_LAYOUT = "blocked"'))
    (tmp_path / "c.toml").write_text(text.replace("page_size = 64", "page_size = 48"))
    flat = (space_file("decode_fp16_d128.toml")).read_text()
    (tmp_path / "d.toml").write_text(flat.replace("Sk = 2000\n", "Sk = 2000\npage_size = 16\n"))
    for name, words in (("a", "needs 'page_size'"), ("b", "KV_LAYOUT: one of contiguous, paged"),
                        ("c", "power of two"), ("d", "'page_size' is for a paged space")):
        with pytest.raises((UserError, ValueError), match=words):
            get_task(load_space(tmp_path / f"{name}.toml")).shapes


def test_the_template_refuses_unknown_choices(tmp_path: Path):
    """A space naming a load path or combine the template does not know renders to an #error, not a silent default."""
    text = (space_file("decode_fp16_d128.toml")).read_text()
    text = text.replace('values = ["cp_async", "bulk", "tma"]', 'values = ["cp_async", "bulk", "tma", "ldg"]')
    (tmp_path / "s.toml").write_text(text)
    space = load_space(tmp_path / "s.toml")
    p = next(q for q in map(space.genome_to_params, space.valid_genomes()) if q["COPY_BYTES"] == 16)
    src = CandidateFactory(space).make({**p, "LOAD_PATH": "ldg"}).source
    assert '#error "unknown LOAD_PATH / COMBINE"' in src


def test_tma_loads_of_pages_and_their_refusal_for_narrow_rows(tmp_path: Path):
    """LOAD_PATH = tma renders for paged caches (a pool map: boxes of one page's rows, lane j issuing box j, its
    pool row read from the block table) and to an #error for rows narrower than the 128-byte swizzle (FP8 at head
    dim 64)."""
    paged = load_space(space_file("decode_fp16_d128_paged.toml"))
    p = next(q for q in map(paged.genome_to_params, paged.valid_genomes()) if q["COPY_BYTES"] == 16)
    assert not paged.violated({**p, "LOAD_PATH": "tma"})
    src = CandidateFactory(paged).make({**p, "LOAD_PATH": "tma"}).source
    assert "#error" not in src and "make_pool_map" in src and "cp.async.bulk.tensor.3d" in src
    assert "static constexpr bool kPaged = true;" in src and "static constexpr bool kTma = true;" in src
    text = (space_file("decode_fp8kv_d64.toml")).read_text().replace('values = ["cp_async", "bulk"]',
                                                                      'values = ["cp_async", "bulk", "tma"]')
    (tmp_path / "d64.toml").write_text(text)
    d64 = load_space(tmp_path / "d64.toml")
    q = next(x for x in map(d64.genome_to_params, d64.valid_genomes()) if x["COPY_BYTES"] == 16)
    src = CandidateFactory(d64).make({**q, "LOAD_PATH": "tma"}).source
    assert '#error "LOAD_PATH = tma needs K/V rows of whole 128-byte boxes' in src
