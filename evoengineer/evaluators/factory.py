"""Build an evaluator from CLI options (new run) or from a run's stored settings (resume)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evoengineer.errors import UserError
from evoengineer.evaluators.base import Evaluator
from evoengineer.evaluators.replay import ReplayEvaluator
from evoengineer.space.spec import SearchSpace


def replay_delay() -> float:
    """Seconds each replayed measurement takes (EVOENGINEER_REPLAY_DELAY_S, default 0): simulates a device."""
    text = os.environ.get("EVOENGINEER_REPLAY_DELAY_S", "0")
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"EVOENGINEER_REPLAY_DELAY_S={text!r}: not a number") from None
    if not 0 <= value <= 60:
        raise UserError(f"EVOENGINEER_REPLAY_DELAY_S={text!r}: must be between 0 and 60")
    return value


def evaluator_for_search(space: SearchSpace, *, landscape: str | None = None, options: dict[str, Any] | None = None
                         ) -> Evaluator:
    """A replay evaluator when a landscape is given, else real builds and runs for the space's backend."""
    if landscape is not None:
        return ReplayEvaluator(landscape, space, delay_s=replay_delay())
    raise UserError(f"space {space.name!r}: real evaluation of {space.backend} kernels is not available yet; "
                    "pass --landscape FILE to replay a recorded landscape")


def evaluator_for_resume(space: SearchSpace, described: dict[str, Any]) -> Evaluator:
    """Rebuild the evaluator a run started with; refuse if its inputs changed since."""
    kind = described.get("kind")
    if kind == "replay":
        path = described["landscape"]
        if not Path(path).exists():
            raise UserError(f"{path}: the run's landscape file is gone")
        ev = ReplayEvaluator(path, space, delay_s=replay_delay())
        if ev.landscape.sha256 != described.get("landscape_sha256"):
            raise UserError(f"{path}: landscape changed since the run started; resuming would mix measurements")
        return ev
    raise UserError(f"run's evaluator {kind!r} is not available in this installation")
