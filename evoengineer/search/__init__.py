"""Search strategies over one shared runner. Each strategy is a module with one class and a `run(state)`."""

from evoengineer.search.ga import GeneticSearch
from evoengineer.search.grid import GridSearch
from evoengineer.search.runner import Runner, SearchSettings

STRATEGIES = {"ga": GeneticSearch, "grid": GridSearch}

__all__ = ["STRATEGIES", "GeneticSearch", "GridSearch", "Runner", "SearchSettings"]
