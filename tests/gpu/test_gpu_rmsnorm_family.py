"""GPU tests (skipped without CUDA): the example RMSNorm family (examples/families/rmsnorm_cuda), written against
the public contract only, as device code its generated binding launches (Signature.launch): sampled genomes built
(cubins) and checked through the real builder (odd row counts, grid-stride
loops, CUDA graph replay, misaligned pointers refused); a search through the CLI; the exported op on held-out rows,
under torch.compile and CUDA graphs, and refusing misuse with clean Python errors."""

from __future__ import annotations

import importlib
import json
import random
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from conftest import assert_right_call_after_call, build_candidate  # noqa: E402
from evoengineer.cli import main  # noqa: E402
from evoengineer.family import Shape  # noqa: E402
from evoengineer.space import load_space  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "families" / "rmsnorm_cuda"
SPACE = "rmsnorm_h100.toml"
HIDDEN = 4096


def _family_dir(tmp: Path) -> Path:
    """A copy of the example (space, family.py, template) in `tmp`, with fewer timing repeats."""
    d = tmp / "rmsnorm"
    d.mkdir()
    for name in (SPACE, "family.py", "rmsnorm.cu.j2"):
        shutil.copy(EXAMPLE / name, d / name)
    text = (d / SPACE).read_text().replace("repeats = 100", "repeats = 20")
    (d / SPACE).write_text(text)
    return d


def _covering(space, n: int, seed: int = 0) -> list[dict]:
    """`n` valid configurations that together take every value of every gene (greedy, then random)."""
    rnd = random.Random(seed)
    valid = [space.genome_to_params(g) for g in space.valid_genomes()]
    rnd.shuffle(valid)
    todo = {(k, v) for p in valid for k, v in p.items()}
    picks: list[dict] = []
    while len(picks) < n:
        best = max(valid, key=lambda p: len(todo & set(p.items())))
        picks.append(best)
        valid.remove(best)
        todo -= set(best.items())
    assert not todo, f"{n} configurations do not cover {sorted(todo)}"
    return picks


def _reference(x, w, eps):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _close(got, want, tol: float = 4e-3) -> bool:
    return bool(torch.isfinite(got).all()) and bool(((got.double() - want).abs() <= tol + tol * want.abs()).all())


def test_sampled_genomes_are_correct(tmp_path: Path, build_cache: Path):
    """Six configurations covering every gene value: right on odd row counts, on a partial last row group, after a
    call of another grid, across many grid-stride iterations and from CUDA graph replays; a misaligned tensor is
    refused by the binding (the signature declares 16-byte alignment), and the next call is still right."""
    space = load_space(_family_dir(tmp_path) / SPACE)
    for params in _covering(space, 6):
        task, module = build_candidate(space, params, build_cache)
        assert task.name == "rmsnorm" and task.entry == "evo_rmsnorm_kernel"  # device code, launched by the binding
        big = task.make_inputs(Shape("big", {"rows": 9001}), 1)  # several iterations of a persistent grid
        for rows in (1, 7, 37):
            small = task.make_inputs(Shape("odd", {"rows": rows}), rows)
            assert_right_call_after_call(task, module, big, small)
        # a contiguous tensor that starts 2 bytes past a vector boundary
        flat = torch.empty(5 * HIDDEN + 1, dtype=torch.float16, device="cuda")
        bad = {**big, "x": flat[1:].view(5, HIDDEN)}
        with pytest.raises(ValueError, match="16-byte aligned data"):  # the declared alignment, before the launch
            task.launch(module, bad, task.new_output(bad))
        out = task.new_output(big)
        task.launch(module, big, out)
        torch.cuda.synchronize()
        assert _close(out, task.reference(big)), params


@pytest.fixture(scope="module")
def searched(tmp_path_factory, build_cache: Path) -> Path:
    """A small search of the example space through the CLI: the folder holding its elite.json."""
    d = _family_dir(tmp_path_factory.mktemp("search"))
    rc = main(["search", "--space", str(d / SPACE), "--budget", "12", "--population", "6", "--seed", "1",
               "--db", f"sqlite:///{d / 's.db'}", "--out", str(d / "elite.json"), "--cache-dir", str(build_cache),
               "--quiet"])
    assert rc == 0
    return d


