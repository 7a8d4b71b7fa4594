"""Builds that overlap measurements on one measuring device: the batch's builds all start at once, each candidate is
measured as soon as its build is done, and builds hinted for later (`prefetch`) run behind them while the batch is
measured. Shared by the local evaluator (real builds) and by replays with a build-time model.

Only builds run ahead: nothing is measured or recorded until a batch asks for it, so what a search evaluates and
decides does not depend on how far ahead the builds got.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from concurrent.futures import Future, as_completed
from typing import Any, Iterable, Iterator, Protocol, Sequence

from evoengineer.candidate import Candidate
from evoengineer.evaluators.base import Evaluator, Measurement


class Builds(Protocol):
    """What the pipeline needs of a builder (compiler.builder.Builder, or a replay's build-time model)."""

    def submit(self, candidate: Candidate, *, ahead: bool = False) -> Future: ...

    def drop_ahead(self, keep: set[str]) -> int: ...


class BuildAheadEvaluator(Evaluator):
    """An evaluator with a builder and one measuring device. Subclasses set `self.builder` and define `measure`
    (a built candidate -> its Measurement) and may refuse build-ahead (`builds_beside_measurements`)."""

    builder: Builds

    def _init_pipeline(self) -> None:
        self.wait_s = 0.0  # time a batch had nothing built to measure (the device waiting on builds)
        self.build_s = 0.0  # builder seconds of the candidates built (not cached) here
        self.builds = 0
        self.built_ahead = 0  # candidates whose build a hint made during an earlier batch had asked for
        self._batches = 0  # batches started
        self._ahead: dict[str, tuple[Future, int]] = {}  # hash -> build asked for ahead, batches started by then

    @abstractmethod
    def measure(self, candidate: Candidate, build: Any) -> Measurement:
        """Check and time a candidate whose build is ok."""

    def builds_beside_measurements(self) -> bool:
        """False where a build would disturb a measurement (CPU kernels timed on the cores the compilers use):
        then nothing is built ahead and a batch finishes its builds before its first measurement."""
        return True

    def before_batch(self) -> None:
        """Called as a batch starts, before its builds are asked for (e.g. start the measuring worker early)."""

    def wants_prefetch(self, certain: bool) -> bool:
        return self.builds_beside_measurements()

    def prefetch(self, candidates: Sequence[Candidate], *, certain: bool = False) -> None:
        """Build these ahead, behind every build asked for now, while the current batch is measured. A strategy hints
        at the batch after the one it is about to evaluate; the hint before it (naming that batch) stays, older
        hints' builds not yet started are dropped."""
        if not self.wants_prefetch(certain):
            return
        wanted = {c.hash: c for c in candidates}
        # the hint made before the last batch named the batch that comes next: kept until that batch asks
        keep = {h for h, (_, hinted) in self._ahead.items() if hinted >= self._batches - 1} | set(wanted)
        self.builder.drop_ahead(keep=keep)
        self._ahead = {h: fb for h, fb in self._ahead.items() if h in keep and not fb[0].cancelled()}
        for h, c in wanted.items():
            if h not in self._ahead:
                self._ahead[h] = (self.builder.submit(c, ahead=True), self._batches)

    def _build_future(self, c: Candidate) -> Future:
        f, hinted = self._ahead.pop(c.hash, (None, 0))
        if f is not None and not f.cancelled():
            # a hint made just before this batch (and naming some of it) gained nothing: only earlier ones count
            if hinted < self._batches - 1:
                self.built_ahead += 1
            return f if f.done() else self.builder.submit(c)  # not done: the same build, moved up the queue
        return self.builder.submit(c)

    def evaluate(self, candidate: Candidate) -> Measurement:
        return next(iter(self.evaluate_many([candidate])))[1]

    def evaluate_many(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        """The batch's builds at once (those built ahead are ready); each candidate measured as soon as its build is
        done; a build whose builder process died is tried once more."""
        candidates = list(candidates)
        self._batches += 1
        self.before_batch()
        futures: dict[Future, Candidate] = {self._build_future(c): c for c in candidates}
        if not self.builds_beside_measurements():
            for f in futures:
                f.result()
        retried: set[str] = set()
        pending = dict(futures)
        while pending:
            t_wait = time.perf_counter()
            for f in as_completed(list(pending)):
                self.wait_s += time.perf_counter() - t_wait
                c = pending.pop(f)
                build = f.result()
                if build.retry and c.hash not in retried:
                    retried.add(c.hash)
                    pending[self.builder.submit(c)] = c
                    break
                if not build.cached:
                    self.build_s += build.build_s
                    self.builds += 1
                if build.status != "ok":
                    yield c, Measurement(build.status, build.reason,
                                         {**build.metrics, "build_s": build.build_s, "build_cached": build.cached})
                else:
                    yield c, self.measure(c, build)
                break  # re-enter as_completed with the current pending set

    def build_stats(self) -> dict[str, float]:
        return {"build_s": self.build_s, "builds": self.builds, "wait_s": self.wait_s, "built_ahead": self.built_ahead}
