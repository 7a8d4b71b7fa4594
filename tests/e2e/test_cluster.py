"""Evaluation on a Dask cluster (evoengineer/evaluators/cluster/) on CPU: simulated GPU workers (the resource
GPU=1, no device) replaying the toy landscape give the evaluated set, elites and elite.json of a run without a
cluster, for 1, 2 and 4 workers and every strategy; a Dask worker killed with -9 mid-candidate loses nothing and
records nothing twice; a candidate that kills two workers is a poison pill (runtime_error) and the search goes on;
a lost scheduler stops the search with one line, resumable; kill -9 of the search resumes exactly; real builds and
measurements (the faults family) through a local cluster; TLS: a plain-TCP address off this host is refused, a
tls:// scheduler with certificates made as the README says works; `worker` serves simulated GPU workers."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import cloudpickle

import cluster_helpers
from conftest import stored_count
from evoengineer.cli import main
from evoengineer.errors import UserError
from evoengineer.evaluators import ReplayEvaluator
from evoengineer.evaluators.cluster import (ClusterEvaluator, HostLayout, TLSFiles, _start_local_cluster,
                                            check_address, configure_dask)
from evoengineer.search import STRATEGIES, RandomSearch, Runner, SearchSettings
from evoengineer.search.driver import cluster_population
from evoengineer.space import load_space
from evoengineer.store import Store

cloudpickle.register_pickle_by_value(cluster_helpers)  # the workers get the test evaluators by value

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stored(db: Path) -> list[tuple]:
    """A run's records, order-free: (hash, status, time)."""
    store = Store(f"sqlite:///{db}")
    try:
        (run,) = store.runs()
        return sorted((r.hash, r.status, r.time_us) for r in store.candidates(run.id))
    finally:
        store.close()


def _run_status(db: Path) -> tuple[str, str]:
    store = Store(f"sqlite:///{db}")
    try:
        (run,) = store.runs()
        return run.status, run.stop_reason
    finally:
        store.close()


def _search(*args: str) -> int:
    return main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--quiet", *args])


def _plain_doc(doc: dict) -> dict:
    """An elite.json without what names the evaluator (the cluster's address)."""
    return {k: v for k, v in doc.items() if k != "evaluator"}


# ---- addresses and TLS: refused before anything connects --------------------------------------------------------
@pytest.mark.parametrize("address, words", [
    ("tcp://10.1.2.3:8786", "refused: a Dask scheduler runs whatever code"),
    ("tcp://192.168.0.7:8786", "must be reached over TLS"),
    ("tcp://example.invalid:8786", "plain tcp:// only on 127.0.0.1"),
    ("tls://10.1.2.3:8786", "tls:// needs --tls-ca-file"),
    ("10.1.2.3:8786", "expected 'local', tcp://127.0.0.1:PORT or tls://HOST:PORT"),
    ("tcp://127.0.0.1", "expected 'local'"),
    ("http://127.0.0.1:8786", "expected 'local'"),
])
def test_addresses_that_would_hand_code_out_in_clear_are_refused(address: str, words: str):
    with pytest.raises(UserError) as info:
        check_address(address, None)
    assert words in str(info.value)


def test_loopback_and_tls_addresses_are_accepted(tmp_path: Path):
    for address in ("local", "tcp://127.0.0.1:8786", "tcp://localhost:8786", "tcp://[::1]:8786",
                    "tcp://127.0.0.2:9000"):
        check_address(address, None)
    for name in ("ca.pem", "node.pem", "node.key"):
        (tmp_path / name).write_text("x")
    tls = TLSFiles.from_options(str(tmp_path / "ca.pem"), str(tmp_path / "node.pem"), str(tmp_path / "node.key"))
    check_address("tls://10.1.2.3:8786", tls)
    with pytest.raises(UserError, match="use tls://10.1.2.3:8786"):
        check_address("tcp://10.1.2.3:8786", tls)
    with pytest.raises(UserError, match="missing --tls-key"):
        TLSFiles.from_options(str(tmp_path / "ca.pem"), str(tmp_path / "node.pem"), None)
    with pytest.raises(UserError, match="--tls-ca-file .*cannot read"):
        TLSFiles.from_options(str(tmp_path / "nope.pem"), str(tmp_path / "node.pem"), str(tmp_path / "node.key"))


