"""Surrogate-guided search: a tree-ensemble model of time over the genome picks each batch (SMAC-like Bayesian
optimization; Hutter et al., "Sequential Model-Based Optimization for General Algorithm Configuration", 2011).

Why trees (scikit-learn's RandomForestRegressor for time, ExtraTreesClassifier for correctness) and not a Gaussian
process: kernel genomes mix ordinal and categorical genes with hard interactions (a tile size is only good with some
warp counts), configurations number up to 10^6, and every evaluation must be proposed in milliseconds. Trees split on
genes of either kind without a kernel to choose, fit a few hundred points in tens of milliseconds, predict 10^5
configurations in about as long, and their spread across trees is the uncertainty Thompson sampling draws from. A
random forest (bootstrap samples, best splits: SMAC's model) needed fewer evaluations than extremely randomized trees
on the tuning seeds of all three recorded landscapes (experiments/strategies/README.md); `model="extra"` keeps the
earlier model.

Each generation (after a random first batch of `population`):
- The time model is fit on log(p50) of the correct candidates evaluated in earlier generations; failures (gate_failed,
  compile_error, wrong, timeout, ...) are never given a time: a separate classifier predicts the chance that a
  configuration is correct, trained on every evaluation. It filters proposals only while its out-of-bag Brier score
  beats always predicting the share of correct results (`trust`): failures that follow genes (real ones) pass that
  test, failures no gene predicts (noise) do not, and then no configuration is set aside on them.
- The pool: every valid configuration not yet evaluated (a seeded sample of them when there are more than
  `pool`), plus every single-gene neighbour of the best few found so far.
- Slot 0 takes the pool's best by the whole forest's mean; each further slot a Thompson-style draw (the mean of a
  random subset of the trees), all among the configurations the classifier thinks likely correct; one slot in
  `explore` explores: the farthest from every evaluation of a few random unseen configurations (half the batch
  once the best time has not improved for `stall` generations), so a landscape the model reads wrong (an optimum
  hidden away from where the model looks) does not stall it.

Batches are the population (`batch` sizes later ones otherwise: smaller batches refit more often, at proportionally
more proposal cost; not the default, see experiments/strategies/README.md).

Everything is seeded by (seed, generation) and the model is trained on the generations before the one it proposes,
so a resumed run proposes exactly what the uninterrupted one did; the checkpoint holds only the generation.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from evoengineer.search.options import build as build_options
from evoengineer.search.runner import Runner
from evoengineer.search.strategy import Genome, Strategy
from evoengineer.status import Status

@dataclass(frozen=True)
class SurrogateParams:
    """The strategy's settings (tuned on seeds the benchmark does not report: experiments/strategies/)."""

    trees: int = 64  # per forest
    pool: int = 20_000  # unseen configurations scored per generation at most (plus the incumbents' neighbours)
    incumbents: int = 5  # the best found so far whose single-gene neighbours join the pool
    explore: int = 8  # one slot in `explore` (rounded up) explores (far from what was seen); 0: none
    stall: int = 3  # generations without a better time after which half of each batch explores
    give_up: int = 6  # ... and after which all but the model's best guess explore (0: never)
    far_draws: int = 32  # an exploring slot takes the farthest from every evaluation of this many random draws
    draw_trees: int = 8  # trees in one Thompson-style draw
    p_correct: float = 0.3  # the classifier's chance of a correct result a proposal needs
    spread: int = 10  # the first batch: the most spread of spread x population random draws (1: plain random)
    model: str = "forest"  # the time model: "forest" (random forest, SMAC's) or "extra" (extremely randomized trees)
    leaf: int = 1  # fewest samples in a leaf of the time model
    features: float = 1.0  # share of the features each split considers
    batch: int = 0  # proposals per generation after the first (population-sized) batch; 0: the population
    trust: float = 0.0  # the classifier filters only once its out-of-bag Brier skill exceeds this (-1: always)
    min_class: int = 0  # ... and once it has seen this many of each class (correct, failed)
    clip: float = 1.0  # the time model's target: log time, capped at this quantile of the times seen (1: none)
    greedy: int = 0  # with smaller batches, 1: slot 0 takes the forest's mean once per population (0: every batch)


