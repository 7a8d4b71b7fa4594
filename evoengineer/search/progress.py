"""Progress observer: a line per generation (and optionally per evaluation) on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from evoengineer.elite_json import ranked_metrics
from evoengineer.status import Status
from evoengineer.store import CandidateRecord


class ProgressPrinter:
    """Generation, evaluated/budget, valid, failures by status, best time, current elites."""

    def __init__(self, stream: TextIO | None = None, *, per_evaluation: bool = False):
        self.stream = stream or sys.stderr
        self.per_evaluation = per_evaluation
        self.t0 = time.monotonic()
        self.evaluations0: int | None = None  # stored before this process started (a resumed run's)

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, runner: Any) -> None:
        """The run starts (or resumes) now, with the evaluations already stored."""
        self.t0 = time.monotonic()
        self.evaluations0 = runner.evaluations

    def _throughput(self, runner: Any) -> str:
        """Candidates measured per minute by this process and the measuring devices' busy share (time spent on
        candidates / wall time x devices): shown for GPU spaces and Dask clusters."""
        busy = runner.evaluator.utilization()
        if busy is None or not (runner.space.target.gpu or runner.evaluator.kind == "dask"):
            return ""
        seconds, devices = busy
        wall = max(1e-9, time.monotonic() - self.t0)
        if self.evaluations0 is None:
            return ""
        rate = 60.0 * (runner.evaluations - self.evaluations0) / wall
        flight = runner.evaluator.in_flight()
        return (f" | {rate:.0f}/min | GPU busy {min(1.0, seconds / (wall * devices)):.0%} of {devices}"
                + (f" | {flight} in flight" if flight else ""))

    def _per_device(self, runner: Any) -> str:
        """At the end of a run on several measuring devices: each one's busy share (how evenly the work spread)."""
        per = runner.evaluator.utilization_by_device()
        if not per or len(per) < 2:
            return ""
        wall = max(1e-9, time.monotonic() - self.t0)
        return " | per GPU: " + ", ".join(f"{name} {min(1.0, s / wall):.0%}" for name, s in per.items())

    @staticmethod
    def _start(runner: Any) -> str:
        """At the end of a run: when each step of the evaluator's start was done (what the first measurement
        waited for)."""
        marks = runner.evaluator.start_timeline()
        if not marks:
            return ""
        return " | start: " + ", ".join(f"{what} {s:.1f} s" for what, s in marks.items())

    def _builds(self, runner: Any) -> str:
        """At the end of a run: builder seconds per candidate built and the share of the run the device waited on
        builds."""
        stats = runner.evaluator.build_stats()
        if not stats:
            return ""
        wall = max(1e-9, time.monotonic() - self.t0)
        per = f"{stats['build_s'] / stats['builds']:.2f} s/candidate" if stats["builds"] else "all cached"
        if not runner.space.target.builds_beside_measuring:  # built before measuring: nothing waits on builds
            return f" | builds {per}"
        return f" | builds {per} | GPU waited on builds {min(1.0, stats['wait_s'] / wall):.0%}"

    def on_evaluation(self, runner: Any, rec: CandidateRecord) -> None:
        if not self.per_evaluation:
            return
        t = rec.metrics.get("time_us")
        what = f"{t:.3f} us" if rec.status == Status.OK and t is not None else f"{rec.status}: {rec.reason[:100]}"
        self._print(f"  [{runner.evaluations}] {rec.hash[:12]} {what}")

    def on_generation(self, runner: Any, generation: int, stats: dict[str, Any]) -> None:
        counts = runner.status_counts()
        budget = runner.settings.budget
        failures = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "ok") or "none"
        elites = [runner.records[h] for h in runner.elite_hashes]
        ranked = {r.hash: ranked_metrics(r.metrics) for r in elites}  # by the timing that ranked them
        shown = {h: m.get("time_us", runner.records[h].time_us) for h, m in ranked.items()}
        best = min((r.time_us for r in runner.records.values()), default=float("inf"))
        if "stop" in stats and any("search_time_us" in m for m in ranked.values()):
            best = shown[elites[0].hash]  # a finished run's best is its rank 1
        head = "done" if "stop" in stats else f"gen {generation}"
        line = (f"{head:>8} | evaluated {runner.evaluations}/{budget if budget is not None else '-'} "
                f"| valid {counts.get('ok', 0)} | failures: {failures} "
                f"| best {best:.3f} us | {time.monotonic() - self.t0:.1f}s")
        line += self._throughput(runner)
        if "stop" in stats:
            line += self._per_device(runner)
            line += self._builds(runner)
            line += self._start(runner)
            fin = getattr(runner, "finish_s", None)
            if fin and sum(fin.values()) >= 0.05:
                budget = getattr(runner, "retime_budget_s", None)
                line += (f" | finishing: re-timing {fin['retime']:.1f} s"
                         + (f" (budget {budget:.1f} s)" if isinstance(budget, (int, float)) else "")
                         + f", sanitizer {fin['sanitizer']:.1f} s")
            line += f" | stopped: {stats['stop']}"
        self._print(line)
        if elites:
            self._print("         elites: " + "; ".join(f"{shown[r.hash]:.3f} us {r.hash[:8]}" for r in elites))
