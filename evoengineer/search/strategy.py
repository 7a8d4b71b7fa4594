"""The contract every strategy keeps: `propose` the next configuration, be `tell`-ed each result as it arrives,
describe itself in `state`. No generation barrier: the search loop (search/loop.py) keeps several candidates in
flight and asks for one more whenever a result comes back, so a strategy proposes from everything measured so far
while other proposals are still pending.

Determinism: a strategy draws only from its own seeded RNG and decides only from what it was told and what it
proposed, in order. The loop logs that order (the store's proposal log and the candidates' arrival order) and a
resumed run replays it, so it proposes exactly what it proposed before. A strategy never reads the store.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evoengineer.search.runner import Runner
    from evoengineer.store import CandidateRecord

Genome = tuple[int, ...]


class Strategy:
    """Base of the strategies: bookkeeping of what was proposed (pending) and told (results, in arrival order)."""

    name = "abstract"
    #: the strategy's options as one dataclass (its fields: names, types, defaults; search/options.py), or None
    params_cls: type | None = None
    #: takes a warm start's configurations as its first proposals (search/warm_start.py)
    accepts_seeds = True

    def __init__(self, runner: "Runner"):
        self.runner = runner  # for the space, the settings and hashing; never the store
        self.space = runner.space
        self.settings = runner.settings
        self.told: dict[Genome, "CandidateRecord"] = {}  # in the order the results arrived
        self.pending: set[Genome] = set()
        seeds = (getattr(self.settings, "warm_start", None) or {}).get("seeds", []) if self.accepts_seeds else []
        self.seeds: list[Genome] = [tuple(self.space.params_to_genome(dict(p))) for p in seeds]

    # ---- the contract -------------------------------------------------------------------------------------------
    def propose(self) -> Genome | None:
        """The next configuration to evaluate (valid, neither told nor pending), or None when there is none left."""
        raise NotImplementedError

    def observe(self, genome: Genome, record: "CandidateRecord") -> None:
        """A result arrived (hook for subclasses; `told` already holds it)."""

    def state(self) -> dict[str, Any]:
        """A JSON summary for people (elite.json's progress, reports): not what a resume needs."""
        ok = [r.time_us for r in self.told.values() if math.isfinite(r.time_us)]
        return {"strategy": self.name, "proposed": len(self.told) + len(self.pending), "told": len(self.told),
                "pending": len(self.pending),
                "best_us": min(ok) if ok else None}

    # ---- used by the loop ---------------------------------------------------------------------------------------
    def ask(self) -> Genome | None:
        while self.seeds:  # a warm start's configurations first, then the strategy's own
            g = self.seeds.pop(0)
            if not self.seen(g):
                self.pending.add(g)
                return g
        g = self.propose()
        if g is not None:
            g = tuple(g)
            self.pending.add(g)
        return g

    def tell(self, genome: Genome, record: "CandidateRecord") -> None:
        genome = tuple(genome)
        self.pending.discard(genome)
        self.told[genome] = record
        self.observe(genome, record)

    def seen(self, genome: Genome) -> bool:
        """Told or pending: proposing it again would evaluate nothing new."""
        g = tuple(genome)
        return g in self.told or g in self.pending

    def run(self, state: dict[str, Any] | None = None) -> str:
        """Search through the runner until the budget, the space or the strategy runs out; why it stopped.
        (`state` is not used: a resume replays the run's proposal log.)"""
        from evoengineer.search.loop import SearchLoop

        return SearchLoop(self.runner, self).run()


class InOrder(Strategy):
    """A strategy that takes the valid configurations in a fixed order (`order`), skipping any told or pending."""

    def order(self) -> list[Genome]:
        raise NotImplementedError

    def propose(self) -> Genome | None:
        if not hasattr(self, "_order"):
            self._order, self._pos = self.order(), 0
        while self._pos < len(self._order):
            g = tuple(self._order[self._pos])
            self._pos += 1
            if not self.seen(g):
                return g
        return None
