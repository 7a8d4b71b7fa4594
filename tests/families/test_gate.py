"""The ptxas static gate: report parsing, gate checks, and real nvcc runs (skipped where nvcc is missing)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from evoengineer.compiler.gate import check_gates, parse_ptxas, ptxas_gate

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
ptxas info    : Function properties for _Z3fooPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3barPf' for 'sm_90'
ptxas info    : Function properties for _Z3barPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 0 barriers, 360 bytes cmem[0]
"""


def test_parse_takes_the_worst_kernel():
    r = parse_ptxas(REPORT)
    assert r == {"registers": 96, "smem_bytes": 4096, "stack_bytes": 16, "spill_bytes": 20, "kernels": 2}
    assert check_gates(r, {"max_registers": 128, "max_spill_bytes": 0}) == "spill_bytes 20 > max_spill_bytes 0"
    assert check_gates(r, {"max_registers": 64}) == "registers 96 > max_registers 64"
    assert check_gates(r, {"max_registers": 255, "max_smem_bytes": 49152}) is None


SPILLY = """
__global__ void __launch_bounds__(256) spilly(float* out, const int* idx, int n) {
  float acc[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = out[threadIdx.x + i * 256];
  for (int k = 0; k < n; ++k) acc[idx[k] & 63] += 1.0f;  // run-time indices put the array on the stack
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i] * i;
  out[threadIdx.x] = s;
}
"""
BROKEN = "__global__ void k(float* p) { p[0] = undefined_name; }\n"


@needs_nvcc
def test_real_ptxas_report_and_compile_error(tmp_path: Path):
    src = tmp_path / "spilly.cu"
    src.write_text(SPILLY)
    r = ptxas_gate(src, cuda_flags=["-O3"], arch="sm_90")
    assert r["status"] == "ok", r
    assert r["report"]["kernels"] == 1 and r["report"]["registers"] > 0 and r["report"]["stack_bytes"] >= 256
    assert check_gates(r["report"], {"max_stack_bytes": 0}).startswith("stack_bytes")
    bad = tmp_path / "broken.cu"
    bad.write_text(BROKEN)
    r = ptxas_gate(bad, cuda_flags=["-O3"], arch="sm_90")
    assert r["status"] == "compile_error" and "undefined_name" in r["reason"]


def cuda_spaces() -> list[Path]:
    from evoengineer import space_file, shipped_space_files

    from evoengineer.space import load_space

    return sorted(p for p in shipped_space_files("*.toml") if load_space(p).target.device_compiler)


def _gate_genome(space, params: dict, path: Path) -> dict:
    from evoengineer.candidate import CandidateFactory

    path.write_text(CandidateFactory(space).make(params).source)
    return ptxas_gate(path, cuda_flags=list(space.cuda_flags), arch=space.arch)


@needs_nvcc
@pytest.mark.parametrize("space_file", cuda_spaces(), ids=lambda p: p.stem)
def test_sampled_genomes_of_cuda_spaces_compile_and_get_a_gate_verdict(space_file: Path, tmp_path: Path):
    """CI renders and gate-checks a sample of genomes from each shipped CUDA space (no GPU needed): every valid
    genome compiles; the verdict follows the ptxas report (a register-capped genome may spill and be rejected)."""
    from concurrent.futures import ThreadPoolExecutor

    from evoengineer.space import load_space

    space = load_space(space_file)
    valid = space.valid_genomes()
    sample = [space.genome_to_params(g) for g in random.Random(0).sample(valid, min(4, len(valid)))]
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda ip: _gate_genome(space, ip[1], tmp_path / f"c{ip[0]}.cu"), enumerate(sample)))
    for params, r in zip(sample, results):
        assert r["status"] == "ok", (params, r.get("reason"))
        rep, gates = r["report"], space.gates
        assert rep["registers"] > 0 and rep["kernels"] >= 1, rep
        fits = (rep["spill_bytes"] <= gates.get("max_spill_bytes", 0)
                and rep["smem_bytes"] <= gates.get("max_smem_bytes", 1 << 30)
                and rep["registers"] <= gates.get("max_registers", 255))
        assert (check_gates(rep, gates) is None) == fits, (params, rep)


@needs_nvcc
def test_gate_rejects_a_spilling_msda_genome(tmp_path: Path):
    """Eight warps at four blocks per SM cap registers at 64; holding the prefetched next query then spills, and the
    gate turns the candidate away before any torch build (found by the full fp16 grid)."""
    from evoengineer import space_file, shipped_space_files
    from evoengineer.space import load_space

    space = load_space(space_file("cuda_msda_fp16.toml"))
    params = {"NUM_WARPS": 8, "NUM_PRODUCER_WARPS": 0, "STAGES": 1, "QUERIES_PER_BLOCK": 4, "D_STRIDE": 2,
              "SHARED_META": False, "PERSISTENT": False, "PREFETCH": True, "MIN_BLOCKS_PER_SM": 4,
              "STAGE_VALUES": False, "CACHE_SMALL_LEVEL": False, "BRANCH_FREE": False, "HALF2": False,
              "WINDOW_TILE": 0, "WINDOW_MARGIN": 3, "WINDOW_HEADS": 1, "WINDOW_STAGES": 0, "HEAD_MAJOR": False,
              "PAIR_LOADS": False}
    assert not space.violated(params)
    r = _gate_genome(space, params, tmp_path / "spill.cu")
    assert r["status"] == "ok" and r["report"]["registers"] <= 64
    assert r["report"]["spill_bytes"] > 0
    assert "spill_bytes" in check_gates(r["report"], space.gates)
    no_prefetch = _gate_genome(space, {**params, "PREFETCH": False}, tmp_path / "fits.cu")
    assert check_gates(no_prefetch["report"], space.gates) is None, no_prefetch["report"]
