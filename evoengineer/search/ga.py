"""Steady-state genetic algorithm over a space (DEAP operators), the K best valid individuals always kept.

No generations: each proposal is one child bred from the population as it stands, and each result that arrives
takes the place of the oldest member that is not one of the K elites (age-based replacement: with results arriving
P - K at a time this is the generational GA with K elites carried). Exploration as tuned on the recorded landscapes
(experiments/strategies/README.md): the unseen neighbours of the best first, a share of random unseen immigrants
(more once the search stagnates), children pre-screened by a gene-value model of what was measured.

Determinism: all randomness comes from one private `random.Random`, seeded from the run's seed (never the global
`random` module: other code in the process, e.g. Dask's client, draws from that); the operators that DEAP would take
from its module-level `random` (uniform crossover, tournament selection) are here with an `rng` argument, drawing
exactly as DEAP's do. A proposal depends only on the seed and on the order of earlier proposals and results, which
the search loop logs: a resumed run replays them (search/loop.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

import numpy as np
from deap import base, creator

from evoengineer.search.options import build as build_options
from evoengineer.search.runner import Runner
from evoengineer.search.strategy import Genome, Strategy
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
    plus_survival: bool = False  # population: the best told so far (mu+lambda), not age-based with K elites kept
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


def _individual(genome: Sequence[int]) -> Individual:
    return creator.EvoIndividual(list(genome))


# ---- the algorithm ----------------------------------------------------------------------------------------------
class GeneticSearch(Strategy):
    """Steady-state GA over a Runner's space (see the module doc)."""

    name = "ga"
    params_cls = GAParams

    def __init__(self, runner: Runner, params: GAParams | None = None):
        super().__init__(runner)
        self.params = params or build_options(GAParams, getattr(self.settings, "options", None) or {})
        self.rng = random.Random(self.settings.seed)
        self.toolbox = make_toolbox(self.space, self.params, self.rng)
        self.population: list[Genome] = []  # members, oldest first (results told)
        self._initial: list[Genome] | None = None
        self._best = math.inf
        self._since_gain = 0  # results told since the best last improved
        self._model: GeneValueModel | None = None
        self._model_at = -1  # results told when the model was made

    # ---- bookkeeping of results ---------------------------------------------------------------------------------
    def _fitness(self, g: Genome) -> tuple[float, str]:
        rec = self.told[g]
        return rec.time_us, rec.hash

    def elites(self) -> list[Genome]:
        """The K best correct configurations of the population (ties by hash)."""
        ok = [g for g in self.population if math.isfinite(self.told[g].time_us)]
        return sorted(ok, key=self._fitness)[: self.settings.elite]

    def observe(self, genome: Genome, record: Any) -> None:
        t = record.time_us
        if t < self._best:
            self._best, self._since_gain = t, 0
        else:
            self._since_gain += 1
        if genome in self.population:
            return
        size = self.settings.population
        if self.params.plus_survival:  # (mu+lambda): the best `population` told so far
            self.population = sorted([*self.population, genome], key=self._fitness)[:size]
            return
        if len(self.population) >= size:
            keep = set(self.elites())
            for i, g in enumerate(self.population):  # the oldest member that is not an elite leaves
                if g not in keep:
                    del self.population[i]
                    break
        self.population.append(genome)

    # ---- proposals ----------------------------------------------------------------------------------------------
    def propose(self) -> Genome | None:
        if self._initial is None:
            valid = self.space.valid_genomes()
            n = min(self.settings.population, len(valid))
            self._initial = [tuple(g) for g in self.rng.sample(valid, n)]
        while self._initial:  # the first population: a random sample of the valid space
            g = self._initial.pop(0)
            if not self.seen(g):
                return g
        if len(self.told) + len(self.pending) >= self.space.count_valid():
            return None
        if len([g for g in self.population if math.isfinite(self.told[g].time_us)]) < 2:
            return self._immigrant()  # nothing to breed from yet (every result so far failed, or none arrived)
        local = self._unseen_neighbours() if 0 <= self.params.local_patience <= self._stagnant() else []
        share = self.params.immigrants if local else self._immigrant_share()
        if self.rng.random() < share:
            return self._immigrant()
        if local:
            return local[self.rng.randrange(len(local))]
        child = self._bred()
        return child if child is not None else self._immigrant()

    def _stagnant(self) -> int:
        """Population turnovers (P - K results each, a generation of the generational GA) since the best improved."""
        return self._since_gain // max(1, self.settings.population - self.settings.elite)

    def _immigrant_share(self) -> float:
        p = self.params
        if self._stagnant() < p.patience or self._since_gain < p.patience_share * self.space.count_valid():
            return p.immigrants
        return max(p.immigrants, p.stagnation_immigrants)

    def _unseen_neighbours(self) -> list[Genome]:
        """The valid configurations one gene away from the best told so far, neither told nor pending."""
        ok = [g for g in self.told if math.isfinite(self.told[g].time_us)]
        if not ok:
            return []
        best = list(min(ok, key=self._fitness))
        out = []
        for i, p in enumerate(self.space.parameters):
            for v in range(len(p.values)):
                if v != best[i]:
                    g = tuple(best[:i] + [v] + best[i + 1:])
                    if self.space.is_valid_genome(g) and not self.seen(g):
                        out.append(g)
        return out

    def _immigrant(self) -> Genome | None:
        """A random valid configuration neither told nor pending."""
        valid = self.space.valid_genomes()
        for _ in range(64):
            g = tuple(valid[self.rng.randrange(len(valid))])
            if not self.seen(g):
                return g
        unseen = [tuple(g) for g in valid if not self.seen(g)]
        return unseen[self.rng.randrange(len(unseen))] if unseen else None

    def model(self) -> GeneValueModel | None:
        """The gene-value model of the results told, made again once a turnover's worth of new results arrived
        (None until 10 correct ones)."""
        n = len(self.told)
        step = max(1, (self.settings.population - self.settings.elite) // 2)
        if self._model_at < 0 or n - self._model_at >= step:
            scored = [(g, r.time_us) for g, r in self.told.items()]
            self._model = GeneValueModel(self.space, scored) \
                if sum(1 for _, t in scored if math.isfinite(t)) >= 10 else None
            self._model_at = n
        return self._model

    def _bred(self) -> Genome | None:
        """One child: `prescreen` children bred from the population (tournament, uniform crossover, mutation,
        repair, nudged away from repeats), the one the gene-value model scores best kept."""
        tb, p = self.toolbox, self.params
        pop = [_individual(g) for g in self.population]
        for ind in pop:
            ind.fitness.values = (self.told[tuple(ind)].time_us,)
        model = self.model() if p.prescreen > 1 else None
        tries = p.prescreen if model is not None else 1
        bred: list[Genome] = []
        for _ in range(tries):
            a, b = (tb.clone(ind) for ind in tb.select(pop, 2))
            if self.rng.random() < p.cxpb:
                tb.mate(a, b)
            if self.rng.random() < p.mutpb:
                tb.mutate(a)
            tb.repair(a)
            for _ in range(p.novelty_tries if self.seen(a) or tuple(a) in bred else 0):
                mutate_genes(a, self.space, 1 / 3, self.rng)
                repair(a, self.space, 1 / 3, rng=self.rng)
                if not self.seen(a) and tuple(a) not in bred:
                    break
            if not self.seen(a) and tuple(a) not in bred:
                bred.append(tuple(a))
        if not bred:
            return None
        if model is None:
            return bred[0]
        if p.prescreen_bypass > 0 and self.rng.random() < p.prescreen_bypass:
            return bred[self.rng.randrange(len(bred))]  # this child drawn at random, not by the model
        return max(enumerate(bred), key=lambda kv: (model.score(kv[1]), -kv[0]))[1]

    def state(self) -> dict[str, Any]:
        return {**super().state(), "population": len(self.population), "stagnant": self._stagnant()}
