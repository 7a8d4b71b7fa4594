"""Builds through cpp_extension: binding once per family, per-candidate cache, end-to-end CPU search."""

from __future__ import annotations

import pytest

import json
import sqlite3
from pathlib import Path

from evoengineer.compiler.builder import Builder
from evoengineer.candidate import CandidateFactory
from evoengineer.cli import main
from evoengineer.space import load_space
from evoengineer.families import get_task


def test_binding_once_and_candidate_cache(faults_dir: Path, build_cache: Path):
    space = load_space(faults_dir / "faults_space.toml")
    task = get_task(space)
    f = CandidateFactory(space)
    cands = [f.make({"FAULT": "none", "D_VEC": 4}), f.make({"FAULT": "none", "D_VEC": 8})]
    bindings = build_cache / "bindings"
    before = set(bindings.iterdir()) if bindings.is_dir() else set()
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                cache_dir=build_cache, jobs=2)
    try:
        first = [b.submit(c).result() for c in cands]
    finally:
        b.close()
    assert all(r.status == "ok" and Path(r.so).exists() for r in first)
    assert len(set(bindings.iterdir()) - before) <= 1  # at most this family's binding was new (other tests share)
    assert (bindings / Path(b.binding()["so"]).parent.name).is_dir()
    # the candidate's objects hold no torch binding: only its kernel and the shim were compiled
    objs = sorted(p.name for p in Path(first[0].so).parent.glob("*.o"))
    assert objs == ["kernel.o", "shim.o"]
    again = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                    cache_dir=build_cache, jobs=1)
    try:
        second = [again.submit(c).result() for c in cands]
    finally:
        again.close()
    assert all(r.cached and r.build_s == 0.0 and r.so == s.so for r, s in zip(second, first))
    assert again._pool is None, "a cached build must not even start a builder process"


@pytest.mark.slow
def test_default_search_on_cpu_then_cached_rebuild(tmp_path: Path, build_cache: Path, monkeypatch, capsys):
    """`search` with no --space on a machine without a GPU runs the CPU MSDA space for real."""
    monkeypatch.chdir(tmp_path)
    args = ["search", "--db", "sqlite:///s.db", "--population", "4", "--generations", "1", "--elite", "1", "--budget", "6",
            "--cache-dir", str(build_cache), "--build-jobs", "2"]
    assert main(args) == 0
    doc = json.loads((tmp_path / "elite.json").read_text())
    assert doc["space"] == "cpu_msda" and doc["evaluator"]["kind"] == "local"
    assert 1 <= len(doc["elites"]) <= 3
    for e in doc["elites"]:
        m = e["metrics"]
        assert m["time_us"] > 0 and m["speedup"] > 0 and m["baseline"] == "reference"
        assert m["max_abs_err"] < 1e-4 and m["repeats"] == 20 and "warm" in m["timing"]
        assert "MsdaTraits" in e["source"]
    # the finalists (2 x K) were re-timed together on fresh inputs, threads pinned, the baseline's noise recorded
    rt = doc["retiming"]
    assert rt["ranked_by"] == "re-timed p50" and rt["finalists"] == 2 and 2 <= rt["rounds"] <= 5
    assert "OMP_PROC_BIND=" in rt["pinning"] and rt["baseline"] == "reference" and rt["noise_cv"] >= 0
    # within its budget (a share of the search's measuring time): calls sized per finalist, two rounds at least
    rounds = rt.get("rounds_done", rt["rounds"])
    assert rt["budget_s"] > 0 and 2 <= rounds <= rt["rounds"] and 2 <= rt["baseline_rounds"] <= rt["rounds"]
    for e in doc["elites"]:
        r = e["retimed"]
        assert r["calls"] % rounds == 0 and 3 <= r["calls"] // rounds <= 20
        assert r["p10_us"] <= r["p50_us"] <= r["p90_us"] and r["ratio"] > 0
        assert isinstance(r["flag"], str) and e["search_p50_us"] == e["metrics"]["search_time_us"]
        assert e["metrics"]["time_us"] == r["p50_us"]  # the ranking's timing first
    con = sqlite3.connect(tmp_path / "s.db")
    retimes = [json.loads(r[0])["retime"] for r in con.execute("select metrics from candidates where run_id = 1")
               if "retime" in json.loads(r[0])]
    assert len(retimes) == 2 and all(len(x["positions"]) == rounds for x in retimes)
    # round-robin: in each round both finalists ran (then the baseline, in the rounds it is timed), the first one
    # alternating
    pairs = sorted(zip(*(x["positions"] for x in retimes)))
    assert all(abs(p - q) == 1 for p, q in pairs) and [min(p) for p in pairs] == sorted(min(p) for p in pairs)
    assert {x["positions"][0] for x in retimes} == {0, 1}
    a, b = (x["positions"] for x in retimes)
    assert (a[0] < b[0]) != (a[1] < b[1])  # round 2 starts with the other
    metrics = [json.loads(r[0]) for r in con.execute("select metrics from candidates where run_id = 1")]
    assert len(metrics) == 6 and all("build_s" in m for m in metrics)
    # a new run with the same seed starts from the same population: those builds all come from the cache
    again = ["search", "--db", "sqlite:///s.db", "--population", "4", "--generations", "0", "--force",
             "--cache-dir", str(build_cache)]
    assert main(again) == 0
    metrics = [json.loads(r[0]) for r in con.execute("select metrics from candidates where run_id = 2")]
    assert len(metrics) == 4 and all(m["build_cached"] and m["build_s"] == 0.0 for m in metrics)


