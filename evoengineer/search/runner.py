"""The shared runner every search goes through: the run's records, the store, observers, elite.json.

The search loop (search/loop.py) commits each result through it the moment it arrives; the runner publishes the
elites (re-timed and certified at the end of the run).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from evoengineer.store import CandidateRecord, RunInfo, Store
from evoengineer import elite_json
from evoengineer.candidate import CandidateFactory, candidate_hash
from evoengineer.evaluators import retiming
from evoengineer.evaluators.base import Evaluator
from evoengineer.evaluators.retiming import Retiming
from evoengineer.settings import evaluation_settings
from evoengineer.space.spec import SearchSpace
from evoengineer.status import Status


def _has_verdict(rec: CandidateRecord) -> bool:
    """A final sanitizer verdict is stored with the record (an unknown one is asked again next time)."""
    v = rec.metrics.get("sanitizer")
    return isinstance(v, dict) and v.get("status") in ("clean", "failed")


class LeaseLost(Exception):
    """This process no longer holds the run's lease (another took it over): it must stop writing."""


def _first_time(rec: CandidateRecord) -> float | None:
    """The search's p50 of a candidate that was timed (also if a later check overturned it), else None."""
    t = rec.metrics.get("time_us")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 \
        else None


class Observer(Protocol):
    def on_evaluation(self, runner: "Runner", record: CandidateRecord) -> None: ...
    def on_generation(self, runner: "Runner", generation: int, stats: dict[str, Any]) -> None: ...


#: the search settings' defaults (a space's [search] table and the CLI override them: driver.settings_from)
DEFAULTS = {"population": 12, "generations": 10, "elite": 3, "budget": None, "seed": 0}


@dataclass
class SearchSettings:
    strategy: str = "ga"
    population: int = DEFAULTS["population"]
    generations: int = DEFAULTS["generations"]
    elite: int = DEFAULTS["elite"]
    budget: int | None = DEFAULTS["budget"]
    seed: int = DEFAULTS["seed"]
    sampler: str | None = None  # --strategy optuna only
    options: dict[str, Any] = field(default_factory=dict)  # the strategy's options (search/options.py), checked
    #: {"runs": [...], "seeds": [params, ...]}: the first proposals, from earlier runs (search/warm_start.py)
    warm_start: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "options": dict(self.options), "warm_start": dict(self.warm_start)}

    @property
    def max_evaluations(self) -> int:
        """The run's evaluation cap. The GA: the budget and population x (generations + 1), whichever is smaller (its
        generations are turnovers of the population); grid: the budget, else the whole space; the other strategies:
        the budget, else population x (generations + 1), the most a GA of the same settings could evaluate."""
        by_generations = self.population * (self.generations + 1)
        if self.budget is None:
            return 2**62 if self.strategy == "grid" else by_generations
        return min(self.budget, by_generations) if self.strategy == "ga" else self.budget

    def cap_reason(self) -> str:
        """Why a run that reached max_evaluations stopped."""
        if self.budget is not None and self.max_evaluations == self.budget:
            return "budget"
        return "generations"


