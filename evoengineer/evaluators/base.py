"""The evaluator interface: a candidate in, a measurement out."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from evoengineer.candidate import Candidate
from evoengineer.status import STATUSES as _STATUSES
from evoengineer.status import Status
from evoengineer.evaluators.retiming import Retiming

if TYPE_CHECKING:
    from evoengineer.evaluators.asynchronous import BatchFeeder

OK = Status.OK.value
STATUSES = _STATUSES  # evoengineer/status.py says what each means

#: Metric names every evaluator uses where it has the number (times in microseconds).
METRICS = ("time_us", "time_p90_us", "time_p99_us", "baseline_us", "speedup", "max_abs_err", "max_rel_err",
           "registers", "smem_bytes", "spill_bytes", "stack_bytes", "build_s")


def state_changed(status: str, reason: str, why: str) -> tuple[str, str]:
    """The verdict of a candidate found to have changed the measuring process's state: `state_changed` because of
    `why`, keeping what its own verdict said (wrong, implausible); a crash or a hang stands as it is."""
    if status not in (Status.OK, Status.WRONG, Status.IMPLAUSIBLE):
        return status, reason
    return Status.STATE_CHANGED.value, why + (f" (also {status}: {reason})" if status != OK else "")


@dataclass
class Measurement:
    """Outcome of evaluating one candidate. `metrics['time_us']` is the p50 time, present when status is ok."""

    status: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        self.status = Status(self.status).value  # a plain string (a member given is stored as its value)

    @property
    def ok(self) -> bool:
        t = self.metrics.get("time_us")
        return self.status == OK and isinstance(t, (int, float)) and math.isfinite(t) and t > 0

    @property
    def time_us(self) -> float:
        return float(self.metrics["time_us"]) if self.ok else math.inf


class Evaluator(ABC):
    """Turns candidates into measurements. Implementations must be deterministic in what they *decide*
    (status), and may run candidates in isolated processes."""

    kind: str = "abstract"

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-able settings, stored with the run so `resume` rebuilds the same evaluator."""

    @abstractmethod
    def evaluate(self, candidate: Candidate) -> Measurement:
        """Measure one candidate."""

    def evaluate_many(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        """Measure several; yields each result as soon as it is known (order may differ from input)."""
        for c in candidates:
            yield c, self.evaluate(c)

    def start(self) -> None:
        """The run is about to ask for measurements: start what takes long to get ready (a measuring worker, a
        family binding) so that it is ready by the first build. Default: nothing."""

    def start_builds(self) -> None:
        """An evaluator that only builds (a cluster's build worker): start its compilers and the family binding
        now, before the first build is asked for. Default: nothing."""

    # ---- asynchronous use: the search keeps `concurrency()` candidates in flight ------------------------------------
    def concurrency(self) -> int:
        """How many candidates the search should keep in flight so that every build slot and every measuring device
        stays busy. Default: 1 (one at a time)."""
        return 1

    def submit(self, candidate: Candidate) -> None:
        """Start evaluating `candidate`; its result comes back from `poll`. Default: a background thread hands what
        was submitted to `evaluate_many`, batch by batch (everything submitted while the last batch ran)."""
        self._feeder().submit(candidate)

    def poll(self, timeout: float | None = None) -> list[tuple[Candidate, Measurement]]:
        """The results finished since the last call, waiting up to `timeout` seconds (None: as long as it takes) for
        at least one while anything is in flight; [] when nothing is. An error of the evaluation itself (a lost
        cluster, say) is raised here."""
        return self._feeder().poll(timeout)

    def in_flight(self) -> int:
        """Candidates submitted whose results `poll` has not handed back yet."""
        return self._feeder().in_flight() if getattr(self, "_batch_feeder", None) is not None else 0

    def cancel(self) -> list[Candidate]:
        """Stop evaluating what is in flight (the search stops): the candidates whose results will not come."""
        f = getattr(self, "_batch_feeder", None)
        return f.cancel() if f is not None else []

    def _evaluate_submitted(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        """`evaluate_many` for an evaluator with its own submit / poll: submit them all, hand each result on as it
        comes; interrupted (Ctrl-C, a lost lease), nothing of them keeps running."""
        todo = {c.hash: c for c in candidates}
        for c in todo.values():
            self.submit(c)
        left = set(todo)
        try:
            while left:
                for c, m in self.poll(None):
                    if c.hash in left:
                        left.discard(c.hash)
                        yield c, m
        finally:
            if left:
                self.cancel()

    def _feeder(self) -> "BatchFeeder":
        f = getattr(self, "_batch_feeder", None)
        if f is None:
            from evoengineer.evaluators.asynchronous import BatchFeeder

            f = self._batch_feeder = BatchFeeder(self)
        return f

    def build(self, candidate: Candidate) -> dict[str, Any] | None:
        """Prepare a candidate away from the measuring device (compile it into the build cache): its build summary
        (status, reason, metrics, build_s, cached), or None when this evaluator has nothing to prepare."""
        return None

    def utilization(self) -> tuple[float, int] | None:
        """(seconds the measuring devices were busy so far, number of devices), for the progress line's busy
        share; None when this evaluator does not say."""
        return None

    def build_stats(self) -> dict[str, float] | None:
        """Builds of this process: {"build_s": builder seconds of the candidates built (cache hits excluded),
        "builds": their number, "wait_s": seconds a batch had nothing built to measure}; None when this evaluator
        does not build or does not say."""
        return None

    def start_timeline(self) -> dict[str, float] | None:
        """Seconds from this evaluator's creation to each step of its start (binding built, first worker ready,
        first candidate measured, ...), for the final line; None when this evaluator does not say."""
        return None

    def utilization_by_device(self) -> dict[str, float] | None:
        """Seconds each measuring device (by name) was busy so far, where there are several; None when this
        evaluator does not say."""
        return None

    def sanitize(self, candidates: Sequence[Candidate]) -> dict[str, dict[str, Any]]:
        """Certify candidates that measured ok under a dynamic checker before they are published as elites: per hash
        {"status": "clean" | "failed" | "unknown", "reason", "tools", ...}. Empty when this evaluator has no checker
        (the elites are published uncertified)."""
        return {}

    def sanitizes_beside_retiming(self) -> bool:
        """Whether `sanitize` may run while `retime` does (on another device: the re-timing's device stays quiet).
        Default: no."""
        return False

    def retime(self, candidates: Sequence[Candidate], *, session: str,
               plan: dict[str, Any] | None = None) -> "Retiming | None":
        """Time finalists again, together (evaluators/retiming.py): rounds of interleaved timings on fresh inputs,
        as `plan` says (retiming.plan_retiming: rounds, calls per finalist, the baseline's calls and rounds, a
        budget in seconds). None when this evaluator cannot (the elites keep the ranking of their first timing)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """What this evaluator adds to the machine fingerprint (e.g. the GPU it measures on)."""
        return {}

    def close(self) -> None:
        """Release workers and devices (subclasses that override this call `_stop_feeder` if they use it)."""
        self._stop_feeder()

    def _stop_feeder(self) -> None:
        """End the default submit / poll's thread (what is in flight is dropped)."""
        f = getattr(self, "_batch_feeder", None)
        if f is not None:
            self._batch_feeder = None
            f.stop()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
