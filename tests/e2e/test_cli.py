"""The command line, in-process: search, resume, inspect, elites; bad inputs give exit 2, one line, nothing written."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import write_toy_landscape
from evoengineer.cli import main
from evoengineer.space import load_space

SEARCH = ["--seed", "3", "--population", "8", "--generations", "8", "--budget", "30"]


def search_args(d: Path, *extra: str, db: str = "sqlite:///s.db", out: str = "elite.json",
                space: str = "toy_space.toml", landscape: str = "landscape.csv") -> list[str]:
    return ["search", "--space", space, "--landscape", landscape, "--db", db, "--out", out, *SEARCH, *extra]


def snapshot(d: Path) -> dict[str, Any]:
    """Every file under `d` with its content: to show a failed command wrote nothing. A SQLite store counts by
    its logical content (its -wal/-shm companions come and go as connections open and close)."""
    snap: dict[str, Any] = {}
    for p in sorted(d.rglob("*")):
        if not p.is_file() or p.name.endswith(("-wal", "-shm")):
            continue
        key = str(p.relative_to(d))
        if p.suffix == ".db" and p.read_bytes()[:16] == b"SQLite format 3\x00":
            con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
            try:
                snap[key] = list(con.iterdump())
            finally:
                con.close()
        else:
            snap[key] = p.read_bytes()
    return snap


def fails(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI, expect exit 2 with exactly one line on stderr (containing `words`) and nothing on stdout."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert out == ""
    return lines[0]


@pytest.fixture
def toy(toy_dir: Path, monkeypatch) -> Path:
    monkeypatch.chdir(toy_dir)
    monkeypatch.setattr("os.fsync", lambda fd: None)  # speed only: elite.json is rewritten every generation
    return toy_dir


@pytest.fixture
def searched(toy: Path, capsys) -> Path:
    """The toy folder after one finished search (run 1 in s.db, elites in elite.json)."""
    assert main(search_args(toy, "--quiet")) == 0
    capsys.readouterr()
    return toy


# ---- search -------------------------------------------------------------------------------------------------------
def test_search_contract(toy: Path, capsys):
    assert main(search_args(toy, "--elite", "2")) == 0
    out, err = capsys.readouterr()
    assert "run 1: space toy (3732 valid configurations)" in err
    assert "finished (budget): 30 evaluations" in err
    assert out.splitlines()[0].split()[:3] == ["rank", "p50", "us"]
    doc = json.loads((toy / "elite.json").read_text())
    assert doc["schema"] == "evoengineer/elite-v1" and doc["space"] == "toy" and doc["run_id"] == 1
    assert doc["run_status"] == "finished" and doc["evaluations"] == 30 and doc["seed"] == 3
    assert len(doc["elites"]) == 2 and [e["rank"] for e in doc["elites"]] == [1, 2]
    times = [e["metrics"]["time_us"] for e in doc["elites"]]
    assert times == sorted(times)
    con = sqlite3.connect(toy / "s.db")
    assert con.execute("select count(*) from candidates").fetchone()[0] == 30
    assert con.execute("select status, stop_reason from runs").fetchall() == [("finished", "budget")]
    best = con.execute("select min(time_us) from candidates where status = 'ok'").fetchone()[0]
    con.close()
    assert times[0] == best


@pytest.mark.parametrize("k", ["1", "3", "5"])
def test_search_elite_k(toy: Path, capsys, k: str):
    assert main(search_args(toy, "--elite", k, "--quiet")) == 0
    assert capsys.readouterr() == ("", "")  # --quiet: nothing at all
    doc = json.loads((toy / "elite.json").read_text())
    assert len(doc["elites"]) == int(k)


def test_search_twice_into_same_db_and_out(searched: Path, capsys):
    assert main(search_args(searched, "--quiet")) == 0
    doc = json.loads((searched / "elite.json").read_text())
    assert doc["run_id"] == 2


def test_search_default_db_is_under_cwd(toy: Path, capsys):
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", *SEARCH, "--quiet"]) == 0
    assert (toy / "elite_store" / "evoengineer.db").is_file() and (toy / "elite.json").is_file()
    assert main(["elites"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run 1 | space toy | finished budget")


# ---- inspect --------------------------------------------------------------------------------------------------------
def test_inspect(searched: Path, capsys):
    assert main(["inspect", "elite.json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("space toy | run 1 (finished)")
    assert out[1].split()[0] == "rank" and [ln.split()[0] for ln in out[2:5]] == ["1", "2", "3"]
    assert out[5].startswith("p50/p90 us, speedup: the finalists' re-timing")  # the columns' legend


def test_inspect_json(searched: Path, capsys):
    assert main(["inspect", "elite.json", "--json"]) == 0
    elites = json.loads(capsys.readouterr().out)
    doc = json.loads((searched / "elite.json").read_text())
    assert elites == doc["elites"] and len(elites) == 3
    space = load_space("toy_space.toml")
    for e in elites:
        assert set(e["params"]) == set(space.names)
        space.check_params(e["params"])
        assert isinstance(e["metrics"]["time_us"], float)


def test_inspect_source(searched: Path, capsys):
    doc = json.loads((searched / "elite.json").read_text())
    assert main(["inspect", "elite.json", "--source", "2"]) == 0
    src = capsys.readouterr().out
    assert src == doc["elites"][1]["source"]
    assert f"kNumWarps = {doc['elites'][1]['params']['NUM_WARPS']};" in src
    fails(capsys, ["inspect", "elite.json", "--source", "9"], "elite.json", "rank 9")


@pytest.mark.parametrize("content, words", [
    (None, ["nope.json", "cannot read"]),
    ("{not json", ["bad.json", "not JSON"]),
    ('{"schema": "something/else", "elites": []}', ["bad.json", "not an elite.json"]),
    ('[1, 2]', ["bad.json", "not an elite.json"]),
    ('{"schema": "evoengineer/elite-v1", "elites": []}', ["bad.json", "missing"]),
])
def test_inspect_bad_file(tmp_path: Path, monkeypatch, capsys, content, words):
    monkeypatch.chdir(tmp_path)
    name = "nope.json" if content is None else "bad.json"
    if content is not None:
        (tmp_path / name).write_text(content)
    fails(capsys, ["inspect", name], *words)


def test_inspect_binary_file(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00\x01")
    fails(capsys, ["inspect", "bin.json"], "bin.json")


# ---- elites -------------------------------------------------------------------------------------------------------
def test_elites(searched: Path, capsys):
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
                 "--out", "second.json", "--seed", "9", "--population", "6", "--generations", "2", "--elite", "2",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["elites", "--db", "sqlite:///s.db"]) == 0  # newest run
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("run 2 | space toy | finished generations |")
    assert [ln.split()[0] for ln in out[2:]] == ["1", "2", "p50/p90"]  # two elites, the columns' legend
    assert main(["elites", "--db", "sqlite:///s.db", "--run", "1", "--json"]) == 0
    elites = json.loads(capsys.readouterr().out)
    doc = json.loads((searched / "elite.json").read_text())
    assert [(e["hash"], e["params"], e["metrics"]) for e in elites] == \
        [(e["hash"], e["params"], e["metrics"]) for e in doc["elites"]]


def test_elites_empty_store(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    from evoengineer.store import Store

    Store("sqlite:///e.db").close()
    fails(capsys, ["elites", "--db", "sqlite:///e.db"], "no runs")


# ---- resume -------------------------------------------------------------------------------------------------------
def test_resume_after_interrupt_in_process(toy: Path, capsys, monkeypatch):
    """A light in-process check of the resume command (tests/e2e/test_resume.py kills real processes)."""
    from evoengineer.evaluators.replay import ReplayEvaluator

    real = ReplayEvaluator.evaluate
    calls = {"n": 0}

    def flaky(self, candidate):
        calls["n"] += 1
        if calls["n"] == 17:
            raise KeyboardInterrupt
        return real(self, candidate)

    monkeypatch.setattr(ReplayEvaluator, "evaluate", flaky)
    assert main(search_args(toy, "--quiet")) == 130
    err = capsys.readouterr().err
    assert "python -m evoengineer resume --db sqlite:///s.db --run 1" in err
    monkeypatch.setattr(ReplayEvaluator, "evaluate", real)
    assert main(["resume", "--db", "sqlite:///s.db", "--quiet"]) == 0
    resumed = (toy / "elite.json").read_text()
    fails(capsys, ["resume", "--db", "sqlite:///s.db"], "no unfinished run")
    fails(capsys, ["resume", "--db", "sqlite:///s.db", "--run", "1"], "--run 1", "already finished")
    # the same search uninterrupted, elsewhere: same elites
    (toy / "ref").mkdir()
    for n in ("toy_space.toml", "toy.cpp.j2", "landscape.csv"):
        shutil.copy(toy / n, toy / "ref" / n)
    monkeypatch.chdir(toy / "ref")
    assert main(search_args(toy / "ref", "--quiet")) == 0
    ref = json.loads((toy / "ref" / "elite.json").read_text())
    got = json.loads(resumed)
    assert [e["hash"] for e in got["elites"]] == [e["hash"] for e in ref["elites"]]
    assert got["evaluations"] == ref["evaluations"] == 30


def test_resume_from_another_directory(toy: Path, capsys, monkeypatch, tmp_path_factory):
    from evoengineer.evaluators.replay import ReplayEvaluator

    real = ReplayEvaluator.evaluate
    calls = {"n": 0}

    def flaky(self, candidate):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, candidate)

    monkeypatch.setattr(ReplayEvaluator, "evaluate", flaky)
    db = f"sqlite:///{toy / 's.db'}"
    assert main(search_args(toy, "--quiet", db=db)) == 130
    monkeypatch.setattr(ReplayEvaluator, "evaluate", real)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    capsys.readouterr()
    assert main(["elites", "--db", db]) == 0, capsys.readouterr().err
    assert main(["resume", "--db", db, "--quiet"]) == 0, capsys.readouterr().err


# ---- bad inputs: exit 2, one line, nothing written ------------------------------------------------------------------
def test_malformed_toml(toy: Path, capsys):
    (toy / "bad.toml").write_text((toy / "toy_space.toml").read_text().replace('name = "toy"', 'name = "toy'))
    before = snapshot(toy)
    fails(capsys, search_args(toy, space="bad.toml"), "bad.toml", "malformed TOML")
    assert snapshot(toy) == before


def test_unknown_name_in_constraint(toy: Path, capsys):
    text = (toy / "toy_space.toml").read_text().replace("NUM_PRODUCER_WARPS < NUM_WARPS",
                                                         "NUM_PRODUCER_WARPS < NUM_WARPZ")
    (toy / "bad.toml").write_text(text)
    before = snapshot(toy)
    fails(capsys, search_args(toy, space="bad.toml"), "bad.toml", "constraints[0]", "NUM_WARPZ", "unknown name")
    assert snapshot(toy) == before


def test_constraints_exclude_every_configuration(toy: Path, capsys):
    text = (toy / "toy_space.toml").read_text().replace('"D % D_STRIDE == 0",', '"D % D_STRIDE == 0", "D > 64",')
    (toy / "bad.toml").write_text(text)
    before = snapshot(toy)
    fails(capsys, search_args(toy, space="bad.toml"), "bad.toml", "exclude every configuration")
    assert snapshot(toy) == before


def test_missing_space_file(toy: Path, capsys):
    before = snapshot(toy)
    fails(capsys, search_args(toy, space="missing.toml"), "missing.toml", "cannot read")
    assert snapshot(toy) == before


@pytest.mark.parametrize("url, words", [
    ("notaurl", ["notaurl", "not a database URL"]),
    ("sqlite:////nonexistent/dir/x.db", ["/nonexistent/dir", "does not exist"]),
    ("sqlite:///no/such/dir/x.db", ["no/such/dir", "does not exist"]),
    ("postgresql://evo:pw@127.0.0.1:1/evo", ["postgresql://", "cannot open"]),
    ("nosuchdb://x", ["nosuchdb://x", "cannot open"]),
])
def test_unreadable_db_url(toy: Path, capsys, url: str, words: list[str]):
    before = snapshot(toy)
    fails(capsys, search_args(toy, db=url), *words)
    fails(capsys, ["resume", "--db", url], *words[:1])
    fails(capsys, ["elites", "--db", url], *words[:1])
    assert snapshot(toy) == before
    assert not Path("/nonexistent").exists()


def test_db_file_missing_for_resume_and_elites(toy: Path, capsys):
    before = snapshot(toy)
    fails(capsys, ["resume", "--db", "sqlite:///gone.db"], "gone.db", "does not exist")
    fails(capsys, ["elites", "--db", "sqlite:///gone.db"], "gone.db", "does not exist")
    fails(capsys, ["elites"], "evoengineer.db", "does not exist")  # default store under the cwd
    assert snapshot(toy) == before and not (toy / "elite_store").exists()


def test_db_not_a_store(toy: Path, capsys):
    (toy / "junk.db").write_text("not a database at all" * 50)
    before = snapshot(toy)
    fails(capsys, search_args(toy, db="sqlite:///junk.db"), "junk.db")
    fails(capsys, ["resume", "--db", "sqlite:///junk.db"], "junk.db")
    assert snapshot(toy) == before


def test_unknown_run_id(searched: Path, capsys):
    before = snapshot(searched)
    fails(capsys, ["resume", "--db", "sqlite:///s.db", "--run", "7"], "--run 7", "not found")
    fails(capsys, ["elites", "--db", "sqlite:///s.db", "--run", "7"], "--run 7", "not found")
    assert snapshot(searched) == before


def test_out_from_another_space(searched: Path, capsys):
    doc = json.loads((searched / "elite.json").read_text())
    doc["space"] = "some_other_space"
    (searched / "other.json").write_text(json.dumps(doc))
    before = snapshot(searched)
    fails(capsys, search_args(searched, db="sqlite:///new.db", out="other.json"), "other.json",
          "some_other_space")
    assert snapshot(searched) == before and not (searched / "new.db").exists()


@pytest.mark.parametrize("content", [b"# my notes\n", b"", b'{"a": 1}', b"\xff\xfe\x00", None])
def test_out_existing_non_elite_file(toy: Path, capsys, content):
    if content is None:
        (toy / "notes.txt").mkdir()
    else:
        (toy / "notes.txt").write_bytes(content)
    before = snapshot(toy)
    fails(capsys, search_args(toy, out="notes.txt"), "notes.txt")
    assert snapshot(toy) == before and not (toy / "s.db").exists()


def _landscape(toy: Path, rows_fn) -> None:
    with open(toy / "landscape.csv", newline="") as f:
        rows = list(csv.reader(f))
    rows = rows_fn(rows)
    with open(toy / "bad.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)


def test_landscape_missing_columns(toy: Path, capsys):
    _landscape(toy, lambda rows: [r[:2] + r[3:] for r in rows])  # drop STAGES
    before = snapshot(toy)
    fails(capsys, search_args(toy, landscape="bad.csv"), "bad.csv", "missing column", "STAGES")
    _landscape(toy, lambda rows: [r[:8] for r in rows])  # drop time_us and reason
    fails(capsys, search_args(toy, landscape="bad.csv"), "bad.csv", "time_us")
    assert snapshot(toy) == {**before, "bad.csv": (toy / "bad.csv").read_bytes()}
    assert not (toy / "s.db").exists() and not (toy / "elite.json").exists()


def test_landscape_missing_a_configuration(toy: Path, capsys):
    space = load_space("toy_space.toml")
    write_toy_landscape(space, toy / "bad.csv", drop=1)
    first = space.genome_to_params(space.valid_genomes()[0])
    before = snapshot(toy)
    line = fails(capsys, search_args(toy, landscape="bad.csv"), "bad.csv", "no row for configuration")
    for k, v in first.items():
        assert f"'{k}': {v!r}" in line  # names the configuration
    assert "1 of 3732" in line
    assert snapshot(toy) == before


def test_landscape_unknown_status(toy: Path, capsys):
    _landscape(toy, lambda rows: rows[:5] + [rows[5][:7] + ["exploded"] + rows[5][8:]] + rows[6:])
    before = snapshot(toy)
    fails(capsys, search_args(toy, landscape="bad.csv"), "bad.csv:6", "unknown status 'exploded'")
    assert snapshot(toy) == before


def test_landscape_missing_file(toy: Path, capsys):
    before = snapshot(toy)
    fails(capsys, search_args(toy, landscape="nope.csv"), "nope.csv", "cannot read")
    assert snapshot(toy) == before


@pytest.mark.parametrize("extra, words", [
    (["--elite", "0"], ["--elite"]),
    (["--elite", "8"], ["--elite"]),
    (["--population", "40"], ["--population 40", "--budget 30"]),
    (["--population", "1"], ["--population"]),
    (["--budget", "0"], ["--budget"]),
    (["--strategy", "annealing"], ["--strategy", "annealing"]),
])
def test_bad_settings(toy: Path, capsys, extra, words):
    before = snapshot(toy)
    fails(capsys, search_args(toy, *extra), *words)
    assert snapshot(toy) == before


def test_out_in_a_folder_that_cannot_be_made(toy: Path, capsys):
    (toy / "afile").write_text("x")
    before = snapshot(toy)
    fails(capsys, search_args(toy, out="afile/sub/elite.json"), "afile", "not a directory")
    assert snapshot(toy) == before


def test_out_in_a_missing_folder_is_refused_as_a_db_in_one_is(toy: Path, capsys):
    before = snapshot(toy)
    fails(capsys, search_args(toy, out="new/sub/elite.json"), "new/sub", "does not exist")
    assert snapshot(toy) == before and not (toy / "new").exists()
    (toy / "new" / "sub").mkdir(parents=True)
    assert main(search_args(toy, "--quiet", out="new/sub/elite.json")) == 0
    assert json.loads((toy / "new" / "sub" / "elite.json").read_text())["space"] == "toy"


def test_space_search_table_gives_defaults(toy: Path, capsys):
    text = (toy / "toy_space.toml").read_text() + "\n[search]\npopulation = 6\nelite = 2\ngenerations = 2\nseed = 4\n"
    (toy / "s2.toml").write_text(text)
    assert main(["search", "--space", "s2.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
                 "--quiet"]) == 0
    doc = json.loads((toy / "elite.json").read_text())
    # generations = 2: at most population x (generations + 1) evaluations
    assert len(doc["elites"]) == 2 and doc["seed"] == 4 and doc["evaluations"] <= 6 * 3
    assert main(["search", "--space", "s2.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
                 "--elite", "3", "--quiet"]) == 0  # the command line wins
    assert len(json.loads((toy / "elite.json").read_text())["elites"]) == 3


@pytest.mark.parametrize("template, words", [
    ("int x = {{ NOT_A_PARAM }};\n", ["bad.j2", "NOT_A_PARAM", "undefined"]),
    ("{% if NUM_WARPS %}never closed\n", ["bad.j2:1", "template error"]),
])
def test_template_errors_write_nothing(toy: Path, capsys, template: str, words: list[str]):
    (toy / "bad.j2").write_text(template)
    (toy / "bad.toml").write_text((toy / "toy_space.toml").read_text().replace("toy.cpp.j2", "bad.j2"))
    before = snapshot(toy)
    fails(capsys, search_args(toy, space="bad.toml"), *words)
    assert snapshot(toy) == before
