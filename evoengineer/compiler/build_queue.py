"""The builder's queue: builds asked for now go before builds asked for ahead, on a fixed number of slots.

A job handed to a slot can no longer be overtaken, so the queue hands out no more jobs than there are free slots
and keeps the rest itself, most urgent first. What runs a job is the owner's (`start`: a process pool's submit for
real builds, a timer for a replay's build-time model).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

#: priorities: asked for now (a batch being evaluated), asked for ahead (the next batch, speculative children)
NOW, AHEAD = 0, 1


@dataclass
class _Entry:
    payload: Any
    priority: int
    future: Future = field(default_factory=Future)
    started: bool = False


class BuildQueue:
    """`submit(key, payload, ahead=...)` -> Future of the result; one build per key at a time (a second ask shares
    it, and an ask for now moves a queued ahead-build up). `start(payload) -> Future` runs one job on a slot;
    `finish(key, payload, future) -> result` turns its outcome into the result handed on."""

    def __init__(self, slots: int, start: Callable[[Any], Future], finish: Callable[[Hashable, Any, Future], Any]):
        self.slots = max(1, slots)
        self._start = start
        self._finish = finish
        self._lock = threading.RLock()
        self._heap: list[tuple[int, int, Hashable]] = []
        self._entries: dict[Hashable, _Entry] = {}
        self._seq = itertools.count()
        self.running = 0  # slots taken (jobs of the owner's own, such as a binding build, count too)
        self._idle = threading.Condition(self._lock)
        self._held = 0  # hold() calls not yet released: no job starts meanwhile

    def submit(self, key: Hashable, payload: Any, *, ahead: bool = False) -> Future:
        priority = AHEAD if ahead else NOW
        with self._lock:
            e = self._entries.get(key)
            if e is not None and not e.future.cancelled():
                if priority < e.priority and not e.started:
                    e.priority = priority
                    heapq.heappush(self._heap, (priority, next(self._seq), key))
            else:
                e = self._entries[key] = _Entry(payload=payload, priority=priority)
                heapq.heappush(self._heap, (priority, next(self._seq), key))
        self.dispatch()
        return e.future

    def queued(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def drop_ahead(self, keep: Callable[[Any], bool]) -> int:
        """Forget the ahead-builds not yet started whose payload `keep` refuses; their futures are cancelled."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.priority == AHEAD and not e.started and not keep(e.payload)]
            futures = [self._entries.pop(k).future for k in gone]
        for f in futures:
            f.cancel()
        return len(futures)

    def pending(self) -> int:
        """Builds waiting for a slot plus slots taken."""
        with self._lock:
            return sum(1 for e in self._entries.values() if not e.started) + self.running

    def take_slot(self) -> None:
        """A job of the owner's own (not queued) takes a slot until `release_slot`."""
        with self._lock:
            self.running += 1

    def release_slot(self) -> None:
        with self._lock:
            self.running -= 1
            self._idle.notify_all()
        self.dispatch()

    def hold(self) -> None:
        """Start no job until `release`, and return once the running ones are done (CPU kernels are timed then)."""
        with self._lock:
            self._held += 1
            while self.running > 0:
                self._idle.wait()

    def release(self) -> None:
        with self._lock:
            self._held = max(0, self._held - 1)
        self.dispatch()

    def cancel_queued(self) -> int:
        """Forget every job not yet started (the search stopped); their futures are cancelled."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if not e.started]
            futures = [self._entries.pop(k).future for k in gone]
            self._heap.clear()
        for f in futures:
            f.cancel()
        return len(futures)

    def dispatch(self) -> None:
        """Hand queued jobs to free slots, most urgent first (within a priority, in the order asked)."""
        while True:
            with self._lock:
                if self._held or self.running >= self.slots or not self._heap:
                    return
                priority, _, key = heapq.heappop(self._heap)
                e = self._entries.get(key)
                if e is None or e.started or e.priority != priority:
                    continue  # dropped, moved up (a newer heap entry stands for it) or taken
                e.started = True
                self.running += 1
                inner = self._start(e.payload)
            inner.add_done_callback(lambda f, key=key, e=e: self._done(key, e, f))

    def _done(self, key: Hashable, e: _Entry, f: Future) -> None:
        try:
            result = self._finish(key, e.payload, f)
        finally:
            with self._lock:
                self.running -= 1
                self._idle.notify_all()
                if self._entries.get(key) is e:
                    del self._entries[key]
            self.dispatch()
        if not e.future.done():
            e.future.set_result(result)

    def close(self) -> None:
        """Cancel what has not started (those futures never resolve otherwise)."""
        with self._lock:
            left = [e.future for e in self._entries.values() if not e.started]
            self._entries = {k: e for k, e in self._entries.items() if e.started}
            self._heap.clear()
        for f in left:
            f.cancel()


class QueuedBuilds:
    """What a builder owning a BuildQueue (`self.queue`) offers the build-and-measure pipeline."""

    queue: BuildQueue

    @property
    def slots(self) -> int:
        return self.queue.slots

    def hold(self) -> None:
        """No build starts until `release`; returns once the running builds are done."""
        self.queue.hold()

    def release(self) -> None:
        self.queue.release()

    def cancel_queued(self) -> int:
        return self.queue.cancel_queued()
