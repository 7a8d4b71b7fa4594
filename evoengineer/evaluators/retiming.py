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
#: the plan's floor: calls per finalist and round, rounds (a round-to-round CV needs two), and the least relative
#: spread a finalist is assumed to have (the search's p90 can sit on its p50)
MIN_CALLS = 3
MIN_ROUNDS = 2
MIN_SPREAD = 0.005
#: what the calls are sized for: a finalist's median known to +-1% (95%), where its noise and the budget allow
TARGET_CI = 0.01
#: the least budget a re-timing gets (a fresh worker's start alone takes seconds; short runs and fast GPU kernels,
#: whose calls cost next to nothing, would otherwise be left two rounds)
MIN_BUDGET_S = 15.0
#: finalists whose re-timed medians lie closer than this share apart (or within twice their round-to-round spread, or
#: whose 95% intervals overlap) are tied: on one machine, fresh processes move a kernel's median by up to ~0.5-1%
#: (the search's and the re-timing's medians of the same kernels: 0.992-1.003 on an H200), so two kernels' medians
#: move apart by up to twice that from one run to the next
MIN_TIE = 0.02


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


def calls_for_noise(p50_us: float, p90_us: float | None, rounds: int, most: int) -> int:
    """Calls per round that put a finalist's median within TARGET_CI (95%) of the truth, from the spread of its
    search timing (p90 over p50; a normal's p90 is 1.28 sigma out, the median's standard error 1.25 sigma /
    sqrt(n)); between MIN_CALLS and `most`."""
    spread = MIN_SPREAD
    if isinstance(p90_us, (int, float)) and p50_us > 0 and math.isfinite(p90_us):
        spread = max(MIN_SPREAD, (p90_us / p50_us - 1.0) / 1.2816)
    n = math.ceil((1.96 * 1.2533 * spread / TARGET_CI) ** 2)
    return max(MIN_CALLS, min(most, math.ceil(n / max(1, rounds))))


def plan_retiming(finalists: dict[str, tuple[float, float | None]], *, baseline_us: float | None, rounds: int,
                  most: int, warmup: int, budget_s: float | None) -> dict[str, Any]:
    """How to re-time `finalists` (hash -> the search's p50 and p90 per call, us) at a bounded cost:

    - calls per finalist and round sized from its noise (calls_for_noise), at most `most`;
    - the baseline (it only gauges the machine's drift between rounds, and the speedup) costs at most half of what
      the finalists cost in a round: at least MIN_CALLS calls, and when even those cost more than the finalists
      together, timed in fewer rounds (at least MIN_ROUNDS, the first and the last among them);
    - with a budget (seconds): what does not fit is cut, the baseline first (MIN_CALLS calls in MIN_ROUNDS rounds),
      then every finalist's calls alike (down to MIN_CALLS), then rounds (down to MIN_ROUNDS). The estimate uses the
      search's timings; the worker also stops after a round once the budget is spent (MIN_ROUNDS done).

    Returns rounds, calls per finalist (`repeats`), the baseline's calls and rounds, the budget and the expected
    seconds."""
    w = max(0, warmup)
    cost = {h: max(0.0, p50) * 1e-6 for h, (p50, _) in finalists.items()}
    calls = {h: calls_for_noise(p50, p90, rounds, most) for h, (p50, p90) in finalists.items()}

    def finalists_round(c: dict[str, int]) -> float:
        return sum((c[h] + w) * cost[h] for h in c)

    base = max(0.0, baseline_us or 0.0) * 1e-6
    f_round = finalists_round(calls)
    b_calls, b_rounds = 0, 0
    if base > 0:
        b_calls = max(MIN_CALLS, min(most, math.floor(f_round / 2 / base)))
        b_rounds = rounds
        if (MIN_CALLS + w) * base > f_round / 2:  # even a few calls cost more than half the finalists' round
            b_rounds = max(MIN_ROUNDS, min(rounds, math.floor(rounds * f_round / 2 / ((MIN_CALLS + w) * base))))

    def total(r: int, c: dict[str, int], bc: int, br: int) -> float:
        return r * finalists_round(c) + br * (bc + w) * base

    if budget_s is not None and total(rounds, calls, b_calls, b_rounds) > budget_s:
        if base > 0:
            b_calls, b_rounds = MIN_CALLS, min(rounds, MIN_ROUNDS)
        left = budget_s - min(rounds, b_rounds) * (b_calls + w) * base
        if rounds * f_round > left:
            warm = sum(w * cost[h] for h in calls)
            timed = sum(calls[h] * cost[h] for h in calls)
            scale = max(0.0, (left / rounds - warm) / timed) if timed > 0 else 1.0
            calls = {h: max(MIN_CALLS, min(calls[h], math.floor(calls[h] * scale))) for h in calls}
            f_round = finalists_round(calls)
            if rounds * f_round > left and f_round > 0:
                rounds = max(MIN_ROUNDS, min(rounds, math.floor(left / f_round)))
        b_rounds = min(b_rounds, rounds)
    spread = sorted({round(i * (rounds - 1) / (b_rounds - 1)) for i in range(b_rounds)}) if b_rounds > 1 else \
        ([0] if b_rounds == 1 else [])
    return {"rounds": rounds, "repeats": calls, "baseline_calls": b_calls, "baseline_rounds": spread,
            "budget_s": budget_s, "expected_s": round(total(rounds, calls, b_calls, len(spread)), 3)}


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


def tied(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two finalists' re-timings (`summarize` results, a at most as fast as b) cannot be told apart: their
    95% median intervals overlap, or their medians lie within max(MIN_TIE, 2 x either's round-to-round CV) of each
    other (no MIN_TIE in a replay: its re-timing is the recorded times)."""
    lo_a, hi_a = a.get("median_ci95_us") or (a["p50_us"], a["p50_us"])
    lo_b, hi_b = b.get("median_ci95_us") or (b["p50_us"], b["p50_us"])
    if lo_b <= hi_a and lo_a <= hi_b:
        return True
    # the candidates' own round-to-round spread, not the machine's drift (round-robin rounds share it); MIN_TIE for
    # what fresh processes add, except in a replay (its times are the landscape's recorded ones, exactly)
    floor = 0.0 if a.get("replay") or b.get("replay") else MIN_TIE
    noise = max(floor, *(2 * (x.get("round_cv") or 0.0) for x in (a, b)))
    fast, slow = sorted((a["p50_us"], b["p50_us"]))
    return fast > 0 and (slow - fast) / fast <= noise


def stable_order(finalists: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, list[str]]]:
    """The finalists (key -> re-timing) ranked so that the same finalists on the same machine come out in the same
    order although their medians move within the noise from run to run: at each rank, the fastest remaining and every
    finalist tied with it (`tied`) compete, and the smallest key among them (a candidate's hash: fixed) takes the
    rank. Also returns, for each finalist placed ahead of a faster one it was tied with, those it was tied with."""
    rest = sorted(finalists, key=lambda k: (finalists[k]["p50_us"], k))
    order: list[str] = []
    ties: dict[str, list[str]] = {}
    while rest:
        lead = rest[0]
        group = [k for k in rest if k == lead or tied(finalists[lead], finalists[k])]
        pick = min(group)
        if pick != lead:
            ties[pick] = sorted(k for k in group if k != pick)
        order.append(pick)
        rest.remove(pick)
    return order, ties
