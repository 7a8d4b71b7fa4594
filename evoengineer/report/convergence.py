"""Best-so-far curves (best valid time after each distinct evaluation) and their PNG plot."""

from __future__ import annotations

import math
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


def plot_convergence(series: Mapping[str, Sequence[float]], path: str | Path, *, title: str,
                     optimum: float | None = None, ylabel: str = "best time (us)") -> Path:
    """One line per label of best-so-far values against evaluations (1-based); `optimum` draws the known best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for label, ys in series.items():
        xs = [i + 1 for i, y in enumerate(ys) if math.isfinite(y)]
        ax.step(xs, [y for y in ys if math.isfinite(y)], where="post", label=label)
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
