"""Builds ahead of the batch that asks for them: the builder's queue (now before ahead, bounded slots, dropped hints),
and searches replayed with a build-time model evaluating exactly what they evaluate without one."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from test_ga import toy  # noqa: F401  (the toy space and its landscape, shared)
from evoengineer.cli import main
from evoengineer.compiler.build_queue import BuildQueue
from evoengineer.evaluators.replay import BuildTimeModel, ReplayEvaluator
from evoengineer.search import GeneticSearch, Runner, SearchSettings
from evoengineer.space import load_space
from evoengineer.store import Store


class ManualSlots:
    """Jobs that finish when the test says so; records the order they started."""

    def __init__(self):
        self.started: list[str] = []
        self.futures: dict[str, Future] = {}
        self.lock = threading.Lock()

    def start(self, payload: str) -> Future:
        with self.lock:
            self.started.append(payload)
            f = self.futures[payload] = Future()
        return f

    def finish(self, key, payload, f: Future) -> str:
        return f"built {payload}"

    def complete(self, payload: str) -> None:
        self.futures[payload].set_result(None)


def test_queue_runs_now_before_ahead_within_its_slots():
    slots = ManualSlots()
    q = BuildQueue(2, slots.start, slots.finish)
    ahead = {k: q.submit(k, k, ahead=True) for k in ("a1", "a2", "a3", "a4")}
    assert slots.started == ["a1", "a2"]  # two slots: the rest wait in the queue, not in the pool
    now = {k: q.submit(k, k) for k in ("n1", "n2")}
    assert q.submit("a4", "a4") is ahead["a4"]  # asked for now: the same build, moved up
    slots.complete("a1")
    slots.complete("a2")
    assert slots.started == ["a1", "a2", "n1", "n2"]  # now-builds overtake the waiting ahead-builds
    assert ahead["a1"].result(timeout=5) == "built a1" and not now["n1"].done()
    assert q.drop_ahead(keep=lambda p: False) == 1  # a3 (a4 was moved up: no longer dropped with a hint)
    assert ahead["a3"].cancelled()
    slots.complete("n1")
    assert slots.started[-1] == "a4"
    slots.complete("n2")
    slots.complete("a4")
    assert now["n2"].result(timeout=5) == "built n2" and ahead["a4"].result(timeout=5) == "built a4"
    assert q.pending() == 0 and q.running == 0


def test_queue_shares_a_running_build_and_closes_cleanly():
    slots = ManualSlots()
    q = BuildQueue(1, slots.start, slots.finish)
    first = q.submit("x", "x")
    assert q.submit("x", "x") is first and slots.started == ["x"]
    waiting = q.submit("y", "y", ahead=True)
    q.close()
    assert waiting.cancelled()
    slots.complete("x")
    assert first.result(timeout=5) == "built x"


def _search(toy: Path, work: Path, monkeypatch, strategy: str, builds: str | None, seed: int) -> tuple[list, str]:
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("toy_space.toml", "toy.cpp.j2", "landscape.csv"):
        shutil.copy(toy / name, work / name)
    if builds is None:
        monkeypatch.delenv("EVOENGINEER_REPLAY_BUILDS", raising=False)
    else:
        monkeypatch.setenv("EVOENGINEER_REPLAY_BUILDS", builds)
    monkeypatch.setenv("EVOENGINEER_REPLAY_DELAY_S", "0.002")
    args = ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
            "--out", "elite.json", "--seed", str(seed), "--strategy", strategy, "--budget", "60", "--quiet"]
    if strategy == "ga":
        args += ["--population", "10", "--generations", "12"]
    assert main(args) == 0
    con = sqlite3.connect(work / "s.db")
    try:
        rows = sorted(con.execute("SELECT hash, generation, status FROM candidates").fetchall())
    finally:
        con.close()
    elites = [e["hash"] for e in json.loads((work / "elite.json").read_text())["elites"]]
    return rows, json.dumps(elites)


@pytest.mark.parametrize("strategy,seed", [("ga", 0), ("ga", 7), ("random", 3), ("grid", 0)])
def test_builds_ahead_change_nothing_that_is_evaluated(toy: Path, tmp_path: Path, monkeypatch, strategy, seed):
    """The same seed evaluates the same configurations in the same generations, and publishes the same elites,
    with simulated builds (4 slots, random-ish durations) running ahead as without builds at all."""
    plain = _search(toy, tmp_path / "plain", monkeypatch, strategy, None, seed)
    ahead = _search(toy, tmp_path / "ahead", monkeypatch, strategy, "4x0.01", seed)
    assert len(plain[0]) == 60
    assert ahead == plain


def test_the_ga_builds_its_likely_children_ahead(toy: Path, tmp_path: Path):
    """While a generation is measured, its likely children are built: some of them are bred for real and their
    builds are then done before their generation asks; what is evaluated is what the GA without builds evaluates."""
    space = load_space(toy / "toy_space.toml")
    results = {}
    for name, builds in (("plain", None), ("ahead", BuildTimeModel(3, 0.02))):
        ev = ReplayEvaluator(toy / "landscape.csv", space, delay_s=0.005, builds=builds)
        store = Store(f"sqlite:///{tmp_path / name}.db")
        settings = SearchSettings(population=10, generations=8, elite=3, budget=None, seed=11)
        rid = store.create_run(space_name=space.name, space_path=str(toy / "toy_space.toml"), space_text=space.text,
                               template=space.template, template_sha256="t" * 64,
                               config={**settings.to_dict(), "evaluator": ev.describe()}, seed=11,
                               fingerprint={"cpu": "test"})
        runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings,
                        out=tmp_path / f"{name}.json")
        t0 = time.monotonic()
        GeneticSearch(runner).run(None)
        results[name] = (sorted((c.hash, c.generation) for c in store.candidates(rid)), time.monotonic() - t0, ev)
        ev.close()
    assert results["ahead"][0] == results["plain"][0]
    ev = results["ahead"][2]
    evaluated = {h for h, _ in results["ahead"][0]}
    started = ev.builder.started
    assert len(started) == len(set(started))  # never built twice (the build cache)
    assert set(started) > evaluated  # guesses that were never bred were built too, and recorded nowhere
    assert 0 < ev.build_stats()["builds"] <= len(evaluated)


def test_a_random_search_finds_its_next_batch_built_ahead(toy: Path, tmp_path: Path):
    """Random search hints at the batch after the one it is about to evaluate: that hint is kept until its batch
    asks (a newer hint does not drop it), so every batch after the first was started ahead."""
    from evoengineer.search.random_search import RandomSearch

    space = load_space(toy / "toy_space.toml")
    ev = ReplayEvaluator(toy / "landscape.csv", space, delay_s=0.002, builds=BuildTimeModel(4, 0.005))
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    settings = SearchSettings(population=8, generations=0, elite=3, budget=40, seed=2)
    rid = store.create_run(space_name=space.name, space_path=str(toy / "toy_space.toml"), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": ev.describe()}, seed=2,
                           fingerprint={"cpu": "test"})
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings,
                    out=tmp_path / "r.json")
    RandomSearch(runner).run(None)
    ev.close()
    assert len(list(store.candidates(rid))) == 40
    assert ev.build_stats()["built_ahead"] == 40 - 8  # all but the first batch