def _sklearn(model: str = "forest"):
    """(time model class for `model`, correctness classifier class)."""
    try:
        from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor, RandomForestRegressor
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise RuntimeError("the surrogate strategy needs scikit-learn (pip install scikit-learn)") from exc
    models = {"forest": RandomForestRegressor, "extra": ExtraTreesRegressor}
    if model not in models:
        raise ValueError(f"surrogate model {model!r}: one of {', '.join(models)}")
    return models[model], ExtraTreesClassifier


class GenomeEncoder:
    """Genomes as model features: an ordinal gene is its index (trees need only the order), a categorical gene with
    more than two values one column per value."""

    def __init__(self, space: Any):
        self.columns: list[tuple[int, int | None]] = []  # (gene, value index for a one-hot column, else None)
        for i, p in enumerate(space.parameters):
            if p.ordinal or len(p.values) <= 2:
                self.columns.append((i, None))
            else:
                self.columns += [(i, v) for v in range(len(p.values))]

    def __call__(self, genomes: np.ndarray) -> np.ndarray:
        out = np.empty((len(genomes), len(self.columns)), dtype=np.float32)
        for c, (gene, value) in enumerate(self.columns):
            out[:, c] = genomes[:, gene] if value is None else (genomes[:, gene] == value)
        return out


