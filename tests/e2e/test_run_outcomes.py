"""How a run ends and what it says (issue 54): a run without a correct candidate exits 3 with its failures by status;
budgets and populations alike for every strategy, in words naming what the user gave; a missing folder for --out
refused as for --db; the report's sanitizer column and the GA's elite warning in plain words."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from evoengineer.cli import main
from evoengineer.errors import UserError
from evoengineer.search import STRATEGIES
from evoengineer.search.driver import settings_from
from evoengineer.search.failures import failures_by_status, first_line
from evoengineer.space import load_space

COMPILER = "toy.cpp:7:3: error: 'kStages' was not declared in this scope"  # a build's reason: its first error


def _failing_landscape(folder: Path) -> Path:
    """Every configuration of the toy space fails: most do not compile, some are wrong."""
    space = load_space(folder / "toy_space.toml")
    path = folder / "failing.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*space.names, "status", "time_us", "reason"])
        for i, g in enumerate(space.valid_genomes()):
            p = space.genome_to_params(g)
            cells = [("true" if v else "false") if isinstance(v, bool) else v for v in p.values()]
            if i % 5 == 4:
                w.writerow([*cells, "wrong", "", "max abs err 0.5 > 1e-4 on shape small (input set 1 of 2)"])
            else:
                w.writerow([*cells, "compile_error", "", COMPILER])
    return path


@pytest.mark.parametrize("quiet", [True, False])
def test_a_run_without_a_correct_candidate_exits_3_with_its_failures_by_status(toy_dir: Path, monkeypatch,
                                                                                 capsys, quiet: bool):
    monkeypatch.chdir(toy_dir)
    _failing_landscape(toy_dir)
    args = ["search", "--space", "toy_space.toml", "--landscape", "failing.csv", "--db", "sqlite:///f.db",
            "--budget", "20", "--strategy", "random"] + (["--quiet"] if quiet else [])
    assert main(args) == 3
    out, err = capsys.readouterr()
    assert out == ""  # no "(no elites)" table
    lines = err.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("error: "))
    assert lines[head] == "error: run 1 found no correct candidate in 20 evaluations; by status:"
    body = lines[head + 1:]
    assert len(body) == 2
    by = {ln.split()[0]: ln for ln in body}
    assert set(by) == {"compile_error", "wrong"}
    n_compile, n_wrong = int(by["compile_error"].split()[1]), int(by["wrong"].split()[1])
    assert n_compile + n_wrong == 20 and n_compile > 0 and n_wrong > 0
    # the compiler's first error line, not its whole log; the check that failed
    assert by["compile_error"].endswith("e.g. toy.cpp:7:3: error: 'kStages' was not declared in this scope")
    assert by["wrong"].endswith("e.g. max abs err 0.5 > 1e-4 on shape small (input set 1 of 2)")
    assert json.loads((toy_dir / "elite.json").read_text())["elites"] == []
    # the report shows the same example reasons
    assert main(["report", "--db", "sqlite:///f.db", "--out", "rep"]) == 0
    page = (toy_dir / "rep" / "index.html").read_text()
    assert "error: &#x27;kStages&#x27; was not declared in this scope" in page


def test_failures_by_status_keeps_the_first_arrived_reason_on_one_line():
    from evoengineer.store import CandidateRecord

    recs = [CandidateRecord(hash="b", params={}, status="wrong", reason="late", seq=5),
            CandidateRecord(hash="a", params={}, status="wrong", reason="\n  first   check\nsecond line", seq=2),
            CandidateRecord(hash="c", params={}, status="timeout", reason="", seq=1),
            CandidateRecord(hash="d", params={}, status="ok", seq=0)]
    assert failures_by_status(recs) == {"wrong": (2, "first check"), "timeout": (1, "(no reason recorded)")}
    assert first_line("x" * 300, 10) == "xxxxxxx..."


# ---- budgets and populations: every strategy alike -----------------------------------------------------------------
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_budget_1_evaluates_one_candidate_with_every_strategy(toy_dir: Path, monkeypatch, capsys, strategy: str):
    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///b.db",
                 "--budget", "1", "--strategy", strategy, "--quiet"]) == 0
    doc = json.loads((toy_dir / "elite.json").read_text())
    assert doc["evaluations"] == 1 and len(doc["elites"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["note: population 12 (the default) shrunk to 2 (the smallest a population can be) for --budget 1, "
                   "elite 3 to 1"]
    if strategy == "ga":  # and said in words that fit one
        assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db",
                     "sqlite:///b.db", "--budget", "1", "--force"]) == 0
        assert "finished (budget): 1 evaluation; elites in elite.json" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_population_given_larger_than_the_budget_is_refused_by_every_strategy(toy_dir: Path, strategy: str):
    space = load_space(toy_dir / "toy_space.toml")
    with pytest.raises(UserError, match=r"^--population 20 is larger than --budget 10: .*--help"):
        settings_from(space, strategy, population=20, budget=10)
    s = settings_from(space, strategy, population=10, budget=10)
    assert (s.population, s.budget) == (10, 10)


def test_a_budget_from_the_space_is_named_as_the_spaces(toy_dir: Path, capsys):
    text = (toy_dir / "toy_space.toml").read_text() + "\n[search]\nbudget = 5\n"
    (toy_dir / "b.toml").write_text(text)
    space = load_space(toy_dir / "b.toml")
    with pytest.raises(UserError) as info:
        settings_from(space, "surrogate", population=8)
    assert str(info.value).startswith("--population 8 is larger than the space's budget 5 (its [search] table; "
                                      "--budget sets it)")
    assert "--budget 5" not in str(info.value)  # a flag the user never gave
    s = settings_from(space, "ga")
    assert (s.population, s.elite) == (5, 3)
    assert "shrunk to 5 to fit the space's budget 5" in capsys.readouterr().err


def test_the_elite_warning_says_child_for_one(toy_dir: Path, monkeypatch, capsys):
    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///w.db",
                 "--population", "4", "--elite", "3", "--budget", "8"]) == 0
    warning = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "leave 1 child per generation" in warning[0]


# ---- a missing folder: refused alike for --out and --db -------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--out", "nodir/elite.json"], ["--out nodir/elite.json", "directory nodir does not exist"]),
    (["--db", "sqlite:///nodir/x.db"], ["--db 'sqlite:///nodir/x.db'", "directory nodir does not exist"]),
])
def test_a_missing_folder_is_refused_for_out_and_db_alike(toy_dir: Path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(toy_dir)
    before = sorted(p.name for p in toy_dir.iterdir())
    capsys.readouterr()
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--budget", "24", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert sorted(p.name for p in toy_dir.iterdir()) == before  # no folder made, no store, no elite.json


# ---- the report says what the terminal says -------------------------------------------------------------------------
def test_the_reports_sanitizer_column_says_not_run_as_the_terminal_does(toy_dir: Path, monkeypatch, capsys):
    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///r.db",
                 "--budget", "12"]) == 0
    terminal = capsys.readouterr().out
    assert "not run" in terminal.splitlines()[1]
    assert main(["report", "--db", "sqlite:///r.db", "--out", "rep"]) == 0
    page = (toy_dir / "rep" / "index.html").read_text()
    table = page[page.index("<h3>Elites of"):].split("</table>")[0]
    assert table.count("<td>not run</td>") == 3  # one per elite, where it used to say "-"
