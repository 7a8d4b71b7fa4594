"""Genetic algorithm over a space (DEAP), with the K best valid individuals carried into every generation.

Determinism: all randomness comes from one private `random.Random` per search, seeded from the run's seed (never
the global `random` module: other code in the process, e.g. Dask's client, draws from that); the operators that DEAP
would take from its module-level `random` (uniform crossover, tournament selection) are here with an `rng` argument,
drawing exactly as DEAP's do. A checkpoint after every generation holds the population, the hall of fame, the logbook
and the RNG state (JSON, no pickle). Resuming replays the interrupted generation from that state, so the evaluated
set and the elites equal an uninterrupted run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

import numpy as np
from deap import base, creator, tools

from evoengineer.search.runner import Runner
from evoengineer.space.spec import SearchSpace

if not hasattr(creator, "EvoFitnessMin"):
    creator.create("EvoFitnessMin", base.Fitness, weights=(-1.0,))
if not hasattr(creator, "EvoIndividual"):
    creator.create("EvoIndividual", list, fitness=creator.EvoFitnessMin)

Individual = Any


@dataclass
class GAParams:
    """Operator rates. cxpb/mutpb per child; indpb per gene. Defaults tuned on the recorded CPU and CUDA landscapes
    (experiments/strategies/README.md): frequent crossover, every child mutated, lightly (one gene in ten), and
    8 children bred per slot of which the gene-value model keeps the most promising."""

    cxpb: float = 0.9
    mutpb: float = 1.0
    indpb: float = 0.1
    tournsize: int = 3
    novelty_tries: int = 20
    plus_survival: bool = False  # next population: the best of parents + children (mu+lambda), not K elites + children
    prescreen: int = 8  # breed this many children per slot and keep the ones the gene-value model ranks best (1: off)
    # exploration that no model or basin can switch off: this share of the kept children is drawn at random from the
    # bred ones instead of by the pre-screen, and this share of each generation is random unseen configurations
    # (immigrants). A child that still repeats an earlier evaluation after the novelty nudges becomes an immigrant
    # too, so every generation evaluates new configurations while unseen ones remain.
    prescreen_bypass: float = 0.0  # tuning stage 6 (experiments/strategies): any bypass cost on the recorded landscapes
    immigrants: float = 0.1  # one of the 9 children of a population of 12
    # local search first: the unseen valid neighbours (one gene changed) of the best configuration so far are bred
    # slots of every generation from `local_patience` generations without a gain on (-1: off), until none is left
    local_patience: int = 0
    # then, once `patience` generations without a better result have evaluated `patience_share` of the valid space
    # and the best has no unseen neighbour left, `stagnation_immigrants` of each generation are immigrants until the
    # best improves again: a basin that stopped paying is left for the rest of the space (isolated optima, needles).
    # Tuned on synthetic landscapes (experiments/strategies/README.md, issue 14).
    stagnation_immigrants: float = 0.9
    patience: int = 2
    patience_share: float = 0.05


# ---- operators --------------------------------------------------------------------------------------------------
# Each takes the RNG to draw from (default: the global `random` module, for interactive use and old callers).
Rng = Any  # random.Random, or the random module itself


def cx_uniform(ind1: Individual, ind2: Individual, indpb: float, rng: Rng = random) -> tuple[Individual, Individual]:
    """DEAP's `tools.cxUniform` drawing from `rng`: swap each gene with probability indpb, in place."""
    for i in range(min(len(ind1), len(ind2))):
        if rng.random() < indpb:
            ind1[i], ind2[i] = ind2[i], ind1[i]
    return ind1, ind2


def sel_tournament(individuals: Sequence[Individual], k: int, tournsize: int, rng: Rng = random) -> list[Individual]:
    """DEAP's `tools.selTournament` drawing from `rng`: k times the fittest of `tournsize` drawn with replacement."""
    return [max([rng.choice(individuals) for _ in range(tournsize)], key=attrgetter("fitness")) for _ in range(k)]


def _mutate_gene(ind: Individual, i: int, space: SearchSpace, rng: Rng = random) -> None:
    p = space.parameters[i]
    n = len(p.values)
    if p.ordinal:
        step = rng.choice((-1, 1)) * (2 if rng.random() < 0.2 else 1)
        j = ind[i] + step
        if not 0 <= j < n:  # reflect at the ends
            j = ind[i] - step
        j = min(max(j, 0), n - 1)
        if j == ind[i]:  # a two-step on a short gene can reflect back onto itself: take the neighbour instead
            j = ind[i] + 1 if ind[i] + 1 < n else ind[i] - 1
        ind[i] = j
    else:
        ind[i] = rng.choice([j for j in range(n) if j != ind[i]])


