"""Issue 15's findings, one test each: one process drives a run (leases), a store created by two processes at
once, no 0-byte database, one-line usage errors, elite/population sanity, stray temp files, the grid's last
generation, full disks and damaged state. Races run as real concurrent processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stored_count as _count

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ["--space", "toy_space.toml", "--landscape", "landscape.csv", "--seed", "3", "--population", "12",
          "--budget", "60"]


def _env(delay: float = 0.0) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["EVOENGINEER_REPLAY_DELAY_S"] = str(delay)
    return env


def _cli(args, cwd: Path, delay: float = 0.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evoengineer", *args], cwd=cwd, env=_env(delay),
                          capture_output=True, text=True, timeout=300)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- one writer per run ------------------------------------------------------------------------------------------
def _lease_holder(db: Path) -> int | None:
    """The pid holding run 1's lease in a store another process is writing (None while there is none)."""
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            row = con.execute("select pid from leases where run_id = 1").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def test_a_second_resume_refuses_while_the_first_drives_then_takes_over_a_dead_one(toy_dir: Path):
    """Events, not timings: the first run's measurements take an hour (a replay delay of a minute each; it is
    killed), so it drives the run however slowly the second starts."""
    db = toy_dir / "s.db"
    first = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", *SEARCH, "--db", "sqlite:///s.db",
                              "--quiet"], cwd=toy_dir, env=_env(60), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _lease_holder(db) != first.pid:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = _cli(["resume", "--db", "sqlite:///s.db", "--run", "1"], toy_dir)
        assert second.returncode == 2
        line = _one_line(second.stderr)
        assert f"pid {first.pid}" in line and socket.gethostname() in line and "run 1" in line
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    n = _count(db)
    third = _cli(["resume", "--db", "sqlite:///s.db", "--run", "1", "--quiet"], toy_dir)  # the holder is dead
    assert third.returncode == 0, third.stderr
    con = sqlite3.connect(db)
    assert con.execute("select status from runs where id = 1").fetchone()[0] == "finished"
    assert con.execute("select count(*) from candidates").fetchone()[0] == 60 > n
    assert con.execute("select count(*) from leases").fetchone()[0] == 0  # released at the end
    con.close()


def test_a_silent_lease_on_another_host_is_taken_over_a_fresh_one_is_not(tmp_path: Path):
    from evoengineer.store import Store, StoreError

    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    rid = store.create_run(space_name="x", space_path="", space_text="", template="", template_sha256="",
                           config={}, seed=0, fingerprint={})
    token = store.acquire_lease(rid)
    con = sqlite3.connect(tmp_path / "l.db")
    con.execute("update leases set host = 'gpu-node-7', pid = 4242, token = 'theirs', heartbeat = ?", (time.time(),))
    con.commit()
    with pytest.raises(StoreError, match="pid 4242 on gpu-node-7"):
        store.acquire_lease(rid, stale_after_s=60)
    assert not store.heartbeat(rid, token)  # ours was taken: the heartbeat says so
    con.execute("update leases set heartbeat = ?", (time.time() - 120,))
    con.commit()
    mine = store.acquire_lease(rid, stale_after_s=60)
    assert store.lease_holder(rid)["host"] == socket.gethostname() and store.heartbeat(rid, mine)
    con.close()


def _create_and_add_a_run(url: str, start: float) -> str:
    from evoengineer.store import Store

    while time.time() < start:
        time.sleep(0.001)
    try:
        s = Store(url)
        s.create_run(space_name="x", space_path="", space_text="", template="", template_sha256="", config={},
                     seed=0, fingerprint={})
        s.close()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reports what failed
        return f"{type(exc).__name__}: {exc}"


def test_processes_creating_one_new_store_at_once_all_succeed(tmp_path: Path):
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        url = f"sqlite:///{tmp_path / f'race{attempt}.db'}"
        start = time.time() + 2.0
        with ctx.Pool(8) as pool:
            results = pool.starmap(_create_and_add_a_run, [(url, start)] * 8)
        assert results == ["ok"] * 8, results
        con = sqlite3.connect(tmp_path / f"race{attempt}.db")
        assert con.execute("select count(*) from runs").fetchone()[0] == 8
        assert con.execute("select value from schema_info").fetchall() == [("1",)]
        con.close()


