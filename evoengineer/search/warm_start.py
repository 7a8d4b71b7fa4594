"""Warm start: a new search's first proposals are the best configurations that earlier runs in the same store found
for the same family and template (other shapes, other signature constants, other GPUs), where they are valid in the
new space. They are chosen when the run is created and stored with it (its config's ``warm_start``), so a resumed run
proposes them again; the strategy then goes on from their results as from its own.

Matching: a run counts when its space names the same ``task`` (family) and the same template file (the knobs mean the
same things); runs measured on the same GPU come first, then the newest. From each, its fastest correct
configurations, best first, until `limit` distinct ones valid in the new space are found.
"""

from __future__ import annotations

import math
from typing import Any

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace
from evoengineer.status import Status

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: at most this many seeds from one earlier run (the rest from others: what transfers is the family's good region)
PER_RUN = 3


def default_limit(population: int) -> int:
    """Seeds for a search of `population`: half of it, at most 6 (the strategy's own exploration keeps the rest)."""
    return max(1, min(6, population // 2))


def _task_of(space_text: str) -> str | None:
    try:
        task = tomllib.loads(space_text).get("task")
    except tomllib.TOMLDecodeError:
        return None
    return task if isinstance(task, str) else None


def find_seeds(store: Any, space: SearchSpace, *, gpu: str | None, limit: int) -> dict[str, Any]:
    """{"runs": [run ids used], "seeds": [params, ...]} (empty lists when the store knows nothing that fits)."""
    if limit <= 0:
        return {"runs": [], "seeds": []}
    runs = [r for r in store.runs() if r.template == space.template and _task_of(r.space_text) == space.task]
    runs.sort(key=lambda r: ((r.fingerprint or {}).get("gpu") != gpu, -r.id))
    seeds: list[dict[str, Any]] = []
    used: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for run in runs:
        recs = [c for c in store.candidates(run.id)
                if c.status == Status.OK and math.isfinite(c.time_us)]
        taken = 0
        for rec in sorted(recs, key=lambda c: (c.time_us, c.hash)):
            if taken >= PER_RUN or len(seeds) >= limit:
                break
            try:
                genome = tuple(space.params_to_genome(dict(rec.params)))
            except (UserError, KeyError, ValueError):
                continue  # a knob this space does not have, a value it does not allow, a constraint it breaks
            if genome in seen:
                continue
            seen.add(genome)
            seeds.append(space.genome_to_params(genome))
            taken += 1
        if taken:
            used.append(run.id)
        if len(seeds) >= limit:
            break
    return {"runs": used, "seeds": seeds}