class Runner:
    """One run of one space: its records, its evaluator and its store. The search loop records through it."""

    def __init__(self, *, space: SearchSpace, evaluator: Evaluator, store: Store, run: RunInfo,
                 settings: SearchSettings, out: str | Path, observers: Sequence[Observer] = ()):
        self.space = space
        self.evaluator = evaluator
        self.store = store
        self.run = run
        self.settings = settings
        self.out = Path(out)
        self.observers = list(observers)
        self.factory = CandidateFactory(space)
        self.records: dict[str, CandidateRecord] = {r.hash: r for r in store.candidates(run.id)}
        self.exhausted = False  # no more evaluations: budget spent, or a stop was requested
        self.stop_reason = ""
        self.elite_hashes: list[str] = []
        self._hash_of: dict[tuple[int, ...], str] = {}
        self.stop_requested = False  # set by the driver's SIGINT handler
        self.retime_note = ""  # why the finished run's elites were not re-timed
        self.finish_s: dict[str, float] = {}  # the finished run's re-timing and sanitizer seconds
        self.retime_budget_s: float | None = None  # the re-timing's budget (seconds), when it ran with one
        self.lease_lost = False  # set by the driver's heartbeat thread when another process took the run over
        self._specs: dict[str, dict[str, Any]] | None = None  # timed shape specs (elite.json's shape_elites)

    # ---- identity -------------------------------------------------------------------------------------------------
    def hash_of(self, genome: Sequence[int]) -> str:
        key = tuple(genome)
        h = self._hash_of.get(key)
        if h is None:
            h = candidate_hash(self.space, self.space.genome_to_params(key), self.factory.template_sha)
            self._hash_of[key] = h
        return h

    def request_stop(self, reason: str) -> None:
        """Ask the strategy to stop at its next check (an observer's early stop, e.g. a target time reached)."""
        self.exhausted = True
        self.stop_reason = self.stop_reason or reason

    def why_stopped(self) -> str:
        return self.stop_reason or "budget"

    @property
    def evaluations(self) -> int:
        return len(self.records)

    # ---- evaluation -----------------------------------------------------------------------------------------------
    def _record(self, rec: CandidateRecord) -> None:
        """Commit one result now, keep it (without its source) for lookups, tell the observers."""
        self.store.record_candidate(self.run.id, rec)
        rec.source = ""  # kept in the store only
        self.records[rec.hash] = rec
        for o in self.observers:
            o.on_evaluation(self, rec)
        if self.stop_requested:  # a Ctrl-C whose KeyboardInterrupt was swallowed (e.g. inside a GC callback)
            raise KeyboardInterrupt
        if self.lease_lost:
            raise LeaseLost(f"run {self.run.id}: another process took over this run's lease; stopping here")

    def best(self, k: int) -> list[str]:
        """Hashes of the k fastest correct candidates evaluated so far (ties broken by hash)."""
        ok = sorted((r for r in self.records.values() if r.status == Status.OK), key=lambda r: (r.time_us, r.hash))
        return [r.hash for r in ok[:k]]

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.records.values():
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts

    def publish_final(self, last_generation: int, reason: str) -> None:
        """The finished run's elites (the last generation that ran, and why the run stopped)."""
        g = max(0, last_generation)
        self.publish(self.best(self.settings.elite), g, finished=True, stats={"gen": g, "stop": reason})

    # ---- results --------------------------------------------------------------------------------------------------
    def _shape_specs(self) -> dict[str, dict[str, Any]] | None:
        """The timed shapes' specs for elite.json's shape_elites, parsed once (None until a shape has a best)."""
        if self._specs is None and elite_json.shape_winners(self.space, self.records.values()):
            self._specs = elite_json.shape_specs(self.space)
        return self._specs

    def retimed(self, proposed: Sequence[str]) -> list[str]:
        """The finalists (the proposed elites, then the next fastest correct candidates, `retime_finalists` x K in
        all) re-timed together by the evaluator (evaluators/retiming.py), best re-timed p50 first. Each finalist's
        re-timing is stored with it (metrics["retime"]); one that fails on the fresh inputs is marked so and drops
        out. A re-timing already stored for the same finalists (a resumed run) is used as it is. Without re-timing
        (turned off, evaluator cannot, or it failed) the proposed order stands."""
        pool = self._finalists(proposed)
        if not pool:
            return list(proposed)
        recs = [self.records[h] for h in pool]
        session = hashlib.sha256(json.dumps(pool).encode()).hexdigest()[:16]
        stored = [r.metrics.get("retime") for r in recs]
        if not all(isinstance(x, dict) and x.get("session") == session for x in stored):
            plan = self.retime_plan(recs)
            self.retime_budget_s = plan["budget_s"]
            rt = self.evaluator.retime([self.factory.make(r.params) for r in recs], session=session, plan=plan)
            if rt is None or rt.notes.get("failed"):
                self.retime_note = (rt.notes["failed"] if rt is not None else "this evaluator does not re-time")
                return list(proposed)
            for rec in recs:
                self._store_retime(rec, rt, session)
        timed = {r.hash: r.metrics["retime"] for r in recs if r.status == Status.OK and "p50_us" in r.metrics["retime"]}
        order, ties = retiming.stable_order(timed)
        for h, others in ties.items():  # said in elite.json: this rank was decided by the fixed key, not the time
            rec = self.records[h]
            if rec.metrics["retime"].get("tied_with") != others:
                rec.metrics = {**rec.metrics, "retime": {**rec.metrics["retime"], "tied_with": others}}
                self.store.update_verdict(self.run.id, h, status=rec.status, reason=rec.reason, metrics=rec.metrics)
        return order

    def _finalists(self, proposed: Sequence[str]) -> list[str]:
        """The hashes `retimed` re-times: the proposed elites, then the next fastest timed candidates,
        `retime_finalists` x K in all (empty: no re-timing)."""
        k = len(proposed)
        factor = int(evaluation_settings(self.space)["retime_finalists"])
        if k == 0 or factor <= 0:
            return []
        # every candidate that was timed once counts, whatever later checks said of it: the finalists of a
        # resumed run are the same as before, and so is its stored re-timing
        timed = sorted((r for r in self.records.values() if _first_time(r) is not None),
                       key=lambda r: (_first_time(r), r.hash))
        pool = [h for h in proposed if h in self.records and _first_time(self.records[h]) is not None]
        return pool + [r.hash for r in timed if r.hash not in pool][:max(0, factor * k - len(pool))]

    def _sanitize_beside_retiming(self, proposed: Sequence[str]) -> "Callable[[], None] | None":
        """Where the evaluator has a device to spare (`Evaluator.sanitizes_beside_retiming`: a cluster with several
        GPU workers), the sanitizer checks every finalist and the timed shapes' winners on one device while the
        re-timing runs on another, so certifying the elites adds no wait after it. Returns the call that waits for
        those verdicts and stores them (on this thread: the re-timing stores too), or None."""
        if not self.evaluator.sanitizes_beside_retiming():
            return None
        recs = [self.records[h] for h in self._finalists(proposed) or proposed if h in self.records]
        todo = list({r.hash: r for r in [*recs, *self._uncertified_shape_winners()]
                     if r.status == Status.OK and not _has_verdict(r)}.values())
        if not todo:
            return None
        cands = [self.factory.make(r.params) for r in todo]
        verdicts: dict[str, dict[str, Any]] = {}

        def work() -> None:
            try:
                verdicts.update(self.evaluator.sanitize(cands))
            except Exception:  # noqa: BLE001 - certified() asks again for any finalist left without a verdict
                pass

        thread = threading.Thread(target=work, name="evo-sanitize-early", daemon=True)
        thread.start()

        def finish() -> None:
            thread.join()
            self._store_verdicts([r for r in todo if r.status == Status.OK], verdicts)  # not one the re-timing dropped

        return finish

    def retime_plan(self, recs: Sequence[CandidateRecord]) -> dict[str, Any]:
        """How the finalists `recs` are re-timed (retiming.plan_retiming): calls sized from each one's search timing,
        the baseline from its search p50, within a budget of `retime_share` of the run's measuring time (the
        measuring seconds the search spent, stored with every candidate, so a resumed run plans alike; at least
        retiming.MIN_BUDGET_S)."""
        st = evaluation_settings(self.space)
        share = float(st["retime_share"])
        measured = sum(float(r.metrics["measure_s"]) for r in self.records.values()
                       if isinstance(r.metrics.get("measure_s"), (int, float)))
        budget = round(max(retiming.MIN_BUDGET_S, share / (1 - share) * measured), 2) if share > 0 else None
        bases = sorted(float(r.metrics["baseline_us"]) for r in self.records.values()
                       if isinstance(r.metrics.get("baseline_us"), (int, float)) and r.metrics["baseline_us"] > 0)
        p90 = {r.hash: r.metrics.get("time_p90_us") for r in recs}
        warmup = max(1, int(st["warmup"]) // 4)
        plan = retiming.plan_retiming({r.hash: (_first_time(r) or 0.0, p90[r.hash]) for r in recs},
                                      baseline_us=bases[len(bases) // 2] if bases else None,
                                      rounds=int(st["retime_rounds"]),
                                      most=int(st["retime_repeats"]) or int(st["repeats"]), warmup=warmup,
                                      budget_s=budget)
        return {**plan, "warmup": warmup}

    def _store_retime(self, rec: CandidateRecord, rt: Retiming, session: str) -> None:
        info: dict[str, Any] = {"session": session, "finalists": len(rt.samples) + len(rt.dropped),
                                "baseline": rt.baseline, **rt.notes}
        if rec.hash in rt.samples:
            info.update(retiming.summarize(_first_time(rec) or math.nan, rt.samples[rec.hash], rt.noise_cv,
                                           key=f"{session}/{rec.hash}"))
            # where this finalist's rounds ran in the sequence of all timings (round-robin: one per round)
            info["positions"] = [i for i, h in enumerate(rt.order) if h == rec.hash]
            if rt.baseline_p50_us:  # the speedup at ranking time: this baseline over the re-timed p50
                info["baseline_p50_us"] = retiming.median(rt.baseline_p50_us)
        else:
            status, reason = rt.dropped.get(rec.hash, ("runtime_error", "not re-timed"))
            info["dropped"] = f"{status}: {reason}"
            rec.status, rec.reason = status, f"on the re-timing inputs: {reason}"
        rec.metrics = {**rec.metrics, "retime": info}
        self.store.update_verdict(self.run.id, rec.hash, status=rec.status, reason=rec.reason, metrics=rec.metrics)

    def certified(self, proposed: Sequence[str], want: int | None = None) -> list[str]:
        """The first `want` (default: all) of the proposed elites that pass the evaluator's sanitizer (run all at
        once; once per candidate: the verdict is stored). One it finds fault with becomes `sanitizer_error` and the
        next proposed, then the next best correct candidate takes its place (certified in turn)."""
        want = len(proposed) if want is None else want
        ranked = [*proposed, *(h for h in self.best(len(self.records)) if h not in set(proposed))]
        chosen: list[str] = []
        # the timed shapes' winners ride along with the first batch: one start of the tools for both
        also = self._uncertified_shape_winners()
        i = 0
        while len(chosen) < want and i < len(ranked):
            batch: list[CandidateRecord] = []
            while i < len(ranked) and len(chosen) + len(batch) < want:
                rec = self.records.get(ranked[i])
                i += 1
                if rec is not None and rec.status == Status.OK:
                    batch.append(rec)
            todo = {r.hash: r for r in [*batch, *also] if not _has_verdict(r)}
            also = []
            self._sanitize(list(todo.values()))
            chosen += [r.hash for r in batch if r.status == Status.OK]
        return chosen

    def _uncertified_shape_winners(self) -> list[CandidateRecord]:
        winners = elite_json.shape_winners(self.space, self.records.values()) or []
        return list({r.hash: r for _, r in winners if r.status == Status.OK and not _has_verdict(r)}.values())

    def certify_shape_winners(self) -> None:
        """Run the sanitizer on each timed shape's fastest correct kernel (elite.json's shape_elites, which an export
        --per-shape ships) as on the elites: one it finds fault with becomes `sanitizer_error` and the next fastest
        on that shape is asked in turn. Stored verdicts are not asked again."""
        while True:
            todo = self._uncertified_shape_winners()
            if not todo:
                return
            self._sanitize(todo)
            if not any(_has_verdict(r) for r in todo):
                return  # this evaluator gives no verdicts

    def _sanitize(self, recs: Sequence[CandidateRecord]) -> None:
        """Ask the evaluator's sanitizer about `recs`; store each verdict (a failure turns the record into
        `sanitizer_error`)."""
        if not recs:
            return
        self._store_verdicts(recs, self.evaluator.sanitize([self.factory.make(r.params) for r in recs]))

    def _store_verdicts(self, recs: Sequence[CandidateRecord], verdicts: dict[str, dict[str, Any]]) -> None:
        for rec in recs:
            verdict = verdicts.get(rec.hash)
            if verdict is None:
                continue
            rec.metrics = {**rec.metrics, "sanitizer": verdict}
            if verdict["status"] == "failed":
                rec.status, rec.reason = Status.SANITIZER_ERROR.value, verdict["reason"]
            self.store.update_verdict(self.run.id, rec.hash, status=rec.status, reason=rec.reason,
                                      metrics=rec.metrics)

    def publish(self, elite_hashes: Sequence[str], generation: int, *, finished: bool = False,
                stats: dict[str, Any] | None = None) -> None:
        """Record the elites in the store, rewrite elite.json atomically, tell the observers. The finished run's
        elites are certified first (`certified`)."""
        if finished:
            t0 = time.perf_counter()
            early = self._sanitize_beside_retiming(elite_hashes)
            retimed = self.retimed(elite_hashes)
            t1 = time.perf_counter()
            if early is not None:
                early()
            elite_hashes = self.certified(retimed, want=len(elite_hashes))
            self.certify_shape_winners()
            self.finish_s = {"retime": t1 - t0,
                             "sanitizer": time.perf_counter() - t1}
        self.elite_hashes = list(elite_hashes)
        self.store.set_elites(self.run.id, elite_hashes)
        elites = self.store.elites(self.run.id)  # with their sources
        with_source = {e.hash: e for e in elites}
        shapes = elite_json.shape_elites(
            self.space, self.records.values(),
            lambda h: with_source.get(h) or self.store.find_candidate(self.run.id, h), self._shape_specs())
        doc = elite_json.build_document(run=self.run, space=self.space, elites=elites, generation=generation,
                                        evaluations=self.evaluations,
                                        run_status="finished" if finished else "running",
                                        retime_note=self.retime_note, shape_elites=shapes,
                                        records=self.records.values())
        elite_json.write_atomic(self.out, doc)
        for o in self.observers:
            o.on_generation(self, generation, stats or {})
