"""Replay evaluator: measurements come from a recorded landscape CSV instead of a device."""

from __future__ import annotations

import csv
import heapq
import dataclasses
import hashlib
import math
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from evoengineer.candidate import Candidate
from evoengineer.errors import UserError
from evoengineer.compiler.build_queue import BuildQueue, QueuedBuilds
from evoengineer.evaluators.base import METRICS, OK, STATUSES, Evaluator, Measurement
from evoengineer.evaluators.pipeline import BuildAheadEvaluator, in_flight_width
from evoengineer.evaluators.retiming import Retiming, round_robin
from evoengineer.space.spec import SearchSpace, canonical_text

Key = tuple[str, ...]


class Landscape:
    """A landscape file: one row per configuration, one column per parameter, then status and time_us.

    Extra columns named like metrics (time_p90_us, baseline_us, ...) and `reason` are read too.
    """

    def __init__(self, path: str | Path, space: SearchSpace):
        self.path = Path(path)
        self.space = space
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise UserError(f"{self.path}: cannot read landscape: {exc.strerror or exc}") from None
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.rows: dict[Key, Measurement] = {}
        self._parse(raw.decode("utf-8-sig", errors="replace"))

    def _parse(self, text: str) -> None:
        reader = csv.reader(text.splitlines())
        header = next(reader, None)
        if not header:
            raise UserError(f"{self.path}: empty landscape file")
        header = [h.strip() for h in header]
        need = self.space.names + ["status", "time_us"]
        missing = [c for c in need if c not in header]
        if missing:
            raise UserError(f"{self.path}: landscape is missing column(s) {', '.join(missing)} "
                            f"for space {self.space.name!r}")
        col = {h: i for i, h in enumerate(header)}
        lookup = [{p.canonical(v): v for v in p.values} for p in self.space.parameters]
        metric_cols = [m for m in METRICS if m in col and m != "time_us"]
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(header):
                raise UserError(f"{self.path}:{lineno}: expected {len(header)} fields, got {len(row)}")
            cells = [row[col[n]].strip() for n in self.space.names]
            key = []
            for p, cell, table in zip(self.space.parameters, cells, lookup):
                text = {"True": "true", "False": "false"}.get(cell, cell)
                if text not in table:
                    try:  # 4.0 written for 4, and the like
                        num = float(text)
                        text = next((t for t, v in table.items()
                                     if isinstance(v, (int, float)) and not isinstance(v, bool) and v == num), text)
                    except ValueError:
                        pass
                key.append(text if text in table else None)
            if None in key:
                continue  # a configuration outside this space
            key_t = tuple(key)
            if key_t in self.rows:
                raise UserError(f"{self.path}:{lineno}: configuration {dict(zip(self.space.names, cells))} "
                                "appears twice")
            status = row[col["status"]].strip()
            if status not in STATUSES:
                raise UserError(f"{self.path}:{lineno}: unknown status {status!r} (known: {', '.join(STATUSES)})")
            metrics: dict[str, Any] = {}
            t = row[col["time_us"]].strip()
            if status == OK:
                try:
                    metrics["time_us"] = float(t)
                except ValueError:
                    raise UserError(f"{self.path}:{lineno}: status ok needs a number in time_us, got {t!r}") from None
                if not (math.isfinite(metrics["time_us"]) and metrics["time_us"] > 0):
                    raise UserError(f"{self.path}:{lineno}: time_us must be a positive finite number")
            for m in metric_cols:
                cell = row[col[m]].strip()
                if cell:
                    try:
                        metrics[m] = float(cell)
                    except ValueError:
                        raise UserError(f"{self.path}:{lineno}: column {m}: not a number: {cell!r}") from None
            if "baseline_us" in metrics and "time_us" in metrics and "speedup" not in metrics:
                metrics["speedup"] = metrics["baseline_us"] / metrics["time_us"]
            reason = row[col["reason"]].strip() if "reason" in col else ("" if status == OK else "recorded")
            self.rows[key_t] = Measurement(status, reason, metrics)

    def key(self, params: dict[str, Any]) -> Key:
        return tuple(canonical_text(params[n]) for n in self.space.names)

    def lookup(self, params: dict[str, Any]) -> Measurement:
        m = self.rows.get(self.key(params))
        if m is None:
            raise UserError(f"{self.path}: landscape has no row for configuration {params}")
        return Measurement(m.status, m.reason, dict(m.metrics))

    def check_covers(self) -> None:
        """Every valid configuration of the space must have a row; name the first that does not."""
        missing = []
        for g in self.space.valid_genomes():
            params = self.space.genome_to_params(g)
            if self.key(params) not in self.rows:
                missing.append(params)
        if missing:
            raise UserError(f"{self.path}: landscape has no row for configuration {missing[0]} "
                            f"({len(missing)} of {self.space.count_valid()} valid configurations missing)")


