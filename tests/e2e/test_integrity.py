"""Evaluation integrity: read-only inputs, guard bands, checks beyond the first call, nothing carried between
candidates. Unit tests of evaluators/integrity.py and of the worker's checks with Python stand-in kernels, then the
compiled faults family (each planted fault, and a healthy kernel right after it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from evoengineer.evaluators.integrity import GUARD_BYTES, Guarded, ProtectedInputs, checksum
from evoengineer.evaluators.worker import Session
from evoengineer.space import load_space
from evoengineer.families.msda.task import INPUT_KEYS, reference

DATA = Path(__file__).parents[1] / "data"


# ---- guard bands and protected inputs -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_guard_reports_how_far_a_write_went(dtype):
    g = Guarded((5, 7), dtype, "cpu", torch.Generator().manual_seed(0))
    assert g.tensor.is_contiguous() and g.tensor.shape == (5, 7) and g.tensor.dtype == dtype
    assert (g.tensor.data_ptr() - g.buf.data_ptr()) % 256 == 0 and g.damage("output") is None
    g.tensor.fill_(3)  # writing the tensor itself touches no canary
    assert g.damage("output") is None
    flat = g.buf[GUARD_BYTES:].view(dtype)  # the tensor and what follows it, in elements
    flat[35 + 15] = 1  # the 16th element past the end
    assert g.damage("output").startswith("wrote past output by 16 elements (up to ")
    g.reset_guards()
    assert g.damage("output") is None
    g.buf[:GUARD_BYTES].view(dtype)[-3] = 1
    assert g.damage("output").startswith("wrote before output by 3 elements (up to ")
    assert "past the end of another tensor" in g.damage("output")


def test_canaries_come_from_a_random_pool_made_once():
    """Each allocation's canaries are a random pattern of a pool drawn once per device (not 128 KiB drawn on the
    host and copied per allocation); different allocations get different patterns, none of them a constant."""
    from evoengineer.evaluators import integrity

    gen = torch.Generator().manual_seed(3)
    guards = [Guarded((4,), torch.float32, "cpu", gen) for _ in range(12)]
    pool = integrity._patterns[("cpu", GUARD_BYTES)]
    assert pool.shape == (integrity.CANARY_PATTERNS, 2 * GUARD_BYTES)
    rows = {int(torch.nonzero((pool[:, :GUARD_BYTES] == g.front).all(1))[0]) for g in guards}
    assert len(rows) > 1  # picked at random, not always the same one
    assert all(len(torch.unique(g.front)) > 200 for g in guards)  # random bytes
    assert integrity._patterns[("cpu", GUARD_BYTES)] is pool  # drawn once


def test_protected_inputs_detect_and_restore():
    raw = {"a": torch.randn(100), "b": torch.arange(10), "flag": True}
    p = ProtectedInputs(raw, torch.Generator().manual_seed(1))
    assert set(p) == {"a", "b", "flag"} and p["flag"] is True
    assert torch.equal(p["a"], raw["a"]) and p.verify() is None
    p["a"][7] = 0.0
    assert p.verify() == "modified input a (1 of 100 elements changed)"
    p.restore()
    assert p.verify() is None and torch.equal(p["a"], raw["a"])
    # NaN written into an input is a change too (compared bitwise), and a write past an input is caught
    p["a"][0] = float("nan")
    assert "modified input a" in p.verify_and_restore() and p.verify() is None
    g = p._guarded["b"]
    g.buf[GUARD_BYTES + g.nbytes] = 1
    assert p.verify() == "wrote past input b by 1 element (up to 1 byte after its end)"
    p.restore()
    assert p.verify() is None


def test_several_input_sets_are_verified_together_and_each_changed_one_restored():
    from evoengineer.evaluators.integrity import verify_and_restore_all

    gen = torch.Generator().manual_seed(2)
    raws = [{"a": torch.randn(50), "b": torch.arange(8)} for _ in range(3)]
    sets = [ProtectedInputs(r, gen) for r in raws]
    assert verify_and_restore_all(sets) is None
    sets[1]["b"][3] = 99
    sets[2]["a"][0] = float("nan")
    bad = verify_and_restore_all(sets)
    assert bad == "modified input b (1 of 8 elements changed)"  # the first set found changed
    assert all(p.verify() is None for p in sets)  # both changed sets restored, not only the first found
    assert all(torch.equal(p[k], r[k]) for p, r in zip(sets, raws) for k in r)
    g = sets[0]._guarded["a"]
    g.buf[GUARD_BYTES + g.nbytes + 5] ^= 0xFF  # a byte past the input: its guard band
    assert verify_and_restore_all(sets).startswith("wrote past input a by ")
    assert verify_and_restore_all(sets) is None


def test_checksum_sees_any_single_change():
    x = torch.randn(1000)
    y = x.clone()
    y[123] = torch.nextafter(y[123], torch.tensor(10.0))  # one ulp
    assert int(checksum(x)) != int(checksum(y)) and int(checksum(x)) == int(checksum(x.clone()))
    h = torch.randn(9).half()
    assert checksum(h).dtype == torch.int64


# ---- the worker's checks, with stand-in kernels ---------------------------------------------------------------------
class StandIn:
    """A 'kernel module' in Python: writes the float32 reference into `out`; `fault(call, inputs, out)` then
    misbehaves on the calls it chooses. Calls are counted from 1."""

    def __init__(self, fault=None):
        self.fault, self.calls = fault, 0

    def forward(self, *args):
        *ins, out = args
        self.calls += 1
        inputs = dict(zip(INPUT_KEYS, ins))
        if self.fault is None or not self.fault(self.calls, inputs, out):
            out.copy_(reference(inputs).to(out.dtype))
        return 0


@pytest.fixture(scope="module")
def session():
    space = load_space(DATA / "faults" / "faults_space.toml")
    return Session({"space_text": space.text, "space_path": str(space.path), "seed": 3})


def _calls_before_timing(session) -> int:
    probe = StandIn()
    session.check(probe, "probe")
    return probe.calls


def _evaluate(session, fault):
    return session.evaluate_module(StandIn(fault), "x" * 64)


def test_stand_in_is_healthy(session):
    r = _evaluate(session, None)
    assert r["status"] == "ok", r
    shapes = r["metrics"]["shapes"]["timed"]
    # 4 kept (the last call of each of the 2 input sets and 2 random others) + one call per set after the timing loop;
    # every timed call fingerprinted (warmup 1 + repeats 5)
    assert shapes["checked_calls"] == 6 and shapes["fingerprinted_calls"] == 6 and shapes["input_sets"] == 2


def _scale_on(calls):
    def fault(call, inputs, out):
        if call in calls:
            out.copy_(reference(inputs).to(out.dtype) * 1.01)
            return True
        return False
    return fault


def test_intermittent_error_in_a_timed_call_is_nondeterministic(session):
    first_timed = _calls_before_timing(session) + 1
    # the second timed call (a warm-up is not among the kept outputs, the fingerprints still see it)
    r = _evaluate(session, _scale_on({first_timed}))
    assert r["status"] == "wrong" and r["reason"] == "nondeterministic: 1 of 3 runs of input set 1 on shape timed " \
        "differ bitwise from its checked output (first: timed call 1)", r
    assert _evaluate(session, None)["status"] == "ok"


def test_intermittent_error_when_fingerprints_are_off_is_caught_by_the_kept_outputs(session):
    session.settings["deterministic"] = False
    try:
        last = _calls_before_timing(session) + 6
        r = _evaluate(session, _scale_on({last}))
        assert r["status"] == "wrong" and "timed call 6 of 6" in r["reason"] and "max abs err" in r["reason"], r
    finally:
        session.settings["deterministic"] = True


def test_error_in_a_later_check_run(session):
    r = _evaluate(session, _scale_on({2}))
    assert r["status"] == "wrong" and r["reason"].startswith("nondeterministic: run 2 of 2 differs from run 1"), r


def test_stale_output_on_later_calls(session):
    r = _evaluate(session, lambda call, inputs, out: call > 1)  # computes on the first call only
    assert r["status"] == "wrong" and r["reason"].startswith("stale output: run 2 of 2 left"), r


def test_stale_output_in_timed_calls(session):
    n = _calls_before_timing(session)
    r = _evaluate(session, lambda call, inputs, out: call > n + 2)  # stops writing during timing
    assert r["status"] == "wrong" and r["reason"].startswith("stale output: timed call"), r


@pytest.mark.parametrize("name", ["value", "sampling_locations", "spatial_shapes"])
def test_input_modified_during_timing_is_caught_and_undone(session, name):
    n = _calls_before_timing(session)

    def fault(call, inputs, out):
        if call == n + 3:
            out.copy_(reference(inputs).to(out.dtype))
            inputs[name].view(-1)[0] += 1
            return True
        return False

    before = {k: v.clone() for k, v in session.timed["timed"][0].inputs.items() if isinstance(v, torch.Tensor)}
    r = _evaluate(session, fault)
    assert r["status"] == "wrong" and f"modified input {name}" in r["reason"], r
    after = session.timed["timed"][0].inputs
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert _evaluate(session, None)["status"] == "ok"


def test_write_past_output_during_timing(session):
    n = _calls_before_timing(session)

    def fault(call, inputs, out):
        if call == n + 4:
            out.copy_(reference(inputs).to(out.dtype))
            # a kernel writing 5 elements beyond its output (through the storage: a raw pointer would do the same)
            base = out.untyped_storage()
            full = torch.empty(0, dtype=out.dtype).set_(base, out.storage_offset(), (out.numel() + 5,))
            full[out.numel():] = 0
            return True
        return False

    r = _evaluate(session, fault)
    assert r["status"] == "wrong" and r["reason"].startswith("wrote past output by 5 elements (up to ") and \
        r["reason"].endswith(" on shape timed after timing"), r


# ---- the compiled faults family --------------------------------------------------------------------------------------
INTEGRITY_FAULTS = {
    "mutate_input": "modified input value",
    "oob_write": "wrote past output by 16 elements",
    "stale_output": "stale output: run 2 of 2",
    "intermittent": "",  # every 7th call: whichever check meets it first (see the reason)
}


def test_each_fault_then_a_healthy_kernel(tmp_path: Path, build_cache: Path):
    """The order that poisoned candidates before: fault, then a healthy kernel in the same worker; the healthy one is
    ok after every fault, with the same tiny error (its inputs were restored)."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator

    d = tmp_path / "faults"
    shutil.copytree(DATA / "faults", d)
    space = load_space(d / "faults_space.toml")
    f = CandidateFactory(space)
    healthy = f.make({"FAULT": "none", "D_VEC": 8})
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        first = ev.evaluate(healthy)
        assert first.status == "ok", first
        for fault, words in INTEGRITY_FAULTS.items():
            workers = ev.workers_started
            m = ev.evaluate(f.make({"FAULT": fault, "D_VEC": 4}))
            assert m.status == "wrong" and words in m.reason, (fault, m)
            if fault == "intermittent":
                assert "nondeterministic" in m.reason or "max abs err" in m.reason, m
            h = ev.evaluate(healthy)
            assert h.status == "ok", (fault, h)
            if ev.workers_started == workers:
                # same worker, same inputs (a worker's seed draws them): the same error only if they were restored
                assert h.metrics["max_abs_err"] == first.metrics["max_abs_err"], fault
            else:
                first = h  # a new worker draws new inputs: compare with its own healthy run from here
        # a restart would hide what a fault left behind: the only one allowed is the sentinel's (a loaded CI host's
        # noise), never state a fault changed
        assert all("sentinel" in why or "drift" in why for why in ev.replaced), ev.replaced
        assert not any("state" in why for why in ev.replaced), ev.replaced


