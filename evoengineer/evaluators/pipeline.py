"""Builds that overlap measurements on one measuring device, asynchronously: `submit` starts a candidate's build at
once (on the builder's slots), a measuring thread takes each build as it finishes and measures it, and `poll` hands
the results to the search. The device waits only when nothing submitted is built yet; the search proposes the next
candidate while the device measures. Shared by the local evaluator (real builds) and by replays with a build-time
model.

CPU kernels are timed on the cores the compilers use: there (`builds_beside_measurements` False) the measuring
thread holds the builder (no new build starts, the running ones finish) while it measures everything built, then
lets the builds go on: builds and measurements take turns instead of sharing the cores.
"""

from __future__ import annotations

import math
import queue
import statistics
import threading
import time
from collections import deque
from abc import abstractmethod
from concurrent.futures import Future
from typing import Any, Iterable, Iterator, Protocol

from evoengineer.candidate import Candidate
from evoengineer.evaluators.asynchronous import Results
from evoengineer.evaluators.base import Evaluator, Measurement


def in_flight_width(slots: int, build_s: float | None, measure_s: float | None) -> int:
    """Candidates to keep in flight on one measuring device: about build_s / measure_s building so that a built one
    always waits for the device, plus one measuring and one waiting; at most every build slot busy (all of them
    while the times are not known)."""
    most = slots + 2
    if build_s is None or not measure_s or measure_s <= 0:
        return most
    return min(most, math.ceil(build_s / max(measure_s, 1e-3)) + 2)


class Builds(Protocol):
    """What the pipeline needs of a builder (compiler.builder.Builder, or a replay's build-time model)."""

    slots: int

    def submit(self, candidate: Candidate) -> Future: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...

    def cancel_queued(self) -> int: ...


class BuildAheadEvaluator(Evaluator):
    """An evaluator with a builder and one measuring device. Subclasses set `self.builder` and define `measure`
    (a built candidate -> its Measurement) and may refuse builds beside measurements."""

    builder: Builds

    def _init_pipeline(self) -> None:
        self.wait_s = 0.0  # time the measuring device had candidates in flight but none built (waiting on builds)
        self.build_s = 0.0  # builder seconds of the candidates built (not cached) here
        self.builds = 0
        self.results = Results()
        self._built: queue.Queue[Any] = queue.Queue()  # (epoch, candidate, build future) as builds finish
        self._epoch = 0  # bumped by cancel: builds of cancelled candidates are not measured
        self._measurer: threading.Thread | None = None
        self._started = False
        self._build_times: deque[float] = deque(maxlen=32)  # recent builds (not cached), seconds
        self._measure_times: deque[float] = deque(maxlen=32)  # recent measurements, seconds of the device

    @abstractmethod
    def measure(self, candidate: Candidate, build: Any) -> Measurement:
        """Check and time a candidate whose build is ok."""

    def builds_beside_measurements(self) -> bool:
        """False where a build would disturb a measurement (CPU kernels timed on the cores the compilers use)."""
        return True

    def before_batch(self) -> None:
        """Called once, before the first build is asked for (e.g. start the measuring worker early)."""

    # ---- asynchronous interface ----------------------------------------------------------------------------------
    def concurrency(self) -> int:
        """Enough in flight that a built candidate always waits for the device, and no more (a candidate proposed
        later is proposed from more results): builds that take B seconds against measurements of M need about B / M
        building; at most every build slot busy, plus one measuring and one built waiting. Before a few builds
        and measurements have been seen: every slot."""
        if len(self._build_times) < 4 or len(self._measure_times) < 4:
            return in_flight_width(self.builder.slots, None, None)
        return in_flight_width(self.builder.slots, statistics.median(self._build_times),
                               statistics.median(self._measure_times))

    def submit(self, candidate: Candidate) -> None:
        if not self._started:
            self._started = True
            self.before_batch()
        if self._measurer is None:
            self._measurer = threading.Thread(target=self._measure_loop, name="evo-measure", daemon=True)
            self._measurer.start()
        self.results.add(candidate)
        self._build(candidate, self._epoch)

    def _build(self, candidate: Candidate, epoch: int, retried: bool = False) -> None:
        f = self.builder.submit(candidate)
        f.add_done_callback(lambda f: self._built.put((epoch, candidate, f, retried)))

    def poll(self, timeout: float | None = None) -> list[tuple[Candidate, Measurement]]:
        return self.results.poll(timeout)

    def in_flight(self) -> int:
        return self.results.in_flight()

    def cancel(self) -> list[Candidate]:
        self._epoch += 1
        self.builder.cancel_queued()
        return self.results.drop()

    def _next_built(self, block: bool) -> Any:
        """The next finished build, waiting for one (`block`); the wait counts as the device waiting on builds
        while candidates are in flight."""
        if not block:
            return self._built.get_nowait()
        t0 = time.perf_counter()
        waiting = self.results.in_flight() > 0
        item = self._built.get()
        if waiting:
            self.wait_s += time.perf_counter() - t0
        return item

    def _measure_loop(self) -> None:
        beside = self.builds_beside_measurements()
        while True:
            item = self._next_built(block=True)
            if item is None:
                return
            if beside:
                self._handle(item)
                continue
            self.builder.hold()  # no build runs while CPU kernels are timed
            try:
                self._handle(item)
                while True:  # everything built meanwhile, in the same turn
                    try:
                        item = self._next_built(block=False)
                    except queue.Empty:
                        break
                    if item is None:
                        return
                    self._handle(item)
            finally:
                self.builder.release()

    def _handle(self, item: tuple[int, Candidate, Future, bool]) -> None:
        epoch, c, f, retried = item
        if epoch != self._epoch or f.cancelled():
            return
        try:
            build = f.result()
            if build.retry and not retried:  # its builder process died: once more
                self._build(c, epoch, retried=True)
                return
            if not build.cached:
                self.build_s += build.build_s
                self.builds += 1
                self._build_times.append(build.build_s)
            if build.status != "ok":
                m = Measurement(build.status, build.reason,
                                {**build.metrics, "build_s": build.build_s, "build_cached": build.cached})
            else:
                t0 = time.perf_counter()
                m = self.measure(c, build)
                self._measure_times.append(time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - the evaluation itself failed: the search raises it
            self.results.fail(exc)
            return
        if epoch == self._epoch:
            self.results.put(c, m)

    def _stop_measuring(self) -> None:
        if self._measurer is not None:
            self._epoch += 1
            self._built.put(None)
            self._measurer.join(timeout=30)
            self._measurer = None

    # ---- synchronous interface -----------------------------------------------------------------------------------
    def evaluate(self, candidate: Candidate) -> Measurement:
        return next(iter(self.evaluate_many([candidate])))[1]

    def evaluate_many(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        """Submit them all, hand each result on as it comes (builds overlap measurements as in a search)."""
        return self._evaluate_submitted(candidates)

    def build_stats(self) -> dict[str, float]:
        return {"build_s": self.build_s, "builds": self.builds, "wait_s": self.wait_s}