def mutate_genes(ind: Individual, space: SearchSpace, indpb: float, rng: Rng = random) -> tuple[Individual]:
    """Per-gene mutation: ordinal genes step to a neighbour (sometimes two), categorical genes resample.
    At least one gene changes, so a mutant is never a silent clone."""
    mutable = [i for i, p in enumerate(space.parameters) if len(p.values) > 1]
    if not mutable:
        return (ind,)
    hits = [i for i in mutable if rng.random() < indpb]
    for i in hits or [rng.choice(mutable)]:
        _mutate_gene(ind, i, space, rng)
    return (ind,)


def repair(ind: Individual, space: SearchSpace, indpb: float, tries: int = 20, rng: Rng = random) -> Individual:
    """Make `ind` valid in place: re-mutate a copy up to `tries` times, else draw a random valid genome."""
    if space.is_valid_genome(ind):
        return ind
    original = list(ind)
    for _ in range(tries):
        trial = creator.EvoIndividual(original)
        mutate_genes(trial, space, indpb, rng)
        if space.is_valid_genome(trial):
            ind[:] = trial
            return ind
    ind[:] = space.random_valid_genome(rng)
    return ind


def make_toolbox(space: SearchSpace, params: GAParams, rng: Rng = random) -> base.Toolbox:
    """The GA's operators bound to the space, the rates and one RNG."""
    tb = base.Toolbox()
    tb.register("individual", lambda: creator.EvoIndividual(space.random_valid_genome(rng)))
    tb.register("mate", cx_uniform, indpb=0.5, rng=rng)
    tb.register("mutate", mutate_genes, space=space, indpb=params.indpb, rng=rng)
    tb.register("repair", repair, space=space, indpb=params.indpb, rng=rng)
    tb.register("select", sel_tournament, tournsize=params.tournsize, rng=rng)
    return tb


def make_stats() -> tools.Statistics:
    def finite(xs: Sequence[float]) -> list[float]:
        return [x for x in xs if math.isfinite(x)]

    stats = tools.Statistics(key=lambda ind: ind.fitness.values[0] if ind.fitness.valid else math.inf)
    stats.register("valid", lambda xs: len(finite(xs)))
    stats.register("best", lambda xs: min(finite(xs)) if finite(xs) else None)
    stats.register("median", lambda xs: float(np.median(finite(xs))) if finite(xs) else None)
    return stats


class GeneValueModel:
    """Which gene values the good configurations have: per gene, smoothed frequencies of each value among the best
    `gamma` share of the correct evaluations vs among the rest (failures count with the rest). A child's score is
    the sum over genes of log(good / rest): a cheap pre-screen of children before anything is built."""

    def __init__(self, space: SearchSpace, scored: Sequence[tuple[Sequence[int], float]], gamma: float = 0.15):
        ok = sorted((t, tuple(g)) for g, t in scored if math.isfinite(t))
        n_good = max(1, math.ceil(gamma * len(ok)))
        good = [g for _, g in ok[:n_good]]
        # sorted: the model is a function of the set of measurements, not of the order they were recorded in (a
        # cluster records them as they finish); float sums in another order could differ in the last bit
        rest = [g for _, g in ok[n_good:]] + sorted(tuple(g) for g, t in scored if not math.isfinite(t))
        self.log_ratio: list[np.ndarray] = []
        for i, p in enumerate(space.parameters):
            n = len(p.values)
            lg = self._density([g[i] for g in good], n, p.ordinal)
            lr = self._density([g[i] for g in rest], n, p.ordinal)
            self.log_ratio.append(np.log(lg) - np.log(lr))

    @staticmethod
    def _density(values: Sequence[int], n: int, ordinal: bool) -> np.ndarray:
        counts = np.full(n, 1.0 / n)  # prior: one observation spread evenly
        for v in values:
            if ordinal:  # half the weight on the value, a quarter on each neighbour (reflected at the ends)
                counts[v] += 0.5
                for u in (v - 1, v + 1):
                    counts[min(max(u, 0), n - 1) if 0 <= u < n else v] += 0.25
            else:
                counts[v] += 1.0
        return counts / counts.sum()

    def score(self, genome: Sequence[int]) -> float:
        return float(sum(lr[g] for lr, g in zip(self.log_ratio, genome)))