# ---- the sanitizer step before elites are published (a stand-in checker over a replayed landscape) -----------------
def _grid_runner(toy_dir: Path, space, space_file: Path, ev, db: str):
    """(runner, store, run id, elite.json path) of a grid run of `space` through `ev`, stored in toy_dir/db."""
    from evoengineer.search.runner import Runner, SearchSettings
    from evoengineer.store import Store

    store = Store(f"sqlite:///{toy_dir / db}")
    settings = SearchSettings(strategy="grid", population=64, generations=0, elite=3, seed=0)
    rid = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": ev.describe()}, seed=0, fingerprint={})
    out = toy_dir / "elite.json"
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings, out=out)
    return runner, store, rid, out


def test_elites_are_certified_and_a_faulty_one_is_replaced(toy_dir: Path):
    import json as _json

    from evoengineer.evaluators.replay import ReplayEvaluator
    from evoengineer.search import STRATEGIES

    class Sanitized(ReplayEvaluator):
        """Replay, plus a checker that finds fault with the fastest configuration."""

        asked: list[list[str]] = []

        def sanitize(self, candidates):
            self.asked.append([c.hash for c in candidates])
            return {c.hash: ({"status": "failed", "reason": "racecheck: Error: Potential RAW hazard", "tools": ["x"]}
                             if c.hash == worst_case else {"status": "clean", "reason": "", "tools": ["x"]})
                    for c in candidates}

    space = load_space(toy_dir / "toy_space.toml")
    ev = Sanitized(toy_dir / "landscape.csv", space)
    runner, store, rid, out = _grid_runner(toy_dir, space, toy_dir / "toy_space.toml", ev, "s.db")
    ranked = None

    class Before:  # learn the true ranking before the final publication, and pick the fastest as the faulty one
        def on_evaluation(self, r, rec):
            nonlocal ranked, worst_case
            ranked = r.best(5)
            worst_case = ranked[0]

        def on_generation(self, r, generation, stats):
            pass

    worst_case = ""
    runner.observers.append(Before())
    STRATEGIES["grid"](runner).run(None)
    doc = _json.loads(out.read_text())
    hashes = [e["hash"] for e in doc["elites"]]
    assert hashes == ranked[1:4]  # the fastest is out, the 4th best took its place
    assert all(e["certified"] and e["sanitizer"]["status"] == "clean" for e in doc["elites"])
    bad = store.find_candidate(rid, ranked[0])
    assert bad.status == "sanitizer_error" and "racecheck" in bad.reason
    assert bad.metrics["sanitizer"]["status"] == "failed"
    assert ev.asked == [ranked[:3], [ranked[3]]]  # the three at once, then the replacement; nothing asked twice
    # a later publication asks nothing again: the verdicts are stored with the candidates
    runner.records = {r.hash: r for r in store.candidates(rid)}
    assert runner.certified(ranked[:3]) == ranked[1:4] and len(ev.asked) == 2


