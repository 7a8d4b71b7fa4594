"""Issue 15's findings, one test each: one process drives a run (leases), a store created by two processes at
once, no 0-byte database, one-line usage errors, elite/population sanity, stray temp files, the grid's last
generation, full disks and damaged state. Races run as real concurrent processes."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


def _count(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("select count(*) from candidates").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- one writer per run ------------------------------------------------------------------------------------------
def test_a_second_resume_refuses_while_the_first_drives_then_takes_over_a_dead_one(toy_dir: Path):
    db = toy_dir / "s.db"
    first = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", *SEARCH, "--db", "sqlite:///s.db",
                              "--quiet"], cwd=toy_dir, env=_env(0.05), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _count(db) < 5:
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