def test_store_creation_retries_a_wal_switch_that_sqlite_refuses_at_once(tmp_path: Path, monkeypatch):
    """SQLite answers "database is locked" to the WAL switch at once (no busy wait) when it would deadlock with a
    concurrent creator (seen in CI: 8 processes creating one store on a loaded machine); creation retries it."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    from evoengineer.store import store as store_mod

    real = store_mod.create_engine
    refused = []

    def engine_refusing_wal_twice(*a, **k):
        engine = real(*a, **k)

        @event.listens_for(engine, "before_cursor_execute")
        def refuse(conn, cursor, statement, *rest):
            if statement.startswith("PRAGMA journal_mode=WAL") and len(refused) < 2:
                refused.append(statement)
                raise OperationalError(statement, {}, sqlite3.OperationalError("database is locked"))

        return engine

    monkeypatch.setattr(store_mod, "create_engine", engine_refusing_wal_twice)
    s = store_mod.Store(f"sqlite:///{tmp_path / 'wal.db'}")
    s.close()
    assert len(refused) == 2
    con = sqlite3.connect(tmp_path / "wal.db")
    assert con.execute("pragma journal_mode").fetchone()[0] == "wal"
    assert con.execute("select value from schema_info").fetchall() == [("1",)]


def test_a_store_that_cannot_be_created_leaves_no_file(tmp_path: Path, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from evoengineer.store import Store, StoreError
    from evoengineer.store import models

    def full(*a, **k):
        raise OperationalError("CREATE TABLE runs", {}, sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(models.Base.metadata, "create_all", full)
    with pytest.raises(StoreError, match="disk is full"):
        Store(f"sqlite:///{tmp_path / 'new.db'}")
    assert list(tmp_path.iterdir()) == []


# ---- command line ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [(["search", "--budget", "-1"], ["--budget", "must be >= 0"]),
                                         (["search", "--seed", "abc"], ["--seed", "abc"]),
                                         (["resume", "--run"], ["--run"])])
def test_usage_errors_are_one_line(tmp_path: Path, args, words):
    r = _cli(args, tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    line = _one_line(r.stderr)
    assert all(w in line for w in words) and "--help" in line


def _claim_holder(lock: Path) -> int | None:
    """The pid in an elite.json claim (None while there is none, or it is being written)."""
    import json

    try:
        return json.loads(lock.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None


def test_two_runs_cannot_write_one_elite_json_and_stray_temp_files_go(toy_dir: Path):
    """Events, not timings: the first run's measurements take an hour (a replay delay of a minute each; it is
    killed), so it holds its claim on elite.json however slowly the second starts."""
    (toy_dir / ".elite.json.abc123.tmp").write_text("half")  # left by a writer killed mid-write
    first = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", *SEARCH, "--db", "sqlite:///a.db",
                              "--quiet"], cwd=toy_dir, env=_env(60), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # the first run claimed elite.json (and removed the stray temp file when it did)
        while _claim_holder(toy_dir / ".elite.json.lock") != first.pid \
                or (toy_dir / ".elite.json.abc123.tmp").exists():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = _cli(["search", *SEARCH, "--db", "sqlite:///b.db", "--quiet"], toy_dir)
        assert second.returncode == 2
        line = _one_line(second.stderr)
        assert "elite.json" in line and f"pid {first.pid}" in line and "run 1" in line
    finally:
        first.kill()
        first.wait(timeout=60)
    # the holder died: its claim is taken over
    third = _cli(["search", *SEARCH, "--db", "sqlite:///b.db", "--quiet"], toy_dir)
    assert third.returncode == 0, third.stderr
    assert not list(toy_dir.glob(".elite.json.*"))


def test_a_grid_run_ends_with_its_last_generation(toy_dir: Path):
    import json

    r = _cli(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--strategy", "grid",
              "--population", "1000", "--budget", "2500", "--db", "sqlite:///g.db", "--quiet"], toy_dir)
    assert r.returncode == 0, r.stderr
    doc = json.loads((toy_dir / "elite.json").read_text())
    con = sqlite3.connect(toy_dir / "g.db")
    last = con.execute("select max(generation) from candidates").fetchone()[0]
    con.close()
    assert doc["generation"] == last == 2  # 2500 evaluations in batches of 1000: generations 0, 1, 2


def test_replay_log_that_is_a_folder_is_one_line(toy_dir: Path):
    env = _env()
    env["EVOENGINEER_REPLAY_LOG"] = str(toy_dir)
    r = subprocess.run([sys.executable, "-m", "evoengineer", "search", *SEARCH, "--db", "sqlite:///s.db"],
                       cwd=toy_dir, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "EVOENGINEER_REPLAY_LOG" in _one_line(r.stderr)


# ---- full disks and damaged state --------------------------------------------------------------------------------
def test_a_store_that_fills_up_mid_run_stops_with_one_line_and_resumes(toy_dir: Path, monkeypatch, capsys):
    from sqlalchemy.exc import OperationalError

    from evoengineer.cli import main
    from evoengineer.store import Store

    real = Store.record_candidate
    calls = {"n": 0}

    def fills_up(self, run_id, rec):
        calls["n"] += 1
        if calls["n"] > 20:
            raise OperationalError("INSERT INTO candidates", {}, sqlite3.OperationalError("database or disk is full"))
        return real(self, run_id, rec)

    monkeypatch.chdir(toy_dir)
    monkeypatch.setattr(Store, "record_candidate", fills_up)
    args = [*SEARCH, "--db", "sqlite:///f.db", "--quiet"]
    assert main(["search", *args]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "database or disk is full" in line and "resume" in line and "run 1" in line
    con = sqlite3.connect(toy_dir / "f.db")
    assert con.execute("select status, count(*) from runs").fetchone() == ("interrupted", 1)
    con.close()
    monkeypatch.setattr(Store, "record_candidate", real)  # space freed
    assert main(["resume", "--db", "sqlite:///f.db", "--quiet"]) == 0
    con = sqlite3.connect(toy_dir / "f.db")
    assert con.execute("select status from runs").fetchone() == ("finished",)
    assert con.execute("select count(*) from candidates").fetchone() == (60,)
    con.close()


def test_a_store_too_full_to_record_the_stop_stays_running_and_resumes(toy_dir: Path, monkeypatch, capsys):
    """Once even the run's status cannot be written (a real full disk), the run stays `running` (README): one line,
    exit 1, and `resume` continues it once there is space."""
    from sqlalchemy.exc import OperationalError

    from evoengineer.cli import main
    from evoengineer.store import Store

    real_record, real_status, real_release = Store.record_candidate, Store.set_run_status, Store.release_lease
    calls = {"n": 0}

    def disk_full(*a, **k):
        raise OperationalError("UPDATE", {}, sqlite3.OperationalError("database or disk is full"))

    def fills_up(self, run_id, rec):
        calls["n"] += 1
        if calls["n"] > 20:
            monkeypatch.setattr(Store, "set_run_status", disk_full)  # from now on nothing more can be written
            monkeypatch.setattr(Store, "release_lease", disk_full)
            disk_full()
        return real_record(self, run_id, rec)

    monkeypatch.chdir(toy_dir)
    monkeypatch.setattr(Store, "record_candidate", fills_up)
    assert main(["search", *SEARCH, "--db", "sqlite:///g.db", "--quiet"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "database or disk is full" in line and "resume" in line
    con = sqlite3.connect(toy_dir / "g.db")
    assert con.execute("select status from runs").fetchone() == ("running",)
    con.close()
    for name, fn in (("record_candidate", real_record), ("set_run_status", real_status),
                     ("release_lease", real_release)):
        monkeypatch.setattr(Store, name, fn)  # space freed
    assert main(["resume", "--db", "sqlite:///g.db", "--quiet"]) == 0
    con = sqlite3.connect(toy_dir / "g.db")
    assert con.execute("select status, (select count(*) from candidates) from runs").fetchone() == ("finished", 60)
    con.close()


def test_elite_json_on_a_full_disk_keeps_the_old_file(toy_dir: Path, monkeypatch, capsys):
    import errno

    from evoengineer import elite_json
    from evoengineer.cli import main

    monkeypatch.chdir(toy_dir)
    assert main(["search", *SEARCH, "--db", "sqlite:///e.db", "--budget", "24", "--quiet"]) == 0
    old = (toy_dir / "elite.json").read_text()

    def full(path, doc):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(elite_json, "write_atomic", full)
    assert main(["search", *SEARCH, "--db", "sqlite:///e.db", "--quiet", "--force"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "No space left on device" in line and "resume" in line
    assert (toy_dir / "elite.json").read_text() == old


def test_a_tampered_proposal_log_is_named_and_from_scratch_recovers(toy_dir: Path, monkeypatch, capsys):
    """A resume replays the run's proposal log; a log the strategy does not reproduce (tampered, or another version
    of the strategy) is refused with one line naming --from-scratch, which then finishes the run."""
    from evoengineer.cli import main

    monkeypatch.chdir(toy_dir)
    first = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", *SEARCH, "--db", "sqlite:///c.db",
                              "--quiet"], cwd=toy_dir, env=_env(0.02), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _count(toy_dir / "c.db") < 30:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    first.kill()
    first.wait(timeout=60)
    con = sqlite3.connect(toy_dir / "c.db")
    con.execute("update proposals set hash = 'f' || substr(hash, 2) where seq = 20")
    con.commit()
    capsys.readouterr()
    assert main(["resume", "--db", "sqlite:///c.db", "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "run 1" in line and "proposal 21" in line and "--from-scratch" in line
    stored = con.execute("select count(*) from candidates").fetchone()[0]
    assert main(["resume", "--db", "sqlite:///c.db", "--quiet", "--from-scratch"]) == 0
    assert con.execute("select status from runs").fetchone() == ("finished",)
    assert con.execute("select count(*) from candidates").fetchone()[0] == 60 >= stored
    con.close()


def test_population_and_elite_sanity(toy_dir: Path):
    r = _cli(["search", *SEARCH, "--db", "sqlite:///p.db", "--population", "100"], toy_dir)  # budget 60
    assert r.returncode == 2 and "--population 100 is larger than --budget 60" in _one_line(r.stderr)
    r = _cli(["search", *SEARCH, "--db", "sqlite:///p.db", "--population", "20", "--elite", "15", "--budget", "40"],
             toy_dir)
    assert r.returncode == 0, r.stderr
    warning = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "--elite 15 of --population 20" in warning[0]


_POOL_OWNER = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from evoengineer.liveness import exit_with_parent

def pids():
    return os.getpid(), os.getppid()

if __name__ == "__main__":
    # as the builder makes its pool: forked from a fork server, each process watching its parent (builder_init)
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"), initializer=exit_with_parent,
                               initargs=(0.05,))
    worker, server = pool.submit(pids).result()
    print(worker, server, flush=True)
    time.sleep(600)
"""


def test_a_killed_pool_owner_leaves_no_fork_server_pool_process_or_resource_tracker(tmp_path: Path):
    """The builder pool's processes are children of multiprocessing's fork server, which outlives the pool's owner
    (a search killed with -9): they watch the owner itself, so the server, they and the resource tracker all end
    (the test suite used to leave such orphans behind)."""
    import psutil

    (tmp_path / "owner.py").write_text(_POOL_OWNER)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py")], cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        worker, server = (int(x) for x in owner.stdout.readline().split())
        helpers = psutil.Process(owner.pid).children(recursive=True)
        what = {p.pid: " ".join(p.cmdline())[:120] for p in helpers}
        assert {worker, server} <= set(what)
        assert any("resource_tracker" in c for c in what.values())
    finally:
        owner.kill()
        owner.wait(timeout=60)
    gone, alive = psutil.wait_procs(helpers, timeout=60)  # a limit for a broken build only: they end at once
    for p in alive:
        p.kill()
    assert not alive, [what[p.pid] for p in alive]
