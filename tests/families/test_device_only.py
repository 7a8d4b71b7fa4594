"""Device-only builds (issue 52), the part that needs no GPU: a CUDA MSDA candidate compiled to a cubin alone gives
the ptxas report its host-and-device compile gives (the static gate reads it unchanged), and exports the launch
traits its family's launcher reads, with the values its genes imply (read from the cubin on the CPU). Skipped
without nvcc."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from evoengineer.candidate import CandidateFactory
from evoengineer.compiler.cubin import cubin_traits
from evoengineer.compiler.gate import compile_cuda
from evoengineer.space import load_space, resolve_space_arg

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (no GPU)")


def _both_builds(tmp_path: Path, space, c, k: int, *, undefined_prefix: str = "evo_trait_") -> dict[str, int]:
    """Candidate `c` compiled with host code (k.o) and to a cubin (k.cubin): both ok, the same ptxas report, no
    symbol starting with `undefined_prefix` left undefined in the host object (a host-code build links); returns the
    cubin's traits."""
    from evoengineer.compiler.steps import cubin_compile_flags, cuda_compile_flags

    job = {"cuda_cflags": [*space.cuda_flags, "-DEVO_WITH_CUDA"], "arch": space.arch}
    src = tmp_path / f"k{k}.cu"
    src.write_text(c.source)
    host = compile_cuda(src, tmp_path / f"k{k}.o", flags=cuda_compile_flags(job))
    dev = compile_cuda(src, tmp_path / f"k{k}.cubin", flags=cubin_compile_flags(job), device_only=True)
    assert host["status"] == dev["status"] == "ok", (host.get("reason"), dev.get("reason"))
    assert dev["report"] == host["report"], c.params
    if shutil.which("nm"):
        undefined = subprocess.run(["nm", "-u", str(tmp_path / f"k{k}.o")], capture_output=True, text=True,
                                   check=True).stdout
        assert undefined_prefix not in undefined, undefined
    return cubin_traits(tmp_path / f"k{k}.cubin")


@pytest.mark.parametrize("space_name,seed", [("cuda_msda_fp16", 3), ("cuda_msda_fp32", 4)])
def test_a_cubin_has_the_report_of_todays_build_and_the_traits_of_its_genes(tmp_path: Path, space_name: str,
                                                                            seed: int):
    space = load_space(resolve_space_arg(space_name))
    factory = CandidateFactory(space)
    rng = random.Random(seed)
    for k in range(2):
        c = factory.from_genome(space.random_valid_genome(rng))
        t = _both_builds(tmp_path, space, c, k)
        p = c.params
        window = p["WINDOW_TILE"] > 0
        assert t["params_bytes"] == 80  # the binding's MsdaParams
        assert t["threads"] == 32 * p["NUM_WARPS"] and t["tile_items"] == 8 * p["QUERIES_PER_BLOCK"]
        assert t["lp"] == space.signature["L"] * space.signature["P"]
        assert (t["head_major"], t["persistent"], t["branch_free"]) == (p["HEAD_MAJOR"], p["PERSISTENT"],
                                                                         p["BRANCH_FREE"])
        assert (t["window"], t["wpipe"]) == (window and p["WINDOW_STAGES"] == 0, window and p["WINDOW_STAGES"] > 0)
        assert t["row_bytes"] == space.signature["D"] * (4 if space.signature["VALUE_DTYPE"] == "float32" else 2)


def test_traits_of_something_that_is_not_a_cubin(tmp_path: Path):
    bad = tmp_path / "x.cubin"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(ValueError, match="not a little-endian ELF64 file"):
        cubin_traits(bad)