@pytest.mark.parametrize("args", [
    ["--cluster", "tcp://10.1.2.3:8786"],
    ["--cluster", "tls://10.1.2.3:8786"],
    ["--cluster", "tcp://127.0.0.1:8786", "--cluster-workers", "2"],
    ["--cluster-workers", "2"],
])
def test_the_cli_refuses_with_one_line_and_writes_nothing(toy_dir: Path, monkeypatch, capsys, args: list[str]):
    monkeypatch.chdir(toy_dir)
    code = main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///c.db",
                 *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert not (toy_dir / "c.db").exists() and not (toy_dir / "elite.json").exists()


def test_worker_command_says_so_on_a_host_without_gpus(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["worker", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "shows no GPU" in err and "--simulate" in err
    assert main(["worker", "--scheduler", "tcp://10.0.0.1:8786", "--simulate", "2"]) == 2
    assert "must be reached over TLS" in capsys.readouterr().err


def test_default_population_follows_the_gpu_workers():
    # a GA generation's children fill whole rounds of the workers; the population is at least 1.5 x the workers
    assert [cluster_population("ga", 12, 3, w) for w in (1, 2, 4, 8, 16)] == [12, 13, 15, 19, 35]
    assert [cluster_population("random", 12, 3, w) for w in (1, 2, 4, 8, 16)] == [12, 12, 12, 16, 32]
    for w in (1, 2, 3, 4, 8, 16):
        p = cluster_population("ga", 12, 3, w)
        assert (p - 3) % w == 0 and p >= 1.5 * w and p >= 12


# ---- the same results on 1, 2 and 4 workers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def clusters():
    """Local clusters of 1, 2 and 4 simulated GPU workers (127.0.0.1), shared by the module's searches, which reach
    them as external schedulers (tcp://127.0.0.1:PORT)."""
    configure_dask()
    started = {n: _start_local_cluster(HostLayout(gpus=[None] * n, build_slots=0)) for n in (1, 2, 4)}
    yield {n: c.scheduler_address for n, c in started.items()}
    for c in started.values():
        c.close(timeout=30)


@pytest.mark.parametrize("strategy", ["ga", "random", "grid", "optuna"])
def test_1_2_and_4_simulated_gpu_workers(toy_dir: Path, monkeypatch, clusters, strategy: str):
    """Random and grid evaluate the same set, with the same elites, on 1, 2 and 4 workers as without a cluster (a
    prefix of their order, whatever order the results arrive in). The GA and Optuna propose from the results as
    they arrive, so the set depends on the workers: each run spends the budget on distinct configurations and
    publishes the best of what it measured, and its proposal log replays exactly."""
    from test_async_search import _replays_exactly

    monkeypatch.chdir(toy_dir)
    monkeypatch.setenv("EVOENGINEER_REPLAY_DELAY_S", "0.005")
    common = ["--strategy", strategy, "--budget", "30", "--population", "8", "--seed", "3"]
    assert _search("--db", "sqlite:///plain.db", "--out", "plain.json", *common) == 0
    want = _stored(toy_dir / "plain.db")
    plain = json.loads((toy_dir / "plain.json").read_text())
    docs = []
    for n, address in clusters.items():
        assert _search("--db", f"sqlite:///w{n}.db", "--out", f"w{n}.json", "--cluster", address, *common) == 0
        got = _stored(toy_dir / f"w{n}.db")
        doc = json.loads((toy_dir / f"w{n}.json").read_text())
        assert doc["evaluator"] == {"kind": "dask", "cluster": address, "inner": plain["evaluator"]}
        assert len(got) == len({h for h, _, _ in got}) == 30 == doc["evaluations"]
        best = sorted((t, h) for h, status, t in got if status == "ok")[:3]
        assert [e["hash"] for e in doc["elites"]] == [h for _, h in best]
        _replays_exactly(toy_dir, strategy, db=f"w{n}.db")
        if strategy in ("random", "grid"):
            assert got == want, n
            docs.append(_plain_doc(doc))
    if docs:
        assert docs[0] == docs[1] == docs[2]  # elite.json: the same but for the scheduler's address
        assert docs[0]["elites"] == plain["elites"]


def test_workers_keep_the_environment_they_were_started_with(monkeypatch):
    """Dask's nannies would set OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS to 1 in their workers (and
    in the process starting them): the measuring processes inherit the worker's environment, so CPU kernels would be
    timed on one thread and a GPU candidate's CPU-side checks would run single-threaded. Workers keep the
    starter's environment: unset stays unset, a value set stays."""
    from distributed import Client

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for name in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    configure_dask()
    cluster = _start_local_cluster(HostLayout(gpus=[None], build_slots=0))
    try:
        with Client(cluster, timeout=30) as client:
            seen = list(client.run(lambda: {k: os.environ.get(k) for k in names}).values())
    finally:
        cluster.close(timeout=30)
    want = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None}
    assert seen == [want]
    assert {k: os.environ.get(k) for k in names} == want  # nor is the starter's own environment changed


def test_a_local_clusters_leftover_processes_are_ended():
    """What a local cluster's close leaves running (a worker that ignores SIGTERM, and what it started) is ended:
    Python's exit would otherwise wait for Dask's non-daemon worker processes forever."""
    import psutil

    from evoengineer.evaluators.cluster import _end_processes

    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen(['sleep', '120']); print(c.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    t0 = time.monotonic()
    _end_processes([parent.pid], grace_s=1.0)
    parent.wait(timeout=10)  # it ignored SIGTERM: killed after the grace (and reaped)

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert gone(parent.pid) and gone(child)
    assert time.monotonic() - t0 < 8


def test_build_parallelism_follows_the_cpus_this_process_may_use():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from evoengineer.compiler.toolchain import usable_cpus; print(usable_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.stdout.strip() == "1", out.stderr


def test_done_line_gives_each_gpu_workers_busy_share(toy_dir: Path, monkeypatch, clusters, capsys):
    """On several GPU workers the run's last progress line says how busy each one was (how evenly work spread)."""
    monkeypatch.chdir(toy_dir)
    monkeypatch.setenv("EVOENGINEER_REPLAY_DELAY_S", "0.05")
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///busy.db",
                 "--out", "busy.json", "--cluster", clusters[2], "--strategy", "random", "--budget", "16",
                 "--seed", "1"]) == 0
    done = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip().startswith("done |")]
    assert len(done) == 1
    m = re.search(r"\| per GPU: (\S+) (\d+)%, (\S+) (\d+)% \|", done[0])
    assert m, done[0]
    assert m.group(1) != m.group(3) and "gpu" in m.group(1) and "gpu" in m.group(3)
    # 8 candidates of 50 ms each per worker at best: each was busy a real share of the run
    assert all(0 < int(m.group(i)) <= 100 for i in (2, 4))


