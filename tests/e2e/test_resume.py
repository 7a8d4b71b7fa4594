"""Interrupt a real search subprocess (SIGKILL at several points, Ctrl-C) and resume it: the end state must equal
an uninterrupted run with the same seed: same evaluated set, same elites, byte-identical elite.json."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stored_count as _count

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ["--seed", "7", "--population", "12", "--generations", "30", "--budget", "90"]


def _env(delay: float) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["EVOENGINEER_REPLAY_DELAY_S"] = str(delay)
    return env


def _cli(args, cwd: Path, delay: float = 0.0, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evoengineer", *args], cwd=cwd, env=_env(delay),
                          capture_output=True, text=True, timeout=300, **kw)


def _evaluated(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("select hash from candidates where run_id = 1")}
    finally:
        con.close()


def _elites(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [r[0] for r in con.execute("select c.hash from elites e join candidates c on c.id = e.candidate_id "
                                          "where e.run_id = 1 order by e.rank")]
    finally:
        con.close()


def _start_and_signal(toy: Path, db: Path, after: int, sig: int) -> subprocess.Popen:
    """Start a search and send `sig` once `after` evaluations are committed."""
    proc = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", "--space", "toy_space.toml",
                             "--landscape", "landscape.csv", "--db", f"sqlite:///{db.name}", "--out",
                             f"{db.stem}.json",
                             *SEARCH], cwd=toy, env=_env(0.02), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while _count(db) < after:
        assert proc.poll() is None, f"search ended before {after} evaluations: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc


@pytest.fixture(scope="module")
def shared_toy(tmp_path_factory) -> Path:
    """One folder for every run here (elite.json names the space and landscape files by absolute path);
    each test uses its own database and elite file in it."""
    from conftest import DATA, write_toy_landscape
    from evoengineer.space import load_space
    import shutil

    d = tmp_path_factory.mktemp("toy")
    for name in ("toy_space.toml", "toy.cpp.j2"):
        shutil.copy(DATA / name, d / name)
    write_toy_landscape(load_space(d / "toy_space.toml"), d / "landscape.csv")
    return d


@pytest.fixture(scope="module")
def reference_run(shared_toy: Path) -> dict:
    """One uninterrupted run of the same search."""
    d = shared_toy
    r = _cli(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///ref.db",
              "--out", "ref.json", *SEARCH], d)
    assert r.returncode == 0, r.stderr
    return {"evaluated": _evaluated(d / "ref.db"), "elites": _elites(d / "ref.db"),
            "elite_json": (d / "ref.json").read_text()}


@pytest.mark.parametrize("kill_points", [[3], [12], [13], [40], [20, 55], [89]])
def test_sigkill_then_resume_equals_uninterrupted(shared_toy: Path, reference_run: dict, kill_points: list[int]):
    toy_dir = shared_toy
    db = toy_dir / f"kill_{'_'.join(map(str, kill_points))}.db"
    for i, point in enumerate(kill_points):
        if i == 0:
            proc = _start_and_signal(toy_dir, db, point, signal.SIGKILL)
        else:  # kill the resumed process too
            proc = subprocess.Popen([sys.executable, "-m", "evoengineer", "resume", "--db", f"sqlite:///{db.name}"],
                                    cwd=toy_dir, env=_env(0.02), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            while _count(db) < point:
                assert proc.poll() is None
                time.sleep(0.005)
            proc.kill()
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert _count(db) < 90, "the kill came too late to interrupt anything"
    r = _cli(["resume", "--db", f"sqlite:///{db.name}"], toy_dir)
    assert r.returncode == 0, r.stderr
    assert _evaluated(db) == reference_run["evaluated"]
    assert _elites(db) == reference_run["elites"]
    assert (toy_dir / f"{db.stem}.json").read_text() == reference_run["elite_json"]
    again = _cli(["resume", "--db", f"sqlite:///{db.name}"], toy_dir)
    assert again.returncode == 2 and "no unfinished run" in again.stderr


def test_ctrl_c_stops_cleanly_and_prints_resume(shared_toy: Path, reference_run: dict):
    toy_dir = shared_toy
    db = toy_dir / "ctrlc.db"
    proc = _start_and_signal(toy_dir, db, 30, signal.SIGINT)
    err = proc.stderr.read()
    assert proc.returncode == 130, err
    assert "python -m evoengineer resume --db sqlite:///ctrlc.db --run 1" in err
    con = sqlite3.connect(db)
    assert con.execute("select status from runs where id = 1").fetchone()[0] == "interrupted"
    con.close()
    r = _cli(["resume", "--db", "sqlite:///ctrlc.db", "--run", "1"], toy_dir)
    assert r.returncode == 0, r.stderr
    assert _evaluated(db) == reference_run["evaluated"]
    assert (toy_dir / "ctrlc.json").read_text() == reference_run["elite_json"]
