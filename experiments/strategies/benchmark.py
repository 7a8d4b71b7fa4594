"""Search-efficiency benchmark of the strategies on recorded landscapes (replay evaluator: no device needed).

For each landscape and strategy, N seeds (30 by default). Every run goes through the product's own pieces: the
replay evaluator, the SQLite store (one database per landscape x strategy, under --work), the shared runner with its
budget and elite.json, and the strategy classes that `python -m evoengineer search --strategy ...` uses.

Per run: the distinct evaluations until the best found is within 1%, 2% and 5% of the landscape's optimum, and the
best found (as a ratio to the optimum) after 5%, 10% and 20% of the valid space. A run stops once it has spent 20% of
the space and is within 1% (or at the cap, by default the whole space): strategies do not look at the budget, so the
prefix of a longer run is exactly the run with the smaller budget. Order statistics are nearest-rank (median = the
15th of 30, p90 = the 27th); a run that never got there counts as more than its evaluations ('>N' in the table).

    python experiments/strategies/benchmark.py                       # all landscapes, default strategies, 30 seeds
    python experiments/strategies/benchmark.py --landscapes cpu_msda --strategies ga,random --seeds 5
    python experiments/strategies/benchmark.py --ga population=24,cxpb=0.5 --tag tuned   # GA settings under test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.store import Store  # noqa: E402
from evoengineer.evaluators.replay import BuildTimeModel, ReplayEvaluator  # noqa: E402
from evoengineer.report.convergence import best_so_far  # noqa: E402
from evoengineer.search import STRATEGIES, Runner, SearchSettings  # noqa: E402
from evoengineer.search.ga import GAParams, GeneticSearch  # noqa: E402
from evoengineer.search.surrogate import SurrogateParams, SurrogateSearch  # noqa: E402
from evoengineer.space.spec import SearchSpace, load_space  # noqa: E402

RESULTS = ROOT / "experiments" / "strategies" / "results"
LANDSCAPES = {  # name: (space file, landscape CSV)
    "cpu_msda": ("evoengineer/families/msda/spaces/cpu_msda.toml", "experiments/data/strategies/landscape_cpu_msda.csv"),
    "cuda_msda_fp16": ("experiments/data/msda/cuda_msda_fp16_v1.toml",  # the space the landscape was recorded in
                       "experiments/data/msda/landscape_cuda_msda_fp16.csv"),
    "sdpa_fp16_d64": ("evoengineer/families/sdpa/spaces/sdpa_fp16_d64.toml", "experiments/data/sdpa/landscape_sdpa_fp16_d64.csv"),
}
DEFAULT_STRATEGIES = ["ga", "random", "optuna-tpe", "optuna-cmaes", "optuna-nsga2", "grid"]
WITHIN = (0.01, 0.02, 0.05)
BUDGETS = (0.05, 0.10, 0.20)
DETERMINISTIC = {"grid"}  # one run stands for every seed


# ---- one run ------------------------------------------------------------------------------------------------------
class StopAtTarget:
    """Observer: once `min_evals` are spent and the best is at or below `target`, ask the strategy to stop."""

    def __init__(self, target: float, min_evals: int):
        self.target, self.min_evals, self.best = target, min_evals, math.inf

    def on_evaluation(self, runner: Runner, rec: Any) -> None:
        if rec.status == "ok":
            self.best = min(self.best, rec.time_us)
        if runner.evaluations >= self.min_evals and self.best <= self.target:
            runner.request_stop("target reached")

    def on_generation(self, runner: Runner, generation: int, stats: dict[str, Any]) -> None:
        pass


def split_strategy(spec: str) -> tuple[str, str | None]:
    name, _, sampler = spec.partition("-")
    if name not in STRATEGIES:
        raise SystemExit(f"--strategies: unknown strategy {spec!r} (known: {', '.join(STRATEGIES)}, optuna-SAMPLER)")
    return name, (sampler or "tpe") if name == "optuna" else None


def optimum_of(evaluator: ReplayEvaluator) -> float:
    return min(m.metrics["time_us"] for m in evaluator.landscape.rows.values() if m.status == "ok")


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """All seeds of one landscape x strategy, sequentially, into one database. Returns per-run results."""
    space_file, csv_path = (ROOT / p for p in job.get("paths") or LANDSCAPES[job["landscape"]])
    space = load_space(space_file)
    evaluator = ReplayEvaluator(csv_path, space, builds=pipeline_model(job.get("pipeline")))
    n_valid = space.count_valid()
    opt = optimum_of(evaluator)
    strategy, sampler = split_strategy(job["strategy"])
    work = Path(job["work"])
    db = work / f"{job['landscape']}__{job['strategy']}{job['tag']}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    store = Store(f"sqlite:///{db}")
    ga_params = GAParams(**job["ga"])
    cap = max(1, min(n_valid, math.ceil(job["cap"] * n_valid)))
    # stop once within `stop_within` of the optimum, after `min_evals` (default: 1%, after 20% of the space)
    stop_within = job.get("stop_within", min(WITHIN))
    min_evals = job.get("min_evals", math.ceil(max(BUDGETS) * n_valid))
    out = []
    seeds = job["seeds"][:1] if strategy in DETERMINISTIC else job["seeds"]
    for seed in seeds:
        t0 = time.monotonic()
        settings = SearchSettings(strategy=strategy, sampler=sampler, population=job["population"],
                                  generations=10**6, elite=3, budget=cap, seed=seed)
        run_id = store.create_run(space_name=space.name, space_path=str(space_file), space_text=space.text,
                                  template=space.template, template_sha256="benchmark",
                                  config={**settings.to_dict(), "evaluator": evaluator.describe(),
                                          "ga": dataclasses.asdict(ga_params), "benchmark": True},
                                  seed=seed, fingerprint={"benchmark": "replay"})
        runner = Runner(space=space, evaluator=evaluator, store=store, run=store.get_run(run_id), settings=settings,
                        out=work / f"{db.stem}.elite.json",
                        observers=[StopAtTarget(opt * (1 + stop_within), min_evals)])
        if strategy == "ga":
            search = GeneticSearch(runner, ga_params)
        elif strategy == "surrogate":
            search = SurrogateSearch(runner, SurrogateParams(**job.get("surrogate", {})))
        else:
            search = STRATEGIES[strategy](runner)
        reason = search.run(None)
        store.set_run_status(run_id, "finished", reason)
        times = [r.time_us for r in store.candidates(run_id)]
        out.append({"landscape": job["landscape"], "strategy": job["strategy"], "seed": seed, "run_id": run_id,
                    "db": str(db), "stop": reason, "evaluations": len(times), "wall_s": time.monotonic() - t0,
                    **run_metrics(times, opt, n_valid), **({"times": times} if job.get("keep_times") else {})})
    store.close()
    return out


def pipeline_model(text: str | None) -> BuildTimeModel | None:
    """--pipeline SLOTSxBUILD_S:MEASURE_S (e.g. 16x3.1:0.25): results arrive as from a host with SLOTS build slots,
    builds of BUILD_S seconds ("recorded": the landscape's build_s) and one device measuring MEASURE_S per candidate,
    in simulated time; the search keeps SLOTS + 2 candidates in flight. None: one candidate at a time."""
    if not text:
        return None
    slots, _, rest = text.partition("x")
    build, _, measure = rest.partition(":")
    recorded = build == "recorded"
    return BuildTimeModel(int(slots), 3.1 if recorded else float(build), recorded=recorded, virtual=True,
                          measure_s=float(measure or 0.25))


def run_metrics(times: list[float], opt: float, n_valid: int) -> dict[str, Any]:
    bsf = best_so_far(times)
    m: dict[str, Any] = {"optimum_us": opt, "n_valid": n_valid}
    for x in WITHIN:
        m[f"evals_to_{round(x * 100)}pct"] = next((i + 1 for i, b in enumerate(bsf) if b <= opt * (1 + x)), None)
    for f in BUDGETS:
        k = math.ceil(f * n_valid)
        m[f"best_at_{round(f * 100)}pct"] = bsf[min(k, len(bsf)) - 1] / opt if bsf else None
    curve_len = math.ceil(max(BUDGETS) * n_valid)
    m["curve"] = [round(b / opt, 5) if math.isfinite(b) else None for b in bsf[:curve_len]]
    return m


# ---- statistics and output ----------------------------------------------------------------------------------------
def nearest_rank(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile; math.inf stands for 'not reached' and sorts last."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        summary.setdefault(r["landscape"], {}).setdefault(r["strategy"], {"runs": []})["runs"].append(r)
    for land, by in summary.items():
        for strat, d in by.items():
            runs = d["runs"]
            d["n_runs"] = len(runs)
            d["n_valid"] = runs[0]["n_valid"]
            for x in WITHIN:
                key = f"evals_to_{round(x * 100)}pct"
                vals = [r[key] if r[key] is not None else math.inf for r in runs]
                most = max(r["evaluations"] for r in runs)
                d[key] = {q: nearest_rank(vals, p) for q, p in (("median", 0.5), ("p90", 0.9))}
                d[key]["censored_at"] = most
            for f in BUDGETS:
                key = f"best_at_{round(f * 100)}pct"
                vals = [r[key] if r[key] is not None else math.inf for r in runs]
                d[key] = {q: nearest_rank(vals, p) for q, p in (("median", 0.5), ("p90", 0.9))}
            d.pop("runs")
    return summary


def _evals(v: float, censored_at: int, n_valid: int) -> str:
    if not math.isfinite(v):
        return f">{censored_at}"
    return f"{int(v)} ({100 * v / n_valid:.1f}%)"


def _ratio(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3f}"


def metric_head(n_valid: int) -> list[str]:
    """The metric columns' headers (evals to 1/2/5%, best@5/10/20% of the space), shared with the peer tables."""
    return [f"evals to {round(x * 100)}% med / p90" for x in WITHIN] + \
        [f"best@{round(f * 100)}% ({math.ceil(f * n_valid)}) med / p90" for f in BUDGETS]


def metric_cells(d: dict[str, Any], n_valid: int) -> list[str]:
    """One strategy's summary (`summarize`) as the cells under `metric_head`."""
    cells = []
    for x in WITHIN:
        e = d[f"evals_to_{round(x * 100)}pct"]
        cells.append(f"{_evals(e['median'], e['censored_at'], n_valid)} / {_evals(e['p90'], e['censored_at'], n_valid)}")
    for f in BUDGETS:
        b = d[f"best_at_{round(f * 100)}pct"]
        cells.append(f"{_ratio(b['median'])} / {_ratio(b['p90'])}")
    return cells


def format_table(summary: dict[str, Any], n_seeds: int) -> str:
    lines = []
    for land, by in summary.items():
        n_valid = next(iter(by.values()))["n_valid"]
        lines.append(f"\n### {land}: {n_valid} valid configurations, {n_seeds} seeds "
                     f"(grid: 1 run, it is deterministic)\n")
        head = ["strategy", *metric_head(n_valid)]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for strat, d in by.items():
            lines.append("| " + " | ".join([strat, *metric_cells(d, n_valid)]) + " |")
    lines.append("\nbest@B: best time found within the first B evaluations, as a ratio to the landscape's optimum.")
    return "\n".join(lines)


def goal_lines(summary: dict[str, Any]) -> list[str]:
    """The issue's goal per landscape: GA median evals-to-2% <= 15% of the space and <= random and Optuna TPE."""
    out = []
    for land, by in summary.items():
        if "ga" not in by:
            continue
        ga = by["ga"]["evals_to_2pct"]["median"]
        n_valid = by["ga"]["n_valid"]
        parts = [f"GA median evals-to-2% {ga if math.isfinite(ga) else 'not reached'} "
                 f"= {100 * ga / n_valid:.1f}% of {n_valid} (goal <= 15%: {'met' if ga <= 0.15 * n_valid else 'MISSED'})"]
        for other in ("random", "optuna-tpe"):
            if other in by:
                o = by[other]["evals_to_2pct"]["median"]
                parts.append(f"vs {other} {o if math.isfinite(o) else 'not reached'} ({'ok' if ga <= o else 'WORSE'})")
        out.append(f"{land}: " + "; ".join(parts))
    return out


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lands = list(dict.fromkeys(r["landscape"] for r in results))
    fig, axes = plt.subplots(1, len(lands), figsize=(5.2 * len(lands), 4.2), dpi=120, squeeze=False)
    for ax, land in zip(axes[0], lands):
        mine = [r for r in results if r["landscape"] == land]
        n_valid = mine[0]["n_valid"]
        for strat in dict.fromkeys(r["strategy"] for r in mine):
            curves = [r["curve"] for r in mine if r["strategy"] == strat]
            n = min(len(c) for c in curves)
            med = []
            for i in range(n):
                col = [c[i] if c[i] is not None else math.inf for c in curves]
                med.append(nearest_rank(col, 0.5))
            xs = [i + 1 for i, y in enumerate(med) if math.isfinite(y)]
            ax.step(xs, [y for y in med if math.isfinite(y)], where="post", label=strat)
        for x in WITHIN:
            ax.axhline(1 + x, color="0.6", linewidth=0.7, linestyle=":")
        ax.axvline(0.15 * n_valid, color="0.4", linewidth=0.8, linestyle="--", label="15% of space")
        ax.set_xscale("log")
        ax.set_ylim(0.995, 1.35)  # the interesting part: within a third of the optimum
        ax.set_title(f"{land} ({n_valid} valid)")
        ax.set_xlabel("distinct evaluations")
        ax.set_ylabel("median best / optimum")
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(path)


def _json_safe(x: Any) -> Any:
    """inf ('not reached') becomes null: strict JSON has no Infinity."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def parse_ga(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    fields = {f.name: f.type for f in dataclasses.fields(GAParams)}
    out: dict[str, Any] = {}
    for item in text.split(","):
        k, _, v = item.partition("=")
        if k not in fields and k != "population":
            raise SystemExit(f"--ga: unknown GA setting {k!r} (known: population, {', '.join(fields)})")
        out[k] = float(v) if "." in v else int(v)
    return out


def parse_surrogate(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    fields = {f.name for f in dataclasses.fields(SurrogateParams)}
    out: dict[str, Any] = {}
    for item in text.split(","):
        k, _, v = item.partition("=")
        if k not in fields:
            raise SystemExit(f"--surrogate: unknown setting {k!r} (known: {', '.join(sorted(fields))})")
        try:
            out[k] = float(v) if "." in v else int(v)
        except ValueError:
            out[k] = v  # a named choice (model=forest)
    return out


def landscape_names(text: str) -> list[str]:
    """--landscapes A,B: known names of LANDSCAPES, else exit with the known ones."""
    lands = [x for x in text.split(",") if x]
    for x in lands:
        if x not in LANDSCAPES:
            raise SystemExit(f"--landscapes: unknown {x!r} (known: {', '.join(LANDSCAPES)})")
    return lands


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", default=",".join(LANDSCAPES))
    ap.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--population", type=int, help="for every strategy (default: each space's [search] value)")
    ap.add_argument("--ga", help="GA settings under test: population=N,cxpb=F,mutpb=F,indpb=F,tournsize=N")
    ap.add_argument("--surrogate", help="surrogate settings under test: trees=N,explore=N,draw_trees=N,...")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1 (tuning: other seeds)")
    ap.add_argument("--cap", type=float, default=1.0, help="most evaluations per run, as a fraction of the space")
    ap.add_argument("--pipeline", help="SLOTSxBUILD_S:MEASURE_S: results arrive as from such a host (simulated "
                    "time), SLOTS + 2 candidates in flight; default: one at a time")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", default="/tmp/evo-strategy-bench", help="databases of the runs")
    ap.add_argument("--out", default=str(RESULTS), help="where the table, JSON and PNG go")
    ap.add_argument("--tag", default="", help="suffix of the output names")
    a = ap.parse_args(argv)
    lands = landscape_names(a.landscapes)
    strategies = [x for x in a.strategies.split(",") if x]
    for s in strategies:
        split_strategy(s)
    ga = parse_ga(a.ga)
    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"_{a.tag}" if a.tag else ""
    jobs = []
    size: dict[str, int] = {}
    for land in lands:
        space: SearchSpace = load_space(ROOT / LANDSCAPES[land][0])
        size[land] = space.count_valid()
        pop = ga.get("population") or a.population or int(space.search.get("population", 16))
        for s in strategies:
            jobs.append({"landscape": land, "strategy": s, "work": str(work),
                         "seeds": list(range(a.first_seed, a.first_seed + a.seeds)),
                         "surrogate": parse_surrogate(a.surrogate),
                         "tag": tag, "cap": a.cap, "pipeline": a.pipeline, "population": pop if s == "ga" else (a.population or pop),
                         "ga": {k: v for k, v in ga.items() if k != "population"}})
    t0 = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(max(1, a.jobs)) as pool:
        # the slowest jobs (Optuna's model-based samplers on the largest spaces) first
        order = sorted(jobs, key=lambda j: (not j["strategy"].startswith("optuna-"), -size[j["landscape"]]))
        results = [r for rs in pool.imap_unordered(run_job, order) for r in rs]
    results.sort(key=lambda r: (lands.index(r["landscape"]), strategies.index(r["strategy"]), r["seed"]))
    summary = summarize(results)
    summary = {land: {s: summary[land][s] for s in strategies if s in summary[land]} for land in lands}
    title = f"Median best-so-far over {a.seeds} seeds" + (f" (GA {a.ga})" if a.ga else "")
    table = format_table(summary, a.seeds)
    goals = goal_lines(summary)
    print(table)
    print()
    for line in goals:
        print(line)
    print(f"\n{len(results)} runs in {time.monotonic() - t0:.0f} s; databases in {work}")
    (out / f"strategy_benchmark{tag}.md").write_text(
        f"# Strategy benchmark{' (' + a.tag + ')' if a.tag else ''}\n\n"
        f"Command: `python experiments/strategies/benchmark.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f"\n{table}\n\n" + "\n".join(f"- {g}" for g in goals) + "\n")
    slim = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    (out / f"strategy_benchmark{tag}.json").write_text(json.dumps(
        _json_safe({"settings": vars(a), "summary": summary, "runs": slim}), indent=1, default=str))
    plot(results, out / f"strategy_benchmark{tag}.png", title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
