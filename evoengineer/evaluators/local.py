"""Real evaluation on this machine: parallel cached builds, then checks and timing in an isolated worker."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from evoengineer.compiler.builder import Builder, BuildResult, default_cache_dir
from evoengineer.compiler.toolchain import usable_cpus
from evoengineer.candidate import Candidate
from evoengineer.evaluators.base import Measurement, state_changed
from evoengineer.evaluators.pipeline import BuildAheadEvaluator
from evoengineer.evaluators.retiming import Retiming
from evoengineer.evaluators.worker_process import PINNING, spawn_worker, take_prestarted, worker_env
from evoengineer.space.spec import SearchSpace
from evoengineer.families import get_task


def device_only_builds(task: Any) -> bool:
    """Whether a family's CUDA candidates build device code only (issue 52: the same checks and times as host-code
    builds on the GPU, 1.75-1.86x less host CPU per candidate): always for a declared Launch (no host code exists);
    where its binding launches cubins (`Family.device_only`), by default where the family says so
    (`device_only_default`); EVOENGINEER_DEVICE_ONLY=1 wherever its binding can, =0 never."""
    from evoengineer.family import launched

    if launched(task):  # device code with a declared launch: there is no host code to build
        return True
    choice = os.environ.get("EVOENGINEER_DEVICE_ONLY", "").strip()
    if not getattr(task, "device_only", False) or choice == "0":
        return False
    return choice == "1" or bool(getattr(task, "device_only_default", True))


class WorkerFailure(Exception):
    """The worker hung (timeout) or died (crash); `status` says which."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class WorkerProcess:
    """One measurement subprocess in its own session (so Ctrl-C and kills stay contained)."""

    def __init__(self, init: dict[str, Any], init_timeout_s: float, *, cpu_kernels: bool = True):
        env = worker_env(cpu_kernels=cpu_kernels)
        # the process the search started ahead (worker_process.prestart_worker), when it was started with this env
        self.proc, self.log = take_prestarted(env) or spawn_worker(env)
        self._buf = b""
        reply = self.request({"cmd": "init", **init}, init_timeout_s)
        if not reply.get("ok"):
            raise WorkerFailure("runtime_error", f"worker failed to start: {reply.get('reason', reply)}")
        # time.monotonic() at the end of each step of the worker's start (the same clock here: Linux's monotonic)
        marks = reply.get("start_marks")
        self.start_marks: dict[str, float] = ({str(k): float(v) for k, v in marks.items()
                                              if isinstance(v, (int, float))} if isinstance(marks, dict) else {})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _log_tail(self, n: int = 600) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-4:])[-n:]

    def request(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one message and wait for its reply line, at most `timeout_s`."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout_s:g} s (worker killed)")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._died()
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _died(self) -> WorkerFailure:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            try:
                what = signal.Signals(-code).name
            except ValueError:
                what = f"signal {-code}"
            reason = f"worker killed by {what}"
        else:
            reason = f"worker exited with code {code}"
        tail = self._log_tail()
        return WorkerFailure("runtime_error", reason + (f": {tail}" if tail else ""))

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"cmd": "quit"}\n')  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


