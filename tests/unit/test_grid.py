"""Grid strategy and landscape export: every valid configuration once, the true K best, a CSV that replays."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from conftest import toy_measure
from evoengineer.cli import main
from evoengineer.space import load_space


def _search(toy: Path, *extra: str) -> list[str]:
    return ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///g.db",
            "--strategy", "grid", "--population", "700", "--quiet", *extra]


def test_grid_covers_the_space_and_finds_the_true_best(toy_dir: Path, monkeypatch):
    monkeypatch.chdir(toy_dir)
    assert main(_search(toy_dir)) == 0
    space = load_space(toy_dir / "toy_space.toml")
    doc = json.loads((toy_dir / "elite.json").read_text())
    assert doc["evaluations"] == space.count_valid() and doc["strategy"] == "grid"
    truth = sorted(t for t in (toy_measure(space.genome_to_params(g)) for g in space.valid_genomes())
                   if t[0] == "ok")
    assert [e["metrics"]["time_us"] for e in doc["elites"]] == [t for _, t in truth[:3]]

    # export, then replay the exported landscape: the same measurements come back
    assert main(["landscape", "--db", "sqlite:///g.db", "--out", "exported.csv"]) == 0
    rows = list(csv.DictReader(open(toy_dir / "exported.csv")))
    assert len(rows) == space.count_valid()
    assert main(["search", "--space", "toy_space.toml", "--landscape", "exported.csv", "--db", "sqlite:///r.db",
                 "--strategy", "grid", "--population", "700", "--out", "replayed.json", "--quiet"]) == 0
    replayed = json.loads((toy_dir / "replayed.json").read_text())
    assert [e["hash"] for e in replayed["elites"]] == [e["hash"] for e in doc["elites"]]


def test_grid_resume_after_interrupt(toy_dir: Path, monkeypatch):
    from evoengineer.evaluators.replay import ReplayEvaluator

    monkeypatch.chdir(toy_dir)
    real = ReplayEvaluator.evaluate
    calls = {"n": 0}

    def flaky(self, candidate):
        calls["n"] += 1
        if calls["n"] == 1500:
            raise KeyboardInterrupt
        return real(self, candidate)

    monkeypatch.setattr(ReplayEvaluator, "evaluate", flaky)
    assert main(_search(toy_dir, "--budget", "2000")) == 130
    monkeypatch.setattr(ReplayEvaluator, "evaluate", real)
    assert main(["resume", "--db", "sqlite:///g.db", "--quiet"]) == 0
    doc = json.loads((toy_dir / "elite.json").read_text())
    assert doc["evaluations"] == 2000 and doc["run_status"] == "finished"
    import sqlite3

    con = sqlite3.connect(toy_dir / "g.db")
    assert con.execute("select count(*), count(distinct hash) from candidates").fetchone() == (2000, 2000)
