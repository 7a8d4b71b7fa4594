"""Strategy options (evoengineer/search/options.py): one table per strategy (its params dataclass), set with
--option KEY=VALUE, refused in one line when unknown or mistyped, stored with the run and given to the strategy
again on resume; `python -m evoengineer options` lists them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from evoengineer.cli import main
from evoengineer.errors import UsageError
from evoengineer.search import STRATEGIES
from evoengineer.search.ga import GAParams, GeneticSearch
from evoengineer.search.options import check, fields_of, parse
from evoengineer.search.surrogate import SurrogateParams


def test_every_strategy_option_has_a_type_and_a_default():
    for name, cls in STRATEGIES.items():
        for option, (kind, default) in fields_of(cls.params_cls).items():
            assert kind in (int, float, bool, str) and isinstance(default, kind), (name, option)
    assert fields_of(GAParams)["cxpb"] == (float, 0.9) and "trees" in fields_of(SurrogateParams)


def test_values_are_typed_and_bad_ones_refused():
    assert parse("ga", GAParams, ["cxpb=0.5", "plus_survival=true", "tournsize=4", "cxpb=0.7"]) == \
        {"cxpb": 0.7, "plus_survival": True, "tournsize": 4}
    assert check("ga", GAParams, {"cxpb": 1}) == {"cxpb": 1.0}  # a TOML/JSON integer for a float option
    for bad, words in [(["nope=1"], "unknown to the ga strategy"), (["cxpb"], "KEY=VALUE"),
                       (["tournsize=2.5"], "an integer"), (["plus_survival=maybe"], "true or false"),
                       (["cxpb=fast"], "a number")]:
        with pytest.raises(UsageError, match=words):
            parse("ga", GAParams, bad)
    with pytest.raises(UsageError, match="takes no options"):
        parse("random", None, ["cxpb=0.5"])


def _config(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("select config from runs where id = 1").fetchone()[0]
    finally:
        con.close()


def test_options_reach_the_strategy_are_stored_and_come_back_on_resume(toy_dir: Path, monkeypatch, capsys):
    import json

    seen: list[GAParams] = []
    real = GeneticSearch.__init__

    def spy(self, runner, params=None):
        real(self, runner, params)
        seen.append(self.params)

    monkeypatch.setattr(GeneticSearch, "__init__", spy)
    monkeypatch.chdir(toy_dir)
    args = ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///o.db",
            "--out", "o.json", "--population", "6", "--budget", "12", "--quiet"]
    assert main([*args, "--option", "immigrants=0.5", "--option", "tournsize=2"]) == 0
    assert seen[-1].immigrants == 0.5 and seen[-1].tournsize == 2 and seen[-1].cxpb == GAParams().cxpb
    assert json.loads(_config(toy_dir / "o.db"))["options"] == {"immigrants": 0.5, "tournsize": 2}
    # an interrupted run resumes with its own options
    con = sqlite3.connect(toy_dir / "o.db")
    con.execute("update runs set status = 'interrupted' where id = 1")
    con.commit()
    con.close()
    assert main(["resume", "--db", "sqlite:///o.db", "--quiet"]) == 0
    assert seen[-1].immigrants == 0.5 and seen[-1].tournsize == 2
    # refused before anything is written
    assert main([*args[:5], "--db", "sqlite:///p.db", "--out", "p.json", "--option", "immigrant=0.5"]) == 2
    assert "immigrant: unknown to the ga strategy" in capsys.readouterr().err
    assert not (toy_dir / "p.db").exists() and not (toy_dir / "p.json").exists()


def test_the_options_command_lists_every_strategy(capsys):
    assert main(["options"]) == 0
    out = capsys.readouterr().out
    for name in STRATEGIES:
        assert f"\n{name:10s} " in out
    assert "cxpb" in out and "float" in out and "0.9" in out
