"""What a newcomer meets (issue 32): small budgets on the shipped defaults, printed commands that can be copied,
plain messages, and a resumed random search whose elite.json is the uninterrupted one's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import DATA, write_toy_landscape
from evoengineer import ROOT, space_file, shipped_space_files
from evoengineer.cli import install_command, main, run_state
from evoengineer.errors import UserError
from evoengineer.search.driver import settings_from
from evoengineer.space import load_space
from evoengineer.space.spec import resolve_space_arg


@pytest.mark.parametrize("space_file", sorted(shipped_space_files("*.toml")), ids=lambda p: p.stem)
def test_a_small_budget_shrinks_the_default_population(space_file: Path, capsys):
    space = load_space(space_file)
    s = settings_from(space, "ga", budget=4)
    assert s.population == 4 and 1 <= s.elite < 4 and s.budget == 4
    err = capsys.readouterr().err
    assert "shrunk to 4 to fit --budget 4" in err and len(err.strip().splitlines()) == 1


def test_a_population_given_larger_than_the_budget_is_refused_with_a_pointer():
    space = load_space(space_file("cpu_msda.toml"))
    with pytest.raises(UserError, match=r"--population 12 is larger than --budget 4.*--help"):
        settings_from(space, "ga", budget=4, population=12)
    with pytest.raises(UserError, match="--elite 5"):
        settings_from(space, "ga", budget=4, elite=5)


def test_search_with_budget_4_on_the_cpu_space_defaults(tmp_path: Path, monkeypatch, capsys):
    landscape = ROOT / "experiments" / "data" / "strategies" / "landscape_cpu_msda.csv"
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--space", "cpu_msda", "--landscape", str(landscape), "--budget", "4", "--db",
                 "sqlite:///b.db", "--quiet"]) == 0
    assert json.loads((tmp_path / "elite.json").read_text())["evaluations"] == 4
    assert "shrunk to 4" in capsys.readouterr().err


def test_an_unknown_space_name_lists_the_known_ones():
    with pytest.raises(UserError, match=r"--space nope: .*not a shipped space \(known: .*cpu_msda"):
        resolve_space_arg("nope")
    assert resolve_space_arg("cpu_msda") == space_file("cpu_msda.toml")


def test_the_printed_install_command_names_a_path():
    assert install_command("op") == "pip install ./op"
    assert install_command(Path("out/op")) == "pip install ./out/op"
    assert install_command("/tmp/my op") == "pip install '/tmp/my op'"
    assert install_command("../op") == "pip install ../op"


def test_run_state_says_each_word_once():
    assert run_state("interrupted", "interrupted by user") == "interrupted by user"
    assert run_state("finished", "budget") == "finished budget"
    assert run_state("running", "") == "running"


def _random_search(d: Path, flaky_at: int | None, monkeypatch) -> tuple[int, dict]:
    from evoengineer.evaluators.replay import ReplayEvaluator

    real = ReplayEvaluator.evaluate
    calls = {"n": 0}

    def flaky(self, candidate):
        calls["n"] += 1
        if calls["n"] == flaky_at:
            raise KeyboardInterrupt
        return real(self, candidate)

    monkeypatch.chdir(d)
    monkeypatch.setattr(ReplayEvaluator, "evaluate", flaky)
    args = ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
            "--strategy", "random", "--population", "8", "--budget", "30", "--seed", "7", "--quiet"]
    code = main(args)
    if flaky_at is not None:
        assert code == 130
        monkeypatch.setattr(ReplayEvaluator, "evaluate", real)
        code = main(["resume", "--db", "sqlite:///s.db", "--quiet"])
    return code, json.loads((d / "elite.json").read_text())


def test_a_random_search_interrupted_in_its_last_batch_resumes_to_the_same_elite_json(tmp_path: Path,
                                                                                          monkeypatch):
    dirs = []
    for name in ("plain", "resumed"):
        d = tmp_path / name
        d.mkdir()
        for f in ("toy_space.toml", "toy.cpp.j2"):
            shutil.copy(DATA / f, d / f)
        write_toy_landscape(load_space(d / "toy_space.toml"), d / "landscape.csv")
        dirs.append(d)
    code, plain = _random_search(dirs[0], None, monkeypatch)
    assert code == 0
    code, resumed = _random_search(dirs[1], 28, monkeypatch)  # batches of 8, 8, 8, 6: inside the last one
    assert code == 0
    assert resumed["generation"] == plain["generation"] == 3
    assert resumed["evaluations"] == plain["evaluations"] == 30
    assert [e["hash"] for e in resumed["elites"]] == [e["hash"] for e in plain["elites"]]


def test_a_claim_that_cannot_be_written_leaves_no_lock(tmp_path: Path, monkeypatch):
    """elite.json's file system full: claiming --out fails with the OSError, and no .elite.json.lock stays behind
    (it would refuse nobody, but it is litter the next run has to judge)."""
    import errno

    from evoengineer import elite_json

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    claim = elite_json.OutClaim(tmp_path / "elite.json", 1, "sqlite:///s.db")
    monkeypatch.setattr(elite_json.json, "dump", full)
    with pytest.raises(OSError, match="No space left"):
        claim.acquire()
    claim.release()
    assert not (tmp_path / ".elite.json.lock").exists()
    monkeypatch.undo()
    claim.acquire()
    assert (tmp_path / ".elite.json.lock").exists()
    claim.release()
    assert not (tmp_path / ".elite.json.lock").exists()