def test_a_relative_cache_dir_builds(faults_dir: Path, build_cache: Path, tmp_path: Path, monkeypatch):
    """--cache-dir given relative to the working folder: candidates still link against the family binding (the
    linker runs inside each build's own folder, so the cache path must be made absolute first)."""
    import shutil

    space = load_space(faults_dir / "faults_space.toml")
    task = get_task(space)
    warm = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                   cache_dir=build_cache, jobs=1)
    try:
        assert warm.binding()["status"] == "ok"
        src = Path(warm.binding()["so"]).parent
    finally:
        warm.close()
    monkeypatch.chdir(tmp_path)
    shutil.copytree(src, tmp_path / "rel" / "bindings" / src.name)  # the binding cached, the candidate not
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                cache_dir="rel", jobs=1)
    try:
        r = b.submit(CandidateFactory(space).make({"FAULT": "none", "D_VEC": 4})).result()
    finally:
        b.close()
    assert r.status == "ok" and not r.cached, (r.status, r.reason)
    assert Path(r.so).is_absolute() and Path(r.so).is_relative_to(tmp_path / "rel")


def test_a_build_killed_mid_way_does_not_block_the_next(faults_dir: Path, build_cache: Path):
    """A build killed mid-way (Ctrl-C, kill -9 of a search) leaves torch's `lock` file in the candidate's folder;
    torch would wait for it forever: the next build of that candidate removes it under its own lock and builds."""
    import shutil

    space = load_space(faults_dir / "faults_space.toml")
    task = get_task(space)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                cache_dir=build_cache, jobs=1)
    try:
        cand = CandidateFactory(space).make({"FAULT": "none", "D_VEC": 8})
        d = b.candidate_dir(cand)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / "lock").touch()
        r = b.submit(cand).result(timeout=600)
        assert r.status == "ok" and not r.cached and not (d / "lock").exists()
    finally:
        b.close()


def test_a_gpu_spaces_worker_has_a_few_unpinned_threads(monkeypatch):
    """OpenMP binding puts every GPU worker's main thread of a host on one core (issue 51): only CPU kernels are
    timed with pinned threads; a GPU space's worker gets GPU_WORKER_THREADS (or EVOENGINEER_WORKER_THREADS)."""
    from evoengineer.evaluators.worker_process import GPU_WORKER_THREADS, PINNING, worker_env

    monkeypatch.setenv("OMP_PROC_BIND", "spread")
    monkeypatch.delenv("OMP_PLACES", raising=False)
    monkeypatch.delenv("EVOENGINEER_WORKER_THREADS", raising=False)
    cpu = worker_env(cpu_kernels=True)
    assert cpu["OMP_PROC_BIND"] == "spread" and cpu["OMP_PLACES"] == PINNING["OMP_PLACES"]  # the user's choice kept
    gpu = worker_env(cpu_kernels=False)
    assert not any(k in gpu for k in PINNING)
    assert 1 <= int(gpu["OMP_NUM_THREADS"]) <= GPU_WORKER_THREADS
    monkeypatch.setenv("EVOENGINEER_WORKER_THREADS", "2")
    assert worker_env(cpu_kernels=False)["OMP_NUM_THREADS"] == "2"


def test_device_only_builds_where_the_family_says_and_as_the_environment_asks(monkeypatch):
    """Device-only builds (issue 52): by default where the family's binding launches cubins and it says so; with
    EVOENGINEER_DEVICE_ONLY=1 wherever the binding can; =0 never."""
    from evoengineer.evaluators.local import device_only_builds

    on = type("On", (), {"device_only": True})()
    opt_in = type("OptIn", (), {"device_only": True, "device_only_default": False})()
    host = type("Host", (), {"device_only": False})()
    monkeypatch.delenv("EVOENGINEER_DEVICE_ONLY", raising=False)
    assert [device_only_builds(t) for t in (on, opt_in, host)] == [True, False, False]
    monkeypatch.setenv("EVOENGINEER_DEVICE_ONLY", "1")
    assert [device_only_builds(t) for t in (on, opt_in, host)] == [True, True, False]
    monkeypatch.setenv("EVOENGINEER_DEVICE_ONLY", "0")
    assert [device_only_builds(t) for t in (on, opt_in, host)] == [False, False, False]
