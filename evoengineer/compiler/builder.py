"""Parallel, cached builds of candidates through torch.utils.cpp_extension.

The family's torch binding is compiled once per toolchain (beside the first candidates' compiles); each candidate
compiles its kernel once (CUDA: one `nvcc -c`, whose ptxas report is the static gate's) and a tiny shim, and links
against it. Builds asked for now go before builds asked for ahead. Results (successes and deterministic failures) are cached by candidate hash + toolchain, so
a repeat or a resumed run builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time
import uuid
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evoengineer.paths import TEMPLATES_DIR
from evoengineer.compiler import steps
from evoengineer.compiler.build_queue import BuildQueue, QueuedBuilds
from evoengineer.compiler.toolchain import toolchain, usable_cpus
from evoengineer.candidate import Candidate
from evoengineer.compiler.binding_source import BindingSource
from evoengineer.ops.runtime import binding_flags
from evoengineer.space.flags import check_flags
from evoengineer.space.spec import SearchSpace

CACHED_FAILURES = ("compile_error", "link_error", "gate_failed")
#: where the bindings' shared header (candidate_module.h) lives
BINDING_INCLUDE = TEMPLATES_DIR / "bindings"


def default_cache_dir() -> Path:
    env = os.environ.get("EVOENGINEER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "evoengineer"


@dataclass
class BuildResult:
    status: str  # ok | compile_error | link_error | build_error
    reason: str = ""
    so: str | None = None
    module: str | None = None
    build_s: float = 0.0
    cached: bool = False
    log: str = ""
    retry: bool = False  # the builder process died (maybe for another candidate): worth one more try
    metrics: dict[str, Any] = field(default_factory=dict)  # static-gate report: registers, smem, spills


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _pool_context() -> multiprocessing.context.BaseContext:
    """Builder processes forked from a server that imported torch's cpp_extension once (a torch import costs
    5-9 s of CPU on a GPU host: fifteen builders each importing it held back the first generation by seconds);
    spawned where there is no fork server. Never a plain fork of this process, which may hold threads and locks."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["evoengineer.compiler.steps", "torch.utils.cpp_extension"])
        return ctx
    return multiprocessing.get_context("spawn")


