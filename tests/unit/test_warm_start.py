"""Warm start (evoengineer/search/warm_start.py): a new search's first proposals are the best configurations earlier
runs of the store found for the same family and template, where valid in the new space; recorded with the run and in
elite.json, proposed again on resume, off with --no-warm-start, never for strategies that cannot take them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import toy_measure
from evoengineer.cli import main
from evoengineer.space import load_space

SEARCH = ["--landscape", "landscape.csv", "--db", "sqlite:///w.db", "--population", "8", "--quiet"]


def _proposals(db: Path, run_id: int) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [h for (h,) in con.execute("select hash from proposals where run_id = ? order by seq", (run_id,))]
    finally:
        con.close()


def _config(db: Path, run_id: int) -> dict:
    con = sqlite3.connect(db)
    try:
        return json.loads(con.execute("select config from runs where id = ?", (run_id,)).fetchone()[0])
    finally:
        con.close()


def _best_ok(space, n: int) -> list[dict]:
    rows = []
    for g in space.valid_genomes():
        p = space.genome_to_params(g)
        status, t = toy_measure(p)
        if status == "ok":
            rows.append((t, p))
    return [p for _, p in sorted(rows, key=lambda r: r[0])[:n]]


def test_a_second_search_starts_from_the_first_ones_best(toy_dir: Path, monkeypatch):
    from evoengineer.candidate import CandidateFactory

    monkeypatch.chdir(toy_dir)
    space = load_space(toy_dir / "toy_space.toml")
    f = CandidateFactory(space)
    assert main(["search", "--space", "toy_space.toml", "--out", "a.json", "--budget", "40", *SEARCH]) == 0
    first = json.loads((toy_dir / "a.json").read_text())
    assert first["warm_start"] == {"runs": [], "seeds": 0}  # an empty store: a cold start
    # the seeds: run 1's fastest correct configurations, best first (3 from one run)
    con = sqlite3.connect(toy_dir / "w.db")
    rows = con.execute("select hash, metrics from candidates where run_id = 1 and status = 'ok'").fetchall()
    con.close()
    best = [h for h, m in sorted(rows, key=lambda r: (json.loads(r[1])["time_us"], r[0]))[:3]]
    assert main(["search", "--space", "toy_space.toml", "--out", "b.json", "--budget", "20", "--seed", "5",
                 *SEARCH]) == 0
    assert _proposals(toy_dir / "w.db", 2)[:3] == best
    cfg = _config(toy_dir / "w.db", 2)
    assert cfg["warm_start"]["runs"] == [1] and [f.make(p).hash for p in cfg["warm_start"]["seeds"]] == best
    assert json.loads((toy_dir / "b.json").read_text())["warm_start"] == {"runs": [1], "seeds": 3}
    # cold on request, and never for grid (a fixed order) or optuna (its sampler tells only its own trials)
    assert main(["search", "--space", "toy_space.toml", "--out", "c.json", "--budget", "10", "--no-warm-start",
                 *SEARCH]) == 0
    assert _config(toy_dir / "w.db", 3)["warm_start"] == {} and _proposals(toy_dir / "w.db", 3)[:3] != best
    assert main(["search", "--space", "toy_space.toml", "--out", "d.json", "--budget", "8", "--strategy", "grid",
                 *SEARCH]) == 0
    assert _config(toy_dir / "w.db", 4)["warm_start"] == {}


def test_seeds_must_be_valid_in_the_new_space_and_come_back_on_resume(toy_dir: Path, monkeypatch):
    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--out", "a.json", "--budget", "60", *SEARCH]) == 0
    # the same family and template, another space: NUM_WARPS 8 is gone and a constraint is added
    text = (toy_dir / "toy_space.toml").read_text().replace('name = "toy"', 'name = "toy_narrow"')
    text = text.replace("NUM_WARPS = [4, 8, 16]", "NUM_WARPS = [4, 16]")
    text = text.replace('  "D % D_STRIDE == 0",', '  "D % D_STRIDE == 0",\n  "STAGES != 3",')
    (toy_dir / "narrow.toml").write_text(text)
    narrow = load_space(toy_dir / "narrow.toml")
    assert main(["search", "--space", "narrow.toml", "--out", "n.json", "--budget", "12", *SEARCH]) in (0, 3)
    seeds = _config(toy_dir / "w.db", 2)["warm_start"]["seeds"]
    assert seeds and all(p["NUM_WARPS"] != 8 and p["STAGES"] != 3 for p in seeds)
    for p in seeds:
        narrow.params_to_genome(p)  # valid there
    # a resumed run replays its proposal log: the same seeds first, or it refuses
    con = sqlite3.connect(toy_dir / "w.db")
    con.execute("update runs set status = 'interrupted' where id = 2")
    con.commit()
    con.close()
    assert main(["resume", "--db", "sqlite:///w.db", "--run", "2", "--quiet"]) in (0, 3)
