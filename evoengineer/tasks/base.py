"""The task interface under its earlier name: a task is a kernel family (evoengineer.family.Family); `get_task`
finds the one a space names (evoengineer.families)."""

from evoengineer.families import get_task
from evoengineer.family import TOLERANCES, Family, Inputs, ShapeEntry, check_shape_keys
from evoengineer.tasks.settings import EVALUATION_DEFAULTS, GENERIC_SHAPE_KEYS, SANITIZER_TOOLS, evaluation_settings

Task = Family

__all__ = ["Task", "Family", "Inputs", "ShapeEntry", "TOLERANCES", "check_shape_keys", "get_task",
           "EVALUATION_DEFAULTS", "GENERIC_SHAPE_KEYS", "SANITIZER_TOOLS", "evaluation_settings"]
