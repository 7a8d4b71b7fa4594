"""GPU cheats (skipped without CUDA): persisting L2 and device limits left behind, work on a stream of the candidate's
own, a kernel that does nothing inside CUDA graph capture (tests/data/cheats_cuda). Each is named; an honest kernel
measured right after each gets its own time."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

#: cheat -> (statuses, words one of which is in the reason)
CHEATS = {
    "persist_l2": (("state_changed",), ("CUDA limit persisting L2 cache size",)),
    "limits": (("state_changed",), ("CUDA limit stack size",)),
    # the output read before the side stream wrote it is an earlier call's: caught by the fingerprints or the time
    "side_stream": (("implausible", "wrong"),
                    ("work left running on another stream", "returned the output of input set")),
    "graph_skip": (("wrong",), ("replay of a CUDA graph",)),
}


@pytest.fixture(scope="module")
def cheats(tmp_path_factory, build_cache):
    from conftest import planted_cheats

    ev, honest, planted = planted_cheats(tmp_path_factory.mktemp("cheats") / "cheats_cuda", build_cache, CHEATS,
                                         THREADS=256)
    yield ev, honest, planted
    ev.close()


def test_gpu_cheats_are_named_and_the_honest_kernel_after_each_keeps_its_time(cheats):
    ev, honest, planted = cheats
    before = ev.evaluate(honest)
    assert before.status == "ok", before
    shape = before.metrics["shapes"]["timed"]
    assert shape["graph_us"] > 0 and "offstream_s" not in shape and len(shape["novel_ratio"]) == 3
    for cheat, (statuses, words) in CHEATS.items():
        m = ev.evaluate(planted[cheat])
        print(f"{cheat}: {m.status}: {m.reason}")
        assert m.status in statuses and any(w in m.reason for w in words), (cheat, m.status, m.reason)
        after = ev.evaluate(honest)
        assert after.status == "ok", (cheat, after)
        ratio = after.time_us / before.time_us
        print(f"  honest kernel after it: {after.time_us:.2f} us against {before.time_us:.2f} us before ({ratio:.3f})")
        assert 0.8 < ratio < 1.25, (cheat, before.time_us, after.time_us)
    assert "persisting" in ev.evaluate(planted["persist_l2"]).reason


def test_gpu_side_stream_is_found_without_graphs(tmp_path, build_cache):
    """A family that allows no CUDA graphs: the burst of back-to-back calls looks for work left on another stream."""
    from conftest import planted_cheats

    ev, honest, planted = planted_cheats(tmp_path / "cheats_cuda", build_cache, ["side_stream"],
                                         space_file="cheats_space_nographs.toml", THREADS=256)
    try:
        m = ev.evaluate(honest)
        assert m.status == "ok", m
        shape = m.metrics["shapes"]["timed"]
        assert "graph_us" not in shape and shape["offstream_s"] < 1e-3
        m = ev.evaluate(planted["side_stream"])
        print(f"side_stream without graphs: {m.status}: {m.reason}")
        # the late output shows first in whichever check looks first: fingerprints, repeated runs, or the burst
        words = (*CHEATS["side_stream"][1], "differ bitwise")
        assert m.status in CHEATS["side_stream"][0] and any(w in m.reason for w in words), m
    finally:
        ev.close()


def test_the_guard_undoes_persisting_l2_and_limits():
    from evoengineer.evaluators.process_state import StateGuard, _CudaContext

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    g = StateGuard("cuda")
    cu = _CudaContext()
    import ctypes

    props = torch.cuda.get_device_properties(0)
    want = getattr(props, "persisting_l2_cache_max_size", 0) or (4 << 20)
    assert cu.cu.cuCtxSetLimit(ctypes.c_int(6), ctypes.c_size_t(want)) == 0
    assert cu.cu.cuCtxSetLimit(ctypes.c_int(0), ctypes.c_size_t(32 * 1024)) == 0
    changes = g.check()
    text = "; ".join(str(c) for c in changes)
    assert "persisting L2 cache size" in text and "stack size" in text and all(c.restored for c in changes), text
    assert g.check() == []


def test_physics_gate_on_this_gpu():
    from evoengineer.evaluators.physics import PhysicsGate

    torch.zeros(1, device="cuda")
    gate = PhysicsGate("cuda", l2_flush=True)
    p = gate.peaks
    assert 1e12 < p.dram_bytes_s < 2e13 and p.flops_s > 1e14, p
    assert gate.verdict(time_us=1000.0, min_bytes=1 << 30, flops=10**9) is None
    assert "DRAM peak" in gate.verdict(time_us=10.0, min_bytes=1 << 30, flops=0)
    assert "TFLOP/s" in gate.verdict(time_us=10.0, min_bytes=0, flops=10**13)


def test_a_slow_host_adds_nothing_to_a_timed_call():
    """A host slow to queue the call (a machine busy with compilers) does not count as the kernel's time: each
    timed call waits behind a GPU spin longer than the host took; calls the host queued slower than their spin (the
    host got slow after the warm-up) are timed again behind a longer one."""
    import time

    from evoengineer.evaluators.timing import time_callable

    x = torch.zeros(1 << 22, device="cuda")

    def busy(us: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < us * 1e-6:
            pass

    quick = time_callable(lambda: x.mul_(1.0), device="cuda", warmup=5, repeats=40)
    slow = time_callable(lambda: (busy(300), x.mul_(1.0)), device="cuda", warmup=5, repeats=40)
    assert slow["p50"] < 1.3 * quick["p50"] + 5, (quick, slow)

    def late_after_warmup(i: int) -> None:  # quick to queue in the warm-up, slow in the timed calls
        busy(300 if i >= 5 else 0)
        x.mul_(1.0)

    turned = time_callable(late_after_warmup, device="cuda", warmup=5, repeats=40, numbered=True)
    assert turned["p50"] < 1.3 * quick["p50"] + 5 and turned["host_late"] == 0, (quick, turned)



def test_any_true_over_cpu_and_device_flags():
    """An input set may hold CPU tensors beside the device's: their flags are read per device (one stack of mixed
    devices fails, which stopped every SDPA worker's start once)."""
    from evoengineer.evaluators.integrity import ProtectedInputs, any_true

    f, t = torch.tensor(False), torch.tensor(True)
    assert any_true([f, f.cuda()]) is False
    assert any_true([f, t.cuda()]) is True and any_true([t, f.cuda()]) is True
    inputs = ProtectedInputs({"x": torch.ones(8, device="cuda"), "sizes": torch.arange(3)}, torch.Generator())
    assert inputs.verify() is None
    inputs["sizes"][0] = 7
    assert "modified input sizes" in inputs.verify()