class SurrogateSearch(Strategy):
    """Proposes from batches made by the model of what was told (a batch's picks are handed out one by one, each
    skipped if it was told or proposed meanwhile); the next batch is made when the last is used up."""

    name = "surrogate"
    params_cls = SurrogateParams

    def __init__(self, runner: Runner, params: SurrogateParams | None = None):
        super().__init__(runner)
        self.params = params or build_options(SurrogateParams, getattr(self.settings, "options", None) or {})
        self.batches = 0  # batches made (each one's RNG is its own)
        self._queue: list[tuple[int, ...]] = []
        self.encode = GenomeEncoder(self.space)
        self._valid: np.ndarray | None = None
        self._weights = self._codes = np.zeros(0, dtype=np.int64)

    # ---- the valid set ---------------------------------------------------------------------------------------
    def valid(self) -> np.ndarray:
        """Every valid genome (rows, in lexicographic order)."""
        if self._valid is None:
            self._valid = np.asarray(self.space.valid_genomes(), dtype=np.int32).reshape(-1, len(self.space.names))
            radix = [len(p.values) for p in self.space.parameters]
            self._weights = np.asarray([math.prod(radix[i + 1:]) for i in range(len(radix))], dtype=np.int64)
            # one integer per genome (mixed radix): in lexicographic order, so already sorted
            self._codes = self._valid.astype(np.int64) @ self._weights
        return self._valid

    def _rows_of(self, genomes: np.ndarray) -> np.ndarray:
        """Each genome's row in `valid()`, or -1 where it is not valid."""
        self.valid()
        codes = genomes.astype(np.int64) @ self._weights
        pos = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
        return np.where(self._codes[pos] == codes, pos, -1)

    # ---- proposals -------------------------------------------------------------------------------------------
    def history(self) -> list[tuple[tuple[int, ...], bool, float]]:
        """(genome, correct, p50) of every result told, in genome order (the model sees the same data whatever
        order the results arrived in)."""
        return sorted((g, r.status == Status.OK, r.time_us if r.status == Status.OK else math.nan) for g, r in self.told.items())

    def propose(self) -> Genome | None:
        while True:
            while self._queue:
                g = self._queue.pop(0)
                if not self.seen(g):
                    return g
            P, s = self.params, self.settings
            n = max(1, s.population) if self.batches == 0 or P.batch <= 0 else P.batch
            self._queue = self.batch(self.batches, n)
            self.batches += 1
            if not self._queue:
                return None

    def batch(self, generation: int, n: int) -> list[tuple[int, ...]]:
        """Up to `n` valid configurations neither told nor pending: batch number `generation`."""
        rng = random.Random(f"surrogate:{self.settings.seed}:{generation}")
        seen_rows = self.history()
        seen = {g for g, _, _ in seen_rows} | set(self.pending)
        ok = [(g, t) for g, good, t in seen_rows if good and t > 0 and math.isfinite(t)]
        valid = self.valid()
        total = len(valid)
        if total - len(seen) <= 0:
            return []
        n = min(n, total - len(seen))
        if generation == 0:
            return self._spread(rng, seen, n)
        if len(ok) < 2:
            return self._random_unseen(rng, seen, n)
        P = self.params
        pool = self._pool(rng, seen, [g for g, _ in sorted(ok, key=lambda x: x[1])[:P.incumbents]])
        if len(pool) == 0:
            return self._random_unseen(rng, seen, n)
        Regressor, _ = _sklearn(P.model)
        seed = rng.randrange(2**31)
        x_ok = self.encode(np.asarray([g for g, _ in ok], dtype=np.int32))
        y = np.log(np.asarray([t for _, t in ok], dtype=np.float64))
        if P.clip < 1.0:  # the slow configurations all alike: the splits go to the differences among the fast ones
            y = np.minimum(y, np.quantile(y, P.clip))
        forest = Regressor(n_estimators=P.trees, min_samples_leaf=P.leaf, max_features=P.features, random_state=seed,
                           n_jobs=1)
        forest.fit(x_ok, y)
        x_pool = self.encode(pool)
        per_tree = np.stack([t.predict(x_pool) for t in forest.estimators_])  # trees x pool
        p_ok = self._p_correct(seen_rows, x_pool, seed)
        likely = p_ok >= P.p_correct
        if not likely.any():
            likely = p_ok >= p_ok.max()
        chosen: list[int] = []
        taken = np.zeros(len(pool), dtype=bool)
        stalled = self._stalled_for(generation) if n > 1 or P.batch else 0
        pop = max(1, self.settings.population)
        if P.batch <= 0:  # population-sized batches
            explore = math.ceil(n / P.explore) if n > 1 and P.explore > 0 else 0
            if P.stall > 0 and stalled >= P.stall:
                explore = max(explore, n // 2)  # the model's region looks spent: look elsewhere harder
            if P.give_up > 0 and stalled >= P.give_up:
                explore = n - 1  # long spent: the model keeps one guess, the rest of the batch searches the space
        else:  # smaller batches: the same shares, spread over generations (the share of all proposals that explore)
            share = 1 / P.explore if P.explore > 0 else 0.0
            if P.stall > 0 and stalled >= P.stall:
                share = max(share, 0.5)
            if P.give_up > 0 and stalled >= P.give_up:
                share = max(share, 1 - 1 / pop)
            explore = min(n, math.floor((generation + 1) * n * share + 1e-9) - math.floor(generation * n * share + 1e-9))
        mean_now = not (P.batch > 0 and P.greedy) or (generation * n) % pop < n
        for slot in range(n - explore):
            if slot == 0 and mean_now:
                score = per_tree.mean(axis=0)
            else:
                trees = rng.sample(range(P.trees), min(P.draw_trees, P.trees))
                score = per_tree[trees].mean(axis=0)
            score = np.where(likely & ~taken, score, np.inf)
            best = int(np.argmin(score))
            if not math.isfinite(score[best]):
                break
            chosen.append(best)
            taken[best] = True
        picks = [tuple(int(v) for v in pool[i]) for i in chosen]
        picks += self._far_unseen(rng, seen, picks, n - len(picks))
        return picks

    def _stalled_for(self, generation: int) -> int:
        """Results told since the best time so far was first reached, in populations."""
        best, when = math.inf, -1
        for i, rec in enumerate(self.told.values()):  # in the order the results arrived
            if rec.time_us < best:
                best, when = rec.time_us, i
        if not math.isfinite(best):
            return 0
        return (len(self.told) - 1 - when) // max(1, self.settings.population)

    def _far_unseen(self, rng: random.Random, seen: set[tuple[int, ...]], picked: list[tuple[int, ...]],
                    n: int) -> list[tuple[int, ...]]:
        """`n` exploring picks: each the farthest (fewest genes in common with any evaluated or picked
        configuration) of `far_draws` random unseen ones; deceptive and needle landscapes hide their best away
        from where the model has been looking."""
        out: list[tuple[int, ...]] = []
        if n <= 0:
            return out
        taken = seen | set(picked)
        ref = np.asarray(sorted(taken), dtype=np.int32).reshape(-1, len(self.space.names))
        for _ in range(n):
            draws = self._random_unseen(rng, taken, max(1, self.params.far_draws))
            if not draws:
                break
            d = np.asarray(draws, dtype=np.int32)
            dist = (d[:, None, :] != ref[None, :, :]).sum(axis=2).min(axis=1) if len(ref) else np.zeros(len(d))
            g = draws[int(np.argmax(dist))]
            out.append(g)
            taken.add(g)
            ref = np.vstack([ref, np.asarray(g, dtype=np.int32)[None, :]])
        return out

    def _p_correct(self, rows: Sequence[tuple[tuple[int, ...], bool, float]], x_pool: np.ndarray,
                   seed: int) -> np.ndarray:
        """The classifier's chance that each pool configuration is correct (1 where every evaluation so far was, or
        none was)."""
        P = self.params
        labels = np.asarray([good for _, good, _ in rows], dtype=bool)
        if labels.all() or not labels.any():
            return np.full(len(x_pool), 1.0 if labels.all() else 0.5)
        if min(labels.sum(), (~labels).sum()) < P.min_class:
            return np.ones(len(x_pool))  # too few of one class to tell where failures are
        _, Classifier = _sklearn()
        check = P.trust > -1
        clf = Classifier(n_estimators=P.trees, min_samples_leaf=1, random_state=seed, n_jobs=1,
                         **({"bootstrap": True, "oob_score": True} if check else {}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few samples: some never out of bag
            clf.fit(self.encode(np.asarray([g for g, _, _ in rows], dtype=np.int32)), labels)
        col = list(clf.classes_).index(True)
        if check:
            # out-of-bag Brier score against always predicting the base rate: failures that follow no gene (random
            # ones) give no skill, and the classifier would only set good configurations aside
            oob = clf.oob_decision_function_[:, col]
            have = np.isfinite(oob)
            y = labels[have].astype(np.float64)
            base = ((y - y.mean()) ** 2).mean() if have.any() else 0.0
            skill = 1.0 - ((oob[have] - y) ** 2).mean() / base if base > 0 else 0.0
            if skill <= P.trust:
                return np.ones(len(x_pool))
        return clf.predict_proba(x_pool)[:, col]

    def _pool(self, rng: random.Random, seen: set[tuple[int, ...]],
              incumbents: list[tuple[int, ...]]) -> np.ndarray:
        """Unseen valid configurations to score: all of them, or a seeded sample of `pool`, plus the incumbents'
        valid single-gene neighbours (as rows of `valid()`, sorted)."""
        valid = self.valid()
        if len(valid) <= self.params.pool:
            rows = np.arange(len(valid))
        else:
            rows = np.asarray(rng.sample(range(len(valid)), self.params.pool), dtype=np.int64)
        near = []
        for g in incumbents:
            for d, p in enumerate(self.space.parameters):
                nb = np.tile(np.asarray(g, dtype=np.int32), (len(p.values), 1))
                nb[:, d] = np.arange(len(p.values))
                near.append(nb)
        if near:
            found = self._rows_of(np.concatenate(near))
            rows = np.concatenate([rows, found[found >= 0]])
        rows = np.unique(rows)
        if seen:
            seen_rows = self._rows_of(np.asarray(sorted(seen), dtype=np.int32))
            rows = rows[~np.isin(rows, seen_rows)]
        return valid[rows]

    def _spread(self, rng: random.Random, seen: set[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
        """The first batch: `n` configurations spread over the space (greedy max-min distance, in genes that
        differ, among `spread` x n random ones), so the first model sees every gene's values."""
        if self.params.spread <= 1:
            return self._random_unseen(rng, seen, n)
        drawn = self._random_unseen(rng, seen, self.params.spread * n)
        if len(drawn) <= n:
            return drawn
        g = np.asarray(drawn, dtype=np.int32)
        picked = [0]
        dist = (g != g[0]).sum(axis=1)
        while len(picked) < n:
            i = int(np.argmax(dist))  # the first of the farthest: deterministic
            picked.append(i)
            dist = np.minimum(dist, (g != g[i]).sum(axis=1))
        return [drawn[i] for i in picked]

    def _random_unseen(self, rng: random.Random, seen: set[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
        valid = self.valid()
        out: list[tuple[int, ...]] = []
        if n <= 0:
            return out
        left = len(valid) - len(seen)
        if left <= 4 * n:  # few left: take them in a seeded order
            rest = [tuple(g) for g in valid.tolist() if tuple(g) not in seen]
            rng.shuffle(rest)
            return rest[:n]
        taken = set(seen)
        while len(out) < n:
            g = tuple(valid[rng.randrange(len(valid))].tolist())
            if g not in taken:
                taken.add(g)
                out.append(g)
        return out
