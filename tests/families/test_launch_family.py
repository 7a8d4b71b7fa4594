"""Device code with a declared launch (issue 52), the part that needs no GPU: `Signature(launch=Launch(items))` is
checked when declared; the generated binding of such a call launches a cubin (its C++ compiles with CUDA); the
CUDA example family (examples/families/rmsnorm_cuda), written that way, builds device code only and its cubins export
the launch traits its genes imply. The launch on a GPU: tests/gpu/test_gpu_rmsnorm_family.py."""

from __future__ import annotations

import random
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from evoengineer import ROOT
from evoengineer.compiler.generic_binding import generate_binding
from evoengineer.errors import UserError
from evoengineer.family import Launch, Scalar, Signature, Tensor, launched

EXAMPLE = ROOT / "examples" / "families" / "rmsnorm_cuda"


def _signature(**kw) -> Signature:
    args = kw.pop("args", (Tensor("x", "float16", ("rows", "hidden")), Tensor("w", "float16", ("hidden",)),
                           Scalar("eps", "float32"), Tensor("out", "float16", ("rows", "hidden"), output=True)))
    return Signature(args=args, fixed=kw.pop("fixed", {"hidden": 64}), **kw)


def test_a_launch_is_checked_where_it_is_declared():
    sig = _signature(launch=Launch(items="rows"))
    assert sig.to_json()["launch"] == {"items": "rows"}
    assert sig.kernel_prototype("k") == ('extern "C" __global__ void k(const void* x, const void* w, void* out, '
                                         'int64_t rows, float eps)')
    assert sig.c_prototype("k") == sig.kernel_prototype("k")  # what `check` prints
    _signature(launch=Launch(items="rows*hidden"))  # a product of sizes (fixed ones too)
    with pytest.raises(ValueError, match="items 'cols': 'cols' is no size of the call"):
        _signature(launch=Launch(items="cols"))
    with pytest.raises(ValueError, match="no size of the call"):
        _signature(launch=Launch(items="rows*2"))
    with pytest.raises(ValueError, match="takes no workspace"):
        _signature(launch=Launch(items="rows"), workspace=True)
    with pytest.raises(ValueError, match="strided tensors"):
        _signature(args=(Tensor("x", "float16", ("rows",), strided=True),
                         Tensor("out", "float16", ("rows",), output=True)), fixed={}, launch=Launch(items="rows"))
    with pytest.raises(ValueError, match="a Launch"):
        _signature(launch="rows")


def test_the_generated_binding_launches_the_cubin():
    text = generate_binding(_signature(launch=Launch(items="rows")), "evo_k", "test")
    assert 'st->module->function("evo_k")' in text and "evo_binding_load_cubin" in text
    for trait in ("threads", "smem_bytes", "items_per_block", "persistent"):
        assert f'trait("{trait}")' in text
    # the kernel's arguments: the entry point's without the stream, in its order
    assert "void* args[] = {(void*)&k_x, (void*)&k_w, (void*)&k_out, (void*)&k_s_rows, (void*)&k_v_eps};" in text
    assert "const int64_t items = s_rows;" in text
    plain = generate_binding(_signature(), "evo_k", "test")
    assert "evo_binding_load_cubin" not in plain and "st.fn(" in plain


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nvcc") is None, reason="needs g++ and CUDA headers")
def test_the_generated_launch_binding_compiles_with_cuda(tmp_path: Path):
    from torch.utils import cpp_extension

    homes = [cpp_extension.CUDA_HOME, Path(shutil.which("nvcc")).resolve().parent.parent,
             *sorted(Path("/usr/local").glob("cuda*"))]
    cuda = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda.h").is_file()), None)
    if cuda is None:
        pytest.skip("no CUDA include folder")
    src = tmp_path / "binding.cpp"
    src.write_text(generate_binding(_signature(launch=Launch(items="rows")), "evo_k", "test"))
    # a CPU build of torch ships c10/cuda's headers without the one its CMake writes: an empty stand-in (the
    # syntax is what is checked here; the GPU host builds it for real)
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    incs = [*cpp_extension.include_paths(), str(cuda), sysconfig.get_path("include"),
            str(ROOT / "templates" / "bindings"), str(tmp_path / "stub")]
    r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-DEVO_WITH_CUDA", *(f"-I{i}" for i in incs),
                        str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_example_family_launches_device_code():
    from evoengineer.families import family_class

    cls = family_class("family.py:RMSNorm", base_dir=EXAMPLE, where="test")
    fam = cls(constants={"DTYPE": "float16", "HIDDEN": 4096}, backend="cuda")
    assert launched(fam) and fam.signature.launch == Launch(items="rows")
    from evoengineer.evaluators.local import device_only_builds

    assert device_only_builds(fam)  # always: there is no host code to build
    cpu = cls(constants={"DTYPE": "float16", "HIDDEN": 4096}, backend="cpu")
    assert launched(cpu)


def test_a_launched_family_on_a_cpu_space_is_refused(tmp_path: Path):
    from evoengineer.families import get_task
    from evoengineer.space import load_space

    d = tmp_path / "rms"
    shutil.copytree(EXAMPLE, d)
    text = (d / "rmsnorm_h100.toml").read_text().replace('backend = "cuda"', 'backend = "cpu"')
    text = text.replace('arch = "sm_90a"\n', "")
    (d / "cpu.toml").write_text(text)
    with pytest.raises(UserError, match="launches device code .* a CUDA space's, not a cpu one's"):
        get_task(load_space(d / "cpu.toml"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_example_cubins_export_the_launch_traits_of_their_genes(tmp_path: Path):
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.cubin import cubin_traits
    from evoengineer.compiler.gate import compile_cuda
    from evoengineer.compiler.steps import cubin_compile_flags
    from evoengineer.space import load_space

    space = load_space(EXAMPLE / "rmsnorm_h100.toml")
    factory = CandidateFactory(space)
    flags = cubin_compile_flags({"cuda_cflags": [*space.cuda_flags, "-DEVO_WITH_CUDA"], "arch": space.arch})
    rng = random.Random(3)
    seen = set()
    for k in range(4):
        c = factory.from_genome(space.random_valid_genome(rng))
        src = tmp_path / f"k{k}.cu"
        src.write_text(c.source)
        r = compile_cuda(src, tmp_path / f"k{k}.cubin", flags=flags, device_only=True)
        assert r["status"] == "ok", r.get("reason")
        t = cubin_traits(tmp_path / f"k{k}.cubin")
        p = c.params
        assert t["threads"] == 32 * p["WARPS_PER_ROW"] * p["ROWS_PER_CTA"] and t["items_per_block"] == p["ROWS_PER_CTA"]
        assert t["persistent"] == int(p["PERSISTENT"]) and t["smem_bytes"] >= 4096 * 2
        seen.add(p["PERSISTENT"])
        # no host code: nothing for a host compiler, the kernel under its C name
        assert "<<<" not in c.source and 'extern "C" __global__ void __launch_bounds__' in c.source


def test_a_builder_of_a_launched_family_builds_cubins_even_when_not_asked():
    """A builder made for a launched family without device_only (a script, a test harness) still builds cubins: a
    host-code build would link nothing and fail only at its first call."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder
    from evoengineer.families import get_task
    from evoengineer.space import load_space

    space = load_space(EXAMPLE / "rmsnorm_h100.toml")
    task = get_task(space)
    assert task.binding.launches
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(), jobs=1)
    cand = CandidateFactory(space).from_genome(space.random_valid_genome(random.Random(0)))
    assert b.device_only and b._device_only(cand)
    b.close()
