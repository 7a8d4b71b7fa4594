"""Failures of a run by status, each with one example reason: what a run that found no correct candidate prints
(exit 3) and what the report's "Evaluations by status" table shows."""

from __future__ import annotations

from typing import Any, Iterable

from evoengineer.status import Status

#: the exit code of a search or resume that finished without a correct candidate
NO_CORRECT_CANDIDATE = 3


def first_line(reason: str, limit: int = 240) -> str:
    """A reason as one line: its first non-empty line (the compiler's first error, the check that failed),
    whitespace collapsed, at most `limit` characters."""
    for line in (reason or "").splitlines():
        text = " ".join(line.split())
        if text:
            return text if len(text) <= limit else text[:limit - 3] + "..."
    return "(no reason recorded)"


def failures_by_status(records: Iterable[Any]) -> dict[str, tuple[int, str]]:
    """status -> (how many, the reason of the first of them to arrive) for every status but `ok`, most frequent
    first."""
    counts: dict[str, int] = {}
    example: dict[str, tuple[int, str]] = {}
    for r in records:
        if r.status == Status.OK:
            continue
        counts[r.status] = counts.get(r.status, 0) + 1
        seq = getattr(r, "seq", 0) or 0
        if r.status not in example or seq < example[r.status][0]:
            example[r.status] = (seq, r.reason or "")
    order = sorted(counts, key=lambda s: (-counts[s], s))
    return {s: (counts[s], first_line(example[s][1])) for s in order}


def no_correct_candidate(run_id: int, records: Iterable[Any]) -> list[str]:
    """The lines a run that ended without a correct candidate prints: how many it evaluated, then per failure
    status how many and one example reason."""
    records = list(records)
    by_status = failures_by_status(records)
    lines = [f"error: run {run_id} found no correct candidate in {len(records)} evaluation"
             f"{'' if len(records) == 1 else 's'}" + ("; by status:" if by_status else "")]
    width = max((len(s) for s in by_status), default=0)
    for status, (n, reason) in by_status.items():
        lines.append(f"  {status.ljust(width)} {n:>4}  e.g. {reason}")
    return lines