# ---- faults: a worker killed mid-candidate, a poison pill -------------------------------------------------------
def _api_search(space_file: Path, landscape: Path, db: Path, evaluator, strategy: str = "random", **kw):
    """A search in this process through the real store and runner (so a test thread can reach the cluster)."""
    space = load_space(space_file)
    store = Store(f"sqlite:///{db}")
    settings = SearchSettings(strategy=strategy, **kw)
    rid = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": evaluator.describe()}, seed=settings.seed,
                           fingerprint={"cpu": "test"})
    runner = Runner(space=space, evaluator=evaluator, store=store, run=store.get_run(rid), settings=settings,
                    out=db.with_suffix(".json"))
    with evaluator:
        reason = STRATEGIES[strategy](runner).run(None)
    store.close()
    return reason, runner


def _audited(toy_dir: Path, audit: Path, *, workers: int, delay_s: float, poison=(), **hold) -> ClusterEvaluator:
    space = load_space(toy_dir / "toy_space.toml")
    with ReplayEvaluator(toy_dir / "landscape.csv", space) as ev:
        inner = ev.describe()
    return ClusterEvaluator(space, inner, address="local", workers=workers, factory=cluster_helpers.audited_replay,
                            extras={"delay_s": delay_s, "audit": str(audit), "poison": sorted(poison), **hold})