@pytest.mark.parametrize("space_name,seed", [("decode_fp8kv_d128_paged", 1), ("decode_fp16_d128", 2)])
def test_a_decode_cubin_has_the_report_and_the_traits_its_launcher_reads(tmp_path: Path, space_name: str, seed: int):
    """The decode family's device-only builds: the same ptxas report as the host-code build, the kernels under the
    C names the binding's DecodeCubin looks up, and the traits of the genes, with Params laid out as the launcher
    writes it (the members up to box_shift, then the optional ones at their offsets). Every load path and combine is
    drawn at least once over the spaces' draws."""
    space = load_space(resolve_space_arg(space_name))
    factory = CandidateFactory(space)
    rng = random.Random(seed)
    valid = space.valid_genomes()
    picks = []
    for path, combine in (("tma", "cluster"), ("bulk", "dependent"), ("cp_async", "in_kernel")):
        fits = [g for g in valid if space.genome_to_params(g)["LOAD_PATH"] == path
                and space.genome_to_params(g)["COMBINE"] == combine]
        if fits:
            picks.append(rng.choice(fits))
    paged = space.signature.get("KV_LAYOUT") == "paged"
    for k, g in enumerate(picks):
        c = factory.from_genome(g)
        p = c.params
        t = _both_builds(tmp_path, space, c, k)
        assert t["threads"] == 32 * p["NUM_WARPS"] and t["block_n"] == p["BLOCK_N"]
        assert t["head_dim"] == space.signature["HEAD_DIM"] and t["paged"] == paged
        assert t["fp8"] == (space.signature["KV_DTYPE"] == "float8_e4m3")
        assert (t["tma"], t["combine_cluster"]) == (p["LOAD_PATH"] == "tma", p["COMBINE"] == "cluster")
        assert t["combine_in_kernel"] == (p["COMBINE"] == "in_kernel")
        assert t["off_box_shift"] == 144  # DecodeParamsHead: 11 pointers, 15 ints and a float before it (LP64)
        assert (t["off_cluster"] >= 148) == (p["COMBINE"] == "cluster")
        if p["LOAD_PATH"] == "tma":
            assert t["off_tm_k"] % 64 == 0 and t["off_tm_v"] == t["off_tm_k"] + 128
            assert t["params_bytes"] == t["off_tm_v"] + 128
        else:
            assert t["off_tm_k"] == t["off_tm_v"] == -1
        assert 148 <= t["params_bytes"] <= 1024  # DecodeCubin::kParamsCapacity
        image = (tmp_path / f"k{k}.cubin").read_bytes()  # the kernels' C names in its symbol strings
        assert b"evo_decode_kernel\0" in image and b"evo_decode_combine_kernel\0" in image


@pytest.mark.parametrize("space_name,seed", [("sdpa_hopper_fp16_d128", 3), ("sdpa_hopper_fp8_d128", 4),
                                             ("sdpa_fp16_d64", 5)])
def test_an_sdpa_cubin_has_the_report_and_the_traits_its_launcher_reads(tmp_path: Path, space_name: str,
                                                                       seed: int):
    """The SDPA family's device-only builds, both templates: the same ptxas report as the host-code build, the
    kernel and the counters under the C names SdpaCubin looks up, the traits of the genes and Params laid out as the
    launcher writes it."""
    space = load_space(resolve_space_arg(space_name))
    factory = CandidateFactory(space)
    rng = random.Random(seed)
    hopper = "hopper" in space.template
    valid = space.valid_genomes()
    if hopper:  # the dynamic scheduler (counter slots in Params and in the module) and the static one
        picks = [rng.choice([g for g in valid if (space.genome_to_params(g).get("SCHEDULER") == "dynamic") == d])
                 for d in (True, False)]
    else:  # persistent CTAs (the module's work counter) and not
        picks = [rng.choice([g for g in valid if space.genome_to_params(g)["USE_PERSISTENT_CTA"] == d])
                 for d in (True, False)]
    for k, g in enumerate(picks):
        c = factory.from_genome(g)
        p = c.params
        t = _both_builds(tmp_path, space, c, k, undefined_prefix="evo_")  # the counters too
        image = (tmp_path / f"k{k}.cubin").read_bytes()
        assert t["block_m"] == p["BLOCK_M"] and t["fp8"] == (space.signature["KV_DTYPE"] == "float8_e4m3")
        if hopper:
            dynamic = p.get("SCHEDULER", "static") == "dynamic"
            assert t["kind"] == 2 and b"evo_sdpa_hopper_kernel\0" in image
            assert (t["cluster"], t["persistent"], t["dynamic"]) == (p["CLUSTER_SIZE"], p["PERSISTENT"], dynamic)
            assert t["off_sched"] == (56 if dynamic else -1)  # after 3 pointers and 8 ints
            assert t["off_scale_log2"] == (64 if dynamic else 56) and t["params_bytes"] <= 256
            assert (b"evo_sdpa_tile_counters\0" in image) == dynamic
            assert t["head_dim"] == space.signature["HEAD_DIM"] and t["box_cols"] * (1 if t["fp8"] else 2) == 128
        else:
            assert t["kind"] == 1 and b"evo_sdpa_kernel\0" in image and b"evo_sdpa_next_item\0" in image
            assert (t["params_bytes"], t["off_scale_log2"]) == (80, 72)  # the launcher's SdpaPlainParams
            assert t["persistent"] == p["USE_PERSISTENT_CTA"]