BUILD_FAILURES = ("compile_error", "gate_failed", "build_error", "link_error")


class BuildTimeModel:
    """How long a replayed candidate's build takes: `seconds` each, or the landscape's recorded `build_s` where it has
    one (`seconds` otherwise); `slots` builds at a time; every duration times `scale` (to replay fast)."""

    def __init__(self, slots: int, seconds: float, *, recorded: bool = False, scale: float = 1.0,
                 virtual: bool = False, measure_s: float = 0.0):
        """`virtual`: simulated time instead of timers (VirtualPipeline: instant, deterministic), each measurement
        taking `measure_s` of the device."""
        if slots < 1 or not (math.isfinite(seconds) and seconds >= 0) or not (math.isfinite(scale) and scale > 0) \
                or not (math.isfinite(measure_s) and measure_s >= 0):
            raise ValueError("BuildTimeModel: slots >= 1, seconds >= 0, measure_s >= 0 and scale > 0")
        self.slots, self.seconds, self.recorded, self.scale = slots, seconds, recorded, scale
        self.virtual, self.measure_s = virtual, measure_s

    def duration(self, recorded: Measurement) -> float:
        t = recorded.metrics.get("build_s") if self.recorded else None
        return (t if isinstance(t, float) and math.isfinite(t) and t >= 0 else self.seconds) * self.scale


class SimulatedBuilder(QueuedBuilds):
    """Builds of a replay under a build-time model: the real builder's queue (now before ahead, a fixed number of
    slots), a timer instead of a compiler; the landscape's build failures are the builds' verdicts."""

    def __init__(self, landscape: Landscape, model: BuildTimeModel):
        self.landscape, self.model = landscape, model
        self.queue = BuildQueue(model.slots, self._start, self._finish)
        self.started: list[str] = []  # hashes, in the order their builds started
        self.built: dict[str, Any] = {}  # the build cache: hash -> BuildResult

    def submit(self, candidate: Candidate, *, ahead: bool = False) -> Future:
        hit = self.built.get(candidate.hash)
        if hit is not None:
            done: Future = Future()
            done.set_result(dataclasses.replace(hit, build_s=0.0, cached=True))
            return done
        return self.queue.submit(candidate.hash, candidate, ahead=ahead)

    def _start(self, candidate: Candidate) -> Future:
        self.started.append(candidate.hash)
        done: Future = Future()
        t = threading.Timer(self.model.duration(self.landscape.lookup(candidate.params)), done.set_result, (None,))
        t.daemon = True
        t.start()
        return done

    def _finish(self, key: str, candidate: Candidate, f: Future) -> Any:
        from evoengineer.compiler.builder import BuildResult

        m = self.landscape.lookup(candidate.params)
        build_s = self.model.duration(m)
        if m.status in BUILD_FAILURES:
            result = BuildResult(status=m.status, reason=m.reason, build_s=build_s)
        else:
            result = BuildResult(status="ok", build_s=build_s)
        self.built[key] = result
        return result

    def close(self) -> None:
        self.queue.close()


