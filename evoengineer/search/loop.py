"""The asynchronous search loop: a fixed number of candidates in flight, the next proposed whenever a result arrives.

    propose -> log the proposal -> submit ... poll -> record the result (its arrival) -> tell the strategy

The number in flight is the evaluator's `concurrency()` (every build slot and every measuring device busy). There is
no generation: a strategy proposes from everything told so far while other proposals are pending.

Exact resume. What a strategy proposes depends only on its seed and on the interleaving of its proposals and the
results it was told. Both are in the store: each proposal is logged (store.record_proposal) with the number of
results told before it, before its candidate is submitted, and each result's arrival is the candidate's commit
(its `seq`). A resumed run replays that history into a fresh strategy, checks that every proposal comes out the same,
submits again the proposals whose results never arrived, and goes on. A kill at any point loses at most the
measurements in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evoengineer.errors import UserError
from evoengineer.status import Status
from evoengineer.store import CandidateRecord

if TYPE_CHECKING:
    from evoengineer.search.runner import Runner
    from evoengineer.search.strategy import Genome, Strategy

POLL_S = 0.5  # the loop looks at stop requests at least this often while it waits for results


class SearchLoop:
    def __init__(self, runner: "Runner", strategy: "Strategy"):
        self.runner = runner
        self.strategy = strategy
        self.in_flight: dict[str, "Genome"] = {}  # hash -> genome, in proposal order
        self.proposal_of: dict[str, int] = {}  # hash -> its proposal's number (the generation label's source)
        self.told = 0  # results that arrived (stored and told), this epoch of proposals
        self.seq = 0  # proposals made
        self.arrived_since_publish = 0

    # ---- resume ---------------------------------------------------------------------------------------------------
    def _replay(self) -> None:
        """Feed the logged history into the strategy; what it proposes must be what it proposed before."""
        r, st = self.runner, self.strategy
        log = r.store.proposals(r.run.id)
        if not log:
            return
        fresh = {h for h, _, known in log if not known}
        arrivals = [rec for rec in sorted(r.records.values(), key=lambda x: x.seq) if rec.hash in fresh]
        nxt = 0
        for seq, (h, told, known) in enumerate(log):
            while nxt < min(told, len(arrivals)):
                self._tell(arrivals[nxt])
                nxt += 1
            g = st.ask()
            if g is None or r.hash_of(g) != h:
                raise UserError(f"run {r.run.id}: replaying its history, the {r.settings.strategy} strategy proposed "
                                f"something else at proposal {seq + 1} (another version of the strategy?); resume "
                                "with --from-scratch (proposes anew; what was measured is reused)")
            self.proposal_of[h] = seq
            if known:
                st.tell(g, r.records[h])
            elif h not in r.records:
                self.in_flight[h] = g  # its result never arrived: submitted again below
        for rec in arrivals[nxt:]:
            self._tell(rec)
        self.seq = len(log)

    def _tell(self, rec: CandidateRecord) -> None:
        g = tuple(self.runner.space.params_to_genome(rec.params))
        self.strategy.tell(g, rec)
        self.told += 1

    # ---- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> str:
        r, ev = self.runner, self.runner.evaluator
        self._replay()
        cap = r.settings.max_evaluations
        reason = ""
        try:
            for h, g in list(self.in_flight.items()):
                self._submit(h, g)
            while True:
                width = max(1, ev.concurrency())  # the evaluator may adapt it (build and measure times)
                while not reason and len(self.in_flight) < width:
                    if r.exhausted:
                        reason = r.why_stopped()
                    elif r.evaluations + len(self.in_flight) >= cap:
                        reason = r.settings.cap_reason()
                    else:
                        reason = self._propose_one()
                if not self.in_flight:
                    break
                for cand, m in ev.poll(POLL_S):
                    g = self.in_flight.pop(cand.hash, None)
                    if g is not None:
                        self._arrive(CandidateRecord(hash=cand.hash, params=cand.params, status=m.status,
                                                     reason=m.reason, metrics=dict(m.metrics),
                                                     generation=self._label(cand.hash), source=cand.source), g)
                if r.exhausted and r.stop_reason and r.stop_reason != "budget":
                    reason = reason or r.why_stopped()
                    break  # an observer's stop: what is in flight is not waited for
        finally:
            if self.in_flight:
                ev.cancel()
        if self.arrived_since_publish or not r.elite_hashes:
            self._publish()
        r.publish_final(self._generation(), reason)
        return reason

    def _propose_one(self) -> str:
        """Ask the strategy for one more and submit it (a configuration measured before is answered at once, a
        template that fails to render is recorded as such). Returns why the search stops proposing, or ''."""
        r, st = self.runner, self.strategy
        g = st.ask()
        if g is None:
            return "space exhausted"
        h = r.hash_of(g)
        known = h in r.records
        r.store.record_proposal(r.run.id, self.seq, h, told=self.told, known=known)
        self.proposal_of[h] = self.seq
        self.seq += 1
        if known:
            st.tell(g, r.records[h])
            return ""
        self._submit(h, g)
        return ""

    def _submit(self, h: str, g: "Genome") -> None:
        r = self.runner
        try:
            cand = r.factory.from_genome(g)
        except UserError as exc:  # the template fails for this genome only: a failed candidate, not a crash
            self._arrive(CandidateRecord(hash=h, params=r.space.genome_to_params(g),
                                         status=Status.COMPILE_ERROR.value, reason=f"render: {exc}",
                                         generation=self._label(h)), g)
            return
        self.in_flight[h] = g
        r.evaluator.submit(cand)

    def _arrive(self, rec: CandidateRecord, g: "Genome") -> None:
        r = self.runner
        r._record(rec)  # committed: this is its arrival
        self.strategy.tell(g, r.records[rec.hash])
        self.told += 1
        self.arrived_since_publish += 1
        if self.arrived_since_publish >= max(1, r.settings.population):
            self._publish()

    def _label(self, h: str) -> int:
        """A record's generation label: its proposal's number / population (proposals come in a deterministic order,
        results do not)."""
        return self.proposal_of.get(h, self.seq) // max(1, self.runner.settings.population)

    def _generation(self) -> int:
        """A label for reports: results arrived / population (no generation exists in the search itself)."""
        return self.told // max(1, self.runner.settings.population)

    def _publish(self) -> None:
        r = self.runner
        self.arrived_since_publish = 0
        stats = {"gen": self._generation(), **self.strategy.state(), "in_flight": len(self.in_flight)}
        r.publish(r.best(r.settings.elite), self._generation(), stats=stats)
