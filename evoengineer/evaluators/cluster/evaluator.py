"""The search side: `ClusterEvaluator`, candidates as Dask tasks (module doc of evoengineer.evaluators.cluster)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from evoengineer.candidate import Candidate
from evoengineer.errors import UserError
from evoengineer.evaluators.base import Evaluator, Measurement
from evoengineer.evaluators.cluster.config import (
    ALLOWED_FAILURES,
    BUILD,
    CLOSE_TIMEOUT_S,
    GPU,
    WAIT_FOR_WORKERS_S,
    ClusterError,
    ClusterLost,
    TLSFiles,
    _one_line,
    check_address,
    configure_dask,
    quiet_dask_logs,
)
from evoengineer.evaluators.cluster.hosts import _end_processes, _start_local_cluster, host_layout, visible_gpus
from evoengineer.evaluators.cluster.tasks import (
    _allowed_failures_setter,
    build_task,
    fingerprint_task,
    measure_task,
    prepare_task,
    retime_task,
    sanitize_task,
)
from evoengineer.space.spec import SearchSpace


# ---- the search side --------------------------------------------------------------------------------------------
class ClusterEvaluator(Evaluator):
    """Candidates as Dask tasks on GPU workers (and build tasks on build workers); see the module doc."""

    kind = "dask"

    def __init__(self, space: SearchSpace, inner: dict[str, Any], *, address: str = "local",
                 workers: int | None = None, build_jobs: int | None = None, tls: TLSFiles | None = None,
                 extras: dict[str, Any] | None = None, factory: Callable[..., Evaluator] | None = None,
                 builds: bool | None = None):
        """`inner`: the description (`describe()`) of the evaluator the workers use. `extras`: settings of this
        session only (replay delay and log, a local cluster's build cache). `workers` (local cluster): GPU workers to
        start; without a device (replays, CPU spaces) that many simulated ones. `factory`: makes the workers'
        evaluator instead of `make_worker_evaluator` (tests). `builds`: submit build tasks (default: for `local`)."""
        check_address(address, tls)
        from distributed import Client

        quiet_dask_logs()
        configure_dask()
        self.space, self.inner, self.address, self.tls = space, dict(inner), address, tls
        self.builds = inner.get("kind") == "local" if builds is None else builds
        # CPU kernels are timed on the cores the compilers use: no builds beside measurements (as LocalEvaluator)
        self.overlap = space.target.builds_beside_measuring
        self._cluster = None
        self._t_created = time.monotonic()
        self._start_marks: dict[str, float] = {}  # start_timeline()
        self._prepared: list[Any] | None = None  # start(): the workers' prepare tasks
        self._init_flight()
        extras = dict(extras or {})
        if address == "local":
            real = self.builds and space.target.gpu
            if real and workers and workers > len(visible_gpus()):
                raise UserError(f"--cluster-workers {workers}: this host shows {len(visible_gpus())} GPU(s)")
            layout = host_layout(gpus=visible_gpus()[:workers] if real and workers else None,
                                 simulate=None if real else (workers or max(1, len(visible_gpus()))),
                                 build_jobs=build_jobs, builds=self.builds, cache_dir=extras.get("cache_dir"))
            try:
                self._cluster = _start_local_cluster(layout)
                self.client = Client(self._cluster)
            except Exception as exc:
                if self._cluster is not None:
                    self._cluster.close()
                raise UserError(f"--cluster local: the cluster did not start ({type(exc).__name__}: "
                                f"{_one_line(exc)})") from None
        else:
            extras.pop("cache_dir", None)  # another host's workers use their own build cache
            try:
                self.client = Client(address, security=tls.security() if tls else None, timeout=30)
            except Exception as exc:  # OSError, TimeoutError, a TLS handshake refused, ...
                raise UserError(f"--cluster {address}: cannot reach the scheduler ({_one_line(exc)})") from None
            try:
                self.client.run_on_scheduler(_allowed_failures_setter(), ALLOWED_FAILURES)
            except Exception as exc:
                self.client.close()
                raise UserError(f"--cluster {address}: the scheduler refused a setting (allowed-failures = "
                                f"{ALLOWED_FAILURES}): {type(exc).__name__}: {_one_line(exc)}") from None
        self.spec = {"space_text": space.text, "space_path": str(space.path) if space.path else None,
                     "inner": self.inner, "extras": extras, "factory": factory}
        self.spec["key"] = hashlib.sha256(json.dumps({k: v for k, v in self.spec.items() if k != "factory"},
                                                     sort_keys=True, default=str).encode()
                                          + repr(factory).encode()).hexdigest()[:20]
        self.slots = self._wait_for_gpu_workers()
        self._mark("GPU workers up")
        self._slots_stale, self._slots_at = False, time.monotonic()
        self.client.subscribe_topic("all", self._on_event)  # workers joining and leaving
        self.build_slots = self._build_slots()
        if self.builds and not self.build_slots:
            self.builds = False  # no build worker: each GPU worker compiles what it measures
        self.busy_s = 0.0  # time the GPU workers spent on this search's candidates
        self.busy_by_worker: dict[str, float] = {}  # the same, per GPU worker (by worker name)

    # ---- cluster state ------------------------------------------------------------------------------------------
    def _workers(self) -> dict[str, Any]:
        try:
            return dict(self.client.scheduler_info(n_workers=-1)["workers"])
        except (OSError, TimeoutError) as exc:
            raise ClusterLost(f"lost the Dask scheduler at {self.where} ({_one_line(exc)})") from None

    @property
    def where(self) -> str:
        return "the local cluster" if self.address == "local" else self.address

    def gpu_workers(self) -> int:
        return self._counts()[0]

    def _build_slots(self) -> int:
        return self._counts()[1]

    def _counts(self) -> tuple[int, int]:
        """(GPU workers, build slots) of the cluster now: one question to the scheduler."""
        res = [w.get("resources", {}) for w in self._workers().values()]
        return sum(1 for r in res if r.get(GPU)), int(sum(r.get(BUILD, 0) for r in res))

    def _wait_for_gpu_workers(self) -> int:
        deadline = time.monotonic() + WAIT_FOR_WORKERS_S
        while True:
            n = self.gpu_workers()
            if n or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not n:
            self.close()
            raise ClusterError(f"--cluster {self.address}: no worker with resource {GPU} joined within "
                               f"{WAIT_FOR_WORKERS_S:g} s (start them with: python -m evoengineer worker "
                               f"--scheduler {self.address})")
        return n

    # ---- the evaluator interface --------------------------------------------------------------------------------
    def start(self) -> None:
        """Each worker of the cluster now makes this run's evaluator and starts its slow parts (`prepare_task`), so
        a GPU worker is ready when the first build is. Fire and forget: a worker that leaves meanwhile drops it."""
        if self._prepared is not None:
            return
        self._prepared = []
        try:
            workers = self._workers()
        except ClusterLost:
            return
        for address, info in workers.items():
            res = info.get("resources", {})
            if res.get(GPU):
                role, resources = "measure", {GPU: 1}
            elif self.builds and res.get(BUILD):
                role, resources = "build", {BUILD: 1}
            else:
                continue
            try:
                self._prepared.append(self.client.submit(prepare_task, self.spec, role, workers=[address],
                                                         allow_other_workers=False, resources=resources,
                                                         pure=False))
            except Exception:  # a lost scheduler: the first submit says so
                return

    def describe(self) -> dict[str, Any]:
        # no worker count: the results do not depend on it (elite.json is the same for 1 or 8 workers)
        return {"kind": self.kind, "cluster": self.address, "inner": self.inner}

    def fingerprint(self) -> dict[str, Any]:
        """The inner evaluator's fingerprint as a worker reports it (a build worker's toolchain, say)."""
        role, resources = ("build", {BUILD: 1}) if self.builds else ("measure", {GPU: 1})
        fut = self.client.submit(fingerprint_task, self.spec, role, resources=resources, pure=False)
        return self._result(fut)

    def utilization(self) -> tuple[float, int]:
        return self.busy_s, max(1, self.slots)

    def utilization_by_device(self) -> dict[str, float]:
        return dict(sorted(self.busy_by_worker.items()))

    def retime(self, candidates: Sequence[Candidate], *, session: str, plan: dict[str, Any] | None = None) -> Any:
        """The finalists re-timed together on one GPU worker (one task: every round on the same device)."""
        from distributed.scheduler import KilledWorker

        from evoengineer.evaluators.retiming import Retiming

        fut = self.client.submit(retime_task, self.spec, list(candidates), session, plan, resources={GPU: 1},
                                 pure=False)
        try:
            return self._result(fut)
        except KilledWorker as exc:
            return Retiming(samples={}, notes={"failed": f"runtime_error: {ALLOWED_FAILURES + 1} cluster workers "
                                                         f"died re-timing the finalists (last {_worker_of(exc)})"})

    def sanitizes_beside_retiming(self) -> bool:
        # the re-timing holds one GPU worker (GPU resource 1), the sanitizer takes another
        try:
            return self.gpu_workers() >= 2
        except ClusterLost:
            return False

    def sanitize(self, candidates: Sequence[Candidate]) -> dict[str, dict[str, Any]]:
        """The elites certified on a GPU worker (its host's compute-sanitizer, its build cache)."""
        from distributed.scheduler import KilledWorker

        if not candidates:
            return {}
        fut = self.client.submit(sanitize_task, self.spec, list(candidates), resources={GPU: 1}, pure=False)
        try:
            return self._result(fut)
        except KilledWorker as exc:
            why = f"{ALLOWED_FAILURES + 1} cluster workers died certifying the elites (last {_worker_of(exc)})"
            return {c.hash: {"status": "unknown", "reason": why} for c in candidates}

    # ---- asynchronous evaluation ---------------------------------------------------------------------------------
    def _init_flight(self) -> None:
        from evoengineer.evaluators.asynchronous import Results

        self.results = Results()
        self._lock = threading.RLock()
        self._builds: dict[Any, Candidate] = {}  # build task -> candidate
        self._measures: dict[Any, Candidate] = {}  # measuring task -> candidate
        self._ready: deque[tuple[Candidate, dict[str, Any] | None]] = deque()  # built, waiting for a GPU worker
        self._unbuilt: deque[Candidate] = deque()  # CPU spaces: builds waiting for the measurements to end
        self._ac: Any = None
        self._wake = threading.Event()
        self._reactor: threading.Thread | None = None
        self._closed = False

    def concurrency(self) -> int:
        """Two candidates per GPU worker (one measuring, one built and waiting) and a build for every build slot."""
        self._refresh_slots()
        return 2 * max(1, self.slots) + (self.build_slots if self.builds else 0)

    def submit(self, candidate: Candidate) -> None:
        from distributed import as_completed

        self.results.add(candidate)
        with self._lock:
            if self._ac is None:
                self._ac = as_completed()
            if not self.builds:
                self._ready.append((candidate, None))
            elif self.overlap or not (self._measures or self._ready):
                self._start_build(candidate)
            else:
                self._unbuilt.append(candidate)  # CPU: built once the measurements running now are done
            self._fill()
        if self._reactor is None:
            self._reactor = threading.Thread(target=self._react_loop, name="evo-cluster", daemon=True)
            self._reactor.start()
        self._wake.set()

    def poll(self, timeout: float | None = None) -> list[tuple[Candidate, Measurement]]:
        return self.results.poll(timeout)

    def in_flight(self) -> int:
        return self.results.in_flight()

    def cancel(self) -> list[Candidate]:
        with self._lock:
            futures = [*self._builds, *self._measures]
            self._builds.clear()
            self._measures.clear()
            self._ready.clear()
            self._unbuilt.clear()
        if futures:
            try:
                self.client.cancel(futures)
            except Exception:  # a lost scheduler: nothing runs for us any more
                pass
        return self.results.drop()

    def evaluate(self, candidate: Candidate) -> Measurement:
        return next(iter(self.evaluate_many([candidate])))[1]

    def evaluate_many(self, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, Measurement]]:
        return self._evaluate_submitted(candidates)

    def _start_build(self, c: Candidate) -> None:
        f = self.client.submit(build_task, self.spec, c, resources={BUILD: 1}, pure=False)
        self._builds[f] = c
        self._ac.add(f)

    def _fill(self) -> None:
        """Measuring tasks for built candidates while GPU workers are free (CPU spaces: once no build runs), and the
        builds held back for the measurements once none runs."""
        if self._ready and (self.overlap or not self._builds):
            self._refresh_slots()
            while self._ready and len(self._measures) < max(1, self.slots):
                c, b = self._ready.popleft()
                f = self.client.submit(measure_task, self.spec, c, b, resources={GPU: 1}, pure=False)
                self._measures[f] = c
                self._ac.add(f)
        if self._unbuilt and not self._measures and not self._ready:
            while self._unbuilt:
                self._start_build(self._unbuilt.popleft())

    def _react_loop(self) -> None:
        """The search process's thread for finished tasks: a build done makes its candidate ready (or a failed
        result), a measurement done is fetched and handed on; after each burst the next tasks start."""
        while not self._closed:
            ac = self._ac
            if ac is None or ac.is_empty():
                self._wake.wait(0.2)
                self._wake.clear()
                continue
            try:
                for done in ac.batches():
                    self._react(done)
                    if self._closed:
                        return
            except BaseException as exc:  # noqa: BLE001 - a lost cluster: the search's thread raises it
                if not self._closed:
                    self.results.fail(exc)
                return

    def _react(self, done: list[Any]) -> None:
        failed: list[tuple[Candidate, Measurement]] = []
        finished: list[tuple[Any, Candidate]] = []
        with self._lock:
            for fut in done:
                if fut in self._builds:
                    c = self._builds.pop(fut)
                    b = self._build_result(fut)
                    if b is not None and b["status"] != "ok":
                        failed.append((c, Measurement(b["status"], b["reason"], {
                            **b.get("metrics", {}), "build_s": b.get("build_s", 0.0),
                            "build_cached": b.get("cached", False)})))
                    else:
                        self._mark("first built")
                        self._ready.append((c, b))
                elif fut in self._measures:
                    self._mark("first measured")
                    finished.append((fut, self._measures.pop(fut)))
                # else: a task of a cancelled candidate
            self._fill()  # the next candidates start before these results are fetched and handed on
        for c, m in failed:
            self.results.put(c, m)
        for (_, c), m in zip(finished, self._measure_results([f for f, _ in finished])):
            self.results.put(c, m)

    def _mark(self, what: str) -> None:
        self._start_marks.setdefault(what, round(time.monotonic() - self._t_created, 2))

    def start_timeline(self) -> dict[str, float]:
        """Seconds from this evaluator's creation to: the cluster connected, the first candidate built, the first
        measured (a worker's own start is inside the last)."""
        return dict(sorted(self._start_marks.items(), key=lambda kv: kv[1]))

    def _on_event(self, event: Any) -> None:
        """Scheduler events (client's loop thread): a worker came or went, count the GPU workers again."""
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(msg, dict) and msg.get("action") in ("add-worker", "remove-worker"):
            self._slots_stale = True

    def _refresh_slots(self) -> None:
        """The live GPU workers and build slots, asked of the scheduler when a worker came or went (and every few
        seconds anyway)."""
        now = time.monotonic()
        if self._slots_stale or now - self._slots_at > 5.0:
            self._slots_stale = False  # first: an event during the question marks it stale again
            self.slots, self.build_slots = self._counts()  # the scheduler asked at most every few seconds
            self._slots_at = now

    def _result(self, fut: Any) -> Any:
        """A finished task's value; ClusterLost when the scheduler is gone, KilledWorker for a poison pill,
        ClusterError (one line) for anything else a worker raised."""
        from distributed.client import FutureCancelledError

        try:
            return fut.result()
        except FutureCancelledError:
            raise ClusterLost(f"lost the Dask scheduler at {self.where}") from None
        except (OSError, TimeoutError) as exc:  # CommClosedError is an OSError
            raise ClusterLost(f"lost the Dask scheduler at {self.where} ({_one_line(exc)})") from None
        except (UserError, ClusterLost):
            raise
        except Exception as exc:
            from distributed.scheduler import KilledWorker

            if isinstance(exc, KilledWorker):
                raise
            raise ClusterError(f"--cluster {self.address}: a worker failed: {type(exc).__name__}: "
                               f"{_one_line(exc)}") from None

    def _build_result(self, fut: Any) -> dict[str, Any] | None:
        from distributed.scheduler import KilledWorker

        try:
            return self._result(fut)
        except KilledWorker as exc:
            return {"status": "build_error", "reason": f"its build killed {ALLOWED_FAILURES + 1} cluster workers "
                                                      f"(last {_worker_of(exc)})", "metrics": {}}

    def _measure_results(self, futures: list[Any]) -> list[Measurement]:
        """The measurements of finished measuring tasks, fetched together (one round trip)."""
        from distributed.scheduler import KilledWorker

        ok = [f for f in futures if f.status == "finished"]
        values: dict[Any, Any] = {}
        if ok:
            try:
                values = dict(zip(ok, self.client.gather(ok)))
            except Exception:  # one of them went missing meanwhile: ask one by one, which says why
                values = {}
        out = []
        for f in futures:
            try:
                r = values[f] if f in values else self._result(f)
            except KilledWorker as exc:
                out.append(Measurement("runtime_error", f"poison pill: {ALLOWED_FAILURES + 1} cluster workers died "
                                                        f"while measuring it (last {_worker_of(exc)})"))
                continue
            busy = float(r.get("busy_s", 0.0))
            self.busy_s += busy
            name = str(r.get("worker_name") or r.get("worker") or "?")
            self.busy_by_worker[name] = self.busy_by_worker.get(name, 0.0) + busy
            out.append(Measurement(r["status"], r["reason"], r["metrics"]))
        return out

    def close(self) -> None:
        self._closed = True
        self.cancel()
        if self._prepared:
            try:
                self.client.cancel(self._prepared)
            except Exception:
                pass
        self._wake.set()
        # a local cluster's worker processes and all they started (builders, measuring workers, compilers) end
        # with the search: whatever its close leaves running is killed (it would hold the exit: Dask's own
        # at-exit close waits for it without a limit)
        workers = self._local_worker_pids() if self._cluster is not None else []
        try:
            self.client.close(timeout=10)
        except Exception:  # a lost scheduler: nothing left to close
            pass
        if self._cluster is not None:
            t0 = time.monotonic()
            try:
                self._cluster.close(timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:
                print(f"warning: the local cluster did not close within {time.monotonic() - t0:.0f} s "
                      f"({type(exc).__name__}): its processes are killed", file=sys.stderr)
            self._cluster = None
            _end_processes(workers, grace_s=5.0)

    def _local_worker_pids(self) -> list[int]:
        try:
            return [int(p) for p in self.client.run(os.getpid).values()]
        except Exception:  # a worker gone already: its process is gone too
            return []


def _worker_of(exc: Any) -> str:
    w = getattr(exc, "last_worker", None)
    return str(getattr(w, "address", None) or getattr(w, "name", None) or w or "?")
