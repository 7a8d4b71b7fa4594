"""Optuna samplers (TPE, CMA-ES, GP, NSGA-II, random, QMC) over the space's parameters, through the shared runner.

Mapping: an ordinal parameter is an integer index (IntDistribution 0..n-1), so every sampler sees its order; a
categorical one (booleans included) is a CategoricalDistribution of its values. Single-valued parameters are fixed.

Every proposal is one trial of an in-memory study (ask), told its result when it arrives (tell): the trials still
pending are the sampler's to handle (TPE's constant liar). A suggestion that violates a constraint, or repeats a
configuration already told (or pending), costs no evaluation: the violation is told as a failed trial, the repeat
its known result (or, pending, once it arrives), and the nearest valid configuration not yet seen is enqueued as the
next trial, so each new evaluation takes at most two asks and the loop cannot stall. Candidates that fail (compile
error, wrong, timeout...) are told as failed trials.

A resume replays the run's proposals and results into a fresh study with the same seeded sampler (search/loop.py):
the sampler ends in the state the interrupted run had, whatever it keeps internally.
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
from evoengineer.search.strategy import Genome, Strategy
from evoengineer.status import Status

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


class OptunaSearch(Strategy):
    """Ask a new valid configuration, tell each result as it arrives."""

    name = "optuna"
    accepts_seeds = False  # its sampler tells only trials it asked for

    def __init__(self, runner: Runner):
        super().__init__(runner)
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
        self._seen = np.zeros(len(self.valid), dtype=bool)  # told or pending (Strategy.seen, as an array for numpy)
        self.rng = random.Random(f"optuna-projection:{self.settings.seed}")
        self.counts = {"asks": 0, "violations": 0, "repeats": 0}
        self.study: Any = None
        self._trials: dict[Genome, Any] = {}  # pending configuration -> its trial
        self._echoes: dict[Genome, list[Any]] = {}  # pending configuration -> trials that repeated it

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

    def _tell(self, trial, rec: CandidateRecord) -> None:
        TrialState = self.optuna.trial.TrialState
        trial.set_user_attr("hash", rec.hash)
        trial.set_user_attr("status", rec.status)
        if rec.status == Status.OK and math.isfinite(rec.time_us):
            self.study.tell(trial, rec.time_us)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def nearest_unseen(self, genome: Sequence[int]) -> tuple[int, ...] | None:
        """The valid configuration closest to `genome` (index steps on ordinal genes, 1 per differing categorical
        gene) that is neither told nor pending; ties broken by the run's seeded RNG. None if none is left."""
        free = np.flatnonzero(~self._seen)
        if len(free) == 0:
            return None
        cand = self.valid[free]
        diff = np.abs(cand - np.asarray(genome, dtype=np.int64))
        dist = np.where(self._ordinal, diff, diff > 0).sum(axis=1)
        best = free[dist == dist.min()]
        return tuple(int(x) for x in self.valid[self.rng.choice(list(best))])

    def propose(self) -> Genome | None:
        """One trial holding a valid configuration neither told nor pending; None when none is left."""
        if self.study is None:
            self.study = self._new_study()
        TrialState = self.optuna.trial.TrialState
        for _ in range(4):  # an enqueued configuration comes back on the next ask; the loop is a safety net
            trial = self.study.ask(self.distributions)
            self.counts["asks"] += 1
            genome = self.genome_of(trial.params)
            i = self._valid_index.get(genome)
            if i is not None and not self._seen[i]:
                self._seen[i] = True
                self._trials[genome] = trial
                return genome
            if i is None:
                self.counts["violations"] += 1
                trial.set_user_attr("violates", "; ".join(self.space.violated(self.space.genome_to_params(genome))))
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.counts["repeats"] += 1
                self._seen[i] = True
                if genome in self.told:
                    self._tell(trial, self.told[genome])
                else:
                    self._echoes.setdefault(genome, []).append(trial)  # pending: told once it arrives
            nxt = self.nearest_unseen(genome)
            if nxt is None:
                return None
            self.study.enqueue_trial(self.params_of(nxt), skip_if_exists=False)
        raise RuntimeError("optuna did not return the enqueued configuration")

    def observe(self, genome: Genome, record: CandidateRecord) -> None:
        i = self._valid_index.get(genome)
        if i is not None:
            self._seen[i] = True
        trial = self._trials.pop(genome, None)
        if trial is not None:
            self._tell(trial, record)
        for t in self._echoes.pop(genome, []):
            self._tell(t, record)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "sampler": self.sampler_name, **self.counts}