def test_search_finds_correct_elites(searched: Path):
    doc = json.loads((searched / "elite.json").read_text())
    assert doc["space"] == "rmsnorm_h100" and doc["elites"]
    for e in doc["elites"]:
        assert e["status"] == "ok"
        assert {k: e["build"]["family"][k] for k in ("name", "version")} == {"name": "rmsnorm", "version": "2"}
        assert e["metrics"]["time_us"] > 0 and e["metrics"]["max_abs_err"] < 4e-2
        assert "evo_rmsnorm_kernel" in e["source"] and "<<<" not in e["source"]  # no host code


def test_exported_op(searched: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EVOENGINEER_EXPORT_CACHE", str(tmp_path / "ops"))
    monkeypatch.chdir(searched)  # --family family.py:Class is relative to the working folder
    assert main(["export", "elite.json", "--out", str(tmp_path / "pkg"), "--family", "family.py:RMSNorm"]) == 0
    (pkg,) = [p for p in (tmp_path / "pkg").iterdir() if p.is_dir()]
    cubin = json.loads((pkg / "kernel.json").read_text())["cubin"]
    assert cubin["launched"] and (pkg / cubin["file"]).is_file()  # the package carries the device code
    sys.path.insert(0, str(tmp_path / "pkg"))
    try:
        mod = importlib.import_module(pkg.name)
    finally:
        sys.path.remove(str(tmp_path / "pkg"))
    fn = mod.rmsnorm
    g = torch.Generator().manual_seed(11)
    w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).half().cuda()
    for rows in (3, 1000):  # held out: no shape of the search
        x = torch.randn(rows, HIDDEN, generator=g).half().cuda()
        x[::5] *= 100
        got = fn(x, w, 1e-6)
        assert got.shape == x.shape and got.dtype == torch.float16 and got.is_cuda
        assert _close(got, _reference(x, w, 1e-6))
        assert _close(fn(x, w, eps=0.5), _reference(x, w, 0.5))

    # evoengineer.load gives the same function without a package
    import evoengineer

    loaded = evoengineer.load("elite.json", family="family.py:RMSNorm", build_root=tmp_path / "ops")
    assert torch.equal(loaded(x, w, 1e-6), fn(x, w, 1e-6))

    compiled = torch.compile(lambda a, b: fn(a, b, 1e-6), fullgraph=True)
    assert torch.equal(compiled(x, w), fn(x, w, 1e-6))

    eager = fn(x, w, 1e-6)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x, w, 1e-6)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn(x, w, 1e-6)
    static.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)

    # gradients come from the reference's backward
    xg, wg = x[:8].clone().requires_grad_(), w.clone().requires_grad_()
    fn(xg, wg, 1e-6).float().square().sum().backward()
    x64, w64 = x[:8].double().requires_grad_(), w.double().requires_grad_()
    _reference(x64, w64, 1e-6).square().sum().backward()
    assert xg.grad.dtype == torch.float16 and wg.grad.dtype == torch.float16
    assert (xg.grad.double() - x64.grad).abs().max() <= 2e-2 * x64.grad.abs().max() + 1e-3

    # non-contiguous x: the op copies it (the binding takes contiguous tensors only)
    wide = torch.randn(64, 2 * HIDDEN, generator=g).half().cuda()
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    assert _close(fn(strided, w, 1e-6), _reference(strided, w, 1e-6))

    # a contiguous view 2 bytes past a vector boundary: the op copies it (declared alignment)
    flat = torch.randn(5 * HIDDEN + 1, generator=g).half().cuda()
    offset = flat[1:].view(5, HIDDEN)
    assert _close(fn(offset, w, 1e-6), _reference(offset, w, 1e-6))

    with pytest.raises(TypeError, match="x: dtype float32, but this kernel was compiled for float16"):
        fn(x.float(), w, 1e-6)
    with pytest.raises(ValueError, match="compiled for hidden = 4096"):
        fn(torch.randn(4, 1024, device="cuda").half(), w, 1e-6)
    with pytest.raises(ValueError, match="weight"):
        fn(x, w[:1024].contiguous(), 1e-6)
    with pytest.raises(ValueError, match="runs on cuda"):
        fn(x.cpu(), w, 1e-6)
    with pytest.raises(TypeError, match="eps"):
        fn(x, w, "1e-6")
    # still right after the refusals
    assert _close(fn(x, w, 1e-6), _reference(x, w, 1e-6))
