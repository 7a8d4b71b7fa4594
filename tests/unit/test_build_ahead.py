"""The builder's queue (now before ahead, bounded slots, hold while CPU kernels are timed) and the asynchronous
build-and-measure pipeline (timers and simulated time)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from test_ga import toy  # noqa: F401  (the toy space and its landscape, shared)
from evoengineer.compiler.build_queue import BuildQueue
from evoengineer.evaluators.replay import BuildTimeModel, ReplayEvaluator
from evoengineer.space import load_space


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


def _replay(space, landscape: Path, model: BuildTimeModel) -> ReplayEvaluator:
    return ReplayEvaluator(landscape, space, builds=model)


def test_the_pipeline_measures_builds_as_they_finish_and_keeps_its_slots_busy(toy: Path):
    """Timer builds of different lengths on 3 slots: each candidate is measured as soon as its build is done (out
    of submission order), every submitted candidate comes back once, and the builds ran 3 at a time."""
    space = load_space(toy / "toy_space.toml")
    cands = [_factory(space).from_genome(g) for g in space.valid_genomes()[:9]]
    ev = _replay(space, toy / "landscape.csv", BuildTimeModel(3, 0.05))
    order, at = [], []
    with ev:
        for c in cands:
            ev.submit(c)
        assert ev.in_flight() == 9 and ev.concurrency() == 5
        while ev.in_flight():
            got = [c.hash for c, m in ev.poll(10.0)]
            order += got
            at += [time.monotonic()] * len(got)
    assert sorted(order) == sorted(c.hash for c in cands)
    # first to last result (the first waits for one-time imports): three builds at a time, not one after another
    assert at[-1] - at[0] < 8 * 0.05 * 0.8
    assert ev.builder.started == [c.hash for c in cands]


def test_cancel_forgets_what_is_in_flight(toy: Path):
    space = load_space(toy / "toy_space.toml")
    cands = [_factory(space).from_genome(g) for g in space.valid_genomes()[:6]]
    ev = _replay(space, toy / "landscape.csv", BuildTimeModel(1, 0.2))
    with ev:
        for c in cands:
            ev.submit(c)
        gone = ev.cancel()
        assert {c.hash for c in gone} == {c.hash for c in cands} and ev.in_flight() == 0
        assert ev.poll(0.5) == []


def test_the_virtual_pipeline_is_deterministic_and_out_of_order(toy: Path):
    """Simulated time: the same submissions give the same arrival order, which is not the submission order when
    builds differ in length; the device's busy and waiting time add up."""
    space = load_space(toy / "toy_space.toml")
    cands = [_factory(space).from_genome(g) for g in space.valid_genomes()[:12]]

    def arrivals():
        model = BuildTimeModel(4, 1.0, virtual=True, measure_s=0.25)
        model.duration = lambda m, it=iter([3.0, 1.0, 2.0, 0.5] * 3): next(it)
        ev = _replay(space, toy / "landscape.csv", model)
        for c in cands:
            ev.submit(c)
        out = []
        while ev.in_flight():
            out += [c.hash for c, _ in ev.poll()]
        return out, ev.virtual

    a, va = arrivals()
    b, _ = arrivals()
    assert a == b and sorted(a) == sorted(c.hash for c in cands) and a != [c.hash for c in cands]
    assert va.busy_s == pytest.approx(12 * 0.25) and va.device_free >= va.busy_s


def _factory(space):
    from evoengineer.candidate import CandidateFactory

    return CandidateFactory(space)
