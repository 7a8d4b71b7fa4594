"""Best-so-far curves and the convergence PNG."""

from __future__ import annotations

import math

from evoengineer.report import best_so_far, plot_convergence


def test_best_so_far_ignores_failures_and_keeps_the_minimum():
    inf = math.inf
    assert best_so_far([inf, 5.0, 7.0, inf, 3.0, 4.0, float("nan")]) == [inf, 5.0, 5.0, 5.0, 3.0, 3.0, 3.0]
    assert best_so_far([]) == []


def test_convergence_png_is_written(tmp_path):
    out = plot_convergence({"ga": best_so_far([9, 8, 8.5, 6]), "random": best_so_far([math.inf, 7, 7.5])},
                           tmp_path / "c.png", title="t", optimum=5.0)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert not list(tmp_path.glob("*.tmp"))
