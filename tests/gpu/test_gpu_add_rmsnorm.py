"""GPU tests (skipped without CUDA): the example fused residual add + RMSNorm family (examples/families/
add_rmsnorm_cuda), residual updated in place, outputs out and rstd. A random search through the CLI, then the exported
op: the residual updated in place and the outputs right against a float64 reference, inside a CUDA graph (replayed
twice, the residual reset between replays) and under torch.compile(fullgraph=True)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from evoengineer.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "families" / "add_rmsnorm_cuda"
SPACE = "add_rmsnorm_h100.toml"
HIDDEN, EPS = 4096, 1e-6
TOL = 3e-2  # bf16 (atol and rtol)


def _reference(x, residual, weight, eps=EPS):
    """(new residual, out, rstd) in float64; the residual rounded to bf16 first, as the kernel writes it."""
    r = (residual.double() + x.double()).to(residual.dtype).double()
    rstd = torch.rsqrt(r.pow(2).mean(-1) + eps)
    return r, r * rstd[:, None] * weight.double(), rstd


def _close(got, want, tol: float = TOL) -> bool:
    return bool(torch.isfinite(got).all()) and bool(((got.double() - want).abs() <= tol + tol * want.abs()).all())


def _inputs(rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, HIDDEN, generator=g)
    x[::5] *= 100
    residual = 3 * torch.randn(rows, HIDDEN, generator=g)
    weight = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
    return [t.to(torch.bfloat16).cuda() for t in (x, residual, weight)]


@pytest.fixture(scope="module")
def searched(tmp_path_factory, build_cache: Path) -> Path:
    """A random search of 8 candidates of a copy of the example space: the folder holding its elite.json."""
    d = tmp_path_factory.mktemp("search") / "arn"
    shutil.copytree(EXAMPLE, d)
    text = (d / SPACE).read_text().replace("budget = 40", "budget = 8").replace("repeats = 100", "repeats = 20")
    (d / SPACE).write_text(text)
    r = subprocess.run([sys.executable, "-m", "evoengineer", "search", "--space", SPACE, "--strategy", "random",
                        "--budget", "8", "--seed", "1", "--db", "sqlite:///run.db", "--out", "elite.json",
                        "--cache-dir", str(build_cache)],
                       cwd=d, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning: baseline" not in r.stderr, r.stderr  # the baseline's (out, rstd) agree with the reference
    return d


def test_search_finds_correct_elites(searched: Path):
    doc = json.loads((searched / "elite.json").read_text())
    assert doc["space"] == "add_rmsnorm_h100" and doc["elites"]
    assert any(e["status"] == "ok" for e in doc["elites"])
    for e in doc["elites"]:
        assert e["status"] == "ok" and e["metrics"]["time_us"] > 0
        assert "evo_add_rmsnorm" in e["source"]


@pytest.fixture(scope="module")
def op(searched: Path, tmp_path_factory):
    """The best elite exported as a package (`evoengineer export`) and imported: the op."""
    root = tmp_path_factory.mktemp("pkg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVOENGINEER_EXPORT_CACHE", str(root / "ops"))
        mp.chdir(searched)  # --family family.py:Class is relative to the working folder
        assert main(["export", "elite.json", "--out", str(root / "out"), "--family", "family.py:AddRmsNorm"]) == 0
        (pkg,) = [p for p in (root / "out").iterdir() if p.is_dir()]
        mp.syspath_prepend(str(root / "out"))
        yield importlib.import_module(pkg.name).add_rmsnorm_cuda


def test_op_updates_the_residual_in_place(op):
    for rows, seed in ((3, 1), (1000, 2)):  # held out: no shape of the search
        x, residual, w = _inputs(rows, seed)
        want_r, want_out, want_rstd = _reference(x, residual, w)
        ptr = residual.data_ptr()
        out, rstd = op(x, residual, w, EPS)
        torch.cuda.synchronize()
        assert residual.data_ptr() == ptr and _close(residual, want_r, tol=0.0), "residual updated in place"
        assert out.dtype == torch.bfloat16 and out.shape == x.shape and _close(out, want_out)
        assert rstd.dtype == torch.float32 and rstd.shape == (rows,) and _close(rstd, want_rstd, tol=1e-4)


def test_op_in_a_cuda_graph(op):
    x, residual, w = _inputs(257, 3)
    start = residual.clone()
    want_r, want_out, want_rstd = _reference(x, start, w)
    side = torch.cuda.Stream()  # warm-up outside the capture (first-call setup)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(x, residual, w, EPS)
    torch.cuda.current_stream().wait_stream(side)
    residual.copy_(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, rstd = op(x, residual, w, EPS)
    for _ in range(2):
        residual.copy_(start)  # outside the graph: each replay starts from the same residual
        out.fill_(float("nan"))
        rstd.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _close(residual, want_r, tol=0.0), "residual updated in place by the replay"
        assert _close(out, want_out) and _close(rstd, want_rstd, tol=1e-4)


def test_op_under_torch_compile(op):
    x, residual, w = _inputs(64, 4)
    want_r, want_out, want_rstd = _reference(x, residual, w)

    def layer(a, res, weight):
        out, rstd = op(a, res, weight, EPS)
        return out * 2, rstd

    out2, rstd = torch.compile(layer, fullgraph=True)(x, residual, w)
    torch.cuda.synchronize()
    assert _close(residual, want_r, tol=0.0), "the compiled function mutates the residual it is given"
    assert _close(out2, 2 * want_out) and _close(rstd, want_rstd, tol=1e-4)
