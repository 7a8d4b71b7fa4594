"""Grid search: every valid configuration once, in the space's order.

Used to record full landscapes (`python -m evoengineer landscape` exports them for the replay evaluator).
"""

from __future__ import annotations

from evoengineer.search.strategy import Genome, InOrder


class GridSearch(InOrder):
    name = "grid"
    accepts_seeds = False  # every configuration in a fixed order: nothing to start from

    def order(self) -> list[Genome]:
        return self.space.valid_genomes()
