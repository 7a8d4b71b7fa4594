"""Optuna samplers (TPE, CMA-ES, GP, NSGA-II, random, QMC) over the space's parameters, through the shared runner.

Mapping: an ordinal parameter is an integer index (IntDistribution 0..n-1), so every sampler sees its order; a
categorical one (booleans included) is a CategoricalDistribution of its values. Single-valued parameters are fixed.

Every suggestion becomes a trial of an in-memory study. A suggestion that violates a constraint, or repeats a
configuration already evaluated (or already pending in this batch), costs no evaluation: the violation is told as a
failed trial, the repeat as its known result, and the nearest valid configuration not yet seen is enqueued as the
next trial, so each new evaluation takes at most two asks and the loop cannot stall. Candidates that fail (compile
error, wrong, timeout...) are told as failed trials.

The store is the source of truth: the study is mirrored there one evaluation at a time (the candidates table, in
evaluation order), and `resume` rebuilds the study from it, so nothing measured is measured again. The sampler's
own random state is not restored: a resumed run continues from the same trials with a fresh draw.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Any, Sequence

import numpy as np

from evoengineer.store import CandidateRecord
from evoengineer.errors import UserError
from evoengineer.search.runner import Runner

SAMPLERS = ("tpe", "cmaes", "gp", "nsga2", "random", "qmc")
DEFAULT_SAMPLER = "tpe"


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def _require(module: str) -> None:
    """Optuna imports a sampler's optional package lazily, at the first ask: import it now for a clear error."""
    import importlib

    importlib.import_module(module)


def make_sampler(name: str, *, seed: int, population: int):
    """The Optuna sampler called `name`, seeded. Raises UserError for an unknown name or a missing extra."""
    optuna = _optuna()
    s = optuna.samplers
    try:
        if name == "tpe":
            return s.TPESampler(seed=seed, constant_liar=True)
        if name == "cmaes":
            _require("cmaes")
            return s.CmaEsSampler(seed=seed, warn_independent_sampling=False,
                                  independent_sampler=s.RandomSampler(seed=seed))
        if name == "gp":
            _require("scipy")
            return s.GPSampler(seed=seed, warn_independent_sampling=False)
        if name == "nsga2":
            return s.NSGAIISampler(seed=seed, population_size=max(2, population))
        if name == "random":
            return s.RandomSampler(seed=seed)
        if name == "qmc":
            _require("scipy")
            return s.QMCSampler(qmc_type="sobol", scramble=True, seed=seed, warn_independent_sampling=False,
                                warn_asynchronous_seeding=False)
    except ImportError as exc:
        raise UserError(f"--sampler {name}: needs the Python package {exc.name!r} (pip install {exc.name})") from None
    raise UserError(f"--sampler {name!r}: unknown (known: {', '.join(SAMPLERS)})")