class LocalEvaluator(BuildAheadEvaluator):
    """Builds candidates (parallel, cached, ahead of the batch that asks for them) and measures them one at a time
    in a replaceable worker."""

    kind = "local"

    def __init__(self, space: SearchSpace, *, seed: int = 0, build_jobs: int | None = None,
                 cache_dir: str | Path | None = None):
        self.space = space
        self.task = get_task(space)  # validates shapes and settings up front
        self.settings = self.task.settings
        self.seed = seed
        jobs = build_jobs or int(self.settings["build_jobs"]) or usable_cpus()
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        device_only = device_only_builds(self.task)
        self.builder = Builder(space, entry=self.task.entry, binding=self.task.binding,
                               signature=self.task.binding_signature(), cache_dir=self.cache_dir, jobs=jobs,
                               device_only=device_only)
        self.worker: WorkerProcess | None = None
        self.workers_started = 0
        self.busy_s = 0.0  # time the device spent on candidates (checks, timing, baselines), for the busy share
        self._baseline_builds: list[dict[str, str]] | None = None
        self._baseline_futures: dict[str, tuple[str, Future[BuildResult]]] | None = None
        self._starting: Future[WorkerProcess] | None = None  # the first worker, started beside the first builds
        self.baselines_off: list[str] = []  # the family's baselines that miss the reference (worker.check_baselines)
        self.replaced: list[str] = []  # why workers were replaced (state left behind, sentinel drift)
        self._t_created = time.monotonic()
        self._start_marks: dict[str, float] = {}  # start_timeline()
        self._init_pipeline()

    def _submit_baselines(self) -> dict[str, tuple[str, "Future[BuildResult]"]]:
        """Ask for the family's baseline kernels (cached like candidates) before anything else is built."""
        if self._baseline_futures is None:
            self._baseline_futures = {name: (template, self.builder.submit(self._baseline_candidate(template, name)))
                                      for name, template in self.task.baseline_kernels().items()}
        return self._baseline_futures

    def _baseline_candidate(self, template: str, name: str) -> Any:
        """A baseline kernel of the family (its template found beside the family, then among the shipped ones)."""
        from evoengineer.candidate import fixed_candidate

        return fixed_candidate(self.space, template, name, self.task.template_path(template))

    def _baselines(self) -> list[dict[str, str]]:
        """The built baseline kernels; the worker times them."""
        if self._baseline_builds is None:
            builds = []
            for name, (template, f) in self._submit_baselines().items():
                r = f.result()
                if r.retry:
                    r = self.builder.submit(self._baseline_candidate(template, name)).result()
                if r.status != "ok":
                    raise WorkerFailure("build_error", f"baseline {name} ({template}) failed: {r.status}: {r.reason}")
                builds.append({"name": name, "so": r.so, "module": r.module})
            self._baseline_builds = builds
        return self._baseline_builds

    def _start_early(self) -> None:
        """Before the first batch's builds: the baselines' builds first in the queue, and the measuring worker's
        start (torch import, device context, baseline checks) on a thread beside the builds, so the first
        measurement waits only for the first build."""
        if self._starting is not None or self.worker is not None:
            return
        self._submit_baselines()
        pool = ThreadPoolExecutor(1, thread_name_prefix="evo-worker-start")
        self._starting = pool.submit(self._new_worker)
        pool.shutdown(wait=False)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "build_jobs": self.builder.jobs, "cache_dir": str(self.cache_dir),
                "evaluation": self.settings}

    def fingerprint(self) -> dict[str, Any]:
        return {"toolchain": self.builder.toolchain}

    # ---- worker lifecycle -------------------------------------------------------------------------------------------
    def _new_worker(self, *, for_retiming: bool = False) -> WorkerProcess:
        """A started worker with the baselines loaded and checked. The process starts (torch, device context, the
        input sets and their references) before the baselines are asked for: the first worker's start overlaps the
        baselines' builds."""
        self.workers_started += 1
        init = {"space_text": self.space.text, "space_path": str(self.space.path or ""),
                "seed": self.seed * 1000 + self.workers_started, "cache_dir": str(self.cache_dir)}
        timeout = float(self.settings["init_timeout_s"])
        worker = WorkerProcess(init, timeout, cpu_kernels=not self.space.target.gpu)
        for what, at in worker.start_marks.items():  # the first worker's steps, on this evaluator's clock
            self._mark(f"worker: {what}", at)
        self._mark("worker started")
        try:
            baselines = self._baselines()
            self._mark("baselines built")
            reply = worker.request({"cmd": "baselines", "baselines": baselines}, timeout)
            if not reply.get("ok"):
                raise WorkerFailure("runtime_error", f"worker failed to start: {reply.get('reason', reply)}")
            # baselines timed, then the state and the sentinel recorded: what every candidate is measured with
            # (a re-timing worker times its baseline in every round, not once at the start)
            reply = worker.request({"cmd": "hello", "baselines": not for_retiming}, timeout)
            if not reply.get("ok"):
                raise WorkerFailure("runtime_error", f"worker failed to start: {reply.get('reason', reply)}")
            for line in reply.get("baselines_off", []):  # said once, before the first candidate's result
                if line not in self.baselines_off:
                    self.baselines_off.append(line)
                    print(f"warning: {line}", file=sys.stderr, flush=True)
            self._mark("worker ready")
        except BaseException:
            worker.close()
            raise
        return worker

    def _worker(self) -> WorkerProcess:
        if self._starting is not None:
            starting, self._starting = self._starting, None
            try:
                self.worker = starting.result()
            except Exception:
                self.worker = None  # started again below, where its failure reaches the candidate
        if self.worker is None or not self.worker.alive():
            if self.worker is not None:
                self.worker.close()
            self.worker = self._new_worker()
        return self.worker

    def measure(self, candidate: Candidate, build: BuildResult) -> Measurement:
        """Check and time a built candidate in the worker; a hang or crash costs only the worker. A worker that
        reports state it cannot undo, or a sentinel that drifted, is replaced; after a drift the candidate is
        measured again in the fresh worker, and a second drift after it makes it `state_changed`."""
        extra = {**build.metrics, "build_s": build.build_s, "build_cached": build.cached}
        first = self._measure_once(candidate, build, extra)
        drift = first.pop("sentinel_drift", None)
        if not drift:
            return self._measurement(first, extra)
        again = self._measure_once(candidate, build, extra)
        drift_again = again.pop("sentinel_drift", None)
        if drift_again:
            m = self._measurement(again, extra)
            m.metrics["sentinel_drifts"] = [drift, drift_again]
            m.status, m.reason = state_changed(m.status, m.reason, "slowed the measuring process after it, in two "
                                               f"fresh workers: {drift_again}")
            return m
        m = self._measurement(again, extra)
        m.metrics["remeasured"] = f"measured again in a fresh worker after {drift}"
        return m

    def _measurement(self, reply: dict[str, Any], extra: dict[str, Any]) -> Measurement:
        return Measurement(reply["status"], reply.get("reason", ""), {**reply.get("metrics", {}), **extra})

    def _measure_once(self, candidate: Candidate, build: BuildResult, extra: dict[str, Any]) -> dict[str, Any]:
        """The worker's reply for one candidate (a failure of the worker as a reply); replaces the worker when the
        reply asks for it."""
        t_start = time.perf_counter()  # the device is this candidate's from here (a fresh worker's start-up too)
        try:
            worker = self._worker()
            t0 = time.perf_counter()
            reply = worker.request({"cmd": "eval", "so": build.so, "module": build.module, "hash": candidate.hash},
                                   float(self.settings["timeout_s"]))
            extra["measure_s"] = round(time.perf_counter() - t0, 4)  # checks, timing and baselines in the worker
            self._mark("first measured")
        except WorkerFailure as f:
            self.busy_s += time.perf_counter() - t_start
            self._drop_worker()
            return {"status": f.status, "reason": f.reason, "metrics": {}}
        self.busy_s += time.perf_counter() - t_start
        if reply.get("fatal"):
            self._drop_worker()
        elif reply.get("replace"):
            self.replaced.append(f"{candidate.hash[:12]}: {reply['replace']}"[:300])
            self._drop_worker()
        return reply

    def _drop_worker(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def build(self, candidate: Candidate) -> dict[str, Any]:
        """Compile into the build cache (one retry when a builder process died, as in evaluate_many)."""
        b = self.builder.submit(candidate).result()
        if b.retry:
            b = self.builder.submit(candidate).result()
        return {"status": b.status, "reason": b.reason, "metrics": dict(b.metrics), "build_s": b.build_s,
                "cached": b.cached}

    def utilization(self) -> tuple[float, int]:
        return self.busy_s, 1

    def _mark(self, what: str, at: float | None = None) -> None:
        when = time.monotonic() if at is None else at
        self._start_marks.setdefault(what, round(when - self._t_created, 2))

    def start_timeline(self) -> dict[str, float]:
        """Seconds from this evaluator's creation to each step of its start, in order: the family binding built
        (when it was not cached), the first measuring process's own steps (`worker: ...`: its Python at the worker
        module, its imports, the device context, the family, the input sets and references; negative when the
        search started that process ahead of the evaluator) and that process started, the baselines built, that
        worker ready (baselines checked and timed, state and sentinel recorded), the first candidate measured."""
        marks = dict(self._start_marks)
        done = self.builder.binding_built_at
        if done is not None:
            marks["binding built"] = round(done - self._t_created, 2)
        return dict(sorted(marks.items(), key=lambda kv: kv[1]))

    def sanitize(self, candidates: Sequence[Candidate]) -> dict[str, dict[str, Any]]:
        """CUDA: run the (cached) builds under compute-sanitizer's tools from the space's `sanitizer` setting."""
        from evoengineer.evaluators.sanitizer import certify, find_tool

        tools = list(self.settings["sanitizer"])
        if not self.space.target.device_compiler or not tools or find_tool() is None:
            return {}
        verdicts, built = {}, []
        for c in candidates:
            b = self.builder.submit(c).result()
            if b.status == "ok":
                built.append({"hash": c.hash, "so": b.so or "", "module": b.module or ""})
            else:
                verdicts[c.hash] = {"status": "unknown", "tools": tools, "reason": f"no build: {b.status}: {b.reason}"}
        verdicts.update(certify(built, space_text=self.space.text, space_path=str(self.space.path or ""),
                                tools=tools, timeout_s=float(self.settings["sanitizer_timeout_s"])))
        return verdicts

    def retime(self, candidates: Sequence[Candidate], *, session: str,
               plan: dict[str, Any] | None = None) -> Retiming | None:
        """The finalists timed together in the worker, round-robin, on fresh inputs (checked first), as `plan`
        says (rounds, calls per finalist, the baseline's calls and rounds, a budget); without one, `retime_rounds`
        rounds of `retime_repeats` calls each, the baseline every round. A hang or crash of the worker fails the
        re-timing as a whole (the notes say why); the search's ranking then stands."""
        t_start = time.perf_counter()
        st = self.settings
        rounds, repeats = int(st["retime_rounds"]), int(st["retime_repeats"]) or int(st["repeats"])
        warmup = max(1, int(st["warmup"]) // 4)
        calls: dict[str, int] = {c.hash: repeats for c in candidates}
        base_calls, base_rounds, budget = repeats, list(range(rounds)), None
        if plan is not None:
            rounds, warmup = int(plan["rounds"]), int(plan.get("warmup", warmup))
            calls.update({h: int(k) for h, k in plan["repeats"].items()})
            base_calls, base_rounds = int(plan["baseline_calls"]), [int(r) for r in plan["baseline_rounds"]]
            budget = plan.get("budget_s")
            repeats = max(calls.values(), default=repeats)
        dropped: dict[str, tuple[str, str]] = {}
        built = []
        for c in candidates:
            b = self.builder.submit(c).result()
            if b.status == "ok":
                built.append({"hash": c.hash, "so": b.so, "module": b.module})
            else:
                dropped[c.hash] = (b.status, b.reason)
        notes: dict[str, Any] = {"rounds": rounds, "repeats": repeats}
        if plan is not None:
            notes.update(budget_s=budget, expected_s=plan.get("expected_s"), baseline_calls=base_calls,
                         baseline_rounds=len(base_rounds))
        if not self.space.target.gpu:  # CPU kernels: the threads' pinning they were timed with
            notes["pinning"] = " ".join(f"{k}={os.environ.get(k, v)}" for k, v in PINNING.items())
        if not built:
            return Retiming(samples={}, dropped=dropped, notes=notes)
        per_candidate = float(st["timeout_s"]) * max(1.0, rounds * (repeats + warmup)
                                                     / (int(st["warmup"]) + int(st["repeats"])))
        # in a fresh measuring process: nothing any candidate of the search did to the last one carries over
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        try:
            if self._starting is not None:  # a first worker still starting is not the fresh one wanted here
                starting, self._starting = self._starting, None
                try:
                    starting.result().close()
                except Exception:  # noqa: BLE001 - it was going to be replaced anyway
                    pass
            self.worker = self._new_worker(for_retiming=True)
            # the budget is the whole re-timing's: what the fresh worker's start took is spent already
            left = None if budget is None else max(0.0, float(budget) - (time.perf_counter() - t_start))
            reply = self.worker.request({"cmd": "retime", "session": session, "rounds": rounds, "warmup": warmup,
                                         "repeats": {b["hash"]: calls[b["hash"]] for b in built},
                                         "baseline_calls": base_calls, "baseline_rounds": base_rounds,
                                         "budget_s": left, "candidates": built},
                                        per_candidate * (len(built) + 1) + float(st["timeout_s"]))
        except WorkerFailure as f:
            self._drop_worker()
            return Retiming(samples={}, dropped=dropped, notes={**notes, "failed": f"{f.status}: {f.reason}"})
        if not reply.get("ok"):
            if reply.get("fatal") and self.worker is not None:
                self.worker.kill()
                self.worker = None
            return Retiming(samples={}, dropped=dropped,
                            notes={**notes, "failed": f"{reply.get('status')}: {reply.get('reason', '')}"})
        for h, why in reply["dropped"].items():
            dropped[h] = (why["status"], why["reason"])
        base = reply["baseline"]
        if reply.get("rounds_done", rounds) < rounds:
            notes["rounds_done"] = reply["rounds_done"]  # the budget was spent before the planned rounds
        if "seconds" in reply:
            notes["seconds"] = reply["seconds"]  # in the fresh worker, its start not counted
        return Retiming(samples=reply["samples"], dropped=dropped, baseline=base["name"],
                        baseline_p50_us=base["p50_per_round"], order=reply["order"],
                        notes={**notes, "cache": reply["cache"], "process": "a fresh measuring process"})

    # ---- the evaluator interface (evaluate, evaluate_many, prefetch: BuildAheadEvaluator) -----------------------
    def builds_beside_measurements(self) -> bool:
        return self.space.target.builds_beside_measuring

    def start(self) -> None:
        self.before_batch()

    def start_builds(self) -> None:
        self.builder.start()

    def before_batch(self) -> None:
        if self.space.target.builds_beside_measuring:
            self._start_early()

    def close(self) -> None:
        if self._starting is not None:
            try:
                self.worker = self._starting.result()
            except Exception:
                pass
            self._starting = None
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.builder.close()
