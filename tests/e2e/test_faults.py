"""Fault isolation: a search over planted faults finishes, classifies each fault, and keeps the healthy elites."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path


from evoengineer.cli import main

EXPECTED = {
    "none": "ok",
    "hang": "timeout",
    "segfault": "runtime_error",
    "abort": "runtime_error",
    "unwritten": "wrong",
    "nan": "wrong",
    "slightly_wrong": "wrong",
    "compile_error": "compile_error",
    "link_error": "link_error",
    "mutate_input": "wrong",
    "oob_write": "wrong",
    "stale_output": "wrong",
    "intermittent": "wrong",
}


def test_search_over_planted_faults(faults_dir: Path, build_cache: Path, monkeypatch, capsys):
    monkeypatch.chdir(faults_dir)
    rc = main(["search", "--space", "faults_space.toml", "--db", "sqlite:///f.db", "--out", "elite.json",
               "--population", "14", "--generations", "0", "--cache-dir", str(build_cache), "--quiet"])
    assert rc == 0
    con = sqlite3.connect(faults_dir / "f.db")
    rows = con.execute("select params, status, reason, metrics from candidates").fetchall()
    assert len(rows) == 14  # every valid configuration
    for params, status, reason, metrics in rows:
        fault = json.loads(params)["FAULT"]
        assert status == EXPECTED[fault], (fault, status, reason)
        m = json.loads(metrics)
        if fault == "segfault":
            assert "SIGSEGV" in reason
        if fault == "abort":
            assert "SIGABRT" in reason
        if fault in ("unwritten", "nan"):
            assert "NaN/Inf" in reason and "shape" in reason
        if fault == "slightly_wrong":
            assert "max abs err" in reason and "on shape " in reason
        if fault == "compile_error":
            assert "error" in reason
        if fault == "link_error":
            assert "evo_symbol_that_nobody_defines" in reason
        if fault == "mutate_input":
            assert reason.startswith("modified input value")
        if fault == "oob_write":
            assert reason.startswith("wrote past output by 16 elements")
        if fault == "stale_output":
            assert reason.startswith("stale output")
        if status == "ok":
            assert m["time_us"] > 0 and m["time_p90_us"] >= m["time_us"] and m["speedup"] > 0
            assert m["max_abs_err"] < 1e-4 and "build_s" in m
    doc = json.loads((faults_dir / "elite.json").read_text())
    assert [e["params"]["FAULT"] for e in doc["elites"]] == ["none", "none"]
    assert all(e["metrics"]["time_us"] > 0 and "evo_msda_forward_v2" in e["source"] for e in doc["elites"])


def test_worker_killed_from_outside_is_replaced(faults_dir: Path, build_cache: Path):
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.space import load_space

    space = load_space(faults_dir / "faults_space.toml")
    f = CandidateFactory(space)
    hang, healthy = f.make({"FAULT": "hang", "D_VEC": 4}), f.make({"FAULT": "none", "D_VEC": 8})
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        for c in (hang, healthy):  # build first, so the kill lands while the worker runs the hanging kernel
            assert ev.builder.submit(c).result().status == "ok"
        victim = ev._worker().pid

        def killer():
            time.sleep(2.0)
            os.kill(victim, signal.SIGKILL)

        t = threading.Thread(target=killer)
        t.start()
        m = ev.evaluate(hang)
        t.join()
        assert m.status == "runtime_error" and "SIGKILL" in m.reason, m
        ok = ev.evaluate(healthy)
        assert ok.status == "ok", ok
        assert ev.worker is not None and ev.worker.pid != victim and ev.workers_started == 2


def test_the_evaluator_says_when_each_step_of_its_start_was_done(faults_dir: Path, build_cache: Path):
    """The final line's `start:` (issue 51): the measuring worker's own steps (its Python up, torch imported, the
    family loaded, the check inputs with their references and the timed inputs made), the worker started, the
    baselines built, the worker ready, the first candidate measured, in that order, in seconds from the evaluator's
    creation."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.search.progress import ProgressPrinter
    from evoengineer.space import load_space

    space = load_space(faults_dir / "faults_space.toml")
    healthy = CandidateFactory(space).make({"FAULT": "none", "D_VEC": 8})
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        assert ev.evaluate(healthy).status == "ok"
        marks = ev.start_timeline()
    steps = [k for k in marks if k != "binding built"]
    inside = ["worker: python", "worker: torch imported", "worker: family loaded",
              "worker: check inputs and references", "worker: timed inputs"]
    assert steps == [*inside, "worker started", "baselines built", "worker ready", "first measured"], marks
    assert all(0 < s < 600 for s in marks.values())
    assert list(marks.values()) == sorted(marks.values())
    line = ProgressPrinter._start(type("R", (), {"evaluator": ev})())
    assert line.startswith(" | start: ") and "worker ready" in line
    assert line.endswith(f"first measured {marks['first measured']:.1f} s")
