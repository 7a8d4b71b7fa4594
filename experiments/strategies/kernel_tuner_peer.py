"""Kernel Tuner's search strategies on our recorded landscapes, in its simulation mode: a peer for benchmark.py's table.

Kernel Tuner (the public `kernel_tuner` package, 1.5.0) can replay a search from a cache file instead of a device
(`tune_kernel(..., cache=FILE, simulation_mode=True)`). Per landscape of benchmark.py's LANDSCAPES, this script

- writes a full-space Kernel Tuner cache file (under --work): one entry per valid configuration of our space, keyed
  as Kernel Tuner keys them (the parameter values joined by commas), with `time` (ms, Kernel Tuner's default
  objective) for a measured configuration, and Kernel Tuner's own failure marker for a failed one:
  CompilationFailedConfig for our build failures (compile_error, gate_failed, build_error, link_error),
  RuntimeFailedConfig for the rest (runtime_error, timeout, wrong, sanitizer_error, skipped), as its cache stores them
  (`"__error__": "CompilationFailedConfig"`, no time). A failure costs an evaluation, as in ours;
- passes our valid set as Kernel Tuner's `restrictions` (one python-constraint FunctionConstraint over all parameters,
  as kernel_tuner.tune_cache builds from a cache), so Kernel Tuner's search space is exactly our valid set (checked:
  528 / 2781 / 360 configurations);
- tunes with each strategy, seeds 0..N-1, with `strategy_options={"max_fevals": <size of the space>}` and every other
  strategy option at Kernel Tuner's default, but for bayes_opt's method: multi-fast, what its default
  (multi-ultrafast) does on a device, where an evaluation is slow; in simulation the default refits its model only
  every 6th round, at points set by wall-clock timings (see STRATEGY_OPTIONS). Kernel Tuner's strategies draw from
  Python's `random` and NumPy's global RNG (and the SciPy optimizers from NumPy's), so both are seeded with the run's
  seed before the run (`seed=` is passed to tune_kernel too, which only its pymoo strategies read). Its Latin
  hypercube samples (bayes_opt's initial sample, diff_evo's population) come from scipy.stats.qmc.LatinHypercube
  without a seed, i.e. from OS entropy: the script hands it a Generator seeded with the run's seed. A run is then
  reproducible (checked: the same metrics and curves whatever the process, the order of the runs in it and
  PYTHONHASHSEED);
- counts a run's evaluations as the distinct configurations in the results list tune_kernel returns, in order (its
  list repeats a configuration a strategy asks for again; the repeat is free, as in our runner), and computes
  benchmark.run_metrics on their recorded times (failures as inf).

One extra row, bayes_opt[failures=1e20], is a diagnostic, not Kernel Tuner as shipped: Kernel Tuner 1.5.0 gives a
failed configuration the cost sys.float_info.max, which its bayes_opt does not recognize as a failure (it looks for its
own invalid_value, 1e20), so after the first failure it fits its Gaussian process on 1.8e308, the model's predictions
become NaN and the search walks the space in its list order. The variant hands failures to the strategies as 1e20.

Parameter values: numbers (not bools) are given to Kernel Tuner as they are; bools and strings as their indices
0..k-1 in the space's list (Kernel Tuner's numeric strategies snap numbers to the nearest value, which strings would
break), the way Kernel Tuner users usually encode switches.

Stopping, as benchmark.py: a run stops once it has spent 20% of the space and is within 1% of the optimum (or at
max_fevals = the whole space, or when the strategy returns on its own, e.g. the genetic algorithm after its
`maxiter` generations). The stop is Kernel Tuner's own budget mechanism: after a batch, the run's TuningBudget is
marked spent, so its next request raises StopCriterionReached, the way max_fevals ends a run. Until then the run is
the full-budget run, so evals-to-1/2/5% and best@5/10/20% are those of the full-budget run (--no-stop: every run to
max_fevals).

Kernel Tuner is a benchmark-only dependency: it lives in its own virtual environment, with this project installed
into it (to read the landscapes and reuse benchmark.py's metrics):

    python3 -m venv /tmp/ktvenv && /tmp/ktvenv/bin/pip install torch==2.13.0 && \\
        /tmp/ktvenv/bin/pip install kernel_tuner==1.5.0 numpy && /tmp/ktvenv/bin/pip install -e .

The one command (results: experiments/strategies/results/kernel_tuner_peer.md and .json):

    /tmp/ktvenv/bin/python experiments/strategies/kernel_tuner_peer.py
    /tmp/ktvenv/bin/python experiments/strategies/kernel_tuner_peer.py --landscapes sdpa_fp16_d64 \\
        --strategies bayes_opt --seeds 3 --out /tmp/kt-try     # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# one BLAS thread per process (set before NumPy loads; the pool's processes inherit it): the processes are the
# parallelism, and bayes_opt's Gaussian process is 4x slower with threads competing for the cores
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import (BUDGETS, LANDSCAPES, RESULTS, ROOT, WITHIN, _json_safe, landscape_names,  # noqa: E402
                       metric_cells, metric_head, nearest_rank, run_metrics, summarize)
from evoengineer.evaluators.replay import BUILD_FAILURES, Landscape  # noqa: E402
from evoengineer.space.spec import SearchSpace, load_space  # noqa: E402

# every strategy of Kernel Tuner 1.5.0 that is single-objective, needs no extra package (skopt: scikit-optimize;
# pyatf_strategies: pyATF) and is not the exhaustive brute_force
DEFAULT_STRATEGIES = ["bayes_opt", "bayes_opt[failures=1e20]", "genetic_algorithm", "dual_annealing",
                      "simulated_annealing", "random_sample", "greedy_ils", "mls", "greedy_mls", "ordered_greedy_mls",
                      "pso", "firefly_algorithm", "diff_evo", "basinhopping", "minimize", "hybrid_vndx",
                      "adaptive_tabu_greywolf"]
KERNEL_TUNER_VERSION = "1.5.0"
PROBLEM_SIZE = (1,)  # a cache records its problem size; any, as long as the cache and the call agree


# ---- the landscape as a Kernel Tuner problem ------------------------------------------------------------------------
def kt_values(space: SearchSpace) -> dict[str, list[Any]]:
    """Kernel Tuner's tune_params: numbers as they are, bools and strings as their indices."""
    out = {}
    for p in space.parameters:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.values)
        out[p.name] = list(p.values) if numeric else list(range(len(p.values)))
    return out