class OptunaSearch:
    """Ask a batch of new valid configurations, evaluate them together, tell the results; repeat."""

    name = "optuna"

    def __init__(self, runner: Runner):
        self.runner = runner
        self.space = runner.space
        self.settings = runner.settings
        self.sampler_name = self.settings.sampler or DEFAULT_SAMPLER
        self.optuna = _optuna()
        d = self.optuna.distributions
        self.distributions: dict[str, Any] = {}
        for p in self.space.parameters:
            if len(p.values) < 2:
                continue
            self.distributions[p.name] = (d.IntDistribution(0, len(p.values) - 1) if p.ordinal
                                          else d.CategoricalDistribution(list(p.values)))
        self.valid = np.array(self.space.valid_genomes(), dtype=np.int64).reshape(-1, len(self.space.parameters))
        self._ordinal = np.array([p.ordinal for p in self.space.parameters], dtype=bool)
        self._valid_index = {tuple(int(x) for x in g): i for i, g in enumerate(self.valid)}
        self._seen = np.zeros(len(self.valid), dtype=bool)  # evaluated, or pending in the current batch
        self.rng = random.Random(f"optuna-projection:{self.settings.seed}")
        self.counts = {"asks": 0, "violations": 0, "repeats": 0}

    # ---- genome <-> trial params ----------------------------------------------------------------------------------
    def genome_of(self, params: dict[str, Any]) -> tuple[int, ...]:
        g = []
        for p in self.space.parameters:
            if p.name not in self.distributions:
                g.append(0)
            elif p.ordinal:
                g.append(int(params[p.name]))
            else:
                g.append(p.index(params[p.name]))
        return tuple(g)

    def params_of(self, genome: Sequence[int]) -> dict[str, Any]:
        out = {}
        for p, i in zip(self.space.parameters, genome):
            if p.name in self.distributions:
                out[p.name] = int(i) if p.ordinal else p.values[i]
        return out

    # ---- the study ------------------------------------------------------------------------------------------------
    def _new_study(self):
        sampler = make_sampler(self.sampler_name, seed=self.settings.seed, population=self.settings.population)
        return self.optuna.create_study(direction="minimize", sampler=sampler,
                                        study_name=f"evoengineer-run-{self.runner.run.id}")

    def _tell(self, study, trial, rec: CandidateRecord | None) -> None:
        TrialState = self.optuna.trial.TrialState
        if rec is None:  # the budget ran out before it was reached
            study.tell(trial, state=TrialState.FAIL)
            return
        trial.set_user_attr("hash", rec.hash)
        trial.set_user_attr("status", rec.status)
        if rec.status == "ok" and math.isfinite(rec.time_us):
            study.tell(trial, rec.time_us)
        else:
            study.tell(trial, state=TrialState.FAIL)

    def nearest_unseen(self, genome: Sequence[int]) -> tuple[int, ...] | None:
        """The valid configuration closest to `genome` (index steps on ordinal genes, 1 per differing categorical
        gene) that is neither evaluated nor pending; ties broken by the run's seeded RNG. None if none is left."""
        free = np.flatnonzero(~self._seen)
        if len(free) == 0:
            return None
        cand = self.valid[free]
        diff = np.abs(cand - np.asarray(genome, dtype=np.int64))
        dist = np.where(self._ordinal, diff, diff > 0).sum(axis=1)
        best = free[dist == dist.min()]
        return tuple(int(x) for x in self.valid[self.rng.choice(list(best))])

    def _ask_new(self, study, echoes: list[tuple[Any, str]], gen: int) -> tuple[Any, tuple[int, ...]] | None:
        """One trial holding a valid, unseen configuration; None when every valid configuration is seen."""
        TrialState = self.optuna.trial.TrialState
        for _ in range(4):  # an enqueued configuration comes back on the next ask; the loop is a safety net
            trial = study.ask(self.distributions)
            self.counts["asks"] += 1
            genome = self.genome_of(trial.params)
            i = self._valid_index.get(genome)
            if i is not None and not self._seen[i]:
                self._seen[i] = True
                return trial, genome
            if i is None:
                self.counts["violations"] += 1
                trial.set_user_attr("violates", "; ".join(self.space.violated(self.space.genome_to_params(genome))))
                study.tell(trial, state=TrialState.FAIL)
            else:
                self.counts["repeats"] += 1
                h = self.runner.hash_of(genome)
                rec = self.runner.records.get(h)
                if rec is not None and rec.generation < gen:
                    self._tell(study, trial, rec)
                else:
                    echoes.append((trial, h))  # pending in this batch: told once it is measured
            nxt = self.nearest_unseen(genome)
            if nxt is None:
                return None
            study.enqueue_trial(self.params_of(nxt), skip_if_exists=False)
        raise RuntimeError("optuna did not return the enqueued configuration")

    def batch_size(self) -> int:
        # GP proposes the acquisition optimum of the completed trials: a batch would repeat it, so it goes one by one
        return 1 if self.sampler_name == "gp" else max(1, self.settings.population)

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    def _checkpoint(self, gen: int) -> None:
        self.runner.store.save_checkpoint(self.runner.run.id, gen, {
            "strategy": self.name, "sampler": self.sampler_name, "generation": gen, **self.counts})

    def run(self, state: dict[str, Any] | None = None) -> str:
        """Ask, evaluate, tell until the budget or the space is spent. A resumed run starts over from generation 0
        with the same seeded sampler and replays its stored generations: every proposal of those is answered from
        the store (nothing is measured again) and told to the study exactly as the first time, so the sampler ends
        in the state the uninterrupted run had and proposes what it would have (an exact resume, whatever the
        sampler keeps internally). `state` (the newest checkpoint) only says how far the replay goes."""
        r, s = self.runner, self.settings
        study = self.study = self._new_study()
        stored_until = max((rec.generation for rec in r.records.values()), default=-1)
        gen = 0
        while True:
            reason = r.cap_reached(gen)
            if reason:
                break
            want = min(self.batch_size(), s.max_evaluations - r.evaluations_before(gen))
            trials: list[tuple[Any, tuple[int, ...]]] = []
            echoes: list[tuple[Any, str]] = []
            for _ in range(want):
                got = self._ask_new(study, echoes, gen)
                if got is None:
                    break
                trials.append(got)
            if not trials:
                reason = "space exhausted"
                break
            records = r.evaluate([g for _, g in trials], gen)
            for (trial, _), rec in zip(trials, records):
                self._tell(study, trial, rec)
            for trial, h in echoes:
                self._tell(study, trial, r.records.get(h))
            if gen >= stored_until:  # replayed generations were checkpointed and published the first time
                if not r.exhausted:
                    self._checkpoint(gen)
                r.publish(r.best(s.elite), gen, stats={"gen": gen, **self.counts})
            gen += 1
        r.publish_final(gen - 1, reason)
        return reason

