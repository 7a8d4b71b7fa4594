"""GPU tests (skipped without CUDA): CUDA MSDA genomes checked on odd and default shapes through the real pipeline,
and GPU fault isolation (hang -> timeout, illegal address -> runtime_error with a fresh worker after it)."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from evoengineer import SPACES_DIR  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.cli import main  # noqa: E402
from evoengineer.space import load_space  # noqa: E402

SPACES = sorted(p for p in SPACES_DIR.glob("cuda_msda*.toml"))


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_sampled_genomes_are_correct(space_file: Path, build_cache: Path):
    """A spread of genomes (extremes included) passes the worker's checks on every shape of the space."""
    from evoengineer.evaluators.local import LocalEvaluator

    space = load_space(space_file)
    valid = space.valid_genomes()
    picks = {valid[0], valid[-1], *random.Random(1).sample(valid, min(10, len(valid)))}
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in sorted(picks)]
    with LocalEvaluator(space, cache_dir=build_cache) as ev:
        results = list(ev.evaluate_many(cands))
    bad = [(c.params, m.status, m.reason) for c, m in results if m.status not in ("ok", "gate_failed")]
    assert not bad, bad
    ok = [m for _, m in results if m.status == "ok"]
    assert ok and all(m.metrics["max_abs_err"] < 1e-2 and m.metrics["speedup_vs"]["classic"] > 0 for m in ok)


def test_gpu_faults_are_isolated(tmp_path: Path, build_cache: Path, monkeypatch):
    import shutil

    d = tmp_path / "faults_cuda"
    shutil.copytree(Path(__file__).parent / "data" / "faults_cuda", d)
    monkeypatch.chdir(d)
    rc = main(["search", "--space", "faults_space.toml", "--db", "sqlite:///f.db", "--population", "4",
               "--generations", "0", "--elite", "1", "--cache-dir", str(build_cache), "--quiet"])
    assert rc == 0
    con = sqlite3.connect(d / "f.db")
    got = {json.loads(p)["FAULT"]: (s, r) for p, s, r in con.execute("select params, status, reason from candidates")}
    assert got["none"][0] == "ok"
    assert got["hang"][0] == "timeout"
    assert got["illegal_address"][0] == "runtime_error"
    assert got["unwritten"][0] == "wrong" and "NaN" in got["unwritten"][1]
    doc = json.loads((d / "elite.json").read_text())
    assert [e["params"]["FAULT"] for e in doc["elites"]] == ["none"]
