"""The ptxas static gate: report parsing, gate checks, and real nvcc runs (skipped where nvcc is missing)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from evoengineer.build.gate import check_gates, parse_ptxas, ptxas_gate

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
    from evoengineer import SPACES_DIR

    return sorted(p for p in SPACES_DIR.glob("*.toml") if 'backend = "cuda"' in p.read_text())


@needs_nvcc
@pytest.mark.parametrize("space_file", cuda_spaces(), ids=lambda p: p.stem)
def test_sampled_genomes_of_cuda_spaces_pass_the_gate(space_file: Path, tmp_path: Path):
    """CI renders and gate-checks a sample of genomes from each shipped CUDA space (no GPU needed)."""
    from concurrent.futures import ThreadPoolExecutor

    from evoengineer.candidate import CandidateFactory
    from evoengineer.space import load_space

    space = load_space(space_file)
    factory = CandidateFactory(space)
    valid = space.valid_genomes()
    sample = random.Random(0).sample(valid, min(6, len(valid)))

    def gate(i_g):
        i, g = i_g
        src = tmp_path / f"c{i}.cu"
        src.write_text(factory.from_genome(g).source)
        r = ptxas_gate(src, cuda_flags=list(space.cuda_flags), arch=space.arch)
        return space.genome_to_params(g), r

    with ThreadPoolExecutor(2) as ex:
        for params, r in ex.map(gate, enumerate(sample)):
            assert r["status"] == "ok", (params, r.get("reason"))
            assert check_gates(r["report"], space.gates) is None, (params, r["report"])
