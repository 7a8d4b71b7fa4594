"""The strategy benchmark script (experiments/strategies/benchmark.py): metrics, order statistics, and a short real
run on a recorded landscape that writes its table, JSON and PNG."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "strategies"))

import benchmark  # noqa: E402


def test_run_metrics_and_nearest_rank():
    inf = math.inf
    times = [130.0, inf, 104.0, 101.5, 100.5, 100.0]
    m = benchmark.run_metrics(times, 100.0, 40)
    assert (m["evals_to_1pct"], m["evals_to_2pct"], m["evals_to_5pct"]) == (5, 4, 3)
    # budgets: 5% of 40 = 2 evaluations, 10% = 4, 20% = 8 (past the end: the last best)
    assert (m["best_at_5pct"], m["best_at_10pct"], m["best_at_20pct"]) == (1.3, 1.015, 1.0)
    assert benchmark.run_metrics([inf, 120.0], 100.0, 10)["evals_to_5pct"] is None
    assert benchmark.nearest_rank(list(range(1, 31)), 0.5) == 15
    assert benchmark.nearest_rank(list(range(1, 31)), 0.9) == 27
    assert benchmark.nearest_rank([3, inf, 1], 0.9) == inf


def test_benchmark_runs_on_a_recorded_landscape(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    assert benchmark.main(["--landscapes", "sdpa_fp16_d64", "--strategies", "ga,random,optuna-tpe,grid",
                           "--seeds", "2", "--jobs", "1", "--work", str(work), "--out", str(out),
                           "--tag", "t"]) == 0
    printed = capsys.readouterr().out
    assert "### sdpa_fp16_d64: 360 valid configurations, 2 seeds" in printed
    assert "sdpa_fp16_d64: GA median evals-to-2%" in printed
    doc = json.loads((out / "strategy_benchmark_t.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 2 * 3 + 1  # grid is deterministic: one run
    for r in runs:
        assert r["optimum_us"] == min(x["optimum_us"] for x in runs)
        assert r["evaluations"] >= math.ceil(0.2 * 360)  # never stops before 20% of the space
        assert r["evals_to_1pct"] is None or r["evals_to_1pct"] <= r["evaluations"]
    assert (out / "strategy_benchmark_t.png").read_bytes()[:4] == b"\x89PNG"
    assert "| ga |" in (out / "strategy_benchmark_t.md").read_text()
