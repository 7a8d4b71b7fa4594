"""Grid search: every valid configuration once, in the space's order, in batches (one batch per 'generation').

Used to record full landscapes (`python -m evoengineer landscape` exports them for the replay evaluator).
"""

from __future__ import annotations

from typing import Any

from evoengineer.search.runner import Runner


class GridSearch:
    name = "grid"

    def __init__(self, runner: Runner):
        self.runner = runner

    def run(self, state: dict[str, Any] | None = None) -> str:
        r, s = self.runner, self.runner.settings
        valid = r.space.valid_genomes()
        batch = max(1, s.population)
        start = int(state["next"]) if state else 0
        gen = int(state["generation"]) + 1 if state else 0
        reason = "space exhausted"
        last = max(0, gen - 1)  # the last generation that ran (a resumed run with nothing left: the stored one)
        for i in range(start, len(valid), batch):
            # the next batch (within the budget): a cluster builds it, and measures it on GPUs this one leaves idle
            after = r.evaluations + sum(1 for g in valid[i:i + batch] if r.hash_of(g) not in r.records)
            left = batch if s.budget is None else max(0, s.budget - after)
            r.prefetch(valid[i + batch:i + batch + min(batch, left)], certain=True)
            r.evaluate(valid[i:i + batch], gen)
            last = gen
            nxt = i + batch
            if not r.exhausted:
                r.store.save_checkpoint(r.run.id, gen, {"strategy": self.name, "generation": gen, "next": nxt})
            r.publish(r.best(s.elite), gen, stats={"gen": gen})
            if r.exhausted:
                reason = r.why_stopped()
                break
            gen += 1
        r.publish(r.best(s.elite), last, finished=True, stats={"gen": last, "stop": reason})
        return reason
