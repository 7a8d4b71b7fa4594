"""The measuring worker started ahead of its evaluator (issue 51, evaluators/worker_process.py): the evaluator's
first worker is that process when its environment matches, a mismatched or unused one is ended, and nothing is left
running when the search's process exits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evoengineer.evaluators import worker_process
from evoengineer.evaluators.worker_process import prestart_worker, take_prestarted, worker_env

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by a parent that is gone) counts as ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _nothing_waiting():
    worker_process._end_unused()
    yield
    worker_process._end_unused()


def test_the_evaluators_first_worker_is_the_one_started_ahead(faults_dir: Path, build_cache: Path, monkeypatch):
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators import local
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.space import load_space

    spawned = []  # workers the evaluator started itself (a sentinel drift under load may replace the first)
    monkeypatch.setattr(local, "spawn_worker", lambda env: spawned.append(1) or worker_process.spawn_worker(env))

    space = load_space(faults_dir / "faults_space.toml")
    prestart_worker(cpu_kernels=not space.target.gpu)
    prestart_worker(cpu_kernels=not space.target.gpu)  # at most one waits
    assert len(worker_process._prestarted) == 1
    ahead = worker_process._prestarted[0][1].pid
    healthy = CandidateFactory(space).make({"FAULT": "none", "D_VEC": 8})
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        assert ev.evaluate(healthy).status == "ok"
        assert not worker_process._prestarted  # taken
        assert len(spawned) == ev.workers_started - 1  # the first worker was the one started ahead
        if ev.workers_started == 1:
            assert ev.worker is not None and ev.worker.pid == ahead
        # the worker's own start steps reach the timeline (before the evaluator's creation: negative seconds)
        assert "worker: timed inputs" in ev.start_timeline()
    assert not _alive(ahead)  # closed with the evaluator


def test_a_worker_started_with_another_environment_is_ended_not_taken(monkeypatch):
    prestart_worker(cpu_kernels=True)
    proc = worker_process._prestarted[0][1]
    monkeypatch.setenv("EVOENGINEER_TEST_MARK", "changed")  # the environment a worker would get now differs
    assert take_prestarted(worker_env(cpu_kernels=True)) is None
    assert proc.poll() is not None and not worker_process._prestarted


def test_an_unused_worker_ends_with_the_search_process():
    code = ("from evoengineer.evaluators.worker_process import prestart_worker, _prestarted\n"
            "prestart_worker(cpu_kernels=False)\n"
            "print(_prestarted[0][1].pid, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
