"""Evaluation on a Dask distributed cluster: every GPU of this host (`--cluster local`) or the workers of an existing
scheduler (`--cluster tcp://127.0.0.1:PORT`, `--cluster tls://HOST:PORT`).

Layout. A *GPU worker* is a Dask worker (under a Nanny) with one thread and the resource ``GPU=1``, pinned to one
device with CUDA_VISIBLE_DEVICES; it measures one candidate at a time through the evaluator the search would use on
one machine (local: the persistent, replaceable measuring subprocess, so a hang is `timeout`, a crash
`runtime_error`, and the Dask worker lives on; replay: the landscape). A *build worker* has one thread per build slot
and the resource ``BUILD=<slots>``; each candidate's compile is a task asking ``BUILD=1`` that fills the build cache
of its host. The measuring task then finds the build in the cache; on a host whose cache or toolchain differs
(another host) the cache key (toolchain fingerprint included) misses and it is built there, so a module is only ever
measured on a host whose toolchain built it.

Flow. The search process stays the only writer of the store. Asynchronously (`submit` / `poll`): a candidate's build
task is submitted the moment the search proposes it, its measuring task as soon as it is built and a GPU worker is
free (never more measuring tasks in flight than GPU workers alive, so a worker holds no queued candidate that its
death would wrongly implicate), and each result is handed on the moment it arrives; a thread of the search process
reacts to the finished tasks (``as_completed``). CPU spaces take turns: no build runs beside a measurement. A Dask
worker killed mid-candidate has its task re-run elsewhere by the scheduler; a candidate whose task was running on
two workers that died is a poison pill (the scheduler's ``allowed-failures`` = 1, set on an external scheduler too)
and is recorded as `runtime_error`. A lost scheduler raises ClusterLost: the driver stops the run, resumable.

Security. A Dask scheduler runs whatever code a connected client or worker sends. The local cluster listens on
127.0.0.1 only; any other address must be reached over TLS (certificates: README, "Scaling out"): a plain-TCP
address off this host is refused before anything connects.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import ipaddress
import json
import logging
import multiprocessing.util
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import urlparse

from evoengineer.candidate import Candidate
from evoengineer.compiler.toolchain import usable_cpus
from evoengineer.errors import UserError
from evoengineer.evaluators.base import Evaluator, Measurement
from evoengineer.space.spec import SearchSpace

GPU, BUILD = "GPU", "BUILD"
#: a task may be running on one worker that dies; on the second it is a poison pill (Dask's KilledWorker)
ALLOWED_FAILURES = 1
#: Dask settings for the processes we start: workers run builder process pools, so they must not be daemonic; no
#: statistical profiler or GIL sampling in the workers (threads waking every few ms: CPU taken from the builds and
#: noise beside CPU timings, for profiles of tasks that only wait on a subprocess)
#: Dask settings of every process of ours that starts workers or a scheduler. Dask's nannies set OMP_NUM_THREADS,
#: MKL_NUM_THREADS and OPENBLAS_NUM_THREADS to 1 in their workers by default: the measuring processes would inherit
#: them, CPU kernels would be timed on one thread and every CPU step of measuring a GPU candidate (inputs,
#: references, checks) would run single-threaded (measured: a cached cpu_msda candidate 1.9 s on a cluster worker
#: against 1.0 s in the local evaluator). Workers keep the environment they were started with.
DASK_CONFIG = {"distributed.worker.daemon": False, "distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
               "distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.gil.enabled": False,
               # None unsets a variable of Dask's defaults (merged into this when distributed is imported)
               "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None,
                                                       "OPENBLAS_NUM_THREADS": None}}
#: how long a new search waits for the first GPU worker of an external scheduler
#: seconds a local cluster has to close before its processes are killed
CLOSE_TIMEOUT_S = 30
WAIT_FOR_WORKERS_S = float(os.environ.get("EVOENGINEER_CLUSTER_WAIT_S", "60"))


class ClusterLost(Exception):
    """The Dask scheduler went away mid-search. What was measured is stored; the run can be resumed."""


class ClusterError(UserError):
    """The cluster cannot do this run (no GPU worker, a worker that cannot set up the evaluator, ...)."""


# ---- addresses and TLS ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TLSFiles:
    """CA certificate, this side's certificate and key (PEM files), for Dask's Security on tls:// addresses."""

    ca_file: str
    cert: str
    key: str

    @classmethod
    def from_options(cls, ca_file: str | None, cert: str | None, key: str | None) -> "TLSFiles | None":
        given = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
        if not any(given.values()):
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise UserError(f"TLS needs all of --tls-ca-file, --tls-cert and --tls-key (missing {', '.join(missing)})")
        paths = {}
        for k, v in given.items():
            p = Path(str(v)).expanduser().resolve()
            try:
                with open(p, "rb"):
                    pass
            except OSError as exc:
                raise UserError(f"{k} {v}: cannot read: {exc.strerror or exc}") from None
            paths[k] = str(p)
        return cls(paths["--tls-ca-file"], paths["--tls-cert"], paths["--tls-key"])

    def to_dict(self) -> dict[str, str]:
        return {"ca_file": self.ca_file, "cert": self.cert, "key": self.key}

    def security(self) -> Any:
        from distributed.security import Security

        return Security(tls_ca_file=self.ca_file, tls_client_cert=self.cert, tls_client_key=self.key,
                        tls_scheduler_cert=self.cert, tls_scheduler_key=self.key, tls_worker_cert=self.cert,
                        tls_worker_key=self.key, require_encryption=True)


