"""Re-timing of a finished search's finalists (evaluators/retiming.py, Runner.retimed): the summary and its flag,
the elites ranked by the re-timed p50 with both timings recorded, a finalist wrong on fresh inputs dropped, a failed
re-timing leaving the search's ranking, round-robin order, and a stored re-timing never asked for again."""

from __future__ import annotations

import json
from pathlib import Path

from evoengineer.evaluators.retiming import MIN_BUDGET_S, MIN_TOLERANCE, Retiming, summarize
from evoengineer.space import load_space


def test_summary_flags_only_what_is_beyond_the_noise():
    rounds = [[100.0, 101.0, 99.0, 100.5], [100.2, 99.8, 100.1, 100.0], [99.9, 100.3, 100.0, 100.4]]
    same = summarize(100.0, rounds, 0.005, key="k")
    assert same["flag"] == "" and same["rounds"] == 3 and same["calls"] == 12
    assert same["p10_us"] <= same["median_ci95_us"][0] <= same["p50_us"] <= same["median_ci95_us"][1] <= same["p90_us"]
    assert same["tolerance"] == MIN_TOLERANCE and abs(same["ratio"] - same["p50_us"] / 100.0) < 1e-12
    lucky = summarize(80.0, rounds, 0.005, key="k")  # the search's timing was 20% too good
    assert lucky["flag"] and "1.25x" in lucky["flag"]
    noisy = summarize(80.0, rounds, 0.1, key="k")  # on a machine this noisy, 25% is within 3 x the noise
    assert noisy["flag"] == "" and abs(noisy["tolerance"] - 0.3) < 1e-12
    assert summarize(80.0, rounds, 0.005, key="k") == lucky  # the bootstrap is seeded: reproducible
    assert Retiming(samples={}, baseline_p50_us=[10.0, 10.0, 10.0]).noise_cv == 0.0
    assert Retiming(samples={}, baseline_p50_us=[10.0]).noise_cv is None


