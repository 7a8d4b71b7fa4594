"""Search strategies over one shared runner. Each strategy is a module with one class and a `run(state)`."""

from evoengineer.search.ga import GeneticSearch
from evoengineer.search.runner import Runner, SearchSettings

STRATEGIES = {"ga": GeneticSearch}

__all__ = ["STRATEGIES", "GeneticSearch", "Runner", "SearchSettings"]