# ---- state <-> JSON ---------------------------------------------------------------------------------------------
def rng_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def rng_from_json(data: list) -> tuple:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


def _individual(genome: Sequence[int]) -> Individual:
    return creator.EvoIndividual(list(genome))


# ---- the algorithm ----------------------------------------------------------------------------------------------
class GeneticSearch:
    """One GA run over a Runner. `run(state)` starts fresh (state None) or continues from a checkpoint state."""

    name = "ga"

    def __init__(self, runner: Runner, params: GAParams | None = None):
        self.runner = runner
        self.space = runner.space
        self.settings = runner.settings
        self.params = params or GAParams()
        self.rng = random.Random(self.settings.seed)  # private: seeded again by run(), restored from checkpoints
        self.toolbox = make_toolbox(self.space, self.params, self.rng)
        self.stats = make_stats()
        self.hof = tools.HallOfFame(max(1, self.settings.elite))
        self.logbook = tools.Logbook()
        self.logbook.header = ["gen", "evals", "valid", "best", "median"]
        self._genomes: dict[str, tuple[int, ...]] = {}  # record hash -> genome, for the pre-screen model

    # fitness from the runner's records; failed or unevaluated -> inf (never in the hall of fame)
    def _assign(self, pop: Sequence[Individual], generation: int) -> None:
        records = self.runner.evaluate(pop, generation)
        for ind, rec in zip(pop, records):
            if rec is not None:
                ind.fitness.values = (rec.time_us,)

    def _update_hof(self, pop: Sequence[Individual]) -> None:
        self.hof.update([ind for ind in pop if ind.fitness.valid and math.isfinite(ind.fitness.values[0])])

    def _elite_hashes(self) -> list[str]:
        return [self.runner.hash_of(ind) for ind in self.hof]

    def _record(self, gen: int, pop: Sequence[Individual]) -> dict[str, Any]:
        rec = self.stats.compile(pop)
        self.logbook.record(gen=gen, evals=self.runner.evaluations, **rec)
        return {"gen": gen, "evals": self.runner.evaluations, **rec}

    def _checkpoint(self, gen: int, pop: Sequence[Individual]) -> None:
        state = {
            "strategy": self.name,
            "generation": gen,
            "population": [list(ind) for ind in pop],
            "hall_of_fame": [list(ind) for ind in self.hof],  # best first
            "logbook": [dict(r) for r in self.logbook],
            "rng": rng_to_json(self.rng.getstate()),
        }
        self.runner.store.save_checkpoint(self.runner.run.id, gen, state)

    def _restore(self, state: dict[str, Any]) -> tuple[int, list[Individual]]:
        pop = [_individual(g) for g in state["population"]]
        for ind in pop:
            rec = self.runner.records.get(self.runner.hash_of(ind))
            if rec is not None:
                ind.fitness.values = (rec.time_us,)
        self.hof.clear()
        for g in reversed(state["hall_of_fame"]):  # reversed insertion reproduces the saved order, ties included
            ind = _individual(g)
            ind.fitness.values = (self.runner.records[self.runner.hash_of(ind)].time_us,)
            self.hof.insert(ind)
        for r in state["logbook"]:
            self.logbook.record(**r)
        self.rng.setstate(rng_from_json(state["rng"]))
        return int(state["generation"]), pop

    def _initial_population(self) -> list[Individual]:
        valid = self.space.valid_genomes()
        n = self.settings.population
        if n <= len(valid):
            return [_individual(g) for g in self.rng.sample(valid, n)]
        return [_individual(g) for g in valid] + [self.toolbox.individual() for _ in range(n - len(valid))]

    def _novel(self, child: Individual, gen: int, taken: set[tuple[int, ...]]) -> Individual:
        """Nudge a child that repeats an earlier evaluation (or a sibling) toward an unseen valid config."""
        for _ in range(self.params.novelty_tries):
            if not self.runner.seen_before(child, gen) and tuple(child) not in taken:
                break
            self.toolbox.mutate(child)
            self.toolbox.repair(child)
        return child

    def _offspring(self, pop: Sequence[Individual], n: int, gen: int) -> list[Individual]:
        """n children for generation `gen`: first the unseen neighbours of the best (see `local_patience`), then
        `immigrants` x n random unseen configurations (`stagnation_immigrants` x n once the run stagnates and no
        neighbour is left); the rest bred, with prescreen > 1 the best-scored of prescreen x as many bred (less a
        `prescreen_bypass` share drawn at random from the others). Any child still repeating an earlier evaluation or
        a sibling is replaced by an immigrant. Every input is a record of an earlier generation or the RNG."""
        stagnant = self._stagnant_generations(gen)
        local = self._unseen_neighbours(gen) if 0 <= self.params.local_patience <= stagnant else []
        share = self.params.immigrants if local else self._immigrant_share(gen)
        n_imm = int(round(n * share)) if n > 2 else 0
        n_local = min(len(local), n - n_imm)
        n_bred = n - n_imm - n_local
        model = self._model(gen) if self.params.prescreen > 1 else None
        if model is None:
            children = self._breed(pop, n_bred, gen)
        else:
            bred = self._breed(pop, n_bred * self.params.prescreen, gen)
            order = sorted(range(len(bred)), key=lambda k: (-model.score(bred[k]), k))
            n_free = int(round(n_bred * self.params.prescreen_bypass))
            kept, rest = order[: n_bred - n_free], order[n_bred - n_free:]
            kept += self.rng.sample(rest, min(n_free, len(rest)))
            children = [bred[k] for k in kept]
        return self._fill_unseen([_individual(g) for g in local[:n_local]] + children, n_imm, gen)

    def _unseen_neighbours(self, gen: int) -> list[tuple[int, ...]]:
        """The valid configurations one gene away from the best of the earlier generations that no earlier
        generation evaluated, in a random (seeded) order."""
        ok = [r for r in self.runner.records.values() if r.generation < gen and math.isfinite(r.time_us)]
        if not ok:
            return []
        best = list(self._genome_of(min(ok, key=lambda r: (r.time_us, r.hash))))
        out = []
        for i, p in enumerate(self.space.parameters):
            for v in range(len(p.values)):
                if v != best[i]:
                    g = tuple(best[:i] + [v] + best[i + 1:])
                    if self.space.is_valid_genome(g) and not self.runner.seen_before(g, gen):
                        out.append(g)
        self.rng.shuffle(out)
        return out

    def _fill_unseen(self, children: list[Individual], n_imm: int, gen: int) -> list[Individual]:
        """`children` with repeats (of earlier generations or of siblings) replaced by random unseen valid
        configurations, plus `n_imm` more of those; fewer only when the unseen configurations run out."""
        unseen: list[tuple[int, ...]] | None = None
        taken: set[tuple[int, ...]] = set()

        def immigrant() -> tuple[int, ...] | None:
            nonlocal unseen
            if unseen is None:  # computed once per generation, and only when needed
                unseen = [g for g in self.space.valid_genomes() if not self.runner.seen_before(g, gen)]
            while unseen:
                g = unseen.pop(self.rng.randrange(len(unseen)))
                if g not in taken:
                    return g
            return None

        def repeats(child: Individual) -> bool:
            return self.runner.seen_before(child, gen) or tuple(child) in taken

        out: list[Individual] = []
        for child in children:
            # a repeat first jumps further from where it is (mutation of a third of its genes), then anywhere
            for _ in range(self.params.novelty_tries if repeats(child) else 0):
                mutate_genes(child, self.space, 1 / 3, self.rng)
                repair(child, self.space, 1 / 3, rng=self.rng)
                if not repeats(child):
                    break
            if repeats(child):
                g = immigrant()
                if g is not None:
                    child[:] = g
            taken.add(tuple(child))
            out.append(child)
        for _ in range(n_imm):
            g = immigrant()
            if g is None:
                break
            taken.add(g)
            out.append(_individual(g))
        return out

    def _immigrant_share(self, gen: int) -> float:
        """The share of generation `gen` that is random unseen configurations (from earlier generations only)."""
        p = self.params
        gens, evals = self._stagnation(gen)
        if gens < p.patience or evals < p.patience_share * self.space.count_valid():
            return p.immigrants
        return max(p.immigrants, p.stagnation_immigrants)

    def _stagnant_generations(self, gen: int) -> int:
        return self._stagnation(gen)[0]

    def _stagnation(self, gen: int) -> tuple[int, int]:
        """Generations before `gen` since the best result last improved, and the evaluations they made (from the
        records of earlier generations only, so a resumed generation decides as the uninterrupted one did)."""
        best_of: dict[int, float] = {}
        count: dict[int, int] = {}
        for r in self.runner.records.values():
            if r.generation < gen:
                best_of[r.generation] = min(best_of.get(r.generation, math.inf), r.time_us)
                count[r.generation] = count.get(r.generation, 0) + 1
        if not best_of:
            return 0, 0
        best, last_gain = math.inf, 0
        for g in sorted(best_of):
            if best_of[g] < best:
                best, last_gain = best_of[g], g
        return (gen - 1) - last_gain, sum(n for g, n in count.items() if g > last_gain)

    def _model(self, gen: int) -> GeneValueModel | None:
        """The gene-value model of what earlier generations measured (never the current one's partial results, so
        a resumed generation breeds exactly as the uninterrupted one did). None until 10 correct evaluations."""
        scored = [(self._genome_of(r), r.time_us) for r in self.runner.records.values() if r.generation < gen]
        if sum(1 for _, t in scored if math.isfinite(t)) < 10:
            return None
        return GeneValueModel(self.space, scored)

    def _genome_of(self, rec: Any) -> tuple[int, ...]:
        g = self._genomes.get(rec.hash)
        if g is None:
            g = self._genomes[rec.hash] = tuple(self.space.params_to_genome(rec.params))
        return g

    def _breed(self, pop: Sequence[Individual], n: int, gen: int) -> list[Individual]:
        tb = self.toolbox
        chosen = tb.select(pop, n)
        offspring = [tb.clone(ind) for ind in chosen]
        for i in range(1, len(offspring), 2):
            if self.rng.random() < self.params.cxpb:
                tb.mate(offspring[i - 1], offspring[i])
        taken: set[tuple[int, ...]] = set()
        for child in offspring:
            if self.rng.random() < self.params.mutpb:
                tb.mutate(child)
            tb.repair(child)
            self._novel(child, gen, taken)
            taken.add(tuple(child))
            del child.fitness.values
        return offspring

    def _speculate(self, pop: Sequence[Individual], n: int, gen: int) -> None:
        """Start building (never measuring) what generation `gen` will likely breed, while the generation before it
        is measured: a guess made as if that generation's results changed nothing (the neighbours of the best so
        far, children of the current elites). The RNG is put back, so the real breeding draws exactly as without
        the guess; a guessed child that is bred for real finds its build in the cache."""
        if not self.runner.wants_prefetch(certain=False):
            return
        state = self.rng.getstate()
        try:
            guess = self._offspring([self.toolbox.clone(ind) for ind in pop], n, gen)
        finally:
            self.rng.setstate(state)
        self.runner.prefetch(guess)

    def run(self, state: dict[str, Any] | None = None) -> str:
        """Search until the generations or the budget run out. Returns why it stopped."""
        r, s = self.runner, self.settings
        if state is None:
            self.rng.seed(s.seed)
            pop = self._initial_population()
            gen = 0
            self._assign(pop, 0)
            self._update_hof(pop)
            stats = self._record(0, pop)
            if not r.exhausted:
                self._checkpoint(0, pop)
            r.publish(self._elite_hashes(), 0, stats=stats)
        else:
            gen, pop = self._restore(state)
        while True:
            if r.exhausted:
                reason = r.why_stopped()
                break
            if r.space_exhausted:
                reason = "space exhausted"
                break
            if gen >= s.generations:
                reason = "generations"
                break
            gen += 1
            elites = [self.toolbox.clone(ind) for ind in self.hof][: s.elite]
            offspring = self._offspring(pop, max(0, s.population - len(elites)), gen)
            if gen < s.generations:
                self._speculate(elites + offspring, max(0, s.population - len(elites)), gen + 1)
            self._assign(offspring, gen)
            if self.params.plus_survival:
                pool = [ind for ind in pop + offspring if ind.fitness.valid]
                pool.sort(key=lambda ind: (ind.fitness.values[0], self.runner.hash_of(ind)))
                pop = [self.toolbox.clone(ind) for ind in pool[: s.population]]
            else:
                pop = elites + offspring
            self._update_hof(offspring)
            stats = self._record(gen, pop)
            if not r.exhausted:
                self._checkpoint(gen, pop)
            r.publish(self._elite_hashes(), gen, stats=stats)
        r.publish(self._elite_hashes(), gen, finished=True, stats={"gen": gen, "stop": reason})
        return reason