def cache_key(config: tuple) -> str:
    return ",".join(str(v) for v in config)  # as Kernel Tuner's runners key a configuration


class Problem:
    """One landscape: our space and records, Kernel Tuner's tune_params, restriction and cache file."""

    def __init__(self, land: str, work: Path):
        space_file, csv_path = (ROOT / p for p in LANDSCAPES[land])
        self.land = land
        self.space = load_space(space_file)
        landscape = Landscape(csv_path, self.space)
        self.n_valid = self.space.count_valid()
        self.tune_params = kt_values(self.space)
        names = self.space.names
        self.outcome: dict[tuple, tuple[str, float]] = {}  # Kernel Tuner config -> (status, time_us or inf)
        for g in self.space.valid_genomes():
            params = self.space.genome_to_params(g)
            m = landscape.rows[landscape.key(params)]  # full grids: every valid configuration has its row
            config = tuple(self.tune_params[n][i] for n, i in zip(names, g))
            self.outcome[config] = (m.status, m.metrics["time_us"] if m.status == "ok" else math.inf)
        assert len(self.outcome) == self.n_valid
        self.optimum = min(t for _, t in self.outcome.values())
        self.cache_file = work / f"{land}.json"
        self._write_cache()

    def _write_cache(self) -> None:
        entries = {}
        for config, (status, t) in self.outcome.items():
            e: dict[str, Any] = dict(zip(self.tune_params, config))
            if status == "ok":
                e.update(time=t / 1000, times=[t / 1000])  # Kernel Tuner's times are in ms
            else:
                e["__error__"] = "CompilationFailedConfig" if status in BUILD_FAILURES else "RuntimeFailedConfig"
            e.update(compile_time=0.0, verification_time=0.0, benchmark_time=0.0)
            entries[cache_key(config)] = e
        doc = {"device_name": f"replay:{self.land}", "kernel_name": self.land, "problem_size": list(PROBLEM_SIZE),
               "tune_params_keys": list(self.tune_params), "tune_params": self.tune_params, "objective": "time",
               "cache": entries}
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_file.with_name(f"{self.cache_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=0))
        tmp.replace(self.cache_file)  # written whole (processes may race to write the same file)

    def restriction(self):
        from constraint import FunctionConstraint

        valid = frozenset(self.outcome)

        def in_our_valid_set(*values) -> bool:  # values in tune_params order, as Kernel Tuner passes them
            return values in valid

        return FunctionConstraint(in_our_valid_set)


# ---- the stop rule: Kernel Tuner's budget, marked spent once the target is met ---------------------------------------
_STOP: dict[str, Any] = {}  # target_ms, min_evals, best_ms, stopped: set per run by run_one


def install_stop_rule() -> None:
    from kernel_tuner.runners.simulation import SimulationRunner

    if getattr(SimulationRunner.run, "_peer_stop", False):
        return
    original = SimulationRunner.run

    def run(self, parameter_space, tuning_options):
        results = original(self, parameter_space, tuning_options)
        if _STOP:
            for r in results:
                if r and "__error__" not in r:
                    _STOP["best_ms"] = min(_STOP["best_ms"], r["time"])
            budget = tuning_options.budget
            if budget.num_fevals >= _STOP["min_evals"] and _STOP["best_ms"] <= _STOP["target_ms"]:
                budget.max_fevals = budget.num_fevals  # spent: the next request raises StopCriterionReached
                _STOP["stopped"] = True
        return results

    run._peer_stop = True
    SimulationRunner.run = run


def seed_latin_hypercube(seed: int) -> None:
    """Kernel Tuner builds scipy.stats.qmc.LatinHypercube without a seed (bayes_opt's initial sample, the LHS
    populations of diff_evo and Searchspace.get_LHS_sample), i.e. from fresh OS entropy: hand it a Generator seeded
    with the run's seed instead, so that a run is reproducible."""
    import numpy as np
    import scipy.stats.qmc as qmc
    import kernel_tuner.strategies.bayes_opt as bayes_opt

    base = getattr(qmc, "_peer_unseeded_lhs", qmc.LatinHypercube)
    qmc._peer_unseeded_lhs = base
    rng = np.random.default_rng(seed)

    def LatinHypercube(d, **kw):  # noqa: N802 (stands for the class)
        if kw.get("rng") is None and kw.get("seed") is None:
            kw["rng"] = rng
        return base(d, **kw)

    qmc.LatinHypercube = LatinHypercube  # Searchspace imports it at each call
    bayes_opt.LatinHypercube = LatinHypercube  # bayes_opt imported it once


# Variants: (Kernel Tuner strategy, how the cost of a failed configuration reaches the strategy). Kernel Tuner 1.5.0
# gives a failure the cost sys.float_info.max (util.get_result_cost); bayes_opt recognizes a failure only by its own
# invalid_value (1e20), so it fits its Gaussian process on 1.8e308 after the first failure. The variant gives
# failures bayes_opt's marker instead: what its model does when it can tell failures apart (a diagnostic, not
# Kernel Tuner as shipped).
VARIANTS = {"bayes_opt[failures=1e20]": ("bayes_opt", 1e20)}

# Options besides max_fevals. bayes_opt's default method, multi-ultrafast, decides from wall-clock timings whether to
# refit its Gaussian process: after every round of its three acquisition functions while an evaluation takes at least 5
# times as long as a prediction (always so on a device: a compile and a benchmark against milliseconds), otherwise only
# every 6th round. In simulation an evaluation takes microseconds, so it would refit every 6th round, at points that
# depend on timing jitter (two full runs differed in 31 of their 180 bayes_opt runs). multi-fast is the same method
# refitting after every round: the default's behaviour on a device, and deterministic.
STRATEGY_OPTIONS = {"bayes_opt": {"method": "multi-fast"}}


def failure_cost(value: float | None) -> None:
    from kernel_tuner import util

    base = getattr(util, "_peer_get_result_cost", util.get_result_cost)
    util._peer_get_result_cost = base
    if value is None:
        util.get_result_cost = base
        return

    def get_result_cost(result, objectives, objective_higher_is_better):
        if "__error__" in result:
            return [value] * len(objectives)
        return base(result, objectives, objective_higher_is_better)

    util.get_result_cost = get_result_cost  # kernel_tuner.strategies.common calls util.get_result_cost


_PROBLEMS: dict[str, Problem] = {}


def problem(land: str, work: Path) -> Problem:
    if land not in _PROBLEMS:
        _PROBLEMS[land] = Problem(land, work)
    return _PROBLEMS[land]


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from kernel_tuner import tune_kernel
    from kernel_tuner.searchspace import Searchspace

    land, strategy, seed = job["landscape"], job["strategy"], job["seed"]
    p = problem(land, Path(job["work"]))
    install_stop_rule()
    _STOP.clear()
    if job["stop"]:
        _STOP.update(target_ms=p.optimum * (1 + min(WITHIN)) / 1000, min_evals=math.ceil(max(BUDGETS) * p.n_valid),
                     best_ms=math.inf, stopped=False)
    restrictions = [p.restriction()]
    if job.get("check_space"):  # Kernel Tuner's space under these restrictions is our valid set
        ss = Searchspace(p.tune_params, restrictions, 1_000_000_000)
        assert ss.size == p.n_valid and set(ss.list) == set(p.outcome), (land, ss.size, p.n_valid)
    kt_strategy, fail_value = VARIANTS.get(strategy, (strategy, None))
    failure_cost(fail_value)
    random.seed(seed)
    np.random.seed(seed)
    seed_latin_hypercube(seed)
    t0 = time.monotonic()
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            results, _env = tune_kernel(p.land, "", PROBLEM_SIZE, [], p.tune_params, restrictions=restrictions,
                                        strategy=kt_strategy,
                                        strategy_options={"max_fevals": p.n_valid,
                                                          **STRATEGY_OPTIONS.get(kt_strategy, {})},
                                        cache=str(p.cache_file), simulation_mode=True, objective="time",
                                        quiet=True, verbose=False, seed=seed)
        except Exception as exc:  # a strategy that breaks: recorded, the table says so
            results, error = [], f"{type(exc).__name__}: {exc}"
    wall = time.monotonic() - t0
    names = list(p.tune_params)
    seen: set[tuple] = set()
    times = []
    for r in results:
        config = tuple(r[n] for n in names)
        if config in seen:
            continue
        seen.add(config)
        status, t = p.outcome[config]  # KeyError: a configuration outside our valid set was evaluated
        assert ("__error__" in r) == (status != "ok") and (status != "ok" or abs(r["time"] * 1000 - t) <= 1e-9 * t)
        times.append(t)
    if error:
        stop = "error"
    elif _STOP.get("stopped"):
        stop = "target reached"
    elif len(times) >= p.n_valid:
        stop = "max_fevals"
    else:
        stop = "strategy returned"
    return {"landscape": land, "strategy": strategy, "seed": seed, "stop": stop, "error": error,
            "evaluations": len(times), "requests": len(results), "wall_s": wall,
            **run_metrics(times, p.optimum, p.n_valid)}


# ---- output ---------------------------------------------------------------------------------------------------------
def format_table(summary: dict[str, Any], n_seeds: int, runs: list[dict[str, Any]]) -> str:
    lines = []
    for land, by in summary.items():
        n_valid = next(iter(by.values()))["n_valid"]
        lines.append(f"\n### {land}: {n_valid} valid configurations, {n_seeds} seeds (Kernel Tuner "
                     f"{KERNEL_TUNER_VERSION}, simulation mode)\n")
        head = ["strategy", *metric_head(n_valid), "evals med", "runs that stopped early"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for strat, d in by.items():
            mine = [r for r in runs if r["landscape"] == land and r["strategy"] == strat]
            cells = [strat, *metric_cells(d, n_valid)]
            cells.append(str(int(nearest_rank([r["evaluations"] for r in mine], 0.5))))
            early = [r for r in mine if r["stop"] in ("strategy returned", "error")]
            cells.append(f"{len(early)}" + (f" (median {int(nearest_rank([r['evaluations'] for r in early], 0.5))} "
                                            "evals)" if early else ""))
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nbest@B: best time found within the first B evaluations, as a ratio to the landscape's optimum "
                 "('-': fewer evaluations, or none correct). evals med: distinct configurations evaluated per run "
                 "(a run stops once within 1% after 20% of the space). Runs that stopped early: the strategy returned "
                 "(or failed) before max_fevals and before that stop, with its own iteration limit or convergence "
                 "test at Kernel Tuner's defaults (it may have reached 1% before it returned).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", default=",".join(LANDSCAPES))
    ap.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1 (e.g. the tuning seeds)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-stop", action="store_true", help="every run to max_fevals (no stop once within 1%%)")
    ap.add_argument("--work", default="/tmp/kernel-tuner-peer", help="where the cache files go")
    ap.add_argument("--out", default=str(RESULTS), help="where the table and JSON go")
    ap.add_argument("--tag", default="", help="suffix of the output names")
    a = ap.parse_args(argv)
    import kernel_tuner

    version = getattr(kernel_tuner, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("kernel_tuner")
    if version != KERNEL_TUNER_VERSION:
        print(f"warning: Kernel Tuner {version}, the results were recorded with {KERNEL_TUNER_VERSION}",
              file=sys.stderr)
    lands = landscape_names(a.landscapes)
    from kernel_tuner.interface import strategy_map

    strategies = [x for x in a.strategies.split(",") if x]
    for s in strategies:
        if s not in strategy_map and s not in VARIANTS:
            raise SystemExit(f"--strategies: unknown {s!r} (Kernel Tuner's: {', '.join(strategy_map)})")
    work, out = Path(a.work), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    size = {}
    for land in lands:  # cache files written once, here; the space checked against ours
        p = problem(land, work)
        run_one({"landscape": land, "strategy": "random_sample", "seed": 0, "work": str(work), "stop": True,
                 "check_space": True})
        size[land] = p.n_valid
        print(f"{land}: {p.n_valid} valid configurations = Kernel Tuner's space; cache {p.cache_file}", flush=True)
    jobs = [{"landscape": land, "strategy": s, "seed": seed, "work": str(work), "stop": not a.no_stop}
            for land in lands for s in strategies for seed in range(a.first_seed, a.first_seed + a.seeds)]
    # the slowest first, so that the pool ends together
    slow = ("hybrid_vndx", "bayes_opt")  # its k-NN surrogate over up to 5000 requests: up to 100 s a run
    jobs.sort(key=lambda j: (not j["strategy"].startswith(slow), j["strategy"] != "hybrid_vndx", -size[j["landscape"]]))
    t0 = time.monotonic()
    results = []
    with multiprocessing.get_context("spawn").Pool(max(1, a.jobs)) as pool:
        for i, r in enumerate(pool.imap_unordered(run_one, jobs), 1):
            results.append(r)
            if r["error"]:
                print(f"  {r['landscape']} {r['strategy']} seed {r['seed']}: {r['error']}", flush=True)
            if i % 100 == 0 or i == len(jobs):
                print(f"  {i}/{len(jobs)} runs, {time.monotonic() - t0:.0f} s", flush=True)
    wall = time.monotonic() - t0
    results.sort(key=lambda r: (lands.index(r["landscape"]), strategies.index(r["strategy"]), r["seed"]))
    summary = summarize(results)
    summary = {land: {s: summary[land][s] for s in strategies if s in summary[land]} for land in lands}
    table = format_table(summary, a.seeds, results)
    cost = {}
    for r in results:
        cost.setdefault(r["strategy"], 0.0)
        cost[r["strategy"]] += r["wall_s"]
    cost_line = "CPU seconds per strategy (all runs): " + ", ".join(f"{s} {cost[s]:.0f}" for s in strategies)
    errors = sorted({f"{r['strategy']} on {r['landscape']}: {r['error']}" for r in results if r["error"]})
    print(table)
    print(f"\n{cost_line}")
    for e in errors:
        print(f"error: {e}")
    print(f"\n{len(results)} runs in {wall:.0f} s with {a.jobs} processes")
    tag = f"_{a.tag}" if a.tag else ""
    cmd = " ".join(["/tmp/ktvenv/bin/python experiments/strategies/kernel_tuner_peer.py",
                    *(argv if argv is not None else sys.argv[1:])])
    (out / f"kernel_tuner_peer{tag}.md").write_text(
        f"# Kernel Tuner {KERNEL_TUNER_VERSION} strategies on our landscapes (simulation mode)\n\n"
        f"Command: `{cmd}` ({len(results)} runs in {wall:.0f} s, {a.jobs} processes). Same metrics as "
        f"strategy_benchmark.md (nearest-rank median = 15th of 30, p90 = 27th; '>N': not reached within the N "
        f"evaluations of the longest run). How the landscapes become Kernel Tuner caches and how runs are seeded, "
        f"counted and stopped: the docstring of kernel_tuner_peer.py.\n{table}\n\n{cost_line}\n"
        + "".join(f"\n- error: {e}" for e in errors) + ("\n" if errors else ""))
    (out / f"kernel_tuner_peer{tag}.json").write_text(json.dumps(
        _json_safe({"settings": {**vars(a), "kernel_tuner": version}, "summary": summary,
                    "runs": [{k: v for k, v in r.items() if k != "curve"} for r in results]}),
        indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
