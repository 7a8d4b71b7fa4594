"""Random search: valid configurations drawn uniformly without replacement, `population` per batch.

The draw order is a seeded permutation of the valid configurations, so a checkpoint only needs the position reached;
resuming continues the same permutation (the evaluated set equals an uninterrupted run's).
"""

from __future__ import annotations

import random
from typing import Any

from evoengineer.search.runner import Runner


class RandomSearch:
    name = "random"

    def __init__(self, runner: Runner):
        self.runner = runner

    def order(self) -> list[tuple[int, ...]]:
        """Every valid configuration, in this run's (seeded) random order."""
        valid = list(self.runner.space.valid_genomes())
        random.Random(f"random-search:{self.runner.settings.seed}").shuffle(valid)
        return valid

    def run(self, state: dict[str, Any] | None = None) -> str:
        r, s = self.runner, self.runner.settings
        order = self.order()
        batch = max(1, s.population)
        pos = int(state["next"]) if state else 0
        gen = int(state["generation"]) + 1 if state else 0
        reason = "space exhausted"
        while pos < len(order):
            # sized as the run stood when this generation began: a resumed batch whose members were partly stored
            # before the interruption is the batch the uninterrupted run took, in the same generation
            before = r.evaluations_before(gen)
            stop = r.cap_reached(gen)
            if stop:
                reason = stop
                break
            take = order[pos:pos + min(batch, s.max_evaluations - before)]
            # the next batch, as the next pass will take it (every configuration of this one ends up stored):
            # a cluster builds it, and measures it on GPUs this batch leaves idle
            after = before + len(take)
            r.prefetch(order[pos + len(take):pos + len(take) + min(batch, s.max_evaluations - after)], certain=True)
            r.evaluate(take, gen)
            pos += len(take)
            if not r.exhausted:
                r.store.save_checkpoint(r.run.id, gen, {"strategy": self.name, "generation": gen, "next": pos})
            r.publish(r.best(s.elite), gen, stats={"gen": gen})
            gen += 1
        if pos >= len(order) and r.exhausted:
            reason = r.why_stopped()
        r.publish_final(gen - 1, reason)
        return reason