@dataclass(frozen=True)
class ClusterOptions:
    """Where a search's evaluations run: `address` ('local' or a scheduler), a local cluster's GPU workers and
    build slots, TLS files. Stored with the run (config["cluster"]) so `resume` finds the cluster again."""

    address: str
    workers: int | None = None
    build_jobs: int | None = None
    tls: TLSFiles | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "workers": self.workers, "build_jobs": self.build_jobs,
                "tls": self.tls.to_dict() if self.tls else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterOptions":
        tls = d.get("tls")
        return cls(address=d["address"], workers=d.get("workers"), build_jobs=d.get("build_jobs"),
                   tls=TLSFiles.from_options(tls["ca_file"], tls["cert"], tls["key"]) if tls else None)


def is_loopback(host: str) -> bool:
    """True when `host` is this machine only (127.0.0.0/8, ::1, or a name resolving to nothing else)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_address(address: str, tls: TLSFiles | None, *, option: str = "--cluster") -> None:
    """Refuse, before anything connects, an address that would hand our code to another host in clear."""
    if address == "local":
        if tls is not None:
            raise UserError(f"{option} local listens on 127.0.0.1 only: the --tls-* options are for a tls:// "
                            "scheduler")
        return
    url = urlparse(address)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme not in ("tcp", "tls") or not url.hostname or not port:
        raise UserError(f"{option} {address!r}: expected 'local', tcp://127.0.0.1:PORT or tls://HOST:PORT")
    if url.scheme == "tls":
        if tls is None:
            raise UserError(f"{option} {address}: tls:// needs --tls-ca-file, --tls-cert and --tls-key "
                            "(README: Scaling out)")
        return
    if tls is not None:
        raise UserError(f"{option} {address}: TLS files given for a plain tcp:// address; use tls://{url.netloc}")
    if not is_loopback(url.hostname):
        raise UserError(f"{option} {address}: refused: a Dask scheduler runs whatever code its clients send, so one "
                        "off this host must be reached over TLS (tls://HOST:PORT with --tls-ca-file, --tls-cert, "
                        "--tls-key; README: Scaling out); plain tcp:// only on 127.0.0.1")


def quiet_dask_logs() -> None:
    """Dask's own log lines (reconnect attempts, worker deaths we handle) stay out of the search's stderr: what
    matters reaches the user as one line of ours."""
    import distributed  # noqa: F401  (its logging set-up first, then ours over it)

    for name in ("distributed", "tornado", "asyncio"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        for h in logger.handlers:
            h.setLevel(logging.CRITICAL + 1)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def configure_dask() -> None:
    import dask
    import distributed  # noqa: F401  (its defaults first: they are merged into whatever was set before)

    dask.config.set(DASK_CONFIG)


# ---- workers of one host ----------------------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """This host's GPUs as CUDA_VISIBLE_DEVICES values (that variable's order if set), without starting CUDA here."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0:
                return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


@dataclass
class HostLayout:
    """The Dask workers of one host: GPU workers (one per device, or simulated ones) and build slots."""

    gpus: list[str | None]  # CUDA_VISIBLE_DEVICES value per GPU worker; None: simulated (no device)
    build_slots: int  # 0: no build worker (replays build nothing)
    cache_dir: str | None = None  # EVOENGINEER_CACHE for every worker (None: the workers' own default)

    def nanny_options(self, *, host: str | None, name: str, security: Any = None) -> list[dict[str, Any]]:
        """Keyword arguments of one distributed.Nanny per worker."""
        # the workers' HTTP endpoints (metrics, health) listen where the workers do: 127.0.0.1 for a local cluster
        common: dict[str, Any] = {"host": host, "dashboard_address": f"{host}:0" if host else None,
                                  "silence_logs": logging.CRITICAL + 1,
                                  "memory_limit": 0, "security": security}
        base_env = {"EVOENGINEER_CACHE": self.cache_dir} if self.cache_dir else {}
        out = []
        for i, gpu in enumerate(self.gpus):
            env = dict(base_env)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            out.append({**common, "nthreads": 1, "resources": {GPU: 1}, "env": env,
                        "name": f"{name}-gpu{i}" + ("" if gpu is not None else "-simulated")})
        if self.build_slots:
            out.append({**common, "nthreads": self.build_slots, "resources": {BUILD: self.build_slots},
                        "env": dict(base_env), "name": f"{name}-build"})
        return out


