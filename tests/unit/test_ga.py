"""The steady-state GA over the shared runner and the search loop, replaying the toy landscape: budget, no repeats,
validity, elites, determinism, exact resume, and a sanity check that it finds the optimum."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from conftest import CheckingEvaluator, toy_measure, write_toy_landscape
from evoengineer.store import Store
from evoengineer import elite_json
from evoengineer.evaluators import ReplayEvaluator
from evoengineer.search import GeneticSearch, Runner, SearchSettings
from evoengineer.search.ga import GAParams, make_toolbox, mutate_genes, repair
from evoengineer.space import load_space


@dataclass
class Result:
    reason: str
    runner: Runner
    store: Store
    run_id: int
    evaluator: CheckingEvaluator
    out: Path
    children: list[tuple] = field(default_factory=list)  # every proposal, in order
    search: GeneticSearch | None = None

    @property
    def doc(self) -> dict:
        return elite_json.read(self.out)

    def ok_times(self) -> list[float]:
        return sorted(c.time_us for c in self.store.candidates(self.run_id) if c.status == "ok")


def run_ga(space_file: Path, landscape: Path, work: Path, *, seed: int = 0, population: int = 8,
           generations: int = 10, elite: int = 3, budget: int | None = None, db: str | None = None,
           capture: bool = True, params: GAParams | None = None) -> Result:
    space = load_space(space_file)
    work.mkdir(parents=True, exist_ok=True)
    ev = CheckingEvaluator(ReplayEvaluator(landscape, space), space)
    store = Store(db or f"sqlite:///{work / 'ga.db'}")
    settings = SearchSettings(population=population, generations=generations, elite=elite, budget=budget, seed=seed)
    rid = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                           template=space.template, template_sha256="t" * 64,
                           config={**settings.to_dict(), "evaluator": ev.describe()}, seed=seed,
                           fingerprint={"cpu": "test"})
    out = work / "elite.json"
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings, out=out)
    res = Result("", runner, store, rid, ev, out)

    search = GeneticSearch(runner, params)
    ask = search.ask

    def checked_ask():
        g = ask()
        if g is not None:  # every proposal is a valid configuration
            assert space.is_valid_genome(g), g
            if capture:
                res.children.append(g)
        return g

    search.ask = checked_ask
    res.search = search
    res.reason = search.run()
    return res


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The toy space, its template and a full landscape; shared by the module (tests only read it)."""
    import shutil

    from conftest import DATA

    d = tmp_path_factory.mktemp("toy")
    for name in ("toy_space.toml", "toy.cpp.j2"):
        shutil.copy(DATA / name, d / name)
    write_toy_landscape(load_space(d / "toy_space.toml"), d / "landscape.csv")
    return d


def toy_run(toy: Path, work: Path, **kw) -> Result:
    return run_ga(toy / "toy_space.toml", toy / "landscape.csv", work, **kw)


def landscape_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


# ---- budget ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget, population", [(1, 8), (5, 8), (8, 8), (9, 8), (61, 8), (150, 12)])
def test_budget_is_respected_exactly(toy: Path, tmp_path: Path, budget: int, population: int):
    r = toy_run(toy, tmp_path, seed=budget, population=population, generations=1000, budget=budget)
    assert r.reason == "budget"
    assert len(r.evaluator.calls) == budget
    assert r.store.count_candidates(r.run_id) == budget == r.runner.evaluations
    assert r.doc["evaluations"] == budget and r.doc["run_status"] == "finished"


def test_generations_limit(toy: Path, tmp_path: Path):
    """Without a budget, --generations caps the run at population x (generations + 1) evaluations."""
    r = toy_run(toy, tmp_path, population=8, generations=3, elite=2)
    assert r.reason == "generations"
    assert len(r.evaluator.calls) == 8 * 4 == len(r.children)
    assert r.doc["generation"] == 4  # a label: results / population


def test_generations_zero(toy: Path, tmp_path: Path):
    r = toy_run(toy, tmp_path, population=6, generations=0)
    assert r.reason == "generations" and len(r.evaluator.calls) == 6


# A small space (12 configurations, 9 valid) to exhaust.
SMALL = """name = "small"
template = "small.j2"
task = "t"
backend = "cpu"
constraints = ["A * B <= 8"]
[parameters]
A = [1, 2, 4]
B = [1, 2, 4, 8]
"""