def test_elite_json_says_why_an_elite_is_not_certified(toy_dir: Path):
    import json as _json

    from evoengineer.cli import main

    rc = main(["search", "--space", str(toy_dir / "toy_space.toml"), "--landscape", str(toy_dir / "landscape.csv"),
               "--db", f"sqlite:///{toy_dir / 'r.db'}", "--out", str(toy_dir / "e.json"), "--budget", "20",
               "--quiet"])
    assert rc == 0
    doc = _json.loads((toy_dir / "e.json").read_text())
    assert doc["elites"] and all(e["certified"] is False and e["sanitizer"]["status"] == "not run"
                                 for e in doc["elites"])


def test_shape_winners_are_certified_and_a_faulty_one_is_replaced(toy_dir: Path):
    """elite.json's shape_elites (what export --per-shape ships) go through the sanitizer like the elites: the
    fastest kernel on shape "b", which the checker finds fault with, gives way to the next fastest there."""
    import json as _json

    from evoengineer.evaluators.replay import ReplayEvaluator
    from evoengineer.search import STRATEGIES

    text = (toy_dir / "toy_space.toml").read_text()
    text = text.replace('[[shapes]]\nname = "small"\nN = 1\n', "")
    text += '\n[[shapes]]\nname = "a"\nN = 1\ntime = true\n\n[[shapes]]\nname = "b"\nN = 2\ntime = true\n'
    (toy_dir / "two.toml").write_text(text)
    space = load_space(toy_dir / "two.toml")
    assert [d["name"] for d in space.shapes if d.get("time")] == ["a", "b"]

    def b_time(params):  # shape b ranks the configurations in another order than the objective
        return 1000.0 / (1 + sum(int(v) for v in params.values() if isinstance(v, (int, bool))))

    class PerShape(ReplayEvaluator):
        asked: list[list[str]] = []

        def evaluate(self, candidate):
            m = super().evaluate(candidate)
            if m.status == "ok":
                m.metrics["shapes"] = {"a": {"p50_us": m.metrics["time_us"]}, "b": {"p50_us": b_time(candidate.params)}}
            return m

        def sanitize(self, candidates):
            self.asked.append([c.hash for c in candidates])
            return {c.hash: ({"status": "failed", "reason": "memcheck: Invalid __global__ read", "tools": ["x"]}
                             if c.hash == faulty else {"status": "clean", "reason": "", "tools": ["x"]})
                    for c in candidates}

    ev = PerShape(toy_dir / "landscape.csv", space)
    runner, store, rid, out = _grid_runner(toy_dir, space, toy_dir / "two.toml", ev, "p.db")
    faulty = ""
    on_b: list[str] = []

    class Before:  # the fastest correct kernels on shape b so far; the fastest of all is the faulty one
        def on_evaluation(self, r, rec):
            nonlocal faulty
            ok = sorted((x for x in r.records.values() if x.status == "ok"),
                        key=lambda x: (x.metrics["shapes"]["b"]["p50_us"], x.hash))
            on_b[:] = [x.hash for x in ok[:2]]
            faulty = on_b[0]

        def on_generation(self, r, generation, stats):
            pass

    runner.observers.append(Before())
    STRATEGIES["grid"](runner).run(None)
    doc = _json.loads(out.read_text())
    entries = {e["shape"]: e for e in doc["shape_elites"]}
    assert entries["b"]["hash"] == on_b[1] and entries["b"]["certified"] is True
    assert entries["a"]["hash"] == doc["elites"][0]["hash"] and entries["a"]["certified"] is True
    assert store.find_candidate(rid, faulty).status == "sanitizer_error"
    # the shape winners ride with the elites' batch (one start of the tools); the faulty one's replacement alone
    assert faulty in ev.asked[0] and doc["elites"][0]["hash"] in ev.asked[0] and [on_b[1]] in ev.asked
    asked = len(ev.asked)
    runner.records = {r.hash: r for r in store.candidates(rid)}
    runner.certify_shape_winners()
    assert len(ev.asked) == asked  # verdicts are stored: nothing asked again


def test_timed_calls_are_numbered_as_the_hooks_see_them():
    """`numbered`: the timed function is given the call's number, the one its hooks get (the worker alternates input
    sets by it, and a call timed again keeps it)."""
    from evoengineer.evaluators.timing import time_callable

    seen: dict[str, list[int]] = {"fn": [], "before": [], "after": []}
    out = time_callable(lambda i: seen["fn"].append(i), device="cpu", warmup=2, repeats=3, numbered=True,
                        before=seen["before"].append, after=seen["after"].append)
    assert seen == {"fn": [0, 1, 2, 3, 4], "before": [0, 1, 2, 3, 4], "after": [0, 1, 2, 3, 4]}
    assert out["n"] == 3
    plain = time_callable(lambda: None, device="cpu", warmup=1, repeats=2)  # not numbered: called without it
    assert plain["n"] == 2


def test_any_true_reads_each_devices_flags():
    from evoengineer.evaluators.integrity import any_true

    assert any_true([]) is False
    assert any_true([torch.tensor(False), torch.tensor(False)]) is False
    assert any_true([torch.tensor(False), torch.tensor(True)]) is True