def test_every_gpu_worker_starts_its_evaluator_before_the_first_candidate(toy_dir: Path, tmp_path: Path):
    """start(): each GPU worker makes the run's evaluator and starts it (its measuring process, on a GPU host)
    before any candidate is submitted, not at its first candidate after that candidate's build."""
    prepared = tmp_path / "prepared"
    with _audited(toy_dir, tmp_path / "audit", workers=2, delay_s=0.0, prepared=str(prepared)) as ev:
        ev.start()
        ev.start()  # once per run
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = prepared.read_text().splitlines() if prepared.exists() else []
            if len(lines) >= 2:
                break
            time.sleep(0.1)
        pids = {ln.split()[1] for ln in lines}
        assert len(lines) == 2 and len(pids) == 2, lines  # one per worker process
        assert not (tmp_path / "audit").exists()  # no candidate ran
        pid_of = {str(p) for p in ev.client.run(os.getpid).values()}
        assert pids == pid_of


def _stored_hashes(db: Path) -> set[str]:
    """The hashes a search writing `db` has recorded so far (read-only, beside it)."""
    import sqlite3

    if not db.exists():
        return set()
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return {h for (h,) in con.execute("select hash from candidates")}
        finally:
            con.close()
    except sqlite3.Error:
        return set()


def test_a_worker_killed_mid_candidate_loses_nothing_and_records_nothing_twice(toy_dir: Path):
    """Events, not timings: the candidate to kill its worker under stops mid-measurement (once 3 have ended) and says
    so (its hash and pid in a file); the worker is killed once every result it had finished is stored and released
    by the scheduler (a result it still held would be computed again for the futures that wanted it), so only that
    candidate is measured again, once, on another worker."""
    audit, hold = toy_dir / "audit.log", toy_dir / "hold"
    ev = _audited(toy_dir, audit, workers=2, delay_s=0.05, hold=str(hold), hold_after=3)
    address_of = {pid: address for address, pid in ev.client.run(os.getpid).items()}
    pids = set(address_of)  # the Dask worker processes (not their nannies)
    killed: list[tuple[str, int]] = []
    stop = threading.Event()

    def killer() -> None:
        while not hold.exists():  # the victim is held mid-measurement
            if stop.wait(0.02):
                return
        h, p = hold.read_text().split()
        pid = int(p)
        # every result the victim's worker finished before is stored, and none is kept on it any more: killing it
        # loses none of them
        while not {x for w, x, y in cluster_helpers.read_audit(audit) if w == "end" and y == pid} \
                <= _stored_hashes(toy_dir / "k.db") or ev.client.has_what().get(address_of.get(pid)):
            if stop.wait(0.02):
                return
        os.kill(pid, signal.SIGKILL)
        killed.append((h, pid))

    t = threading.Thread(target=killer)
    t.start()
    try:
        reason, runner = _api_search(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "k.db", ev,
                                     budget=12, population=4, seed=2)
    finally:
        stop.set()
        t.join()
    assert reason == "budget" and killed
    victim_hash, victim_pid = killed[0]
    assert victim_pid in pids
    lines = cluster_helpers.read_audit(audit)
    # the victim was mid-measurement on the killed worker, then measured once, to the end, on another
    assert ("start", victim_hash, victim_pid) in lines and ("end", victim_hash, victim_pid) not in lines
    ends = [h for w, h, _ in lines if w == "end"]
    # each measured to the end exactly once (nothing finished was lost with the worker), stored once each
    assert len(ends) == len(set(ends)) == 12
    assert [p for w, h, p in lines if w == "end" and h == victim_hash] != [victim_pid]
    # the victim with its landscape verdict; the set of a run without a cluster
    assert sorted(ends) == sorted(runner.records)
    space = load_space(toy_dir / "toy_space.toml")
    _api_search(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "ref.db",
                ReplayEvaluator(toy_dir / "landscape.csv", space), budget=12, population=4, seed=2)
    assert _stored(toy_dir / "k.db") == _stored(toy_dir / "ref.db")