class VirtualPipeline:
    """The build-and-measure pipeline in simulated time: builds on the model's slots (each starts once submitted and
    a slot is free), one device measuring whatever build finished first, `measure_s` each; a build failure needs no
    device. `poll` moves the clock to the next result. Instant and deterministic, so the order in which results
    arrive (and so what an asynchronous search proposes) depends only on the durations: replays of many seeds
    and strategies in seconds."""

    def __init__(self, landscape: Landscape, model: BuildTimeModel):
        self.landscape, self.model = landscape, model
        self.now = 0.0
        self.slot_free = [0.0] * model.slots
        self.device_free = 0.0
        self.busy_s = self.wait_s = 0.0
        self._built: list[tuple[float, int, Candidate]] = []  # (build done, submit order, candidate)
        self._seq = 0

    def submit(self, candidate: Candidate) -> None:
        i = min(range(len(self.slot_free)), key=lambda k: (self.slot_free[k], k))
        done = max(self.now, self.slot_free[i]) + self.model.duration(self.landscape.lookup(candidate.params))
        self.slot_free[i] = done
        heapq.heappush(self._built, (done, self._seq, candidate))
        self._seq += 1

    def poll(self) -> list[tuple[Candidate, Measurement]]:
        if not self._built:
            return []
        done, _, c = heapq.heappop(self._built)
        m = self.landscape.lookup(c.params)
        if m.status in BUILD_FAILURES:
            self.now = max(self.now, done)
            return [(c, m)]
        start = max(self.device_free, done)
        if self._built or done > self.device_free:
            self.wait_s += max(0.0, done - self.device_free)
        self.device_free = start + self.model.measure_s
        self.busy_s += self.model.measure_s
        self.now = max(self.now, self.device_free)
        return [(c, m)]

    def in_flight(self) -> int:
        return len(self._built)

    def cancel(self) -> list[Candidate]:
        gone = [c for _, _, c in self._built]
        self._built.clear()
        return gone


