"""What an evaluator needs to run candidates asynchronously: a queue of finished results that the search polls, and
a default that turns any `evaluate_many` into submit / poll.

The search (search/loop.py) keeps a number of candidates in flight and proposes the next one whenever a result comes
back; an evaluator either implements `submit` / `poll` itself (the build-and-measure pipeline does) or inherits the
`BatchFeeder`: a thread that hands everything submitted so far to `evaluate_many` as one batch, and the next batch
once that one is done.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evoengineer.candidate import Candidate
    from evoengineer.evaluators.base import Evaluator, Measurement


class Results:
    """Finished results (or the error that ended the evaluation), handed to the search in the order they came."""

    def __init__(self) -> None:
        self._q: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self.pending: dict[str, Candidate] = {}  # submitted, result not yet handed back: hash -> candidate
        self.error: BaseException | None = None

    def add(self, candidate: Candidate) -> None:
        with self._lock:
            self.pending[candidate.hash] = candidate

    def put(self, candidate: Candidate, m: Measurement) -> None:
        self._q.put((candidate, m))

    def fail(self, exc: BaseException) -> None:
        """The evaluation itself failed (not a candidate): `poll` raises it."""
        self.error = exc
        self._q.put(None)

    def poll(self, timeout: float | None) -> list[tuple[Candidate, Measurement]]:
        out: list[tuple[Candidate, Measurement]] = []
        with self._lock:
            waiting = bool(self.pending)
        if not waiting and self.error is None:
            return out
        try:
            item = self._q.get(timeout=timeout) if timeout is None or timeout > 0 else self._q.get_nowait()
            while True:
                if item is not None:
                    out.append(item)
                item = self._q.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            for c, _ in out:
                self.pending.pop(c.hash, None)
        if not out and self.error is not None:
            raise self.error
        return out

    def in_flight(self) -> int:
        with self._lock:
            return len(self.pending)

    def drop(self) -> list[Candidate]:
        """Forget everything in flight (its results, should they still come, are ignored by the search)."""
        with self._lock:
            gone = list(self.pending.values())
            self.pending.clear()
        return gone


class BatchFeeder:
    """submit / poll over an evaluator's `evaluate_many`: a daemon thread takes everything submitted while the
    previous batch ran as the next batch."""

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator
        self.results = Results()
        self._todo: list[Candidate] = []
        self._cv = threading.Condition()
        self._stopped = False
        self._generation = 0  # bumped by cancel: results of a cancelled batch are not handed on
        self._thread = threading.Thread(target=self._run, name="evo-batch-feeder", daemon=True)
        self._thread.start()

    def submit(self, candidate: Candidate) -> None:
        self.results.add(candidate)
        with self._cv:
            self._todo.append(candidate)
            self._cv.notify()

    def poll(self, timeout: float | None) -> list[tuple[Candidate, Measurement]]:
        return self.results.poll(timeout)

    def in_flight(self) -> int:
        return self.results.in_flight()

    def cancel(self) -> list[Candidate]:
        with self._cv:
            self._todo.clear()
            self._generation += 1
        return self.results.drop()

    def stop(self) -> None:
        self.cancel()
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                batch, self._todo = self._todo, []
                generation = self._generation
            try:
                for c, m in self.evaluator.evaluate_many(batch):
                    if generation == self._generation:
                        self.results.put(c, m)
            except BaseException as exc:  # noqa: BLE001 - handed to the search's thread, which raises it
                if generation == self._generation:
                    self.results.fail(exc)
                return