def test_a_candidate_that_kills_two_workers_is_a_poison_pill_and_the_search_goes_on(toy_dir: Path):
    space = load_space(toy_dir / "toy_space.toml")
    store = Store("sqlite://")
    settings = SearchSettings(strategy="random", budget=10, population=4, seed=7)
    rid = store.create_run(space_name=space.name, space_path="x", space_text=space.text, template=space.template,
                           template_sha256="t" * 64, config={}, seed=7, fingerprint={})
    runner = Runner(space=space, evaluator=ReplayEvaluator(toy_dir / "landscape.csv", space), store=store,
                    run=store.get_run(rid), settings=settings, out=toy_dir / "x.json")
    order = RandomSearch(runner).order()
    h = runner.hash_of
    poison = h(order[1])
    audit = toy_dir / "audit.log"
    ev = _audited(toy_dir, audit, workers=2, delay_s=0.05, poison=[poison])
    reason, runner = _api_search(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "p.db", ev,
                                 budget=10, population=4, seed=7)
    assert reason == "budget" and runner.evaluations == 10
    rec = runner.records[poison]
    assert rec.status == "runtime_error" and "poison pill: 2 cluster workers died" in rec.reason
    lines = cluster_helpers.read_audit(audit)
    starts = [p for w, x, p in lines if w == "start" and x == poison]
    assert len(starts) == 2 and len(set(starts)) == 2  # it ran on two workers and took both down
    # every other candidate has its landscape verdict, measured once
    landscape = ReplayEvaluator(toy_dir / "landscape.csv", space).landscape
    others = [r for r in runner.records.values() if r.hash != poison]
    assert len(others) == 9
    for r in others:
        assert r.status == landscape.lookup(r.params).status
    # each measured to the end (recorded once: the store has one row per hash). One that had just finished on a
    # worker the poison pill then took down can be measured again: its result went down with that worker
    ends = [x for w, x, _ in lines if w == "end"]
    assert set(ends) == {r.hash for r in others} and len(ends) <= len(others) + 2


