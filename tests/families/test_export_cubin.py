"""Exported CUDA kernels carry their device code (issue 52), the part that needs no GPU: the kernel folder of a
device-only family holds the cubin the search's builds make (same flags, same traits), recorded in kernel.json with
what loads it; a folder written again keeps it; the loader takes it for the GPUs it runs on, compiles the recorded
source for another architecture (device code only, cached), refuses an architecture-specific cubin elsewhere and a
cubin changed after the export. Skipped without nvcc; loading on a GPU: test_gpu_export.py."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from evoengineer.candidate import CandidateFactory
from evoengineer.compiler.cubin import cubin_traits
from evoengineer.elite_json import build_record
from evoengineer.ops.device_code import CUBIN_FILE, PerDeviceModule, cubin_for, cubin_runs_on
from evoengineer.space import load_space, resolve_space_arg

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (no GPU)")


@pytest.mark.parametrize("cubin,device,runs", [
    ("sm_90", "sm_90", True), ("sm_80", "sm_86", True), ("sm_86", "sm_80", False), ("sm_90", "sm_100", False),
    ("sm_90a", "sm_90", True), ("sm_90a", "sm_100", False), ("sm_100a", "sm_100", True), ("sm_80", "sm_90", False),
    ("sm_100", "sm_103", True), ("sm_9", "sm_90", False), ("x", "sm_90", False)])
def test_which_gpus_a_cubin_runs_on(cubin: str, device: str, runs: bool):
    assert cubin_runs_on(cubin, device) is runs


def _elite(space_name: str, seed: int) -> tuple[dict, type]:
    """An elite record of a random valid genome of a shipped CUDA space, as elite.json holds it."""
    from evoengineer.families import find_family

    space = load_space(resolve_space_arg(space_name))
    c = CandidateFactory(space).from_genome(space.random_valid_genome(random.Random(seed)))
    build = build_record(space, SimpleNamespace(template_sha256="t" * 64, fingerprint={}))
    return {"hash": c.hash, "source": c.source, "rank": 1, "space": space.name, "params": c.params,
            "metrics": {"time_us": 1.0}, "build": build}, find_family(build["task"], build["family"]["version"])


@needs_nvcc
def test_a_cuda_kernel_folder_carries_the_cubin_of_the_search(tmp_path: Path):
    from evoengineer.compiler.gate import compile_cuda
    from evoengineer.compiler.steps import cubin_compile_flags
    from evoengineer.export import write_kernel_folder

    elite, cls = _elite("cuda_msda_fp16", 5)
    folder = tmp_path / "k"
    write_kernel_folder(elite, folder, cls)
    kernel = json.loads((folder / "kernel.json").read_text())
    rec = kernel["cubin"]
    assert rec["file"] == CUBIN_FILE and rec["arch"] == "sm_90" and rec["retarget"] is True
    assert rec["signature"] == cls.signature_text(elite["build"]["signature"])
    assert not any(f.startswith(("-arch", "-gencode")) for f in rec["nvcc_flags"])
    # the search's device-only build of the same source: the same traits (what the launcher reads)
    space = load_space(resolve_space_arg("cuda_msda_fp16"))
    (tmp_path / "s.cu").write_text(elite["source"])
    job = {"cuda_cflags": [*space.cuda_flags, "-DEVO_WITH_CUDA"], "arch": space.arch}
    assert compile_cuda(tmp_path / "s.cu", tmp_path / "s.cubin", flags=cubin_compile_flags(job),
                        device_only=True)["status"] == "ok"
    assert rec["flags"] == cubin_compile_flags(job)
    assert cubin_traits(folder / CUBIN_FILE) == cubin_traits(tmp_path / "s.cubin")

    # written again (evoengineer.load does, each time): the cubin is kept, not compiled again
    stamp = (folder / CUBIN_FILE).stat().st_mtime_ns
    write_kernel_folder(elite, folder, cls)
    assert (folder / CUBIN_FILE).stat().st_mtime_ns == stamp
    assert json.loads((folder / "kernel.json").read_text())["cubin"] == rec

    root = tmp_path / "cache"
    assert cubin_for(folder, kernel, root, "sm_90") == folder / CUBIN_FILE  # this GPU: the exported one
    # another architecture (a newer GPU): the recorded source compiled for it, device code only, once; an older
    # one than its instructions need says what the compiler said
    with pytest.raises(RuntimeError, match="compiling its device code for sm_80 failed:\n.*requires .target sm_90"):
        cubin_for(folder, kernel, root, "sm_80")
    other = cubin_for(folder, kernel, root, "sm_100")
    assert other.is_relative_to(root / "cubins") and cubin_traits(other) == cubin_traits(folder / CUBIN_FILE)
    stamp = other.stat().st_mtime_ns
    assert cubin_for(folder, kernel, root, "sm_100") == other and other.stat().st_mtime_ns == stamp
    # changed after the export: refused, named
    data = bytearray((folder / CUBIN_FILE).read_bytes())
    data[-1] ^= 1
    (folder / CUBIN_FILE).write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="does not match the sha256"):
        cubin_for(folder, kernel, root, "sm_90")
    # flags of a kernel.json are checked before they reach nvcc
    bad = json.loads(json.dumps(kernel))
    bad["cubin"]["nvcc_flags"].append("-DX=1;touch /tmp/x")
    with pytest.raises(RuntimeError, match="refused"):
        cubin_for(folder, bad, root, "sm_75")


@needs_nvcc
def test_architecture_specific_device_code_runs_on_its_architecture_only(tmp_path: Path):
    from evoengineer.export import write_kernel_folder

    elite, cls = _elite("sdpa_hopper_fp16_d64", 2)
    write_kernel_folder(elite, tmp_path, cls)
    kernel = json.loads((tmp_path / "kernel.json").read_text())
    assert kernel["cubin"]["arch"] == "sm_90a" and kernel["cubin"]["retarget"] is False
    assert cubin_for(tmp_path, kernel, tmp_path / "cache", "sm_90") == tmp_path / CUBIN_FILE
    with pytest.raises(RuntimeError, match="compiled for sm_90a .* this GPU is sm_100: it runs on sm_90a GPUs only"):
        cubin_for(tmp_path, kernel, tmp_path / "cache", "sm_100")


@needs_nvcc
def test_an_exported_package_carries_the_cubin_and_its_loader(tmp_path: Path):
    from evoengineer.cli import main
    from evoengineer.elite_json import SCHEMA

    elite, _ = _elite("decode_fp16_d128", 3)
    doc = {"schema": SCHEMA, "space": "decode_fp16_d128", "run_id": 1, "run_status": "finished", "generation": 1,
           "evaluations": 1, "fingerprint": {}, "elites": [elite]}
    (tmp_path / "elite.json").write_text(json.dumps(doc))
    assert main(["export", str(tmp_path / "elite.json"), "--out", str(tmp_path / "pkg")]) == 0
    (pkg,) = [p for p in (tmp_path / "pkg").iterdir() if p.is_dir()]
    kernel = json.loads((pkg / "kernel.json").read_text())
    assert (pkg / CUBIN_FILE).is_file() and kernel["cubin"]["arch"] == "sm_90"
    assert (pkg / "device_code.py").is_file() and (pkg / "runtime.py").is_file()
    assert '"*.cubin"' in (tmp_path / "pkg" / "pyproject.toml").read_text()
    assert "device code comes compiled (kernel.cubin" in (tmp_path / "pkg" / "README.md").read_text()
    # the package's own copies import without EvoEngineer's modules (a fresh interpreter, evoengineer hidden)
    import subprocess
    import sys

    code = ("import sys, builtins\n"
            "real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    if name.startswith('evoengineer'):\n"
            "        raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            "import types\n"
            f"shell = types.ModuleType({pkg.name!r})\n"  # the package's files without its __init__ (which builds)
            f"shell.__path__ = [{str(pkg)!r}]\n"
            f"sys.modules[{pkg.name!r}] = shell\n"
            f"from {pkg.name} import device_code, runtime\n"
            "assert runtime.device_code is device_code and device_code.cubin_runs_on('sm_90', 'sm_90')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_cpu_kernel_folder_has_no_cubin(tmp_path: Path):
    from evoengineer.export import write_kernel_folder

    elite, cls = _elite("cpu_msda", 1)
    write_kernel_folder(elite, tmp_path, cls)
    assert "cubin" not in json.loads((tmp_path / "kernel.json").read_text())
    assert not (tmp_path / CUBIN_FILE).exists()


def test_calls_go_to_the_module_of_their_device():
    """PerDeviceModule without a GPU: tensors stand in by their `is_cuda` / `device.index`; a module is loaded on a
    device when a call first needs it; attributes that are not functions are the first module's."""
    import torch

    loaded = []

    def load(device: int):
        loaded.append(device)
        return SimpleNamespace(signature="S=1", forward=lambda *a: (device, len(a)))

    m = PerDeviceModule(load, 0)
    assert loaded == [0] and m.signature == "S=1"

    class OnDevice(torch.Tensor):  # a CPU tensor that says it lives on cuda:1
        is_cuda = True
        device = SimpleNamespace(index=1)

    t = torch.zeros(1).as_subclass(OnDevice)
    assert m.forward(3, t, 4) == (1, 3) and loaded == [0, 1]
    assert m.forward(t) == (1, 1) and loaded == [0, 1]  # loaded once per device
    with pytest.raises(AttributeError):
        m._private  # noqa: B018
