"""Surrogate-guided search: a tree-ensemble model of time over the genome picks each batch (SMAC-like Bayesian
optimization; Hutter et al., "Sequential Model-Based Optimization for General Algorithm Configuration", 2011).

Why trees (scikit-learn's ExtraTreesRegressor / ExtraTreesClassifier) and not a Gaussian process: kernel genomes mix
ordinal and categorical genes with hard interactions (a tile size is only good with some warp counts), configurations
number up to 10^6, and every evaluation must be proposed in milliseconds. Trees split on genes of either kind without
a kernel to choose, fit a few hundred points in tens of milliseconds, predict 10^5 configurations in about as long,
and their spread across trees is the uncertainty Thompson sampling draws from.

Each generation (after a random first batch of `population`):
- The time model is fit on log(p50) of the correct candidates evaluated in earlier generations; failures (gate_failed,
  compile_error, wrong, timeout, ...) are never given a time: a separate classifier predicts the chance that a
  configuration is correct, trained on every evaluation.
- The pool: every valid configuration not yet evaluated (a seeded sample of them when there are more than
  `POOL`), plus every single-gene neighbour of the best few found so far.
- Slot 0 takes the pool's best by the whole forest's mean; each further slot a Thompson-style draw (the mean of a
  random subset of the trees), all among the configurations the classifier thinks likelier correct than not; one
  slot in `EXPLORE` is a uniform random unseen configuration (no stall on a landscape the model reads wrong).

Everything is seeded by (seed, generation) and the model is trained on the generations before the one it proposes,
so a resumed run proposes exactly what the uninterrupted one did; the checkpoint holds only the generation.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

import numpy as np

from evoengineer.search.runner import Runner

#: trees per forest; configurations scored per generation at most (plus the incumbents' neighbours)
TREES = 64
POOL = 20_000
#: incumbents whose single-gene neighbours join the pool
INCUMBENTS = 5
#: one slot in EXPLORE (rounded up) is a uniform random unseen configuration
EXPLORE = 8
#: trees in one Thompson-style draw
DRAW_TREES = 8


def _sklearn():
    try:
        from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise RuntimeError("the surrogate strategy needs scikit-learn (pip install scikit-learn)") from exc
    return ExtraTreesRegressor, ExtraTreesClassifier


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


class SurrogateSearch:
    name = "surrogate"

    def __init__(self, runner: Runner):
        self.runner = runner
        self.space = runner.space
        self.encode = GenomeEncoder(self.space)
        self._valid: np.ndarray | None = None
        self._valid_set: set[tuple[int, ...]] | None = None

    # ---- the valid set ---------------------------------------------------------------------------------------
    def valid(self) -> np.ndarray:
        if self._valid is None:
            self._valid = np.asarray(self.space.valid_genomes(), dtype=np.int32).reshape(-1, len(self.space.names))
        return self._valid

    def is_valid(self, genome: tuple[int, ...]) -> bool:
        if self._valid_set is None:
            self._valid_set = set(map(tuple, self.valid().tolist()))
        return genome in self._valid_set

    # ---- proposals -------------------------------------------------------------------------------------------
    def history(self, generation: int) -> list[tuple[tuple[int, ...], bool, float]]:
        """(genome, correct, p50) of every evaluation of the generations before `generation`, in genome order (the
        model sees the same data however the records were loaded)."""
        out = []
        for r in self.runner.records.values():
            if r.generation >= generation:
                continue
            try:
                g = tuple(self.space.params_to_genome(r.params))
            except Exception:
                continue  # not a configuration of this space
            out.append((g, r.status == "ok", r.time_us if r.status == "ok" else math.nan))
        return sorted(out)

    def propose(self, generation: int, n: int) -> list[tuple[int, ...]]:
        """Up to `n` unseen valid configurations for `generation`."""
        rng = random.Random(f"surrogate:{self.runner.settings.seed}:{generation}")
        seen_rows = self.history(generation)
        seen = {g for g, _, _ in seen_rows}
        ok = [(g, t) for g, good, t in seen_rows if good and t > 0 and math.isfinite(t)]
        valid = self.valid()
        total = len(valid)
        if total - len(seen) <= 0:
            return []
        n = min(n, total - len(seen))
        if len(ok) < 2 or generation == 0:
            return self._random_unseen(rng, seen, n)
        pool = self._pool(rng, seen, [g for g, _ in sorted(ok, key=lambda x: x[1])[:INCUMBENTS]])
        if len(pool) == 0:
            return self._random_unseen(rng, seen, n)
        Regressor, Classifier = _sklearn()
        seed = rng.randrange(2**31)
        x_ok = self.encode(np.asarray([g for g, _ in ok], dtype=np.int32))
        y = np.log(np.asarray([t for _, t in ok], dtype=np.float64))
        forest = Regressor(n_estimators=TREES, min_samples_leaf=1, max_features=1.0, random_state=seed, n_jobs=1)
        forest.fit(x_ok, y)
        x_pool = self.encode(pool)
        per_tree = np.stack([t.predict(x_pool) for t in forest.estimators_])  # trees x pool
        p_ok = self._p_correct(seen_rows, x_pool, seed)
        likely = p_ok >= 0.5
        if not likely.any():
            likely = p_ok >= p_ok.max()
        chosen: list[int] = []
        taken = np.zeros(len(pool), dtype=bool)
        explore = math.ceil(n / EXPLORE) if n > 1 else 0
        for slot in range(n - explore):
            if slot == 0:
                score = per_tree.mean(axis=0)
            else:
                trees = rng.sample(range(TREES), DRAW_TREES)
                score = per_tree[trees].mean(axis=0)
            score = np.where(likely & ~taken, score, np.inf)
            best = int(np.argmin(score))
            if not math.isfinite(score[best]):
                break
            chosen.append(best)
            taken[best] = True
        picks = [tuple(int(v) for v in pool[i]) for i in chosen]
        picks += self._random_unseen(rng, seen | set(picks), n - len(picks))
        return picks

    def _p_correct(self, rows: Sequence[tuple[tuple[int, ...], bool, float]], x_pool: np.ndarray,
                   seed: int) -> np.ndarray:
        """The classifier's chance that each pool configuration is correct (1 where every evaluation so far was, or
        none was)."""
        labels = np.asarray([good for _, good, _ in rows], dtype=bool)
        if labels.all() or not labels.any():
            return np.full(len(x_pool), 1.0 if labels.all() else 0.5)
        _, Classifier = _sklearn()
        clf = Classifier(n_estimators=TREES, min_samples_leaf=1, random_state=seed, n_jobs=1)
        clf.fit(self.encode(np.asarray([g for g, _, _ in rows], dtype=np.int32)), labels)
        return clf.predict_proba(x_pool)[:, list(clf.classes_).index(True)]

    def _pool(self, rng: random.Random, seen: set[tuple[int, ...]],
              incumbents: list[tuple[int, ...]]) -> np.ndarray:
        """Unseen valid configurations to score: all of them, or a seeded sample of POOL, plus the incumbents'
        valid single-gene neighbours."""
        valid = self.valid()
        if len(valid) <= POOL:
            rows = [i for i in range(len(valid))]
        else:
            rows = rng.sample(range(len(valid)), POOL)
        picked = {tuple(valid[i].tolist()) for i in rows}
        for g in incumbents:
            for d, p in enumerate(self.space.parameters):
                for v in range(len(p.values)):
                    if v != g[d]:
                        nb = g[:d] + (v,) + g[d + 1:]
                        if nb not in picked and self.is_valid(nb):
                            picked.add(nb)
        unseen = sorted(g for g in picked if g not in seen)
        return np.asarray(unseen, dtype=np.int32).reshape(-1, len(self.space.names))

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

    # ---- the loop --------------------------------------------------------------------------------------------
    def run(self, state: dict[str, Any] | None = None) -> str:
        r, s = self.runner, self.runner.settings
        batch = max(1, s.population)
        gen = int(state["generation"]) + 1 if state else 0
        reason = "space exhausted"
        while True:
            before = r.evaluations_before(gen)  # as the run stood when this generation began (exact resume)
            stop = r.cap_reached(gen)
            if stop:
                reason = stop
                break
            take = self.propose(gen, min(batch, s.max_evaluations - before))
            if not take:
                break
            r.evaluate(take, gen)
            if not r.exhausted:
                r.store.save_checkpoint(r.run.id, gen, {"strategy": self.name, "generation": gen})
            r.publish(r.best(s.elite), gen, stats={"gen": gen})
            gen += 1
        if r.exhausted:
            reason = r.why_stopped()
        r.publish_final(gen - 1, reason)
        return reason