# ---- the search process: kill -9 and resume; a lost scheduler ----------------------------------------------------
def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended early: {proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_kill_9_of_the_search_then_resume_measures_nothing_twice(toy_dir: Path, monkeypatch):
    log = toy_dir / "measured.log"
    env = _env(EVOENGINEER_REPLAY_DELAY_S="0.05", EVOENGINEER_REPLAY_LOG=str(log))
    common = ["--strategy", "ga", "--budget", "40", "--population", "8", "--seed", "5"]
    cmd = [sys.executable, "-m", "evoengineer", "search", "--space", "toy_space.toml", "--landscape",
           "landscape.csv", "--db", "sqlite:///k.db", "--out", "k.json", "--quiet", *common]
    proc = subprocess.Popen([*cmd, "--cluster", "local", "--cluster-workers", "2"], cwd=toy_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: stored_count(toy_dir / "k.db") >= 14, 120, "14 stored evaluations", proc)
    proc.kill()
    proc.wait(timeout=30)
    before = {h for h, _, _ in _stored(toy_dir / "k.db")}
    assert 14 <= len(before) < 40
    log.write_text("")
    r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///k.db", "--quiet"],
                       cwd=toy_dir, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    measured = [line.split()[0] for line in log.read_text().splitlines()]
    assert not set(measured) & before, "the resumed run measured a stored configuration again"
    assert len(measured) == len(set(measured)) == 40 - len(before)
    from test_async_search import _replays_exactly

    _replays_exactly(toy_dir, "ga", db="k.db")  # the resumed run is the run its proposal log describes
    doc = json.loads((toy_dir / "k.json").read_text())
    got = _stored(toy_dir / "k.db")
    assert doc["run_status"] == "finished" and len(got) == 40
    assert [e["hash"] for e in doc["elites"]] == [h for _, h in sorted((t, h) for h, st, t in got if st == "ok")[:3]]


def test_a_run_started_without_a_cluster_resumes_on_one_with_a_grown_default_population(toy_dir: Path, monkeypatch,
                                                                                       capsys):
    """`resume --cluster local` measures an interrupted plain run's remaining candidates on a cluster (same set as an
    uninterrupted run); and a new GA search on 4 workers without --population gets 15 (3 elites + 3 x 4)."""
    env = _env(EVOENGINEER_REPLAY_DELAY_S="0.05")
    common = ["--strategy", "random", "--budget", "30", "--population", "6", "--seed", "8"]
    proc = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", "--space", "toy_space.toml",
                             "--landscape", "landscape.csv", "--db", "sqlite:///r.db", "--out", "r.json", "--quiet",
                             *common], cwd=toy_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: stored_count(toy_dir / "r.db") >= 8, 120, "8 stored evaluations", proc)
    proc.kill()
    proc.wait(timeout=30)
    monkeypatch.chdir(toy_dir)
    assert main(["resume", "--db", "sqlite:///r.db", "--quiet", "--cluster", "local", "--cluster-workers", "2"]) == 0
    assert _search("--db", "sqlite:///ref.db", "--out", "ref.json", *common) == 0
    assert _stored(toy_dir / "r.db") == _stored(toy_dir / "ref.db")
    capsys.readouterr()
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///g.db",
                 "--out", "g.json", "--budget", "20", "--cluster", "local", "--cluster-workers", "4"]) == 0
    err = capsys.readouterr().err
    assert "population 15 for 4 GPU worker(s)" in err and "GPU busy" in err
    store = Store("sqlite:///g.db")
    try:
        (run,) = store.runs()
        assert run.config["population"] == 15 and run.config["cluster"]["workers"] == 4
    finally:
        store.close()


def _scheduler(port: int, env: dict, *tls: str) -> subprocess.Popen:
    """`dask scheduler` on 127.0.0.1 (its HTTP endpoint too), as the README starts it."""
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                             str(port), "--no-dashboard", "--dashboard-address", "127.0.0.1:0", *tls], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _workers(address: str, env: dict, n: int, *tls: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evoengineer", "worker", "--scheduler", address, "--simulate",
                             str(n), *tls], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_a_lost_scheduler_stops_the_search_with_one_line_and_resume_completes(toy_dir: Path, monkeypatch):
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = _env(EVOENGINEER_REPLAY_DELAY_S="0.1")
    sched, workers = _scheduler(port, env), _workers(address, env, 2)
    procs = [sched, workers]
    try:
        common = ["--strategy", "random", "--budget", "40", "--population", "6", "--seed", "4"]
        search = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", "--space", "toy_space.toml",
                                   "--landscape", "landscape.csv", "--db", "sqlite:///s.db", "--out", "s.json",
                                   "--quiet", "--cluster", address, *common], cwd=toy_dir, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(search)
        _wait_for(lambda: stored_count(toy_dir / "s.db") >= 8, 120, "8 stored evaluations", search)
        sched.kill()
        t0 = time.monotonic()
        _, err = search.communicate(timeout=90)
        assert search.returncode == 2, err
        assert time.monotonic() - t0 < 30
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert f"lost the Dask scheduler at {address}" in lines[0]
        assert "resume with: python -m evoengineer resume --db sqlite:///s.db --run 1" in lines[0]
        status, why = _run_status(toy_dir / "s.db")
        assert status == "interrupted" and "scheduler" in why
        before = _stored(toy_dir / "s.db")
        assert 8 <= len(before) < 40
        _stop(workers)
        # the scheduler comes back at the same address; resume finds it from the run's settings
        sched, workers = _scheduler(port, env), _workers(address, env, 2)
        procs += [sched, workers]
        r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///s.db", "--quiet"],
                           cwd=toy_dir, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        after = _stored(toy_dir / "s.db")
        assert set(before) <= set(after) and len(after) == 40
        monkeypatch.chdir(toy_dir)
        monkeypatch.setenv("EVOENGINEER_REPLAY_DELAY_S", "0")
        assert _search("--db", "sqlite:///ref.db", "--out", "ref.json", *common) == 0
        assert after == _stored(toy_dir / "ref.db")
    finally:
        _stop(*procs)