class ReplayEvaluator(BuildAheadEvaluator):
    """Answers each candidate from a landscape file: deterministic, instant, no device. With a build-time model
    (`builds`), candidates are built (simulated) and measured as the local evaluator does: the batch's builds at
    once, builds ahead behind them."""

    kind = "replay"

    def __init__(self, landscape: str | Path, space: SearchSpace, *, check: bool = True, delay_s: float = 0.0,
                 log_path: str | Path | None = None, builds: BuildTimeModel | None = None):
        self.landscape = Landscape(landscape, space)
        self.space = space
        self.delay_s = delay_s  # simulated measurement time, for demos and interruption tests
        self.log_path = Path(log_path) if log_path else None  # audit trail: one line per measurement asked for
        self.busy_s = 0.0  # simulated device time spent
        self.virtual = VirtualPipeline(self.landscape, builds) if builds is not None and builds.virtual else None
        self.builder = SimulatedBuilder(self.landscape, builds) if builds is not None and not builds.virtual else None
        self._init_pipeline()
        if check:
            self.landscape.check_covers()

    # without a build-time model: one candidate at a time, answered at once (Evaluator's defaults); in simulated
    # time: the VirtualPipeline; with timers: the build-and-measure pipeline
    def concurrency(self) -> int:
        if self.virtual is not None:  # as the pipeline settles once it has seen the times
            model = self.virtual.model
            return in_flight_width(model.slots, model.seconds * model.scale, model.measure_s)
        return super().concurrency() if self.builder is not None else 1

    def submit(self, candidate: Candidate) -> None:
        if self.virtual is not None:
            self.virtual.submit(candidate)
        elif self.builder is not None:
            super().submit(candidate)
        else:
            Evaluator.submit(self, candidate)

    def poll(self, timeout: float | None = None) -> list[tuple[Candidate, Measurement]]:
        if self.virtual is not None:
            out = self.virtual.poll()
            self.busy_s = self.virtual.busy_s
            for c, m in out:
                self._append_log(c, m)
            return out
        return super().poll(timeout) if self.builder is not None else Evaluator.poll(self, timeout)

    def in_flight(self) -> int:
        if self.virtual is not None:
            return self.virtual.in_flight()
        return super().in_flight() if self.builder is not None else Evaluator.in_flight(self)

    def cancel(self) -> list[Candidate]:
        if self.virtual is not None:
            return self.virtual.cancel()
        return super().cancel() if self.builder is not None else Evaluator.cancel(self)

    def evaluate_many(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        if self.builder is not None or self.virtual is not None:
            yield from super().evaluate_many(candidates)
        else:
            for c in candidates:
                yield c, self.evaluate(c)

    def evaluate(self, candidate: Candidate) -> Measurement:
        if self.builder is None and self.virtual is None:
            return self.measure(candidate, None)
        return next(iter(super().evaluate_many([candidate])))[1]

    def build_stats(self) -> dict[str, float] | None:
        if self.virtual is not None:
            return {"build_s": 0.0, "builds": 0, "wait_s": self.virtual.wait_s}
        return super().build_stats() if self.builder is not None else None

    def close(self) -> None:
        self._stop_feeder()
        if self.builder is not None:
            self.builder.close()

    def utilization(self) -> tuple[float, int]:
        return self.busy_s, 1

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "landscape": str(self.landscape.path), "landscape_sha256": self.landscape.sha256}

    def measure(self, candidate: Candidate, build: Any) -> Measurement:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
            self.busy_s += self.delay_s
        m = self.landscape.lookup(candidate.params)
        self._append_log(candidate, m)
        return m

    def _append_log(self, candidate: Candidate, m: Measurement) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(f"{candidate.hash} {m.status}\n")

    def retime(self, candidates: Sequence[Candidate], *, session: str,
               plan: dict[str, Any] | None = None) -> Retiming:
        """The recorded time again, once per round, in the order a real re-timing would run (round-robin): a
        landscape has one measurement per configuration, so re-timing confirms it and never reorders (a plan's
        calls and budget do not apply: nothing is timed)."""
        from evoengineer.settings import evaluation_settings

        rounds = int(evaluation_settings(self.space)["retime_rounds"])
        samples: dict[str, list[list[float]]] = {}
        dropped: dict[str, tuple[str, str]] = {}
        for c in candidates:
            m = self.landscape.lookup(c.params)
            if m.ok:
                samples[c.hash] = [[m.time_us] for _ in range(rounds)]
            else:
                dropped[c.hash] = (m.status, m.reason)
        order = [h for turn in round_robin(list(samples), rounds) for h in turn]
        return Retiming(samples=samples, dropped=dropped, order=order,
                        notes={"rounds": rounds, "repeats": 1, "replay": "the landscape's recorded time"})


EXPORT_METRICS = ("time_p90_us", "time_p99_us", "baseline_us", "speedup", "max_abs_err", "max_rel_err",
                  "registers", "smem_bytes", "spill_bytes", "stack_bytes", "build_s")


def write_landscape(space: SearchSpace, records: list[Any], path: str | Path) -> int:
    """Write evaluated candidates (CandidateRecords of `space`) as a landscape CSV the replay evaluator reads.
    Returns the number of rows. Written to a temp file and renamed, so a failure leaves no half file."""
    from evoengineer.fileio import atomic_open

    with atomic_open(path, newline="") as f:
        w = csv.writer(f)
        w.writerow([*space.names, "status", "time_us", *EXPORT_METRICS, "reason"])
        for r in records:
            m = r.metrics
            cells = [canonical_text(r.params[n]) for n in space.names]
            t = m.get("time_us") if r.status == OK else None
            extra = ["" if m.get(k) is None else m.get(k) for k in EXPORT_METRICS]
            w.writerow([*cells, r.status, "" if t is None else t, *extra, " ".join(r.reason.split())[:300]])
    return len(records)
