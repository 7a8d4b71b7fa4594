"""GPU test (skipped without CUDA): a short search of the default GPU space through `--cluster local` (one Dask worker
per visible GPU, pinned with CUDA_VISIBLE_DEVICES, build slots on the other cores); the same candidates then through
today's local evaluator, for the verdicts (the times differ: two measurements)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from evoengineer.cli import main  # noqa: E402
from evoengineer.evaluators.cluster import visible_gpus  # noqa: E402


def _rows(db: Path) -> dict[str, tuple[str, dict]]:
    con = sqlite3.connect(db)
    try:
        return {h: (s, json.loads(m)) for h, s, m in con.execute("select hash, status, metrics from candidates")}
    finally:
        con.close()


def test_short_search_through_a_local_cluster(tmp_path: Path, build_cache: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = ["--space", "cuda_msda_fp16", "--budget", "24", "--seed", "1", "--cache-dir", str(build_cache)]
    rc = main(["search", *common, "--db", "sqlite:///c.db", "--out", "c.json", "--cluster", "local"])
    err = capsys.readouterr().err
    assert rc == 0, err
    gpus = len(visible_gpus())
    assert f"evaluator dask on the local cluster ({gpus} GPU workers)" in err
    assert "GPU busy" in err and "/min" in err
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["evaluator"]["kind"] == "dask" and doc["evaluator"]["inner"]["kind"] == "local"
    assert doc["run_status"] == "finished" and doc["evaluations"] == 24
    assert doc["elites"] and all(e["status"] == "ok" and e["metrics"]["time_us"] > 0 for e in doc["elites"])
    assert all(e["sanitizer"]["status"] in ("clean", "not run") for e in doc["elites"])
    assert all("retimed" in e for e in doc["elites"])  # finalists re-timed together on one GPU worker
    rows = _rows(tmp_path / "c.db")
    assert len(rows) == 24
    ok = [m for s, m in rows.values() if s == "ok"]
    assert ok and all(m["measure_s"] > 0 and "build_s" in m for m in ok)
    # the same configurations through today's evaluator: the same verdicts
    rc = main(["search", *common, "--db", "sqlite:///l.db", "--out", "l.json", "--quiet",
               "--population", str(_population(tmp_path / "c.db"))])
    assert rc == 0
    local = _rows(tmp_path / "l.db")
    both = set(rows) & set(local)
    assert both and all(rows[h][0] == local[h][0] for h in both)


def _population(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        (config,) = con.execute("select config from runs").fetchone()
        return int(json.loads(config)["population"])
    finally:
        con.close()
