"""What runs on the workers: the evaluator each worker process keeps per run, and the tasks the search submits."""

from __future__ import annotations

import atexit
import hashlib
import json
import multiprocessing.util
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from evoengineer.candidate import Candidate
from evoengineer.evaluators.base import Evaluator
from evoengineer.evaluators.cluster.config import ClusterError, _one_line
from evoengineer.space.spec import SearchSpace

# ---- what runs on the workers -----------------------------------------------------------------------------------
_EVALUATORS: "OrderedDict[str, Evaluator]" = OrderedDict()
_EVALUATORS_LOCK = threading.Lock()
_KEEP_EVALUATORS = 2  # a worker serving searches one after another keeps the newest two


def make_worker_evaluator(space: SearchSpace, inner: dict[str, Any], extras: dict[str, Any], *,
                          build_jobs: int) -> Evaluator:
    """The evaluator a worker measures (or builds) with: the one the search would use on one machine."""
    kind = inner.get("kind")
    if kind == "replay":
        from evoengineer.evaluators.replay import ReplayEvaluator

        ev = ReplayEvaluator(inner["landscape"], space, check=False, delay_s=float(extras.get("delay_s", 0.0)),
                             log_path=extras.get("log_path"))
        if ev.landscape.sha256 != inner.get("landscape_sha256"):
            raise ClusterError(f"{inner['landscape']}: the landscape on this worker differs from the search's")
        return ev
    if kind == "local":
        from evoengineer.evaluators.local import LocalEvaluator

        return LocalEvaluator(space, seed=int(inner.get("seed", 0)), build_jobs=build_jobs,
                              cache_dir=extras.get("cache_dir"))
    raise ClusterError(f"evaluator {kind!r} cannot run on a cluster worker")


def _close_worker_evaluators() -> None:
    """At the worker process's exit: measuring subprocesses and builder pools go with it."""
    with _EVALUATORS_LOCK:
        while _EVALUATORS:
            _, ev = _EVALUATORS.popitem()
            try:
                ev.close()
            except Exception:
                pass


def _worker_evaluator(spec: dict[str, Any], role: str) -> Evaluator:
    """This worker process's evaluator for the run `spec` describes (made once, kept for the next tasks)."""
    from distributed import get_worker

    key = f"{spec['key']}/{role}"
    with _EVALUATORS_LOCK:  # a build worker runs several tasks at once
        ev = _EVALUATORS.get(key)
        if ev is not None:
            _EVALUATORS.move_to_end(key)
            return ev
        space = SearchSpace.from_text(spec["space_text"], spec["space_path"])
        jobs = get_worker().state.nthreads if role == "build" else 1
        factory: Callable[..., Evaluator] = spec.get("factory") or make_worker_evaluator
        ev = factory(space, spec["inner"], spec["extras"], build_jobs=jobs)
        if not _EVALUATORS:
            # a Nanny's worker process ends through multiprocessing (its finalizers run, atexit's do not)
            multiprocessing.util.Finalize(None, _close_worker_evaluators, exitpriority=10)
            atexit.register(_close_worker_evaluators)
        _EVALUATORS[key] = ev
        while len(_EVALUATORS) > _KEEP_EVALUATORS:
            _, old = _EVALUATORS.popitem(last=False)
            old.close()
        return ev


def prepare_task(spec: dict[str, Any], role: str) -> str:
    """Task on each worker at the run's start: make this run's evaluator and start what takes long beside the first
    builds (a GPU worker: its measuring process, the family binding and the baselines; a build worker: its compiler
    pool and the binding). Without it a GPU worker began all that at its first candidate, after that candidate's
    build (on 2 x H200 the first measurement came 19 s after the first build). "" or why it failed (the candidates'
    own tasks meet that failure again and report it)."""
    try:
        ev = _worker_evaluator(spec, role)
        if role == "measure":
            ev.start()
        else:
            ev.start_builds()
        return ""
    except Exception as exc:  # noqa: BLE001 - the first measurement reports it, with its candidate
        return f"{type(exc).__name__}: {_one_line(exc)}"


def build_task(spec: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """Task on a build worker: compile into this host's build cache; the build summary (or None: nothing to do)."""
    ev = _worker_evaluator(spec, "build")
    out = ev.build(candidate)
    if out is not None:
        out["toolchain"] = _toolchain_key(ev)
    return out  # type: ignore[return-value]


def measure_task(spec: dict[str, Any], candidate: Candidate, build: dict[str, Any] | None) -> dict[str, Any]:
    """Task on a GPU worker: measure one candidate (its build comes from this host's cache, or is made here)."""
    from distributed import get_worker

    t0 = time.perf_counter()
    ev = _worker_evaluator(spec, "measure")
    m = ev.evaluate(candidate)
    metrics = dict(m.metrics)
    if build is not None and metrics.get("build_cached") and build.get("toolchain") == _toolchain_key(ev):
        # the compile happened in the build task: report its cost, not the cache hit's
        metrics["build_s"], metrics["build_cached"] = build["build_s"], build["cached"]
    worker = get_worker()
    return {"status": m.status, "reason": m.reason, "metrics": metrics, "busy_s": time.perf_counter() - t0,
            "worker": worker.address, "worker_name": str(worker.name)}


def retime_task(spec: dict[str, Any], candidates: list[Candidate], session: str,
                plan: dict[str, Any] | None = None) -> Any:
    """Task on a GPU worker: the finalists timed again together, round-robin, on this one device."""
    return _worker_evaluator(spec, "measure").retime(candidates, session=session, plan=plan)


def sanitize_task(spec: dict[str, Any], candidates: list[Candidate]) -> dict[str, dict[str, Any]]:
    """Task on a GPU worker: the elites under the dynamic checker (compute-sanitizer) of this host."""
    return _worker_evaluator(spec, "measure").sanitize(candidates)


def fingerprint_task(spec: dict[str, Any], role: str) -> dict[str, Any]:
    return _worker_evaluator(spec, role).fingerprint()


def _toolchain_key(ev: Evaluator) -> str:
    return hashlib.sha256(json.dumps(ev.fingerprint(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _allowed_failures_setter() -> Callable[..., int]:
    """A function for Client.run_on_scheduler setting the scheduler's allowed failures (a task may be running on
    at most that many workers that die; then KilledWorker). A closure, so it travels by value."""

    def set_allowed_failures(n: int, dask_scheduler: Any = None) -> int:
        dask_scheduler.allowed_failures = n
        return n

    return set_allowed_failures
