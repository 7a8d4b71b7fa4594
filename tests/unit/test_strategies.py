"""Every strategy (ga, random, grid, optuna with each sampler) over the shared runner on replayed landscapes: end to
end, budget, no configuration measured twice, constraint-violating suggestions never measured, failures told to
Optuna as failed trials, resume after SIGKILL with no repeated measurement."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CheckingEvaluator
from evoengineer.store import Store
from evoengineer.cli import main
from evoengineer.evaluators import ReplayEvaluator
from evoengineer.search import STRATEGIES, OptunaSearch, Runner, SearchSettings
from evoengineer.space import load_space

ROOT = Path(__file__).resolve().parents[2]
# (strategy, sampler): every strategy, and every Optuna sampler
KINDS = [("ga", None), ("random", None), ("grid", None), ("optuna", "tpe"), ("optuna", "cmaes"),
         ("optuna", "gp"), ("optuna", "nsga2"), ("optuna", "random"), ("optuna", "qmc"), ("surrogate", None)]
IDS = [s if p is None else f"{s}-{p}" for s, p in KINDS]
FAILED = {"gate_failed", "timeout", "wrong"}  # the toy landscape's planted failures


def run_strategy(space_file: Path, landscape: Path, db: Path, strategy: str, sampler: str | None, *,
                 budget: int | None, population: int = 8, generations: int = 200, seed: int = 0,
                 state: dict | None = None, run_id: int | None = None):
    """One strategy run in process, through the real store and a replay evaluator that checks every call."""
    space = load_space(space_file)
    ev = CheckingEvaluator(ReplayEvaluator(landscape, space), space)
    store = Store(f"sqlite:///{db}")
    settings = SearchSettings(strategy=strategy, sampler=sampler, population=population, generations=generations,
                              elite=3, budget=budget, seed=seed)
    if run_id is None:
        run_id = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                                  template=space.template, template_sha256="t" * 64,
                                  config={**settings.to_dict(), "evaluator": ev.describe()}, seed=seed,
                                  fingerprint={"cpu": "test"})
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(run_id), settings=settings,
                    out=db.with_suffix(".json"))
    strategy_obj = STRATEGIES[strategy](runner)
    reason = strategy_obj.run(state)
    return reason, runner, store, run_id, ev, strategy_obj


@pytest.mark.parametrize("strategy, sampler", KINDS, ids=IDS)
def test_end_to_end_budget_and_no_repeats(toy_dir: Path, strategy: str, sampler: str | None):
    budget = 40 if sampler != "gp" else 24  # the GP sampler refits per suggestion: keep it short
    reason, runner, store, rid, ev, _ = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv",
                                                     toy_dir / "s.db", strategy, sampler, budget=budget)
    assert reason == "budget"
    recs = store.candidates(rid)
    assert len(recs) == budget == len(ev.calls)  # the budget is spent exactly, on distinct valid configurations
    assert [r.hash for r in recs] == ev.calls
    doc = json.loads((toy_dir / "s.json").read_text())
    ok = sorted((r.time_us, r.hash) for r in recs if r.status == "ok")
    assert [e["hash"] for e in doc["elites"]] == [h for _, h in ok[:3]]
    assert doc["run_status"] == "finished" and doc["evaluations"] == budget and doc["strategy"] == strategy
    assert doc.get("sampler") == sampler


@pytest.mark.parametrize("strategy, sampler", [k for k in KINDS if k[1] != "gp"],
                         ids=[i for i, k in zip(IDS, KINDS) if k[1] != "gp"])
def test_small_space_is_exhausted_exactly_once(tmp_path: Path, strategy: str, sampler: str | None):
    from test_ga import small_space

    space_file, land = small_space(tmp_path / "s", fail={(2, 4)})
    reason, runner, store, rid, ev, _ = run_strategy(space_file, land, tmp_path / "x.db", strategy, sampler,
                                                     budget=100, population=4)
    assert reason == "space exhausted"
    assert len(ev.calls) == 9 == len(set(ev.calls))


@pytest.mark.parametrize("strategy", ["random", "optuna"])
def test_generations_cap_without_budget(toy_dir: Path, strategy: str):
    reason, runner, *_ = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "g.db",
                                      strategy, "tpe" if strategy == "optuna" else None, budget=None,
                                      population=6, generations=4)
    assert reason == "generations" and runner.evaluations == 6 * 5


def test_random_search_is_a_seeded_permutation_of_the_valid_space(toy_dir: Path):
    space = load_space(toy_dir / "toy_space.toml")
    a = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "a.db", "random", None,
                     budget=50, seed=3)
    b = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "b.db", "random", None,
                     budget=50, seed=3)
    c = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "c.db", "random", None,
                     budget=50, seed=4)
    assert a[4].calls == b[4].calls != c[4].calls
    order = a[5].order()
    assert sorted(order) == sorted(space.valid_genomes())
    assert [a[1].hash_of(g) for g in order[:50]] == a[4].calls


def test_optuna_violations_cost_nothing_and_failures_are_failed_trials(toy_dir: Path):
    """The toy space has 5760 configurations, 3732 valid: the sampler proposes invalid ones; none is measured."""
    import optuna

    reason, runner, store, rid, ev, search = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv",
                                                          toy_dir / "o.db", "optuna", "random", budget=120, seed=5)
    assert isinstance(search, OptunaSearch)
    assert search.counts["violations"] > 10  # proposed, rejected, not measured (CheckingEvaluator asserts)
    study = search.study
    by_state = {}
    for t in study.trials:
        by_state.setdefault(t.state, []).append(t)
    complete = by_state.get(optuna.trial.TrialState.COMPLETE, [])
    failed = by_state.get(optuna.trial.TrialState.FAIL, [])
    violating = [t for t in failed if "violates" in t.user_attrs]
    assert len(violating) == search.counts["violations"]
    recs = {r.hash: r for r in store.candidates(rid)}
    measured_failures = [t for t in failed if t.user_attrs.get("status") in FAILED]
    assert {t.user_attrs["hash"] for t in measured_failures} == {h for h, r in recs.items() if r.status != "ok"}
    assert any(r.status != "ok" for r in recs.values())
    for t in complete:  # each complete trial carries the measured time of its configuration
        assert t.value == recs[t.user_attrs["hash"]].time_us


def test_optuna_resume_rebuilds_the_study_from_the_store(toy_dir: Path):
    """A run continued with a larger budget replays its proposals and results into a fresh study (nothing measured
    again) and goes on."""
    space_file, land, db = toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "r.db"
    _, _, store, rid, ev1, _ = run_strategy(space_file, land, db, "optuna", "tpe", budget=30, seed=2)
    first = set(ev1.calls)
    reason, runner, store, _, ev2, search = run_strategy(space_file, land, db, "optuna", "tpe", budget=70, seed=2,
                                                         run_id=rid)
    assert reason == "budget" and not first & set(ev2.calls) and len(ev2.calls) == 40
    assert len([t for t in search.study.trials if "hash" in t.user_attrs]) >= 70
    assert store.count_candidates(rid) == 70


def test_nearest_unseen_projection(toy_dir: Path):
    space = load_space(toy_dir / "toy_space.toml")
    _, runner, *_ = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv", toy_dir / "p.db", "optuna",
                                 "tpe", budget=1)
    search = OptunaSearch(runner)
    names = space.names
    bad = [0] * len(space.parameters)
    bad[names.index("NUM_WARPS")] = 0  # 4 warps
    bad[names.index("NUM_PRODUCER_WARPS")] = 4  # 4 producers: not < NUM_WARPS (the only constraint broken)
    bad[names.index("STAGES")] = 1  # 2 stages, as producers need
    assert not space.is_valid_genome(bad)
    got = search.nearest_unseen(bad)
    assert space.is_valid_genome(got)
    dist = sum(abs(a - b) if p.ordinal else int(a != b) for a, b, p in zip(got, bad, space.parameters))
    assert dist == 1  # one step on one gene repairs it (fewer producers, or more warps)


# ---- CLI ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--strategy", "annealing"], "--strategy 'annealing': unknown"),
    (["--strategy", "ga", "--sampler", "tpe"], "--sampler tpe: only with --strategy optuna"),
    (["--strategy", "optuna", "--sampler", "bohb"], "--sampler 'bohb': unknown"),
])
def test_cli_rejects_bad_strategy_options(toy_dir: Path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(toy_dir)
    code = main(["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///c.db",
                 *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (toy_dir / "c.db").exists() and not (toy_dir / "elite.json").exists()


# ---- SIGKILL and resume, through the CLI ---------------------------------------------------------------------------
def _env(log: Path | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["EVOENGINEER_REPLAY_DELAY_S"] = "0.02"
    if log is not None:
        env["EVOENGINEER_REPLAY_LOG"] = str(log)
    return env


def _stored(db: Path) -> list[str]:
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return [r[0] for r in con.execute("select hash from candidates where run_id = 1 order by seq")]
        finally:
            con.close()
    except sqlite3.Error:
        return []


KILLS = [("ga", None, 17), ("random", None, 17), ("grid", None, 17), ("optuna", "tpe", 17), ("optuna", "cmaes", 17),
         ("optuna", "nsga2", 17), ("optuna", "tpe", 4), ("optuna", "tpe", 29), ("optuna", "tpe", 44),
         ("surrogate", None, 17), ("surrogate", None, 44)]


@pytest.mark.parametrize("strategy, sampler, kill_after", KILLS,
                         ids=[f"{s}{'-' + p if p else ''}-{k}" for s, p, k in KILLS])
def test_sigkill_then_resume_measures_nothing_twice(toy_dir: Path, strategy: str, sampler: str | None,
                                                    kill_after: int):
    budget = 50
    db = toy_dir / "k.db"
    cmd = [sys.executable, "-m", "evoengineer", "search", "--space", "toy_space.toml", "--landscape",
           "landscape.csv", "--db", "sqlite:///k.db", "--out", "k.json", "--strategy", strategy, "--seed", "11",
           "--population", "6", "--generations", "100", "--budget", str(budget)]
    if sampler:
        cmd += ["--sampler", sampler]
    proc = subprocess.Popen(cmd, cwd=toy_dir, env=_env(toy_dir / "first.log"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(_stored(db)) < kill_after:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.kill()
    proc.wait(timeout=60)
    before = _stored(db)
    assert kill_after <= len(before) < budget
    log = toy_dir / "resumed.log"
    r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///k.db"], cwd=toy_dir,
                       env=_env(log), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    measured = [line.split()[0] for line in log.read_text().splitlines()]
    assert not set(measured) & set(before), "the resumed run measured a stored configuration again"
    assert len(measured) == len(set(measured)) == budget - len(before)
    after = _stored(db)
    assert len(after) == budget == len(set(after)) and after[:len(before)] == before
    doc = json.loads((toy_dir / "k.json").read_text())
    assert doc["run_status"] == "finished" and doc["evaluations"] == budget
    # every strategy (Optuna's samplers too: a resume replays the stored generations into a fresh, equally seeded
    # sampler) ends with the set and the elites of an uninterrupted run
    ref_cmd = [{"sqlite:///k.db": "sqlite:///ref.db", "k.json": "ref.json"}.get(x, x) for x in cmd]
    ref = subprocess.run(ref_cmd, cwd=toy_dir, env=_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert set(_stored(toy_dir / "ref.db")) == set(after)
    ref_doc = json.loads((toy_dir / "ref.json").read_text())
    assert [e["hash"] for e in ref_doc["elites"]] == [e["hash"] for e in doc["elites"]]
    assert ref_doc["generation"] == doc["generation"]


def test_surrogate_models_failures_apart_and_proposes_deterministically(toy_dir: Path):
    """The time model sees only correct candidates (a failure is never given a time); the correctness classifier
    sees every evaluation; the same history and seed give the same proposal, never a configuration seen before."""
    from evoengineer.search.surrogate import SurrogateSearch

    reason, runner, store, rid, ev, strat = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv",
                                                         toy_dir / "s.db", "surrogate", None, budget=36, seed=5)
    assert reason == "budget" and len(ev.calls) == 36
    statuses = {r.status for r in runner.records.values()}
    assert statuses & FAILED, "the toy landscape plants failures"
    hist = strat.history()
    assert len(hist) == 36 and all(good == (t == t) for _, good, t in hist)  # failures carry no time (NaN)
    again = SurrogateSearch(runner)
    again.told = dict(reversed(list(strat.told.items())))  # the same results, told in another order
    first, second = strat.batch(3, 6), again.batch(3, 6)
    assert first == second and len(first) == 6 and len(set(first)) == 6
    assert not set(first) & set(strat.told)


def test_surrogate_explores_more_the_longer_it_stalls(toy_dir: Path, monkeypatch):
    """One slot in `explore` explores; half the batch once the best has not improved for `stall` generations; all
    but the model's best guess after `give_up`; the earlier ExtraTrees model stays available, an unknown one is
    refused."""
    from evoengineer.search.surrogate import SurrogateParams, SurrogateSearch

    *_, runner, _, _, _, done = run_strategy(toy_dir / "toy_space.toml", toy_dir / "landscape.csv",
                                             toy_dir / "s.db", "surrogate", None, budget=36, seed=5)

    def told(params=None):
        s = SurrogateSearch(runner, params)
        s.told = dict(done.told)
        return s

    asked = []
    far = SurrogateSearch._far_unseen

    def spy(self, rng, seen, picked, n):
        asked.append((len(picked), n))
        return far(self, rng, seen, picked, n)

    monkeypatch.setattr(SurrogateSearch, "_far_unseen", spy)
    for stalled, split in ((0, (7, 1)), (3, (4, 4)), (6, (1, 7))):
        monkeypatch.setattr(SurrogateSearch, "_stalled_for", lambda self, g, s=stalled: s)
        out = told().batch(3, 8)
        assert asked[-1] == split and len(out) == len(set(out)) == 8, (stalled, asked[-1])
    assert len(told(SurrogateParams(model="extra")).batch(3, 8)) == 8
    with pytest.raises(ValueError, match="surrogate model 'gp'"):
        told(SurrogateParams(model="gp")).batch(3, 8)


def test_surrogate_trusts_its_correctness_classifier_only_where_failures_follow_genes(toy_dir: Path):
    """Failures that follow a gene: the classifier (out-of-bag skill above the base rate) marks that gene's value
    unlikely; failures at random (no gene predicts them): it is set aside, every configuration counts as likely
    correct, so good configurations are not dropped on noise. trust=-1 keeps the classifier whatever its skill."""
    import random as _random
    from types import SimpleNamespace

    from evoengineer.search.surrogate import SurrogateParams, SurrogateSearch

    space = load_space(toy_dir / "toy_space.toml")
    runner = SimpleNamespace(space=space, records={}, settings=SimpleNamespace(seed=0, population=8))
    strat = SurrogateSearch(runner)  # type: ignore[arg-type]
    valid = strat.valid()
    rng = _random.Random(3)
    rows = [tuple(int(v) for v in valid[i]) for i in rng.sample(range(len(valid)), min(len(valid), 60))]
    x = strat.encode(valid)
    gene = next(i for i, p in enumerate(space.parameters) if len(set(valid[:, i].tolist())) > 1)
    bad = valid[:, gene] == valid[0, gene]
    by_gene = [(g, g[gene] != valid[0, gene], 1.0) for g in rows]
    p = strat._p_correct(by_gene, x, seed=1)
    assert p[bad].mean() < 0.5 < p[~bad].mean() and (p < 1.0).any()
    at_random = [(g, rng.random() > 0.3, 1.0) for g in rows]
    assert (strat._p_correct(at_random, x, seed=1) == 1.0).all()
    always = SurrogateSearch(runner, SurrogateParams(trust=-1))  # type: ignore[arg-type]
    assert (always._p_correct(at_random, x, seed=1) < 1.0).any()