def small_space(d: Path, fail: set[tuple[int, int]] = frozenset()) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "small.j2").write_text("{{ A }} {{ B }}\n")
    (d / "small.toml").write_text(SMALL)
    space = load_space(d / "small.toml")
    rows = []
    for g in space.valid_genomes():
        p = space.genome_to_params(g)
        bad = (p["A"], p["B"]) in fail
        rows.append({"A": p["A"], "B": p["B"], "status": "runtime_error" if bad else "ok",
                     "time_us": "" if bad else 100 + 10 * p["A"] - p["B"]})
    return d / "small.toml", write_rows(d / "landscape.csv", rows)


def test_stops_when_the_space_is_exhausted(tmp_path: Path):
    space_file, land = small_space(tmp_path / "s")
    assert load_space(space_file).count_valid() == 9
    r = run_ga(space_file, land, tmp_path / "w", population=4, generations=500, elite=2, budget=1000)
    assert r.reason == "space exhausted"
    assert len(r.evaluator.calls) == 9 == len(set(r.evaluator.calls))


def test_population_larger_than_the_space(tmp_path: Path):
    space_file, land = small_space(tmp_path / "s")
    r = run_ga(space_file, land, tmp_path / "w", population=16, generations=5, elite=3)
    assert r.reason == "space exhausted" and len(r.evaluator.calls) == 9
    assert len(r.doc["elites"]) == 3


# ---- no repeats, valid children -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_configuration_evaluated_twice_and_children_valid(toy: Path, tmp_path: Path, seed: int):
    r = toy_run(toy, tmp_path, seed=seed, population=10, generations=25, elite=3)
    # CheckingEvaluator asserted validity and novelty on every call; the store agrees
    hashes = [c.hash for c in r.store.candidates(r.run_id)]
    assert hashes == r.evaluator.calls and len(set(hashes)) == len(hashes) == 10 * 26
    assert {tuple(r.runner.space.params_to_genome(c.params)) for c in r.store.candidates(r.run_id)} \
        == r.evaluator.keys
    # every proposal is new: nothing proposed twice, nothing proposed that was measured before
    assert len(set(r.children)) == len(r.children) == len(hashes)


# ---- elites -------------------------------------------------------------------------------------------------------
def check_elites(r: Result, k: int) -> None:
    doc = r.doc
    elites = doc["elites"]
    ok = r.ok_times()
    assert [e["metrics"]["time_us"] for e in elites] == ok[:k]
    assert [e["rank"] for e in elites] == list(range(1, len(elites) + 1))
    assert all(e["status"] == "ok" for e in elites)
    assert [e.hash for e in r.store.elites(r.run_id)] == [e["hash"] for e in elites]
    by_hash = {c.hash: c for c in r.store.candidates(r.run_id, with_source=True)}
    for e in elites:
        c = by_hash[e["hash"]]
        assert c.status == "ok" and c.params == e["params"] and c.source == e["source"] and c.source
        assert e["metrics"] == c.metrics
    assert doc["evaluations"] == r.store.count_candidates(r.run_id)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_elites_are_the_k_best_ok_candidates(toy: Path, tmp_path: Path, k: int):
    r = toy_run(toy, tmp_path, seed=k, population=10, generations=12, elite=k)
    assert len(r.doc["elites"]) == k
    check_elites(r, k)


def test_failed_candidates_never_enter_the_elites(toy: Path, tmp_path: Path):
    """Plant failures on the 300 configurations the smooth cost likes best: the GA is drawn to them."""
    rows = landscape_rows(toy / "landscape.csv")
    oks = sorted((float(r["time_us"]), i) for i, r in enumerate(rows) if r["status"] == "ok")
    statuses = ["timeout", "wrong", "gate_failed", "runtime_error", "compile_error"]
    for n, (_, i) in enumerate(oks[:300]):
        rows[i] = {**rows[i], "status": statuses[n % len(statuses)], "time_us": "", "reason": "planted"}
    land = write_rows(tmp_path / "land.csv", rows)
    r = run_ga(toy / "toy_space.toml", land, tmp_path / "w", seed=4, population=12, generations=30, elite=4)
    failed = {c.hash for c in r.store.candidates(r.run_id) if c.status != "ok"}
    assert len(failed) > 20  # the search did run into the planted failures
    assert not {r.runner.hash_of(g) for g in r.search.elites()} & failed
    check_elites(r, 4)


