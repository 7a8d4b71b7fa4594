"""Search strategies over one shared runner: each a module with one class keeping the propose / tell / state contract
(search/strategy.py), driven by the asynchronous search loop (search/loop.py)."""

from evoengineer.search.ga import GeneticSearch
from evoengineer.search.grid import GridSearch
from evoengineer.search.optuna_search import SAMPLERS, OptunaSearch
from evoengineer.search.random_search import RandomSearch
from evoengineer.search.runner import Runner, SearchSettings
from evoengineer.search.surrogate import SurrogateSearch

STRATEGIES = {"ga": GeneticSearch, "random": RandomSearch, "grid": GridSearch, "optuna": OptunaSearch,
              "surrogate": SurrogateSearch}

__all__ = ["SAMPLERS", "STRATEGIES", "GeneticSearch", "GridSearch", "OptunaSearch", "RandomSearch", "Runner",
           "SearchSettings", "SurrogateSearch"]
