"""Re-timing of a search's finalists: what an evaluator hands back, and how it is read.

A search ranks candidates by one timing each, taken minutes apart on a machine whose speed drifts. At the end the
runner has the evaluator time its finalists (2K by default) together: several rounds, each round timing every
finalist once, the order rotated every round (round-robin), on inputs none of them has seen. The elites are then
ranked by the re-timed median; both timings, the spread and a flag (re-timing disagrees with the first timing by
more than the noise) are recorded.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

#: a re-timing within this share of the first timing is never flagged (timer resolution, clocks)
MIN_TOLERANCE = 0.03
BOOTSTRAP_RESAMPLES = 200


@dataclass
class Retiming:
    """An evaluator's re-timing of finalists. `samples[hash]` is one list of per-call times (us) per round;
    `dropped[hash]` says why a finalist was not timed (wrong on the fresh inputs, did not load); `baseline_p50_us`
    is the baseline's p50 per round (the machine's noise); `order` is the sequence the timings ran in."""

    samples: dict[str, list[list[float]]]
    dropped: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    baseline_p50_us: list[float] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def noise_cv(self) -> float | None:
        """Coefficient of variation of the baseline's per-round p50s (None without a baseline or with one round)."""
        return cv(self.baseline_p50_us)


def round_robin(items: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: every item once, the start rotated by one per round (so no finalist always runs
    first or right after the baseline)."""
    n = len(items)
    return [items[r % n:] + items[:r % n] for r in range(rounds)] if n else [[] for _ in range(rounds)]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def cv(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m > 0 else None


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(first_us: float, rounds: list[list[float]], noise_cv: float | None, *, key: str) -> dict[str, Any]:
    """One finalist's re-timing: p50 over every re-timed call, p10/p90, a bootstrap 95% interval of the median
    (resampling calls; the RNG is seeded by `key`, so the result is reproducible), the round-to-round CV, the ratio
    to the first timing and a flag when that ratio is off by more than the noise: max(3%, 3 x the baseline's CV,
    3 x this candidate's round-to-round CV)."""
    calls = sorted(x for r in rounds for x in r)
    p50 = _quantile(calls, 0.5)
    rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    boots = sorted(median(rng.choices(calls, k=len(calls))) for _ in range(BOOTSTRAP_RESAMPLES))
    round_cv = cv([median(r) for r in rounds if r])
    tol = max(MIN_TOLERANCE, 3 * (noise_cv or 0.0), 3 * (round_cv or 0.0))
    ratio = p50 / first_us if first_us > 0 and math.isfinite(first_us) else math.nan
    flag = ""
    if not math.isfinite(ratio) or abs(ratio - 1) > tol:
        flag = (f"re-timed p50 {p50:.4g} us is {ratio:.2f}x the search's {first_us:.4g} us, beyond the noise "
                f"(+-{tol:.0%})")
    return {"p50_us": p50, "p10_us": _quantile(calls, 0.1), "p90_us": _quantile(calls, 0.9),
            "p99_us": _quantile(calls, 0.99),
            "median_ci95_us": [_quantile(boots, 0.025), _quantile(boots, 0.975)], "rounds": len(rounds),
            "calls": len(calls), "round_cv": round_cv, "noise_cv": noise_cv, "tolerance": tol,
            "first_us": first_us, "ratio": ratio, "flag": flag}
