"""Planted cheats on the CPU: each is rejected (naming what was detected) or timed at its honest cost, and an honest
kernel measured right after it gets its own time (tests/data/cheats_cpu; the GPU cheats: test_gpu_integrity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoengineer.evaluators.worker import Session
from evoengineer.space import load_space

DATA = Path(__file__).parents[1] / "data"

#: cheat -> (status, words in the reason)
CHEATS = {
    "omp_threads": ("state_changed", "OpenMP (libgomp.so.1) max threads"),
    "ftz": ("state_changed", "floating-point environment: flush-to-zero False -> True"),
    "ftz_team": ("state_changed", "floating-point environment of OpenMP threads"),
    "rounding": ("state_changed", "floating-point environment: rounding 'nearest' -> 'up'"),
    "setenv": ("state_changed", "environment variable OMP_NUM_THREADS None -> '1'"),
    "affinity": ("state_changed", "CPU affinity of thread"),
    "memo_ptr": ("wrong", "returned the output of input set"),
    "memo_content": ("implausible", "calls on inputs it had not seen took"),
    "spin_thread": ("state_changed", "threads left running"),
}


@pytest.fixture(scope="module")
def cheats(tmp_path_factory, build_cache):
    from conftest import planted_cheats

    ev, honest, planted = planted_cheats(tmp_path_factory.mktemp("cheats") / "cheats_cpu", build_cache,
                                         [*CHEATS, "late_thread"], WORK=2)
    yield ev, honest, planted
    ev.close()


@pytest.mark.slow
def test_each_cheat_is_named_and_the_honest_kernel_after_it_keeps_its_time(cheats):
    ev, honest, planted = cheats
    assert ev.evaluate(honest).status == "ok"  # a fresh worker's first candidate: its team and caches warm up
    firsts = [ev.evaluate(honest) for _ in range(2)]
    assert all(b.status == "ok" for b in firsts), firsts
    assert {"state", "sentinel", "honesty"} <= set(firsts[0].metrics["worker_s"])
    shape = next(iter(firsts[0].metrics["shapes"].values()))  # what the new-input check did and cost
    assert shape["novel_rounds"] in (1, 2) and shape["novel_late"] == 0 and shape["novel_s"] > 0
    before = min(b.time_us for b in firsts)  # the honest kernel's time right before the next cheat
    for cheat, (status, words) in CHEATS.items():
        # the timing-based verdicts (memo_content: calls on new inputs slower) can miss under a loaded machine's
        # noise once: such a cheat is evaluated again (up to three times)
        for _ in range(3):
            m = ev.evaluate(planted[cheat])
            if m.status == status:
                break
        assert m.status == status and words in m.reason, (cheat, m.status, m.reason)
        # the honest kernel right after it, against its time right before it: within the noise (the poisoners slow
        # it 2x-12x when not undone, and keep slowing every call); a measurement the load spoiled is taken again,
        # up to three in all, and the best counts (compared with the one before the cheat, drift of the machine's
        # load over the whole test does not count)
        times = []
        for _ in range(3):
            after = ev.evaluate(honest)
            assert after.status == "ok", (cheat, after)
            assert not after.metrics.get("state_changes"), (cheat, after.metrics.get("state_changes"))
            times.append(after.time_us)
            if 0.6 < min(times) / before < 1.5:
                break
        assert 0.6 < min(times) / before < 1.5, (cheat, before, times)
        before = min(times)


def test_a_thread_left_running_replaces_the_worker_and_restorable_state_does_not(cheats):
    ev, honest, planted = cheats
    assert ev.evaluate(honest).status == "ok"
    n = len(ev.replaced)
    assert ev.evaluate(planted["omp_threads"]).status == "state_changed"
    assert ev.evaluate(honest).status == "ok"
    assert not any("OpenMP" in r for r in ev.replaced[n:]), ev.replaced  # undone in place
    assert ev.evaluate(planted["spin_thread"]).status == "state_changed"
    started = ev.workers_started
    assert ev.evaluate(honest).status == "ok"
    # cannot be undone: the worker was replaced, the next candidate measured in a fresh one
    assert any("threads left running" in r for r in ev.replaced[n:]), ev.replaced
    assert ev.worker is not None and ev.workers_started >= started


def test_work_finished_by_a_thread_after_the_call_returned(cheats):
    ev, honest, planted = cheats
    m = ev.evaluate(planted["late_thread"])
    # the thread writes into an output the worker may already have freed: caught by the check, or the worker's heap
    # breaks and the worker dies with the candidate (a rejection too; the honest kernel after it gets a fresh worker)
    assert m.status in ("wrong", "state_changed", "runtime_error"), m
    assert any(w in m.reason for w in ("NaN/Inf", "unwritten", "threads left running", "differ", "worker killed")), \
        m.reason
    assert ev.evaluate(honest).status == "ok"


def test_the_guard_restores_what_it_records():
    """StateGuard alone: OpenMP team size, the calling thread's FP environment and an environment variable,
    changed from Python, are reported and put back."""
    import ctypes

    import torch

    from evoengineer.evaluators.process_state import StateGuard

    g = StateGuard("cpu")
    n = torch.get_num_threads()
    libc = ctypes.CDLL(None)
    torch.set_num_threads(max(1, n - 1) if n > 1 else 2)
    libc.fesetround(0x800)  # FE_UPWARD on x86-64
    libc.setenv(b"EVO_GUARD_TEST", b"1", 1)
    try:
        # (threads a busy test process starts meanwhile are not this test's business)
        changes = [c for c in g.check() if c.what != "threads left running"]
    finally:
        libc.fesetround(0)
        libc.unsetenv(b"EVO_GUARD_TEST")
        torch.set_num_threads(n)
    text = "; ".join(str(c) for c in changes)
    assert "max threads" in text or "torch intra-op threads" in text, text
    assert "rounding 'nearest' -> 'up'" in text and "EVO_GUARD_TEST None -> '1'" in text, text
    assert all(c.restored for c in changes), text
    assert torch.get_num_threads() == n and libc.fegetround() == 0
    assert [c for c in g.check() if c.what != "threads left running"] == []


def test_physics_gate_rejects_a_time_no_cpu_reaches():
    from evoengineer.evaluators.physics import PhysicsGate

    gate = PhysicsGate("cpu", l2_flush=False)
    gate.prepare(8 << 20)
    assert gate.verdict(time_us=1e6, min_bytes=8 << 20, flops=0) is None
    why = gate.verdict(time_us=0.01, min_bytes=8 << 20, flops=0)
    assert why and "measured copy" in why


def test_session_reports_what_it_measures_with():
    space = load_space(DATA / "cheats_cpu" / "cheats_space.toml")
    s = Session({"space_text": space.text, "space_path": str(space.path), "seed": 1})
    hello = s.hello()
    tolerance = hello["sentinel"]["tolerance"]
    assert hello["ok"] and set(hello["sentinel"]["us"]) >= {"torch"} and min(tolerance.values()) >= 0.3
    assert hello["state"]["fenv"]["rounding"] == "nearest" and hello["state"]["openmp"]