def host_layout(*, gpus: Sequence[str] | None, simulate: int | None, build_jobs: int | None, builds: bool,
                cache_dir: str | None = None, what: str = "--cluster local") -> HostLayout:
    """One GPU worker per GPU in `gpus` (default: every visible GPU), or `simulate` workers without a device; build
    slots on the remaining cores (or `build_jobs`)."""
    if simulate:
        ids: list[str | None] = [None] * simulate
    else:
        ids = list(gpus) if gpus is not None else list(visible_gpus())
        if not ids:
            raise UserError(f"{what}: this host shows no GPU (CUDA_VISIBLE_DEVICES, nvidia-smi); simulated GPU "
                            "workers (replays, CPU spaces, tests) with --cluster-workers N / worker --simulate N")
    slots = 0
    if builds:
        slots = build_jobs if build_jobs else max(1, usable_cpus() - len(ids))
    return HostLayout(gpus=ids, build_slots=slots, cache_dir=cache_dir)


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
        self.overlap = space.backend != "cpu"
        self._cluster = None
        self._t_created = time.monotonic()
        self._start_marks: dict[str, float] = {}  # start_timeline()
        self._prepared: list[Any] | None = None  # start(): the workers' prepare tasks
        self._init_flight()
        extras = dict(extras or {})
        if address == "local":
            real = self.builds and space.backend == "cuda"
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


def _end_processes(pids: list[int], grace_s: float) -> None:
    """Processes `pids` and their descendants: terminated if still running, killed after `grace_s`."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _start_local_cluster(layout: HostLayout) -> Any:
    """A SpecCluster on 127.0.0.1: the scheduler in this process (allowed-failures 1), a Nanny per worker."""
    from distributed import Nanny, Scheduler, SpecCluster

    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0",
                                               "allowed_failures": ALLOWED_FAILURES}}
    workers = {o["name"]: {"cls": Nanny, "options": o}
               for o in layout.nanny_options(host="127.0.0.1", name="local")}
    return SpecCluster(scheduler=scheduler, workers=workers, silence_logs=logging.CRITICAL + 1, name="evoengineer")


def _worker_of(exc: Any) -> str:
    w = getattr(exc, "last_worker", None)
    return str(getattr(w, "address", None) or getattr(w, "name", None) or w or "?")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


# ---- `python -m evoengineer worker` -----------------------------------------------------------------------------
def serve_workers(scheduler: str, layout: HostLayout, tls: TLSFiles | None, *, name: str | None = None,
                  announce: Callable[[str], None] = print) -> int:
    """Start this host's workers (a Nanny each) for `scheduler` and run until interrupted (SIGINT/SIGTERM)."""
    import asyncio
    import signal

    from distributed import Nanny

    check_address(scheduler, tls, option="--scheduler")
    configure_dask()
    quiet_dask_logs()
    url = urlparse(scheduler)
    # listen where the scheduler can reach us: loopback for a loopback scheduler, else every interface (TLS only)
    listen = "127.0.0.1" if url.scheme == "tcp" else None
    security = tls.security() if tls else None
    label = name or socket.gethostname().split(".")[0]

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        nannies = [Nanny(scheduler, **o) for o in layout.nanny_options(host=listen, name=label, security=security)]
        await asyncio.gather(*nannies)
        gpu = sum(1 for g in layout.gpus if g is not None)
        announce(f"{len(layout.gpus)} GPU worker(s) ({gpu} pinned to a device, {len(layout.gpus) - gpu} simulated) "
                 f"and {layout.build_slots} build slot(s) serving {scheduler}; Ctrl-C stops them")
        finished = asyncio.ensure_future(asyncio.gather(*(n.finished() for n in nannies)))
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait([finished, waiter], return_when=asyncio.FIRST_COMPLETED)
        stopped = stop.is_set()
        await asyncio.gather(*(n.close() for n in nannies), return_exceptions=True)
        waiter.cancel()
        finished.cancel()
        if not stopped:  # Dask workers close once their scheduler is gone for good
            announce(f"error: the workers lost the scheduler at {scheduler} and stopped; start them again with it")
            return 1
        return 0

    return asyncio.run(main())
