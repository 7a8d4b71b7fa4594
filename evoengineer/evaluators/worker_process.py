"""The measuring worker's process: its environment, and its start ahead of the evaluator (no torch import here).

A search's first candidate waits for the measuring worker (Python, torch, the device context, input sets and their
float64 references). `prestart_worker` starts that process the moment the search knows its space, before the
search's own process imports torch and builds its evaluator, so the two imports run side by side; the evaluator's
first worker then takes it (`take_prestarted`) if its environment is the one the worker would be started with now.
A process nobody takes is ended when the search's process exits (and would read end-of-file on its stdin anyway).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from evoengineer.compiler.toolchain import usable_cpus
from evoengineer.paths import ROOT

PINNING = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
#: CPU threads of a GPU space's measuring worker (its own CPU work: fresh inputs, host-side checks). Its OpenMP
#: threads are not pinned: bound threads put every worker's main thread of a host on its first core (4 GPU workers
#: measured 3.5x slower per candidate beside the compilers, issue 51), and 64 spinning threads per worker take the
#: cores the builds need. EVOENGINEER_WORKER_THREADS overrides.
GPU_WORKER_THREADS = 4


def worker_env(*, cpu_kernels: bool) -> dict[str, str]:
    """The environment of a measuring worker: CPU kernels time with OpenMP threads pinned to cores (unless the user
    chose otherwise: a thread that migrates mid-measurement is noise, not the kernel); a GPU space's worker gets a
    few unpinned threads (GPU_WORKER_THREADS)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if cpu_kernels:
        for key, value in PINNING.items():
            env.setdefault(key, value)
    else:
        threads = env.get("EVOENGINEER_WORKER_THREADS") or str(min(GPU_WORKER_THREADS, usable_cpus()))
        for key in PINNING:
            env.pop(key, None)
        env["OMP_NUM_THREADS"] = env["EVOENGINEER_WORKER_THREADS"] = threads
    return env


def spawn_worker(env: dict[str, str]) -> tuple[subprocess.Popen, IO[bytes]]:
    """A measuring worker process in its own session (Ctrl-C and kills stay contained), its stderr in a log file."""
    log = tempfile.NamedTemporaryFile(prefix="evo-worker-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "evoengineer.evaluators.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True)
    return proc, log


_lock = threading.Lock()
_prestarted: list[tuple[dict[str, str], subprocess.Popen, Any]] = []


def prestart_worker(*, cpu_kernels: bool) -> None:
    """Start one measuring worker now, for the evaluator made next to take (at most one waits at a time)."""
    with _lock:
        if _prestarted:
            return
        env = worker_env(cpu_kernels=cpu_kernels)
        proc, log = spawn_worker(env)
        _prestarted.append((env, proc, log))


def take_prestarted(env: dict[str, str]) -> tuple[subprocess.Popen, Any] | None:
    """The waiting worker process if it was started with `env` and is alive; else None (and it is ended)."""
    with _lock:
        if not _prestarted:
            return None
        started_env, proc, log = _prestarted.pop()
    if started_env == env and proc.poll() is None:
        return proc, log
    _end(proc, log)
    return None


def _end(proc: subprocess.Popen, log: Any) -> None:
    """Ends an unused worker at once (it has measured nothing: no reason to wait for its imports)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()
    try:
        os.unlink(log.name)
    except OSError:
        pass


@atexit.register
def _end_unused() -> None:
    """A worker started ahead that no evaluator took (the search stopped before measuring) ends with this process."""
    with _lock:
        left = list(_prestarted)
        _prestarted.clear()
    for _, proc, log in left:
        _end(proc, log)
