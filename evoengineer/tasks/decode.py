"""The decode family's task under its earlier module name (it lives in evoengineer/families/decode/)."""

import sys

from evoengineer.families.decode import task as _task

sys.modules[__name__] = _task