class Builder(QueuedBuilds):
    """Builds candidates of one space on `jobs` processes. `submit` returns a Future[BuildResult]."""

    def __init__(self, space: SearchSpace, *, entry: str, binding: "str | Path | BindingSource", signature: str,
                 cache_dir: str | Path | None = None, jobs: int | None = None, device_only: bool = False):
        """`binding`: the family's binding (Family.binding: its own file or generated from its signature), or a
        file (under templates/ when relative). `device_only` (CUDA, a binding that launches cubins): each
        candidate of the space's template is compiled to a cubin alone (no host compile, no link), which the
        binding loads and launches."""
        # load_space already refused these; a space made some other way must not reach /bin/sh through ninja either
        for key, flags in (("flags", space.build_flags), ("cuda_flags", space.cuda_flags), ("ldflags", space.ldflags)):
            check_flags(list(flags), str(space.path or space.name), key)
        self.space = space
        self.entry = entry
        self.signature = signature  # "KEY=VALUE;..." handed to the binding, which refuses other inputs
        self.binding_source = binding if isinstance(binding, BindingSource) else None
        self.binding_path = None if self.binding_source else (TEMPLATES_DIR / binding).resolve()
        # absolute: the linker runs in each build's own folder, where a relative -L to the binding would miss
        self.cache_dir = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()).resolve()
        self.jobs = max(1, jobs or usable_cpus())
        self.toolchain = toolchain(space.backend)
        self.cflags = list(space.build_flags)
        self.cuda_cflags = list(space.cuda_flags) if space.target.device_compiler else None
        if space.target.device_compiler:
            self.cflags.append("-DEVO_WITH_CUDA")
            self.cuda_cflags = [*(self.cuda_cflags or []), "-DEVO_WITH_CUDA"]
        self.ldflags = list(space.ldflags)
        self.suffix = space.target.source_suffix
        # a binding that launches device code has nothing to link a host-code build against: cubins, always
        launches = self.binding_source is not None and self.binding_source.launches
        self.device_only = (bool(device_only) or launches) and space.target.device_compiler
        self._pool: ProcessPoolExecutor | None = None
        self._pool_broken = False
        self._built_binding: dict[str, Any] | None = None
        self._binding_started = False
        self.binding_built_at: float | None = None  # time.monotonic() when this builder built the binding
        self._binding_key_memo: str | None = None
        self.session = uuid.uuid4().hex[:12]  # a binding failure is remembered for this builder's session only
        # the builder's own queue in front of the process pool: builds asked for now before builds asked for ahead
        self.queue = BuildQueue(self.jobs, self._start_job, self._finish_job)
        # submit may be called from several threads (a Dask build worker runs one build task per thread)
        self._lock = threading.RLock()

    # ---- keys and cache -------------------------------------------------------------------------------------------
    def _binding(self) -> BindingSource:
        if self.binding_source is None:
            self.binding_source = BindingSource(name=self.binding_path.stem, text=self.binding_path.read_text(),
                                                origin=str(self.binding_path))
        return self.binding_source

    def _binding_key(self) -> str:
        # the binding and the headers it includes (candidate_module.h, shared by every binding); read once per
        # builder, not per candidate (every key, cache lookup and job asks for it)
        if self._binding_key_memo is None:
            headers = {h.name: h.read_text() for h in sorted(BINDING_INCLUDE.glob("*.h"))}
            self._binding_key_memo = _sha({"source": self._binding().text, "headers": headers,
                                           "toolchain": self.toolchain, "cflags": binding_flags(self.cflags),
                                           "cuda": binding_flags(self.cuda_cflags), "backend": self.space.backend})[:20]
        return self._binding_key_memo

    def key(self, candidate: Candidate) -> str:
        return _sha({"candidate": candidate.hash, "toolchain": self.toolchain, "binding": self._binding_key(),
                     "entry": self.entry, "signature": self.signature,
                     **({"device_only": True} if self._device_only(candidate) else {})})[:32]

    def _device_only(self, candidate: Candidate) -> bool:
        """Device-only builds are for the space's template (whose kernels export what the binding's launcher
        reads); a fixed kernel of another template (a baseline) keeps its host code."""
        return self.device_only and candidate.template == self.space.template

    def candidate_dir(self, candidate: Candidate) -> Path:
        k = self.key(candidate)
        return self.cache_dir / "candidates" / k[:2] / k

    def cached(self, candidate: Candidate) -> BuildResult | None:
        meta = self.candidate_dir(candidate) / "meta.json"
        try:
            data = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if data.get("status") == "ok" and not Path(data.get("so", "")).exists():
            return None
        return BuildResult(status=data["status"], reason=data.get("reason", ""), so=data.get("so"),
                           module=data.get("module"), build_s=0.0, cached=True, metrics=data.get("metrics", {}))

    def _save(self, candidate: Candidate, result: BuildResult) -> None:
        d = self.candidate_dir(candidate)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"meta.json.{os.getpid()}.{threading.get_ident()}.tmp"  # several processes may save one build
        tmp.write_text(json.dumps({"status": result.status, "reason": result.reason, "so": result.so,
                                   "module": result.module, "build_s": result.build_s, "metrics": result.metrics,
                                   "candidate": candidate.hash}))
        os.replace(tmp, d / "meta.json")
        if result.log:
            (d / "build.log").write_text(result.log)

    # ---- processes ------------------------------------------------------------------------------------------------
    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool_broken:
                self._restart_pool()
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=_pool_context(),
                                                 initializer=steps.builder_init, initargs=(dict(os.environ),))
            return self._pool

    def _restart_pool(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._pool_broken = False

    def binding(self) -> dict[str, Any]:
        """Build (or find) the family binding; its cost is paid once, never per candidate."""
        with self._lock:
            return self._find_binding()

    def _binding_job(self) -> dict[str, Any]:
        key = self._binding_key()
        name = f"evo_binding_{key}"
        return {"name": name, "dir": str(self.cache_dir / "bindings" / name), "source_text": self._binding().text,
                "include": str(BINDING_INCLUDE), "session": self.session,
                "cflags": binding_flags(self.cflags), "cuda_cflags": binding_flags(self.cuda_cflags),
                "arch": self.space.arch, "with_cuda": self.space.target.device_compiler}

    def _find_binding(self) -> dict[str, Any]:
        if self._built_binding is None:
            job = self._binding_job()
            so = Path(job["dir"]) / f"{job['name']}.so"
            with steps.dir_lock(Path(job["dir"])):  # another process may be linking it right now
                found = so.exists()
            if found:
                self._built_binding = {"status": "ok", "so": str(so), "build_s": 0.0}
            else:
                try:
                    self._built_binding = self._executor().submit(steps.safe, steps.build_binding, job).result()
                    if self._built_binding.get("status") == "ok" and self.binding_built_at is None:
                        self.binding_built_at = time.monotonic()
                except BrokenProcessPool:
                    self._restart_pool()
                    self._built_binding = {"status": "build_error",
                                           "reason": "builder process died building the binding"}
        return self._built_binding

    def _start_binding(self) -> None:
        """Start building the family binding on one builder process, beside the first candidates' compiles (they
        need it only to link, and wait for it there): once per builder, a no-op when it is cached."""
        if self._binding_started:
            return
        self._binding_started = True
        job = self._binding_job()
        if (Path(job["dir"]) / f"{job['name']}.so").exists():
            return
        self.queue.take_slot()

        def done(f: "Future[dict[str, Any]]") -> None:
            self.queue.release_slot()
            if not f.cancelled() and f.exception() is None and f.result().get("status") == "ok":
                self.binding_built_at = time.monotonic()

        self._executor().submit(steps.safe, steps.build_binding, job).add_done_callback(done)

    def start(self) -> None:
        """Start the compiler processes and the family binding's build now (not at the first submit)."""
        with self._lock:
            self._executor()
            self._start_binding()

    def _gate_job(self) -> dict[str, Any] | None:
        if not self.space.target.device_compiler:
            return None
        return {"cuda_flags": list(self.space.cuda_flags), "arch": self.space.arch, "gates": dict(self.space.gates)}

    def submit(self, candidate: Candidate, *, ahead: bool = False) -> "Future[BuildResult]":
        """Start building `candidate` (or answer from the cache at once). `ahead`: a build for later (the next batch,
        a speculative child): it waits while builds asked for now are queued. A candidate queued or building
        already shares that build (asked for now, it moves up the queue)."""
        hit = self.cached(candidate)
        if hit is not None:
            done: Future[BuildResult] = Future()
            done.set_result(hit)
            return done
        k = self.key(candidate)
        if not self.queue.queued(k):
            with self._lock:
                self._start_binding()
        name = f"evo_{k[:24]}"
        job = {"name": name, "entry": self.entry, "signature": self.signature,
               "dir": str(self.candidate_dir(candidate)), "suffix": self.suffix,
               "source": candidate.source, "binding": self._binding_job(), "cflags": self.cflags,
               "cuda_cflags": self.cuda_cflags, "ldflags": self.ldflags, "arch": self.space.arch,
               "gate": self._gate_job(), "device_only": self._device_only(candidate)}
        return self.queue.submit(k, (candidate, job, time.perf_counter()), ahead=ahead)

    def compile_job(self, candidate: Candidate, folder: Path) -> dict[str, Any]:
        """The job of `steps.compile_checked` for `candidate` in `folder`: the compile and gate a build would run
        (device flags, arch, gates, device-only or not), nothing linked (`evoengineer check`)."""
        return {"dir": str(folder), "suffix": self.suffix, "source": candidate.source,
                "cuda_cflags": self.cuda_cflags, "arch": self.space.arch, "gate": self._gate_job(),
                "device_only": self._device_only(candidate)}

    def _start_job(self, payload: tuple[Candidate, dict[str, Any], float]) -> Future:
        try:
            return self._executor().submit(steps.safe, steps.build_candidate, payload[1])
        except BrokenProcessPool:
            self._restart_pool()
            return self._executor().submit(steps.safe, steps.build_candidate, payload[1])

    def _finish_job(self, k: str, payload: tuple[Candidate, dict[str, Any], float], f: Future) -> BuildResult:
        candidate, job, t0 = payload
        try:
            r = f.result()
        except BrokenProcessPool:
            self._pool_broken = True  # replaced on the next start
            r = {"status": "build_error", "reason": "builder process died (a crash while loading a candidate?)",
                 "build_s": time.perf_counter() - t0, "retry": True}
        except Exception as exc:  # pragma: no cover - defensive
            r = {"status": "build_error", "reason": f"{type(exc).__name__}: {exc}"}
        result = BuildResult(status=r["status"], reason=r.get("reason", ""), so=r.get("so"),
                             module=job["name"] if r["status"] == "ok" else None,
                             build_s=float(r.get("build_s", 0.0)), log=r.get("log", ""), retry=bool(r.get("retry")),
                             metrics=r.get("metrics", {}))
        if result.status == "ok" or result.status in CACHED_FAILURES:
            self._save(candidate, result)
        return result

    def close(self) -> None:
        self.queue.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