# ---- real builds and measurements through a local cluster (CPU) ---------------------------------------------------
@pytest.mark.slow
def test_real_builds_and_planted_faults_through_a_local_cluster(faults_dir: Path, build_cache: Path, monkeypatch):
    """The faults family's first five configurations (grid order): built on the cluster's build worker, measured by
    two simulated GPU workers in the isolated, replaceable measuring subprocess: a hang is a timeout, a crash a
    runtime_error with its signal, and the Dask workers live on (no poison pill)."""
    monkeypatch.chdir(faults_dir)
    rc = main(["search", "--space", "faults_space.toml", "--db", "sqlite:///f.db", "--out", "elite.json",
               "--strategy", "grid", "--population", "5", "--budget", "5", "--cache-dir", str(build_cache),
               "--cluster", "local", "--cluster-workers", "2", "--quiet"])
    assert rc == 0
    store = Store(f"sqlite:///{faults_dir / 'f.db'}")
    (run,) = store.runs()
    got = {(c.params["FAULT"], c.params["D_VEC"]): c for c in store.candidates(run.id)}
    want = {("none", 4): "ok", ("none", 8): "ok", ("hang", 4): "timeout", ("segfault", 4): "runtime_error",
            ("abort", 4): "runtime_error"}
    assert {k: c.status for k, c in got.items()} == want, {k: (c.status, c.reason) for k, c in got.items()}
    assert "SIGSEGV" in got[("segfault", 4)].reason and "SIGABRT" in got[("abort", 4)].reason
    for c in got.values():
        assert "poison" not in c.reason and "build_s" in c.metrics
    ok = got[("none", 4)].metrics
    assert ok["time_us"] > 0 and ok["max_abs_err"] < 1e-4 and ok["measure_s"] > 0
    doc = json.loads((faults_dir / "elite.json").read_text())
    assert doc["evaluator"]["kind"] == "dask" and doc["evaluator"]["inner"]["kind"] == "local"
    assert {e["params"]["FAULT"] for e in doc["elites"]} == {"none"}
    store.close()


# ---- TLS: certificates as the README makes them ------------------------------------------------------------------
def _certificates(d: Path) -> list[str]:
    """The README's openssl commands: a CA, and one key and certificate it signed for every member."""
    def run(*cmd: str) -> None:
        subprocess.run(cmd, cwd=d, check=True, capture_output=True)

    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-subj", "/CN=evoengineer-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=evoengineer", "-keyout", "node.key",
        "-out", "node.csr")
    run("openssl", "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "365", "-out", "node.pem")
    return ["--tls-ca-file", str(d / "ca.pem"), "--tls-cert", str(d / "node.pem"), "--tls-key", str(d / "node.key")]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_tls_scheduler_with_certificates_works(toy_dir: Path, tmp_path: Path, monkeypatch):
    tls = _certificates(tmp_path)
    port = _free_port()
    address = f"tls://127.0.0.1:{port}"
    env = _env(EVOENGINEER_REPLAY_DELAY_S="0")
    sched = _scheduler(port, env, "--protocol", "tls", *tls)
    workers = _workers(address, env, 2, *tls)
    try:
        monkeypatch.chdir(toy_dir)
        common = ["--strategy", "random", "--budget", "12", "--population", "6"]
        assert _search("--db", "sqlite:///t.db", "--out", "t.json", "--cluster", address, *tls, *common) == 0
        assert _search("--db", "sqlite:///ref.db", "--out", "ref.json", *common) == 0
        assert _stored(toy_dir / "t.db") == _stored(toy_dir / "ref.db")
        with pytest.raises(UserError, match="tls:// needs"):  # without the certificates it is not even tried
            check_address(address, None)
    finally:
        _stop(sched, workers)
