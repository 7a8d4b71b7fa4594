"""Evaluators: one interface (candidate -> measurement); replay from a landscape, or real builds and runs."""

from evoengineer.evaluators.base import METRICS, OK, STATUSES, Evaluator, Measurement
from evoengineer.evaluators.replay import Landscape, ReplayEvaluator

__all__ = ["METRICS", "OK", "STATUSES", "Evaluator", "Measurement", "Landscape", "ReplayEvaluator"]
