"""The sdpa family's task under its earlier module name (it lives in evoengineer/families/sdpa/)."""

import sys

from evoengineer.families.sdpa import task as _task

sys.modules[__name__] = _task
