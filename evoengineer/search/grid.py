"""Grid search: every valid configuration once, in the space's order.

Used to record full landscapes (`python -m evoengineer landscape` exports them for the replay evaluator).
"""

from __future__ import annotations

from evoengineer.search.strategy import Genome, Strategy


class GridSearch(Strategy):
    name = "grid"

    def propose(self) -> Genome | None:
        if not hasattr(self, "_valid"):
            self._valid, self._pos = self.space.valid_genomes(), 0
        while self._pos < len(self._valid):
            g = tuple(self._valid[self._pos])
            self._pos += 1
            if not self.seen(g):
                return g
        return None