def _run(toy_dir: Path, evaluator, elite: int = 3):
    from evoengineer.search import STRATEGIES
    from evoengineer.search.runner import Runner, SearchSettings
    from evoengineer.store import Store

    space = load_space(toy_dir / "toy_space.toml")
    store = Store(f"sqlite:///{toy_dir / 's.db'}")
    settings = SearchSettings(strategy="grid", population=64, generations=0, elite=elite, seed=0)
    rid = store.create_run(space_name=space.name, space_path=str(toy_dir / "toy_space.toml"), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": evaluator.describe()}, seed=0, fingerprint={})
    out = toy_dir / "elite.json"
    runner = Runner(space=space, evaluator=evaluator, store=store, run=store.get_run(rid), settings=settings, out=out)
    STRATEGIES["grid"](runner).run(None)
    return runner, store, rid, json.loads(out.read_text())


def test_elites_are_ranked_by_the_retimed_p50(toy_dir: Path):
    from evoengineer.evaluators.replay import ReplayEvaluator

    class Drifting(ReplayEvaluator):
        """Replay whose re-timing disagrees: the search's fastest was a lucky measurement (1.5x slower re-timed),
        the second is wrong on the fresh inputs, the rest re-time as measured."""

        asked: list[list[str]] = []
        lucky = wrong = ""

        def retime(self, candidates, *, session, **kw):
            self.asked.append([c.hash for c in candidates])
            rt = super().retime(candidates, session=session, **kw)
            rt.samples[self.lucky] = [[x * 1.5 for x in r] for r in rt.samples[self.lucky]]
            del rt.samples[self.wrong]
            rt.dropped[self.wrong] = ("wrong", "3 of 64 outputs beyond tolerance on shape s (seed 1)")
            rt.order = [h for h in rt.order if h != self.wrong]
            rt.baseline, rt.baseline_p50_us = "reference", [10.0, 10.2, 9.9, 10.1, 10.0]
            return rt

    space = load_space(toy_dir / "toy_space.toml")
    ev = Drifting(toy_dir / "landscape.csv", space)
    first = sorted(((ev.landscape.lookup(space.genome_to_params(g)).time_us, g) for g in space.valid_genomes()))
    from evoengineer.candidate import CandidateFactory

    f = CandidateFactory(space)
    by_time = [f.from_genome(g).hash for _, g in first]
    ev.lucky, ev.wrong = by_time[0], by_time[1]
    runner, store, rid, doc = _run(toy_dir, ev)
    assert ev.asked == [by_time[:6]]  # 2 x K finalists: the elites and the next three, at once
    hashes = [e["hash"] for e in doc["elites"]]
    # the lucky one re-timed at 1.5x falls behind; the wrong one is out
    assert ev.wrong not in hashes and ev.lucky not in hashes[:2]
    for a, b in zip(doc["elites"], doc["elites"][1:]):  # by re-timed p50, but for finalists tied within the noise
        if a["retimed"]["p50_us"] > b["retimed"]["p50_us"]:
            assert b["hash"] in a["retimed"]["tied_with"] and a["hash"] < b["hash"]
    for e in doc["elites"]:
        # the number users read first is the ranking's; the search's keeps its own key
        assert e["metrics"]["time_us"] == e["retimed"]["p50_us"] and e["retimed"]["calls"] == 5
        assert e["search_p50_us"] == e["metrics"]["search_time_us"]
        lo, hi = e["retimed"]["median_ci95_us"]
        assert lo <= e["retimed"]["p50_us"] <= hi
    lucky = store.find_candidate(rid, ev.lucky).metrics["retime"]
    assert lucky["flag"] and abs(lucky["ratio"] - 1.5) < 1e-9 and lucky["first_us"] == first[0][0]
    assert all(store.find_candidate(rid, h).metrics["retime"]["flag"] == "" for h in by_time[2:6])
    bad = store.find_candidate(rid, ev.wrong)
    assert bad.status == "wrong" and "re-timing inputs" in bad.reason and "dropped" in bad.metrics["retime"]
    assert doc["retiming"]["ranked_by"] == "re-timed p50" and doc["retiming"]["finalists"] == 6
    assert abs(doc["retiming"]["noise_cv"] - 0.0098) < 1e-3 and doc["retiming"]["flagged"] == 0
    # publishing again (a resumed run that finishes again) finds the re-timing stored: nothing is timed twice
    runner.records = {r.hash: r for r in store.candidates(rid)}
    again = runner.retimed(by_time[:3])
    p50 = {h: runner.records[h].metrics["retime"]["p50_us"] for h in again}
    assert again[:3] == hashes and len(again) == 5 and ev.wrong not in again
    from evoengineer.evaluators.retiming import stable_order

    assert again == stable_order({h: runner.records[h].metrics["retime"] for h in again})[0]  # the same order
    assert [p50[h] for h in again][2:] == sorted(p50.values())[2:] and len(ev.asked) == 1


def test_a_failed_retiming_keeps_the_search_ranking_and_says_why(toy_dir: Path):
    from evoengineer.evaluators.replay import ReplayEvaluator

    class Hangs(ReplayEvaluator):
        def retime(self, candidates, *, session, **kw):
            return Retiming(samples={}, notes={"failed": "timeout: no answer within 60 s (worker killed)"})

    space = load_space(toy_dir / "toy_space.toml")
    runner, store, rid, doc = _run(toy_dir, Hangs(toy_dir / "landscape.csv", space))
    assert [e["hash"] for e in doc["elites"]] == runner.best(3)
    assert doc["retiming"] == {"ranked_by": "search p50", "reason": "timeout: no answer within 60 s (worker killed)"}
    assert all("retimed" not in e and e["search_p50_us"] > 0 for e in doc["elites"])


def test_replay_retiming_is_round_robin_and_confirms_the_ranking(toy_dir: Path):
    from evoengineer.cli import main

    rc = main(["search", "--space", str(toy_dir / "toy_space.toml"), "--landscape", str(toy_dir / "landscape.csv"),
               "--db", f"sqlite:///{toy_dir / 'r.db'}", "--out", str(toy_dir / "e.json"), "--budget", "20",
               "--quiet"])
    assert rc == 0
    doc = json.loads((toy_dir / "e.json").read_text())
    from evoengineer.store import Store

    store = Store(f"sqlite:///{toy_dir / 'r.db'}")
    recs = [r for r in store.candidates(doc["run_id"]) if "retime" in r.metrics]
    n, rounds = len(recs), doc["retiming"]["rounds"]
    assert n == 6 and rounds == 5
    firsts = set()
    for r in recs:
        pos = r.metrics["retime"]["positions"]
        # one timing per round, each inside its round's block of n
        assert [p // n for p in pos] == list(range(rounds))
        firsts |= {k for k, p in enumerate(pos) if p % n == 0}
        assert r.metrics["retime"]["flag"] == "" and r.metrics["retime"]["ratio"] == 1.0
    assert firsts == set(range(rounds))  # every round starts with another finalist (the order rotates)
    times = [e["metrics"]["time_us"] for e in doc["elites"]]
    assert times == sorted(times) and doc["retiming"]["ranked_by"] == "re-timed p50"


def test_retiming_can_be_turned_off(toy_dir: Path):
    from evoengineer.evaluators.replay import ReplayEvaluator

    text = (toy_dir / "toy_space.toml").read_text()
    assert "[evaluation]" not in text
    (toy_dir / "toy_space.toml").write_text(text + "\n[evaluation]\nretime_finalists = 0\n")
    space = load_space(toy_dir / "toy_space.toml")
    runner, store, rid, doc = _run(toy_dir, ReplayEvaluator(toy_dir / "landscape.csv", space))
    assert doc["retiming"]["ranked_by"] == "search p50" and "retime_finalists" in doc["retiming"]["reason"]
    assert not any("retime" in r.metrics for r in store.candidates(rid))


def test_tables_lead_with_the_ranking_time_on_a_noisy_machine(toy_dir: Path, capsys):
    """elite.json's metrics.time_us, the speedup, inspect's and elites' tables, the HTML report and the final
    progress line all show the timing the ranking used; every marker has a legend; a noisy run says so."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.cli import main
    from evoengineer.elite_json import format_table
    from evoengineer.evaluators.replay import ReplayEvaluator
    from evoengineer.report import write_report
    from evoengineer.search.progress import ProgressPrinter

    class Noisy(ReplayEvaluator):
        lucky = ""

        def retime(self, candidates, *, session, **kw):
            rt = super().retime(candidates, session=session, **kw)
            # the search's fastest was a lucky timing: twice as slow re-timed; the machine's noise is ~25%
            rt.samples[self.lucky] = [[x * 2.0 for x in r] for r in rt.samples[self.lucky]]
            rt.baseline, rt.baseline_p50_us = "reference", [1000.0, 1400.0, 700.0, 1200.0, 900.0]
            return rt

    space = load_space(toy_dir / "toy_space.toml")
    ev = Noisy(toy_dir / "landscape.csv", space)
    first = sorted((ev.landscape.lookup(space.genome_to_params(g)).time_us, g) for g in space.valid_genomes())
    ev.lucky = CandidateFactory(space).from_genome(first[0][1]).hash
    import io

    log = io.StringIO()
    from evoengineer.search import STRATEGIES
    from evoengineer.search.runner import Runner, SearchSettings
    from evoengineer.store import Store

    store = Store(f"sqlite:///{toy_dir / 's.db'}")
    settings = SearchSettings(strategy="grid", population=64, generations=0, elite=3, seed=0)
    rid = store.create_run(space_name=space.name, space_path=str(toy_dir / "toy_space.toml"), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": ev.describe(), "out": str(toy_dir / "e.json")},
                           seed=0, fingerprint={})
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings,
                    out=toy_dir / "e.json", observers=[ProgressPrinter(log)])
    STRATEGIES["grid"](runner).run(None)
    store.set_run_status(rid, "finished", "budget")
    doc = json.loads((toy_dir / "e.json").read_text())
    elites = doc["elites"]
    times = [e["metrics"]["time_us"] for e in elites]
    assert times == [e["retimed"]["p50_us"] for e in elites]
    for a, b in zip(elites, elites[1:]):  # by re-timed p50, but for finalists tied within the noise
        assert a["retimed"]["p50_us"] <= b["retimed"]["p50_us"] or b["hash"] in a["retimed"]["tied_with"]
    assert ev.lucky not in [e["hash"] for e in elites[:1]]
    for e in elites:
        m = e["metrics"]
        assert m["search_time_us"] == e["search_p50_us"] and abs(m["speedup"] - 1000.0 / m["time_us"]) < 1e-9
    # the done line's best is rank 1 by the ranking's timing, and so are its elites
    done = [ln for ln in log.getvalue().splitlines() if ln.strip().startswith("done")][0]
    assert f"best {times[0]:.3f} us" in done
    table = format_table(elites).splitlines()
    assert [float(r.split()[1]) for r in table[1:4]] == [round(t, 3) for t in times]
    assert any(ln.startswith("p50/p90 us, speedup: the finalists' re-timing") for ln in table)
    assert any(ln.startswith("warning: this machine was noisy") for ln in table)
    if any(e["retimed"]["flag"] for e in elites):
        assert any(ln.startswith("!: ") for ln in table) and any(" !" in r for r in table[1:4])
    # the same table from the store (elites) and from elite.json (inspect)
    import os

    os.chdir(toy_dir)
    assert main(["elites", "--db", f"sqlite:///{toy_dir / 's.db'}"]) == 0
    from_store = capsys.readouterr().out.splitlines()[1:]
    assert main(["inspect", str(toy_dir / "e.json")]) == 0
    from_file = capsys.readouterr().out.splitlines()[1:]
    from evoengineer.elite_json import format_search_best

    # the lucky one, the search's best, is not rank 1: a line says why
    assert format_search_best(doc["search_best"]).startswith("the search's best")
    assert from_store == from_file == [*table, format_search_best(doc["search_best"])]
    index, summaries = write_report(store, [store.get_run(rid)], toy_dir / "report")
    page = index.read_text()
    assert summaries[0].best == times[0] and "this machine was noisy" in page and "search p50" in page


def test_the_searchs_best_re_timed_slower_is_named_everywhere(toy_dir: Path, monkeypatch, capsys):
    """The search's best re-timed 1.5x slower (beyond the noise) is not rank 1: elite.json records it and why,
    the search's final table, inspect and elites print one line about it, and the report's convergence plot marks
    it (and rank 1's re-timed p50) beside the curve of the search's timings."""
    from evoengineer.cli import main
    from evoengineer.evaluators.replay import ReplayEvaluator
    from evoengineer.report import summarize_run, write_report
    from evoengineer.store import Store

    real = ReplayEvaluator.retime
    slow: dict[str, str] = {}

    def retime(self, candidates, *, session, **kw):
        rt = real(self, candidates, session=session, **kw)
        lucky = min(rt.samples, key=lambda h: (rt.samples[h][0][0], h))  # the search's fastest finalist
        slow["hash"] = lucky
        rt.samples[lucky] = [[x * 1.5 for x in r] for r in rt.samples[lucky]]
        return rt

    monkeypatch.setattr(ReplayEvaluator, "retime", retime)
    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///b.db",
                 "--budget", "30"]) == 0
    out = capsys.readouterr().out.splitlines()
    doc = json.loads((toy_dir / "elite.json").read_text())
    best = doc["search_best"]
    assert best["hash"] == slow["hash"] and best["rank"] != 1 and best["retimed"]["beyond_noise"]
    assert abs(best["retimed"]["ratio"] - 1.5) < 1e-9 and best["search_p50_us"] < doc["elites"][0]["metrics"]["time_us"]
    assert best["not_rank_1"].startswith("re-timed 1.50x slower (") and "beyond the noise (+-3%)" in best["not_rank_1"]
    assert doc["retiming"]["finalists_flagged"] == 1
    line = [ln for ln in out if ln.startswith("the search's best")]
    assert len(line) == 1 and f"{best['search_p50_us']:.3f} us ({best['hash'][:12]}), is not rank 1" in line[0]
    assert main(["inspect", "elite.json"]) == 0
    assert line[0] in capsys.readouterr().out.splitlines()
    assert main(["elites", "--db", "sqlite:///b.db"]) == 0
    assert line[0] in capsys.readouterr().out.splitlines()
    store = Store("sqlite:///b.db")
    run = store.runs()[0]
    sm = summarize_run(store, run)
    stars = [m for m in sm.retimed if m.rank1]
    crosses = [m for m in sm.retimed if m.search_best]
    assert len(sm.retimed) == 6 and len(stars) == 1 and len(crosses) == 1
    assert stars[0].retimed_us == doc["elites"][0]["metrics"]["time_us"]
    assert crosses[0].search_us == best["search_p50_us"] == min(sm.search_times)
    assert abs(crosses[0].retimed_us - 1.5 * best["search_p50_us"]) < 1e-6
    index, _ = write_report(store, [run], toy_dir / "rep")
    assert "is not rank 1: re-timed 1.50x slower" in index.read_text()
    store.close()


def test_a_best_that_is_rank_1_draws_no_line(toy_dir: Path, monkeypatch, capsys):
    from evoengineer.cli import main

    monkeypatch.chdir(toy_dir)
    assert main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///c.db",
                 "--budget", "30"]) == 0
    doc = json.loads((toy_dir / "elite.json").read_text())
    assert doc["search_best"]["rank"] == 1 and "not_rank_1" not in doc["search_best"]
    assert doc["search_best"]["hash"] == doc["elites"][0]["hash"]
    assert not any(ln.startswith("the search's best") for ln in capsys.readouterr().out.splitlines())


# ---- a bounded re-timing: calls from the noise, the baseline as often as the ranking needs, a budget ---------------
def test_plan_sizes_calls_from_the_noise_and_times_a_costly_baseline_in_fewer_rounds():
    from evoengineer.evaluators.retiming import MIN_CALLS, MIN_ROUNDS, plan_retiming

    quiet, noisy = (1000.0, 1000.0), (1000.0, 1300.0)
    plan = plan_retiming({"q": quiet, "n": noisy}, baseline_us=10.0, rounds=5, most=50, warmup=1, budget_s=None)
    assert plan["repeats"] == {"q": MIN_CALLS, "n": 50}  # a quiet finalist needs few calls, a noisy one the most
    assert plan["baseline_rounds"] == [0, 1, 2, 3, 4] and plan["baseline_calls"] == 50  # cheap: every round
    # the CPU MSDA case of issue 54: six finalists at ~45 ms, a 650 ms baseline, 20 calls at the most
    six = {f"f{i}": (45000.0, 47000.0) for i in range(6)}
    unbounded = plan_retiming(six, baseline_us=650000.0, rounds=5, most=20, warmup=1, budget_s=None)
    finalists_round = sum((k + 1) * 0.045 for k in unbounded["repeats"].values())
    assert unbounded["baseline_calls"] == MIN_CALLS and len(unbounded["baseline_rounds"]) < 5
    assert unbounded["baseline_rounds"][0] == 0 and unbounded["baseline_rounds"][-1] == 4
    assert len(unbounded["baseline_rounds"]) * (MIN_CALLS + 1) * 0.65 <= 5 * finalists_round / 2 + 1e-9
    # within a budget: the baseline is cut first, then every finalist's calls alike, then rounds
    bounded = plan_retiming(six, baseline_us=650000.0, rounds=5, most=20, warmup=1, budget_s=20.0)
    assert bounded["expected_s"] <= 20.0 and bounded["baseline_rounds"] == [0, 4]
    assert len(set(bounded["repeats"].values())) == 1 and bounded["rounds"] == 5
    tiny = plan_retiming(six, baseline_us=650000.0, rounds=5, most=20, warmup=1, budget_s=1.0)
    assert tiny["rounds"] == MIN_ROUNDS and set(tiny["repeats"].values()) == {MIN_CALLS}  # the least there is
    assert tiny["baseline_rounds"] == [0, 1]


def test_the_runner_budgets_the_re_timing_from_the_runs_measuring_time(toy_dir: Path):
    from evoengineer.evaluators.replay import ReplayEvaluator
    from evoengineer.search.runner import Runner, SearchSettings
    from evoengineer.store import CandidateRecord, Store

    space = load_space(toy_dir / "toy_space.toml")
    store = Store("sqlite://")
    rid = store.create_run(space_name=space.name, space_path="x", space_text=space.text, template=space.template,
                           template_sha256="t" * 64, config={}, seed=0, fingerprint={})
    runner = Runner(space=space, evaluator=ReplayEvaluator(toy_dir / "landscape.csv", space), store=store,
                    run=store.get_run(rid), settings=SearchSettings(), out=toy_dir / "e.json")
    for i in range(10):
        runner.records[f"h{i}"] = CandidateRecord(hash=f"h{i}", params={}, status="ok", metrics={
            "time_us": 1000.0 + i, "time_p90_us": 1100.0 + i, "measure_s": 8.0, "baseline_us": 50000.0})
    plan = runner.retime_plan([runner.records[f"h{i}"] for i in range(6)])
    assert plan["budget_s"] == 20.0  # retime_share 0.2 of search + re-timing: a quarter of the 80 s measured
    assert set(plan["repeats"]) == {f"h{i}" for i in range(6)} and plan["expected_s"] <= 20.0
    for r in runner.records.values():
        r.metrics["measure_s"] = 1.0
    assert runner.retime_plan([runner.records["h0"]])["budget_s"] == MIN_BUDGET_S  # a short run: the least budget


def test_the_progress_line_states_the_re_timing_budget():
    import io
    from types import SimpleNamespace

    from evoengineer.search.progress import ProgressPrinter

    class Ev:
        kind = "local"

        def utilization(self):
            return None

        def utilization_by_device(self):
            return {}

        def build_stats(self):
            return {}

        def start_timeline(self):
            return {}

    runner = SimpleNamespace(status_counts=lambda: {"ok": 1}, settings=SimpleNamespace(budget=1), evaluations=1,
                             elite_hashes=[], records={}, evaluator=Ev(), space=SimpleNamespace(backend="cpu"),
                             finish_s={"retime": 12.34, "sanitizer": 0.0}, retime_budget_s=15.0)
    log = io.StringIO()
    ProgressPrinter(log).on_generation(runner, 0, {"stop": "budget"})
    assert "finishing: re-timing 12.3 s (budget 15.0 s), sanitizer 0.0 s" in log.getvalue()


def test_a_real_re_timing_follows_its_plan_and_stops_at_its_budget(tmp_path: Path, build_cache: Path):
    """The measuring worker times each finalist for its own calls, the baseline only in the rounds the plan names,
    and starts no round once its budget is spent (two rounds at the least)."""
    import shutil

    from conftest import DATA
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.evaluators.retiming import MIN_ROUNDS

    shutil.copytree(DATA / "faults", tmp_path / "faults")
    space = load_space(tmp_path / "faults" / "faults_space.toml")
    f = CandidateFactory(space)
    a, b = f.make({"FAULT": "none", "D_VEC": 4}), f.make({"FAULT": "none", "D_VEC": 8})
    ev = LocalEvaluator(space, cache_dir=build_cache, build_jobs=2)
    try:
        plan = {"rounds": 4, "warmup": 1, "repeats": {a.hash: 3, b.hash: 5}, "baseline_calls": 3,
                "baseline_rounds": [0, 3], "budget_s": None, "expected_s": 0.0}
        rt = ev.retime([a, b], session="plan", plan=plan)
        assert not rt.notes.get("failed"), rt.notes
        assert [len(r) for r in rt.samples[a.hash]] == [3] * 4 and [len(r) for r in rt.samples[b.hash]] == [5] * 4
        assert len(rt.baseline_p50_us) == 2
        assert [i for i, h in enumerate(rt.order) if h.startswith("baseline:")] == [2, 9]  # after rounds 1 and 4
        assert rt.notes["baseline_rounds"] == 2 and "rounds_done" not in rt.notes
        rt = ev.retime([a, b], session="spent", plan={**plan, "budget_s": 0.0})
        assert len(rt.samples[a.hash]) == MIN_ROUNDS and rt.notes["rounds_done"] == MIN_ROUNDS
        assert len(rt.baseline_p50_us) == 2  # its last planned round not reached: timed once more, for the noise
    finally:
        ev.close()


def test_with_a_device_to_spare_the_sanitizer_checks_the_finalists_while_they_are_retimed(toy_dir: Path):
    """An evaluator with a second device (a cluster of several GPU workers) certifies every finalist while the
    re-timing runs (the re-timing waits until the sanitizer has started: they overlap, by events, not timings); its
    verdicts are stored, a faulty finalist becomes sanitizer_error and no elite is certified twice."""
    import threading

    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.replay import ReplayEvaluator

    class TwoDevices(ReplayEvaluator):
        started = threading.Event()
        asked: list[list[str]] = []
        faulty = ""

        def sanitizes_beside_retiming(self):
            return True

        def sanitize(self, candidates):
            self.asked.append([c.hash for c in candidates])
            self.started.set()
            return {c.hash: {"status": "failed" if c.hash == self.faulty else "clean", "reason": "planted",
                             "tools": ["memcheck"]} for c in candidates}

        def retime(self, candidates, *, session, **kw):
            assert self.started.wait(30), "the sanitizer did not run beside the re-timing"
            return super().retime(candidates, session=session, **kw)

    space = load_space(toy_dir / "toy_space.toml")
    ev = TwoDevices(toy_dir / "landscape.csv", space)
    f = CandidateFactory(space)
    by_time = [f.from_genome(g).hash for _, g in
               sorted((ev.landscape.lookup(space.genome_to_params(g)).time_us, g) for g in space.valid_genomes())]
    ev.faulty = by_time[0]
    runner, store, rid, doc = _run(toy_dir, ev)
    assert set(ev.asked[0]) == set(by_time[:6])  # every finalist, at once, beside the re-timing
    assert all(ev.faulty not in a for a in ev.asked[1:])  # nothing asked twice
    hashes = [e["hash"] for e in doc["elites"]]
    assert len(hashes) == 3 and ev.faulty not in hashes
    assert store.find_candidate(rid, ev.faulty).status == "sanitizer_error"
    assert all(store.find_candidate(rid, h).metrics["sanitizer"]["status"] == "clean" for h in hashes)


def test_finalists_within_the_noise_keep_one_order_run_after_run():
    """Twenty re-timings of the same finalists, each moving every median by up to 0.8% (fresh processes on one
    machine): ranked by p50 alone the winner flips between the two tied fastest; with ties broken by the hash
    (retiming.stable_order) every run picks the same winner, and a finalist clearly faster is never passed over."""
    import random

    from evoengineer.evaluators.retiming import stable_order, tied

    true = {"c" * 64: 100.0, "a" * 64: 100.3, "b" * 64: 104.0, "d" * 64: 110.0}
    rng = random.Random(5)
    firsts, stable = [], []
    for _ in range(20):
        infos = {}
        for h, t in true.items():
            p50 = t * (1 + rng.uniform(-0.008, 0.008))
            infos[h] = {"p50_us": p50, "median_ci95_us": [p50 * 0.999, p50 * 1.001], "round_cv": 0.002,
                        "noise_cv": 0.002}
        firsts.append(min(infos, key=lambda h: infos[h]["p50_us"]))
        order, ties = stable_order(infos)
        stable.append(order[0])
        assert order[2:] == ["b" * 64, "d" * 64]  # 4% and 10% slower: never tied with the two fastest
    assert len(set(firsts)) == 2  # by p50 alone the winner flips
    assert set(stable) == {"a" * 64}  # tied with the faster c, and first by its hash, every time
    assert not tied({"p50_us": 100.0}, {"p50_us": 102.5}) and tied({"p50_us": 100.0}, {"p50_us": 101.9})
