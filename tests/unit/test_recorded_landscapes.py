"""Every recorded landscape under experiments/ replays in a space that renders with today's templates (issue 33: a
frozen space whose template had gained genes stopped rendering, and its study no longer reproduced)."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import pytest

from evoengineer import ROOT, shipped_space_files
from evoengineer.candidate import CandidateFactory
from evoengineer.evaluators.replay import Landscape
from evoengineer.space import load_space

LANDSCAPES = sorted((ROOT / "experiments").rglob("landscape*.csv"))
SPACE_FILES = sorted(shipped_space_files("*.toml")) + sorted((ROOT / "experiments").rglob("*.toml"))


def _parameter_columns(path: Path) -> set[str]:
    with path.open(newline="") as f:
        header = next(csv.reader(f))
    return set(header[:header.index("status")])


def _spaces_for(path: Path) -> list:
    """The space files whose parameters are exactly the landscape's parameter columns."""
    columns = _parameter_columns(path)
    return [space for space in _all_spaces() if set(space.names) == columns]


@functools.cache
def _all_spaces() -> tuple:
    """Every space file that loads, loaded once for all landscapes (a load enumerates the valid set)."""
    spaces = []
    for p in SPACE_FILES:
        try:
            spaces.append(load_space(p))
        except Exception:  # not a space file (or one that fails: reported by the space tests)
            continue
    return tuple(spaces)


def test_recorded_landscapes_are_found():
    assert len(LANDSCAPES) >= 9 and any(p.name == "landscape_cuda_msda_fp16.csv" for p in LANDSCAPES)


def _recorded_params(land: Landscape) -> list[dict]:
    space = land.space
    return [{p.name: next(v for v in p.values if p.canonical(v) == k) for p, k in zip(space.parameters, key)}
            for key in land.rows]


@pytest.mark.parametrize("path", LANDSCAPES, ids=lambda p: str(p.relative_to(ROOT / "experiments")))
def test_a_recorded_landscape_replays_in_a_space_that_renders(path: Path):
    # its spaces: same parameters, and every recorded configuration meets the constraints (a d128 space shares
    # the d64 one's genes but not its shared-memory limits)
    lands = [Landscape(path, s) for s in _spaces_for(path)]
    with path.open(newline="") as f:
        recorded = sum(1 for row in csv.reader(f) if any(c.strip() for c in row)) - 1
    lands = [land for land in lands if len(land.rows) == recorded
             and all(not land.space.violated(p) for p in _recorded_params(land))]
    assert lands, f"{path}: no space file has exactly its parameter columns and admits every recorded row"
    for land in lands:
        factory = CandidateFactory(land.space)
        for params in _recorded_params(land):  # every recorded configuration renders (StrictUndefined)
            factory.make(params)
