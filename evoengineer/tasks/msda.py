"""The msda family's task under its earlier module name (it lives in evoengineer/families/msda/)."""

import sys

from evoengineer.families.msda import task as _task

sys.modules[__name__] = _task
