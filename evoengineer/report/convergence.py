"""Best-so-far curves (best valid time after each distinct evaluation) and their PNG plot."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence


def best_so_far(times: Iterable[float]) -> list[float]:
    """Running minimum of evaluation times in evaluation order; failed evaluations are inf (inf until one is valid)."""
    out: list[float] = []
    best = math.inf
    for t in times:
        t = float(t)
        if math.isfinite(t) and t < best:
            best = t
        out.append(best)
    return out


@dataclass(frozen=True)
class Retimed:
    """A finalist re-timed at the end of a run: where it was evaluated (1-based), its search p50, its re-timed p50
    (None: dropped by the re-timing), whether it is rank 1, and whether it was the search's best."""

    x: int
    search_us: float
    retimed_us: float | None
    rank1: bool = False
    search_best: bool = False


def plot_convergence(series: Mapping[str, Sequence[float]], path: str | Path, *, title: str,
                     optimum: float | None = None, ylabel: str = "best time (us)",
                     retimed: Mapping[str, Sequence[Retimed]] | None = None) -> Path:
    """One line per label of best-so-far values against evaluations (1-based); `optimum` draws the known best.
    `retimed` (per label) marks the finalists' re-timing: a segment from each finalist's search time to its re-timed
    one, rank 1 as a star (its re-timed p50 drawn on to the end), and the search's best, when it is not rank 1, as
    an X: the curve's last point is then not what the run ranked first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    last_x = max((len(ys) for ys in series.values()), default=1)
    for label, ys in series.items():
        xs = [i + 1 for i, y in enumerate(ys) if math.isfinite(y)]
        line = ax.step(xs, [y for y in ys if math.isfinite(y)], where="post", label=label)[0]
        for f in (retimed or {}).get(label, ()):
            color = line.get_color()
            if f.retimed_us is not None:
                ax.plot([f.x, f.x], [f.search_us, f.retimed_us], color=color, linewidth=0.8, alpha=0.6)
                ax.plot([f.x], [f.retimed_us], marker="*" if f.rank1 else "o", markersize=11 if f.rank1 else 4,
                        color=color, markerfacecolor=color if f.rank1 else "none", linestyle="none")
            if f.rank1 and f.retimed_us is not None:
                ax.hlines(f.retimed_us, f.x, last_x, colors=color, linestyles=":", linewidth=1,
                          label=f"{label}: rank 1 re-timed {f.retimed_us:.4g}")
            if f.search_best and not f.rank1:
                ax.plot([f.x], [f.search_us], marker="X", markersize=9, color="crimson", linestyle="none",
                        label=f"{label}: search's best {f.search_us:.4g}, not rank 1"
                              + (f" (re-timed {f.retimed_us:.4g})" if f.retimed_us is not None else " (dropped)"))
    if optimum is not None and math.isfinite(optimum):
        ax.axhline(optimum, color="0.4", linestyle="--", linewidth=1, label=f"optimum {optimum:.4g}")
    ax.set_xlabel("distinct evaluations")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(path)
    return path
