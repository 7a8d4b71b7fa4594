"""Worker-side evaluators for the cluster tests. The tests register this module with cloudpickle by value, so Dask
workers get these classes without importing the tests."""

from __future__ import annotations

import os
import signal
import time

from evoengineer.evaluators.replay import ReplayEvaluator


class AuditedReplay(ReplayEvaluator):
    """A replay that appends `start HASH PID` before its simulated measurement and `end HASH PID` after it, and kills
    its own worker process (SIGKILL) on a poisoned hash: a candidate that takes its Dask worker down. With `hold`
    (a file path), the first candidate to start once `hold_after` others have ended (on any worker) stops
    mid-measurement: it writes `HASH PID` to `hold` and waits there until its process is killed (a test's event
    to kill it at, not a moment guessed from timings)."""

    def __init__(self, landscape, space, *, delay_s: float, audit: str, poison=(), hold=None, hold_after: int = 0,
                 prepared=None):
        super().__init__(landscape, space, check=False, delay_s=delay_s)
        self.audit, self.poison = audit, set(poison)
        self.hold, self.hold_after = hold, hold_after
        self.prepared = prepared  # a file: `start PID` per start() (the cluster's prepare task on this worker)

    def start(self):
        if self.prepared:
            with open(self.prepared, "a") as f:
                f.write(f"start {os.getpid()}\n")

    def _held_here(self, candidate) -> bool:
        """Whether this is the candidate to hold (exactly one, across all workers: an exclusive claim file)."""
        if not self.hold or sum(1 for w, _, _ in read_audit(self.audit) if w == "end") < self.hold_after:
            return False
        try:
            os.close(os.open(self.hold + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        with open(self.hold + ".tmp", "w") as f:
            f.write(f"{candidate.hash} {os.getpid()}\n")
        os.replace(self.hold + ".tmp", self.hold)  # whole, for the test that waits for it
        return True

    def _log(self, what: str, candidate) -> None:
        with open(self.audit, "a") as f:
            f.write(f"{what} {candidate.hash} {os.getpid()}\n")

    def evaluate(self, candidate):
        self._log("start", candidate)
        if candidate.hash in self.poison:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._held_here(candidate):
            deadline = time.monotonic() + 300  # only a test that never kills it gets past this
            while time.monotonic() < deadline:
                time.sleep(0.05)
        m = super().evaluate(candidate)
        self._log("end", candidate)
        return m


def audited_replay(space, inner, extras, *, build_jobs):
    """ClusterEvaluator factory: an AuditedReplay of the run's landscape."""
    return AuditedReplay(inner["landscape"], space, delay_s=float(extras.get("delay_s", 0.0)),
                         audit=extras["audit"], poison=extras.get("poison", ()), hold=extras.get("hold"),
                         hold_after=int(extras.get("hold_after", 0)), prepared=extras.get("prepared"))


def read_audit(path) -> list[tuple[str, str, int]]:
    """(what, hash, pid) per line of an audit file."""
    out = []
    try:
        text = open(path).read()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], parts[1], int(parts[2])))
    return out
