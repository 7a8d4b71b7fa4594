"""`python -m evoengineer check`: a space's template rendered, compiled and gated without a search (and, for a CUDA
space, without a GPU: nvcc alone)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evoengineer.cli import main

ROOT = Path(__file__).resolve().parents[2]
CPU_EXAMPLE = ROOT / "examples" / "families" / "add_rmsnorm_cpu"
CUDA_EXAMPLE = ROOT / "examples" / "families" / "rmsnorm_cuda"


def _nvcc() -> bool:
    from evoengineer.compiler.steps import nvcc_path as found

    return found() is not None or shutil.which("nvcc") is not None


def test_check_builds_a_cpu_space_and_prints_the_prototype(tmp_path: Path, build_cache: Path, capsys):
    assert main(["check", "--space", str(CPU_EXAMPLE / "add_rmsnorm.toml"), "--genomes", "2",
                 "--cache-dir", str(build_cache)]) == 0
    out = capsys.readouterr().out
    assert ('entry point: extern "C" int evo_add_rmsnorm(const void* x, void* residual, const void* weight, '
            'void* out, void* rstd, int64_t rows, int64_t hidden, float eps, void* stream);') in out
    assert out.count("  ok  ") == 2 and "2 of 2 built and passed the gates" in out


def test_check_reports_a_template_that_does_not_compile(tmp_path: Path, build_cache: Path, capsys):
    d = tmp_path / "broken"
    shutil.copytree(CPU_EXAMPLE, d)
    t = d / "add_rmsnorm.cpp.j2"
    t.write_text(t.read_text().replace("*rstd = inv;", "*rstd = inv_typo;"))
    assert main(["check", "--space", str(d / "add_rmsnorm.toml"), "--genomes", "1",
                 "--cache-dir", str(build_cache)]) == 1
    out = capsys.readouterr().out
    assert "compile_error" in out and "inv_typo" in out and "0 of 1 built" in out


@pytest.mark.skipif(not _nvcc(), reason="no nvcc")
def test_check_compiles_and_gates_a_cuda_space_without_a_gpu(tmp_path: Path, build_cache: Path, capsys):
    """The CUDA example family: compiled and gated with nvcc only (nothing linked or loaded, so no GPU or CUDA
    torch needed); a gate set below what the kernels use fails them, naming the gate."""
    d = tmp_path / "rms"
    shutil.copytree(CUDA_EXAMPLE, d)
    space = d / "rmsnorm_h100.toml"
    assert main(["check", "--space", str(space), "--genomes", "1", "--cache-dir", str(build_cache)]) == 0
    out = capsys.readouterr().out
    # device code only (the example declares its launch): a cubin, the kernel's prototype
    assert "compiling device code only (cubins) with nvcc" in out and "regs " in out and "1 of 1 built" in out
    assert 'extern "C" __global__ void evo_rmsnorm_kernel(const void* x, const void* weight, void* out' in out
    text = space.read_text()
    assert "max_registers = 255" in text
    space.write_text(text.replace("max_registers = 255", "max_registers = 8"))
    assert main(["check", "--space", str(space), "--genomes", "1", "--cache-dir", str(build_cache)]) == 1
    out = capsys.readouterr().out
    assert "gate_failed" in out and "> max_registers 8" in out


@pytest.mark.slow
def test_check_goes_through_every_signature_variant(tmp_path: Path, build_cache: Path, capsys):
    data = Path(__file__).resolve().parents[1] / "data" / "variants"
    assert main(["check", "--space", str(data / "variants.toml"), "--genomes", "1", "--cache-dir",
                 str(build_cache)]) == 0
    out = capsys.readouterr().out
    assert "== variant float32 ==" in out and "== variant float64 ==" in out
    assert "const void* x, void* out, int64_t n, double scale" in out and out.count("1 of 1 built") == 2
