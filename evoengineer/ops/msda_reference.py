"""The old import path of the MSDA family's reference (it lives in evoengineer/families/msda/reference.py)."""

import sys

from evoengineer.families.msda import reference as _reference

sys.modules[__name__] = _reference