def test_few_ok_candidates_gives_fewer_elites(tmp_path: Path):
    space_file, land = small_space(tmp_path / "s", fail={(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1), (1, 8)})
    r = run_ga(space_file, land, tmp_path / "w", population=4, generations=50, elite=3)
    assert r.reason == "space exhausted"
    elites = r.doc["elites"]
    assert [(e["params"]["A"], e["params"]["B"]) for e in elites] == [(2, 4), (4, 2)]  # 116 us, 138 us
    assert all(e["status"] == "ok" for e in elites)
    check_elites(r, 3)


def test_every_candidate_failing(tmp_path: Path):
    all_bad = {(a, b) for a in (1, 2, 4) for b in (1, 2, 4, 8)}
    space_file, land = small_space(tmp_path / "s", fail=all_bad)
    r = run_ga(space_file, land, tmp_path / "w", population=4, generations=5, elite=2)
    assert r.doc["elites"] == [] and r.store.elites(r.run_id) == []
    assert r.reason == "space exhausted"


def test_elite_preservation(toy: Path, tmp_path: Path, monkeypatch):
    """After every result, the population holds the K best configurations told so far (age-based replacement never
    removes an elite) and never more than the population size."""
    k = 3
    seen: list[tuple[list, list]] = []
    original = GeneticSearch.observe

    def spy(self, genome, record):
        original(self, genome, record)
        ok = sorted((g for g, rec in self.told.items() if rec.status == "ok"), key=self._fitness)[:k]
        seen.append((list(self.population), ok))

    monkeypatch.setattr(GeneticSearch, "observe", spy)
    toy_run(toy, tmp_path, seed=11, population=8, generations=20, elite=k)
    assert len(seen) == 8 * 21
    for pop, best in seen:
        assert len(pop) <= 8 and set(best) <= set(pop)


# ---- determinism ----------------------------------------------------------------------------------------------------
def test_same_seed_same_result_different_seed_differs(toy: Path, tmp_path: Path):
    kw = dict(population=10, generations=15, elite=3, budget=120)
    a = toy_run(toy, tmp_path / "a", seed=5, **kw)
    random.seed(12345)  # whatever state the global RNG is in before a run does not matter
    b = toy_run(toy, tmp_path / "b", seed=5, **kw)
    c = toy_run(toy, tmp_path / "c", seed=6, **kw)
    assert a.evaluator.calls == b.evaluator.calls
    assert [(c1.hash, c1.generation, c1.status) for c1 in a.store.candidates(a.run_id)] == \
        [(c2.hash, c2.generation, c2.status) for c2 in b.store.candidates(b.run_id)]
    assert a.children == b.children
    assert a.out.read_text() == b.out.read_text()  # byte for byte
    assert a.evaluator.calls != c.evaluator.calls
    assert set(a.evaluator.calls) != set(c.evaluator.calls)


def test_the_ga_draws_from_its_own_rng_only(toy: Path, tmp_path: Path, monkeypatch):
    """Whatever else in the process draws from the global RNG (Dask's client does, on every submit), the GA's
    draws stay the same; and the GA never moves the global RNG itself."""
    kw = dict(seed=5, population=10, generations=8, elite=3, budget=70)
    random.seed(99)
    before = random.getstate()
    a = toy_run(toy, tmp_path / "a", **kw)
    assert random.getstate() == before
    plain = ReplayEvaluator.evaluate

    def eat_then_evaluate(self, candidate):
        random.getrandbits(64)
        return plain(self, candidate)

    monkeypatch.setattr(ReplayEvaluator, "evaluate", eat_then_evaluate)
    b = toy_run(toy, tmp_path / "b", **kw)
    assert random.getstate() != before  # the evaluator did draw from it
    assert a.evaluator.calls == b.evaluator.calls and a.children == b.children


# ---- operators ------------------------------------------------------------------------------------------------------
def test_mutation_always_changes_a_gene(tmp_path: Path):
    (tmp_path / "m.j2").write_text("x")
    (tmp_path / "m.toml").write_text('name = "m"\ntemplate = "m.j2"\ntask = "t"\nbackend = "cpu"\n'
                                     "[parameters]\nA = [1, 2]\nB = [5]\nC = { values = [1, 2], ordered = true }\n")
    space = load_space(tmp_path / "m.toml")
    from deap import creator

    random.seed(0)
    for _ in range(2000):
        g = random.choice(space.valid_genomes())
        ind = creator.EvoIndividual(list(g))
        mutate_genes(ind, space, indpb=random.choice([0.0, 0.3, 1.0]))
        assert list(ind) != list(g)
        assert space.is_valid_genome(ind)


