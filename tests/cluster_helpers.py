"""Worker-side evaluators for the cluster tests. The tests register this module with cloudpickle by value, so Dask
workers get these classes without importing the tests."""

from __future__ import annotations

import os
import signal

from evoengineer.evaluators.replay import ReplayEvaluator


class AuditedReplay(ReplayEvaluator):
    """A replay that appends `start HASH PID` before its simulated measurement and `end HASH PID` after it, and kills
    its own worker process (SIGKILL) on a poisoned hash: a candidate that takes its Dask worker down."""

    def __init__(self, landscape, space, *, delay_s: float, audit: str, poison=()):
        super().__init__(landscape, space, check=False, delay_s=delay_s)
        self.audit, self.poison = audit, set(poison)

    def _log(self, what: str, candidate) -> None:
        with open(self.audit, "a") as f:
            f.write(f"{what} {candidate.hash} {os.getpid()}\n")

    def evaluate(self, candidate):
        self._log("start", candidate)
        if candidate.hash in self.poison:
            os.kill(os.getpid(), signal.SIGKILL)
        m = super().evaluate(candidate)
        self._log("end", candidate)
        return m


def audited_replay(space, inner, extras, *, build_jobs):
    """ClusterEvaluator factory: an AuditedReplay of the run's landscape."""
    return AuditedReplay(inner["landscape"], space, delay_s=float(extras.get("delay_s", 0.0)),
                         audit=extras["audit"], poison=extras.get("poison", ()))


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
