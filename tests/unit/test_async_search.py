"""The asynchronous search: kill -9 at random points of runs whose results arrive out of order (replayed builds of
different lengths on several slots), then resume; the proposal log replays exactly, nothing is measured twice, the
budget is spent exactly."""

from __future__ import annotations

import csv
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import stored_count
from test_ga import toy  # noqa: F401  (the toy space and its landscape, shared)
from evoengineer.cli import main
from evoengineer.evaluators.replay import ReplayEvaluator
from evoengineer.search import STRATEGIES, Runner, SearchSettings
from evoengineer.search.loop import SearchLoop
from evoengineer.space import load_space
from evoengineer.store import Store

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 60


def _with_build_times(toy: Path, work: Path) -> None:
    """The toy landscape with a build_s column of different lengths (5-60 ms): results arrive out of order."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("toy_space.toml", "toy.cpp.j2"):
        (work / name).write_bytes((toy / name).read_bytes())
    with open(toy / "landscape.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(7)
    for r in rows:
        r["build_s"] = f"{rng.uniform(0.005, 0.06):.4f}"
    with open(work / "landscape.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["EVOENGINEER_REPLAY_BUILDS"] = "4xrecorded"  # 4 slots, the landscape's build times: 6 in flight
    env["EVOENGINEER_REPLAY_DELAY_S"] = "0.01"
    env["EVOENGINEER_REPLAY_LOG"] = "measured.log"
    return env


def _replays_exactly(work: Path, strategy: str, db: str = "s.db") -> None:
    """A fresh strategy fed the run's whole history proposes exactly what the log says it proposed."""
    store = Store(f"sqlite:///{work / db}")
    (run,) = store.runs()
    space = load_space(work / "toy_space.toml")
    cfg = run.config
    settings = SearchSettings(**{k: cfg[k] for k in ("strategy", "population", "generations", "elite", "budget",
                                                      "seed")}, sampler=cfg.get("sampler"))
    runner = Runner(space=space, evaluator=ReplayEvaluator(work / "landscape.csv", space), store=store, run=run,
                    settings=settings, out=work / "check.json")
    loop = SearchLoop(runner, STRATEGIES[strategy](runner))
    loop._replay()  # raises if any proposal differs
    assert loop.seq == len(store.proposals(run.id)) and not loop.in_flight
    store.close()


@pytest.mark.parametrize("strategy,seed", [("ga", 1), ("ga", 2), ("random", 3), ("optuna", 4), ("surrogate", 5)])
def test_kill_9_at_random_points_then_resume(toy: Path, tmp_path: Path, strategy: str, seed: int):
    work = tmp_path / "w"
    _with_build_times(toy, work)
    rng = random.Random(seed)
    args = ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
            "--strategy", strategy, "--seed", str(seed), "--population", "8", "--budget", str(BUDGET), "--quiet"]
    kills = 0
    for _ in range(3):  # three kills at random points, each followed by a resume that is killed again
        cmd = args if kills == 0 else ["resume", "--db", "sqlite:///s.db", "--quiet"]
        proc = subprocess.Popen([sys.executable, "-m", "evoengineer", *cmd], cwd=work, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        target = stored_count(work / "s.db") + rng.randint(3, 12)
        deadline = time.monotonic() + 120
        while stored_count(work / "s.db") < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
    assert kills >= 1
    done = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///s.db", "--quiet"],
                          cwd=work, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    con = sqlite3.connect(work / "s.db")
    rows = con.execute("select hash, status from candidates order by seq").fetchall()
    hashes = [h for h, _ in rows]
    built = {h for h, status in rows if status not in ("compile_error", "gate_failed", "build_error", "link_error")}
    assert con.execute("select status from runs").fetchone() == ("finished",)
    logged = [h for (h,) in con.execute("select hash from proposals order by seq")]
    con.close()
    assert len(hashes) == len(set(hashes)) == BUDGET  # the budget, spent exactly, nothing stored twice
    assert set(logged) == set(hashes)  # every proposal measured; only proposals measured
    measured = (work / "measured.log").read_text().split()[::2]
    # (a build failure is not measured) a measurement in flight at a kill is measured again on resume
    assert set(measured) == built and len(measured) - len(set(measured)) <= 6 * kills
    _replays_exactly(work, strategy)


def test_a_resume_of_a_finished_history_proposes_nothing_new(toy: Path, tmp_path: Path, monkeypatch):
    """A run that finished in process replays its log into a fresh strategy without a difference."""
    work = tmp_path / "w"
    _with_build_times(toy, work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("EVOENGINEER_REPLAY_BUILDS", "4xrecorded")
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///s.db",
                 "--seed", "9", "--population", "8", "--budget", "40", "--quiet"]) == 0
    _replays_exactly(work, "ga")