def test_repair_makes_valid(toy: Path):
    from deap import creator

    space = load_space(toy / "toy_space.toml")
    random.seed(1)
    valid = set(space.valid_genomes())
    for _ in range(300):
        g = [random.randrange(len(p.values)) for p in space.parameters]
        ind = creator.EvoIndividual(g)
        was_valid = tuple(g) in valid
        repair(ind, space, indpb=0.3)
        assert tuple(ind) in valid
        if was_valid:
            assert list(ind) == g  # valid genomes are left alone
    tb = make_toolbox(space, GAParams())
    for _ in range(50):
        assert tuple(tb.individual()) in valid


# ---- sanity: it finds the optimum -----------------------------------------------------------------------------------
def test_finds_the_optimum_within_a_quarter_of_the_space(toy: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr("os.fsync", lambda fd: None)  # elite.json is rewritten every generation: skip the disk sync
    space = load_space(toy / "toy_space.toml")
    optimum = min(t for g in space.valid_genomes()
                  for s, t in [toy_measure(space.genome_to_params(g))] if s == "ok")
    budget = space.count_valid() // 4
    seeds = [0, 1, 2, 3, 4]
    hits = 0
    for seed in seeds:
        r = toy_run(toy, tmp_path / str(seed), seed=seed, population=16, generations=10_000, budget=budget,
                    db="sqlite://", capture=False)
        assert r.reason == "budget" and len(r.evaluator.calls) == budget
        best = r.doc["elites"][0]["metrics"]["time_us"]
        assert best == r.ok_times()[0] >= optimum
        hits += best <= optimum * 1.05
    assert hits >= len(seeds) - 1, f"only {hits}/{len(seeds)} seeds got within 5% of {optimum}"


def test_plus_survival_keeps_the_best_so_far_as_the_population(toy: Path, tmp_path: Path):
    """The (mu+lambda) variant: the population is the best `population` told so far."""
    r = toy_run(toy, tmp_path, seed=4, population=10, generations=12, elite=3, params=GAParams(plus_survival=True))
    cands = r.store.candidates(r.run_id)
    assert len({c.hash for c in cands}) == len(cands) == len(r.evaluator.calls)
    best = sorted((c.time_us, c.hash) for c in cands)[:10]
    assert sorted(r.search._fitness(g) for g in r.search.population) == best
    check_elites(r, 3)


def test_gene_value_model_prefers_the_values_of_the_good_configurations(toy: Path):
    from evoengineer.search.ga import GeneValueModel

    space = load_space(toy / "toy_space.toml")
    valid = space.valid_genomes()
    rng = random.Random(0)
    sample = rng.sample(valid, 300)
    scored = []
    for g in sample:
        status, t = toy_measure(space.genome_to_params(g))
        scored.append((g, t if status == "ok" else float("inf")))
    model = GeneValueModel(space, scored)
    ranked = sorted(valid, key=lambda g: -model.score(g))
    truth = {g: toy_measure(space.genome_to_params(g)) for g in valid}

    def mean_time(gs):
        ts = [truth[g][1] for g in gs if truth[g][0] == "ok"]
        return sum(ts) / len(ts)

    # the model's top tenth is much faster on average than its bottom tenth, and than the space at large
    k = len(valid) // 10
    assert mean_time(ranked[:k]) < 0.8 * mean_time(ranked[-k:])
    assert mean_time(ranked[:k]) < 0.9 * mean_time(valid)
    # failures count against their values: an all-failing value scores below the same value when it succeeds
    bad = GeneValueModel(space, [(g, float("inf")) for g, _ in scored[:50]] + scored[50:])
    assert all(np.isfinite(lr).all() for lr in bad.log_ratio)


@pytest.mark.parametrize("prescreen", [1, 8])
def test_prescreen_breeds_new_valid_children_deterministically(toy: Path, tmp_path: Path, prescreen: int):
    kw = dict(seed=3, population=12, generations=20, elite=3, budget=150, params=GAParams(prescreen=prescreen))
    a = toy_run(toy, tmp_path / "a", **kw)
    b = toy_run(toy, tmp_path / "b", **kw)
    assert a.evaluator.calls == b.evaluator.calls and len(a.evaluator.calls) == 150  # CheckingEvaluator: no repeats
    assert a.out.read_text() == b.out.read_text()


def test_the_prescreen_model_is_made_from_the_results_told(toy: Path, tmp_path: Path):
    """The gene-value model is a function of the results told (whatever order they arrived in)."""
    r = toy_run(toy, tmp_path, seed=1, population=12, generations=3, elite=3, params=GAParams(prescreen=4))
    from evoengineer.search.ga import GeneValueModel

    search = r.search
    search._model_at = -1
    m = search.model()
    told = list(search.told.items())
    ref = GeneValueModel(r.runner.space, [(g, rec.time_us) for g, rec in reversed(told)])
    assert all((x == y).all() for x, y in zip(m.log_ratio, ref.log_ratio))


# ---- never stalls ---------------------------------------------------------------------------------------------------
MID = """name = "mid"
template = "mid.j2"
task = "t"
backend = "cpu"
[parameters]
A = [1, 2, 3, 4, 5, 6]
B = [1, 2, 3, 4]
C = [1, 2, 3]
D = { values = ["x", "y"], ordered = false }
"""


def deceptive_space(d: Path) -> tuple[Path, Path, float]:
    """144 configurations: a smooth bowl around (2, 2, 2, x) and, far from it, an isolated optimum at (6, 4, 1, y)
    whose neighbours are the worst of all: the landscape that made the pre-screened GA stall."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "mid.j2").write_text("{{ A }} {{ B }} {{ C }} {{ D }}\n")
    (d / "mid.toml").write_text(MID)
    space = load_space(d / "mid.toml")
    rows = []
    for g in space.valid_genomes():
        p = space.genome_to_params(g)
        t = 100 + 5 * ((p["A"] - 2) ** 2 + (p["B"] - 2) ** 2 + (p["C"] - 2) ** 2) + (3 if p["D"] == "y" else 0)
        far = abs(p["A"] - 6) + abs(p["B"] - 4) + abs(p["C"] - 1) + (p["D"] != "y")
        if far == 0:
            t = 50.0
        elif far == 1:
            t = 400.0
        rows.append({**p, "status": "ok", "time_us": t})
    return d / "mid.toml", write_rows(d / "landscape.csv", rows), 50.0


@pytest.mark.parametrize("prescreen", [1, 8])
def test_a_budget_covering_the_space_is_spent(tmp_path: Path, prescreen: int):
    """Generations enough for the whole space (8 + 5 x 28 slots for 144 configurations): the GA does not stall in
    the bowl with budget left; it evaluates every configuration and finds the isolated optimum."""
    space_file, land, optimum = deceptive_space(tmp_path / "s")
    r = run_ga(space_file, land, tmp_path / "w", population=8, elite=3, generations=28, budget=1000,
               params=GAParams(prescreen=prescreen))
    assert r.reason == "space exhausted"
    assert len(r.evaluator.calls) == 144 == len(set(r.evaluator.calls))
    assert r.doc["elites"][0]["metrics"]["time_us"] == optimum


@pytest.mark.parametrize("prescreen", [1, 8])
def test_every_proposal_is_a_new_configuration(toy: Path, tmp_path: Path, prescreen: int):
    """Children that would repeat an evaluation (or a pending proposal) become immigrants: every proposal is
    evaluated, until the space runs out."""
    r = toy_run(toy, tmp_path, population=10, generations=40, elite=3, params=GAParams(prescreen=prescreen))
    assert len(r.children) == len(set(r.children)) == len(r.evaluator.calls) == 10 * 41


def test_immigrants_and_bypass_are_drawn_from_the_seeded_rng(toy: Path, tmp_path: Path):
    a = toy_run(toy, tmp_path / "a", seed=5, population=12, generations=6)
    b = toy_run(toy, tmp_path / "b", seed=5, population=12, generations=6)
    assert a.evaluator.calls == b.evaluator.calls and a.children == b.children


# ---- stagnation: decided from earlier generations only, so an interrupted run resumes exactly ----------------------
class Killed(Exception):
    pass


class KillingEvaluator(CheckingEvaluator):
    """Dies (like a SIGKILL between two commits) once `after` evaluations are stored."""

    def __init__(self, inner, space, after: int):
        super().__init__(inner, space)
        self.after = after

    def evaluate(self, candidate):
        if len(self.calls) >= self.after:
            raise Killed
        return super().evaluate(candidate)


def run_until_killed_then_resume(space_file: Path, land: Path, work: Path, kill: int, params: GAParams,
                                 **settings_kw) -> tuple[Store, int]:
    space = load_space(space_file)
    work.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{work / 'ga.db'}"
    store = Store(url)
    settings = SearchSettings(**settings_kw)
    rid = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                           template=space.template, template_sha256="t" * 64, config=settings.to_dict(),
                           seed=settings.seed, fingerprint={"cpu": "test"})
    ev = KillingEvaluator(ReplayEvaluator(land, space), space, kill)
    runner = Runner(space=space, evaluator=ev, store=store, run=store.get_run(rid), settings=settings,
                    out=work / "elite.json")
    with pytest.raises(Killed):
        GeneticSearch(runner, params).run()
    store.close()
    store = Store(url)  # a new process: everything comes back from the store
    runner = Runner(space=space, evaluator=CheckingEvaluator(ReplayEvaluator(land, space), space), store=store,
                    run=store.get_run(rid), settings=settings, out=work / "elite.json")
    random.seed(12345)  # whatever the new process's RNG holds, the replayed history decides
    GeneticSearch(runner, params).run()
    return store, rid


@pytest.mark.parametrize("kill", [5, 14, 31, 47, 70, 99])
def test_a_killed_run_resumes_exactly_through_stagnation(tmp_path: Path, kill: int):
    """The deceptive landscape stalls the GA in its bowl: the neighbourhood of the best, the stagnation share and
    the immigrants all come into play. Killed between two results and resumed (its proposal log replayed), the run
    evaluates the same configurations in the same order as the uninterrupted one (one at a time here: the replay
    evaluator answers in order; tests/unit/test_async_search.py kills runs whose results arrive out of order)."""
    space_file, land, _ = deceptive_space(tmp_path / "s")
    params = GAParams()
    kw = dict(population=8, generations=40, elite=3, budget=120, seed=4)
    ref = run_ga(space_file, land, tmp_path / "ref", params=params, **kw)
    store, rid = run_until_killed_then_resume(space_file, land, tmp_path / "killed", kill, params, **kw)
    got = [(c.generation, c.hash) for c in store.candidates(rid)]
    want = [(c.generation, c.hash) for c in ref.store.candidates(ref.run_id)]
    assert got == want
    assert [e.hash for e in store.elites(rid)] == [e.hash for e in ref.store.elites(ref.run_id)]


def test_the_unseen_neighbours_of_the_best_come_first(tmp_path: Path):
    """After the first population, while the best told so far has unseen one-gene neighbours, the proposals are
    those neighbours (less the immigrants' share): the search never stalls next to an untried better neighbour."""
    space_file, land, _ = deceptive_space(tmp_path / "s")
    r = run_ga(space_file, land, tmp_path / "w", population=8, elite=3, generations=12, budget=100, seed=2)
    space = load_space(space_file)
    cands = r.store.candidates(r.run_id)  # one at a time: candidate i was proposed after results 0..i-1
    asked = hits = 0
    for i in range(8, len(cands)):
        before = cands[:i]
        best = min((c for c in before if c.status == "ok"), key=lambda c: (c.time_us, c.hash))
        b = space.params_to_genome(best.params)
        seen = {tuple(space.params_to_genome(c.params)) for c in before}
        nbrs = {g for g in space.valid_genomes() if sum(x != y for x, y in zip(g, b)) == 1 and g not in seen}
        if nbrs:
            asked += 1
            hits += tuple(space.params_to_genome(cands[i].params)) in nbrs
    assert asked > 10 and hits >= 0.75 * asked, (hits, asked)


def test_the_isolated_optimum_is_found_once_the_space_is_spent(tmp_path: Path):
    """With the default switch to immigrants, a run given the whole space finds the deceptive optimum, and does
    so before the last configurations (on this seed: well before; the bowl does not hold it)."""
    space_file, land, optimum = deceptive_space(tmp_path / "s")
    r = run_ga(space_file, land, tmp_path / "w", population=12, elite=3, generations=1000, budget=144, seed=0)
    times = [c.time_us for c in r.store.candidates(r.run_id)]
    assert len(times) == 144 and min(times) == optimum
