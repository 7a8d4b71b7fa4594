"""A space's [evaluation] settings over the defaults (torch-free: the runner and replay read them too)."""

from __future__ import annotations

from typing import Any

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace

GENERIC_SHAPE_KEYS = ("checks", "time", "fresh")
EVALUATION_DEFAULTS = {"warmup": 20, "repeats": 100, "timeout_s": 120.0, "init_timeout_s": 900.0,
                       "l2_flush": True, "build_jobs": 0,
                       # integrity (evaluators/integrity.py): runs per check set that must agree, timed calls
                       # whose output is checked against the reference (the last one and random others), whether
                       # runs of the same inputs must agree bitwise (else within the tolerance)
                       "check_runs": 2, "check_calls": 4, "deterministic": True,
                       # compute-sanitizer tools each elite runs under before it is published (CUDA; [] = none)
                       "sanitizer": ["memcheck", "racecheck", "synccheck"], "sanitizer_timeout_s": 300.0,
                       # re-timing at the end of a search (evaluators/retiming.py): finalists = this x K (0 = off),
                       # rounds of interleaved timings, the most calls per finalist and round (0 = `repeats`; fewer
                       # where a finalist's noise allows), and its budget: this share of the run's measuring time
                       # (search and re-timing; 0 = no budget)
                       "retime_finalists": 2, "retime_rounds": 5, "retime_repeats": 0, "retime_share": 0.2}
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def evaluation_settings(space: SearchSpace) -> dict[str, Any]:
    """The space's [evaluation] table over the defaults; unknown keys and bad values are UserErrors."""
    where = f"{space.path or space.name}: evaluation"
    out = dict(EVALUATION_DEFAULTS)
    for k, v in space.evaluation.items():
        if k not in EVALUATION_DEFAULTS:
            raise UserError(f"{where}.{k}: unknown key (known: {', '.join(EVALUATION_DEFAULTS)})")
        default = EVALUATION_DEFAULTS[k]
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise UserError(f"{where}.{k}: must be true or false")
        elif isinstance(default, list):
            if not isinstance(v, list) or any(t not in SANITIZER_TOOLS for t in v) or len(set(v)) != len(v):
                raise UserError(f"{where}.{k}: a list of distinct tools among {', '.join(SANITIZER_TOOLS)}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise UserError(f"{where}.{k}: must be a non-negative number")
        out[k] = v
    for k in ("repeats", "check_runs", "check_calls", "retime_rounds"):
        if out[k] < 1 or out[k] != int(out[k]):
            raise UserError(f"{where}.{k}: must be a whole number, at least 1")
    for k in ("retime_finalists", "retime_repeats"):
        if out[k] != int(out[k]):
            raise UserError(f"{where}.{k}: must be a whole number")
    if out["retime_share"] >= 1:
        raise UserError(f"{where}.retime_share: a share of the run, below 1 (0 = no budget)")
    return out
