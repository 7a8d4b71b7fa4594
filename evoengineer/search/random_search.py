"""Random search: valid configurations drawn uniformly without replacement.

The draw order is a seeded permutation of the valid configurations; each proposal is the next one not yet told or
pending, so the evaluated set is a prefix of the permutation whatever order the results arrive in.
"""

from __future__ import annotations

import random

from evoengineer.search.strategy import Genome, InOrder


class RandomSearch(InOrder):
    name = "random"

    def order(self) -> list[Genome]:
        """Every valid configuration, in this run's (seeded) random order."""
        valid = list(self.space.valid_genomes())
        random.Random(f"random-search:{self.settings.seed}").shuffle(valid)
        return valid
