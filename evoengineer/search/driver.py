"""Start or resume a search run: wire space, evaluator, store, runner and strategy together."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from evoengineer.store import DEFAULT_URL, RunInfo, Store, StoreError
from evoengineer import elite_json
from evoengineer.candidate import CandidateFactory, template_sha256
from evoengineer.errors import UsageError, UserError
from evoengineer.evaluators.base import Evaluator
from evoengineer.evaluators.cluster import ClusterEvaluator, ClusterLost, ClusterOptions
from evoengineer.evaluators.factory import evaluator_for_resume, evaluator_for_search
from evoengineer.evaluators.worker_process import prestart_worker
from evoengineer.fingerprint import machine_fingerprint
from evoengineer.search import SAMPLERS, STRATEGIES
from evoengineer.search.failures import NO_CORRECT_CANDIDATE, no_correct_candidate
from evoengineer.search.optuna_search import make_sampler
from evoengineer.search.progress import ProgressPrinter
from evoengineer.search import options as strategy_options
from evoengineer.search.runner import DEFAULTS, LeaseLost, Runner, SearchSettings
from evoengineer.search.warm_start import default_limit, find_seeds
from evoengineer.space.spec import SearchSpace, load_space



def open_store(url: str, *, create: bool) -> Store:
    try:
        return Store(url, create=create)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def settings_from(space: SearchSpace, strategy: str, sampler: str | None = None, **given: Any) -> SearchSettings:
    """CLI values win over the space's [search] table, which wins over the defaults."""
    values: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        v = given.get(key)
        values[key] = v if v is not None else space.search.get(key, default)
    if values["population"] < 2:
        raise UsageError("--population must be at least 2")
    if values["elite"] < 1 or values["elite"] >= values["population"]:
        raise UsageError("--elite must be at least 1 and smaller than --population")
    if values["generations"] < 0:
        raise UsageError("--generations must be >= 0")
    if values["budget"] is not None and values["budget"] < 1:
        raise UsageError("--budget must be at least 1")
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy {strategy!r}: unknown (known: {', '.join(STRATEGIES)})")
    if strategy == "ga":
        n_valid = space.count_valid()
        if values["population"] > n_valid:
            raise UsageError(f"--population {values['population']}: the space has only {n_valid} valid "
                            "configurations (a GA population holds distinct ones)")
    _fit_budget(values, given, space)
    if sampler is not None and strategy != "optuna":
        raise UsageError(f"--sampler {sampler}: only with --strategy optuna")
    if strategy == "optuna":
        sampler = sampler or "tpe"
        if sampler not in SAMPLERS:
            raise UsageError(f"--sampler {sampler!r}: unknown (known: {', '.join(SAMPLERS)})")
    return SearchSettings(strategy=strategy, sampler=sampler, options=_options(strategy, given.get("options")), **values)


def _options(strategy: str, given: Any) -> dict[str, Any]:
    """The strategy's options: KEY=VALUE strings (--option) or a table (stored with a run), checked."""
    params_cls = STRATEGIES[strategy].params_cls
    if not given:
        return {}
    if isinstance(given, (list, tuple)):
        return strategy_options.parse(strategy, params_cls, given)
    return strategy_options.check(strategy, params_cls, given)


def _fit_budget(values: dict[str, Any], given: dict[str, Any], space: SearchSpace) -> None:
    """Every strategy alike: a population given with --population may not exceed the budget; a default one (ours or
    the space's [search] table) shrinks to fit a small budget (to 2 at the least: a budget of 1 evaluates one
    candidate of that population), and the elite with it, said in one line."""
    budget = values["budget"]
    if budget is None or values["population"] <= budget:
        return
    # name the budget as the user gave it: a flag, or the space's [search] table
    where = f"--budget {budget}" if given.get("budget") is not None else \
        f"the space's budget {budget} (its [search] table; --budget sets it)"
    if given.get("population") is not None:
        raise UsageError(f"--population {values['population']} is larger than {where}: the run would end before "
                        "its first population is evaluated (python -m evoengineer search --help)")
    fit = max(2, budget)
    if fit >= values["population"]:
        return
    was, elite_was = values["population"], values["elite"]
    values["population"] = fit
    if given.get("elite") is None:
        values["elite"] = min(values["elite"], fit - 1)
    elif values["elite"] >= fit:
        raise UsageError(f"--elite {values['elite']}: must be smaller than the population, which {where} "
                        f"makes {fit}")
    how = f"to fit {where}" if fit == budget else f"(the smallest a population can be) for {where}"
    print(f"note: population {was} (the default) shrunk to {fit} {how}"
          + (f", elite {elite_was} to {values['elite']}" if values["elite"] != elite_was else ""),
          file=sys.stderr)


def cluster_population(strategy: str, population: int, elite: int, gpu_workers: int) -> int:
    """The default population on a cluster of `gpu_workers`: at least `population` and 1.5 x the workers, with the
    candidates of a generation (a GA's children: population - elite) a multiple of the workers, so no generation ends
    with a partly idle round. 12 on one worker, as without a cluster."""
    carried = elite if strategy == "ga" else 0
    w = max(1, gpu_workers)
    want = max(population, math.ceil(1.5 * w)) - carried
    return carried + w * math.ceil(want / w)


def resume_command(url: str, run_id: int) -> str:
    return f"python -m evoengineer resume --db {shlex.quote(url)} --run {run_id}"


def start_search(*, space_path: str | Path, db: str = DEFAULT_URL, out: str = "elite.json",
                 landscape: str | None = None, strategy: str = "ga", force: bool = False, quiet: bool = False,
                 build_jobs: int | None = None, cache_dir: str | None = None,
                 cluster: ClusterOptions | None = None, **settings: Any) -> int:
    """Validate everything, create the run, search. Returns the process exit code. With `cluster`, candidates are
    measured on a Dask cluster's GPU workers (evaluators/cluster/). A space with signature variants (a list in
    [signature]) runs one search per variant (search/variants.py)."""
    space_path = Path(space_path).resolve()  # resume may run from another directory
    space = load_space(space_path)
    if space.variant_axes:
        from evoengineer.search.variants import start_variants

        return start_variants(space, space_path=space_path, db=db, out=out, landscape=landscape, strategy=strategy,
                              force=force, quiet=quiet, build_jobs=build_jobs, cache_dir=cache_dir, cluster=cluster,
                              **settings)
    return start_space(space, space_path=space_path, db=db, out=out, landscape=landscape, strategy=strategy,
                       force=force, quiet=quiet, build_jobs=build_jobs, cache_dir=cache_dir, cluster=cluster,
                       **settings)


def start_space(space: SearchSpace, *, space_path: Path, db: str = DEFAULT_URL, out: str = "elite.json",
                landscape: str | None = None, strategy: str = "ga", force: bool = False, quiet: bool = False,
                build_jobs: int | None = None, cache_dir: str | None = None, cluster: ClusterOptions | None = None,
                variant: dict[str, Any] | None = None, warm_start: bool = True, **settings: Any) -> int:
    """start_search of a loaded space (one variant's, with `variant` recorded in the run's options). `warm_start`:
    the first proposals are the best configurations earlier runs of the store found for this family and template
    (search/warm_start.py)."""
    s = settings_from(space, strategy, **settings)
    if s.strategy == "optuna":
        make_sampler(s.sampler, seed=s.seed, population=s.population)  # a missing optional package fails here
    CandidateFactory(space).from_genome(space.valid_genomes()[0])  # template errors surface before anything is written
    elite_json.check_writable(out, space.name, force=force)
    if s.strategy == "ga" and s.generations > 0 and s.elite > s.population // 2 and not quiet:
        children = s.population - s.elite
        print(f"warning: --elite {s.elite} of --population {s.population}: the carried elites leave "
              f"{children} {'child' if children == 1 else 'children'} per generation (selection barely moves); fine "
              "for a one-generation screen, not for a search", file=sys.stderr)
    if landscape is not None:
        landscape = str(Path(landscape).resolve())
    if cluster is not None and cluster.address == "local" and build_jobs is not None:
        cluster = dataclasses.replace(cluster, build_jobs=build_jobs)  # a local cluster's build slots
    if landscape is None and cluster is None and space.target.builds_beside_measuring:
        # the measuring worker's process starts before this one imports torch for the evaluator: the first
        # candidate waits for the worker's start (issue 51), which now runs beside the evaluator's set-up
        prestart_worker(cpu_kernels=not space.target.gpu)
    evaluator = evaluator_for_search(space, landscape=landscape, seed=s.seed, build_jobs=build_jobs,
                                     cache_dir=cache_dir, cluster=cluster)
    try:
        # the measuring worker, the family binding and the baselines start now, beside the fingerprint (a device
        # query, nvidia-smi) and the store's set-up, not after them
        evaluator.start()
        if isinstance(evaluator, ClusterEvaluator) and settings.get("population") is None \
                and "population" not in space.search:
            _size_for_cluster(s, space, evaluator.slots, quiet)
        fingerprint = {**machine_fingerprint(), **evaluator.fingerprint(), "template_sha256": template_sha256(space)}
        store = open_store(db, create=True)
        if warm_start and STRATEGIES[s.strategy].accepts_seeds:
            s.warm_start = find_seeds(store, space, gpu=fingerprint.get("gpu"), limit=default_limit(s.population))
        config = {**s.to_dict(), "evaluator": evaluator.describe(), "out": str(Path(out).resolve())}
        if variant is not None:
            config["variant"] = variant
        if cluster is not None:
            config["cluster"] = cluster.to_dict()
        run_id = store.create_run(space_name=space.name, space_path=str(space_path), space_text=space.text,
                                  template=space.template, template_sha256=template_sha256(space), config=config,
                                  seed=s.seed, fingerprint=fingerprint)
        run = store.get_run(run_id)
        token = _lease(store, run.id)
    except BaseException:
        evaluator.close()  # a local cluster's worker processes go with it
        raise
    if not quiet:
        what = s.strategy + (f" ({s.sampler} sampler)" if s.sampler else "")
        where = f" on {evaluator.where} ({evaluator.slots} GPU workers)" if isinstance(evaluator, ClusterEvaluator) \
            else ""
        print(f"run {run_id}: space {space.name} ({space.count_valid()} valid configurations), "
              f"strategy {what}, evaluator {evaluator.kind}{where}, store {db}", file=sys.stderr)
        if s.warm_start.get("seeds"):
            runs = ", ".join(str(r) for r in s.warm_start["runs"])
            print(f"warm start: the first {len(s.warm_start['seeds'])} proposals are the best configurations of "
                  f"run{'s' if len(s.warm_start['runs']) > 1 else ''} {runs} (same family and template; "
                  "--no-warm-start turns this off)", file=sys.stderr)
    return _execute(store, run, space, evaluator, s, Path(out), quiet=quiet, token=token)


def _size_for_cluster(s: SearchSettings, space: SearchSpace, gpu_workers: int, quiet: bool) -> None:
    """Grow the default population to the cluster (cluster_population), within the space and the budget."""
    p = min(cluster_population(s.strategy, s.population, s.elite, gpu_workers), s.budget or 2**62)
    if s.strategy == "ga":
        p = min(p, space.count_valid())
    if p > s.population:
        if not quiet:
            print(f"population {p} for {gpu_workers} GPU worker(s) (the default {s.population} would leave workers "
                  "idle; --population sets it)", file=sys.stderr)
        s.population = p


def resume_search(*, db: str = DEFAULT_URL, run_id: int | None = None, quiet: bool = False,
                  from_scratch: bool = False, cluster: ClusterOptions | None = None) -> int:
    """Continue an unfinished run from its newest checkpoint; nothing measured is measured again. `cluster`
    measures on that cluster instead of the one the run used (the evaluator itself stays the run's)."""
    store = open_store(db, create=False)
    if run_id is None:
        run = store.latest_unfinished_run()
        if run is None:
            from evoengineer.search.variants import unfinished_group

            group = unfinished_group(store)  # killed between two variants: the next ones start
            if group is not None:
                from evoengineer.search.variants import continue_variants

                return continue_variants(store, group, db=db, quiet=quiet, cluster=cluster)
            raise UserError(f"--db {db}: no unfinished run to resume")
    else:
        try:
            run = store.get_run(run_id)
        except StoreError as exc:
            raise UserError(f"--run {run_id}: {exc}") from None
        if run.status == "finished":
            raise UserError(f"--run {run_id}: run already finished ({run.stop_reason})")
    token = _lease(store, run.id)  # one process drives a run: a second resume stops here
    try:
        return _resume(store, run, token, quiet, from_scratch, cluster)
    except BaseException:
        store.release_lease(run.id, token)
        raise


def _lease(store: Store, run_id: int) -> str:
    try:
        return store.acquire_lease(run_id)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def _resume(store: Store, run: RunInfo, token: str, quiet: bool, from_scratch: bool,
            cluster: ClusterOptions | None) -> int:
    space = SearchSpace.from_text(run.space_text, run.space_path)
    if template_sha256(space) != run.template_sha256:
        raise UserError(f"{space.template_path}: template changed since run {run.id} started; "
                        "resuming would mix kernels (start a new search)")
    cfg = run.config
    s = SearchSettings(**{k: cfg[k] for k in ("strategy", "population", "generations", "elite", "budget", "seed")},
                       sampler=cfg.get("sampler"), warm_start=dict(cfg.get("warm_start") or {}))
    if s.strategy not in STRATEGIES:
        raise UserError(f"--run {run.id}: strategy {s.strategy!r} is not available in this installation")
    try:  # the options it was started with (a run of an older version has none: the defaults)
        s.options = _options(s.strategy, cfg.get("options") or {})
    except UsageError as exc:
        raise UserError(f"--run {run.id}: its stored strategy options: {exc}") from None
    if s.strategy == "optuna":
        make_sampler(s.sampler or "tpe", seed=s.seed, population=s.population)
    out = Path(cfg["out"])
    elite_json.check_writable(out, space.name)
    if cluster is None and cfg.get("cluster"):
        cluster = ClusterOptions.from_dict(cfg["cluster"])
    evaluator = evaluator_for_resume(space, cfg["evaluator"], cluster)
    try:
        code = _resume_with(store, run, token, quiet, from_scratch, space, s, out, evaluator)
    except BaseException:
        evaluator.close()
        raise
    if cfg.get("variant") and code in (0, NO_CORRECT_CANDIDATE):  # the variants after this one
        from evoengineer.search.variants import continue_variants

        return max(code, continue_variants(store, cfg["variant"], db=store.url, quiet=quiet, cluster=cluster))
    return code


def _resume_with(store: Store, run: RunInfo, token: str, quiet: bool, from_scratch: bool, space: SearchSpace,
                 s: SearchSettings, out: Path, evaluator: Evaluator) -> int:
    if from_scratch:
        store.clear_proposals(run.id)  # the search proposes anew (what was measured is answered at once)
    proposals = len(store.proposals(run.id))
    store.set_run_status(run.id, "running")
    if not quiet:
        where = f"its {proposals} proposals replayed" if proposals else "the start"
        print(f"resuming run {run.id} ({space.name}) from {where}; "
              f"{store.count_candidates(run.id)} evaluations already stored", file=sys.stderr)
    return _execute(store, run, space, evaluator, s, out, quiet=quiet, token=token)


@contextlib.contextmanager
def _stop_on_sigint(runner: Runner) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual and also flags the runner, so the search stops after the next
    stored evaluation even when Python swallows the exception (a signal landing in a __del__ or weakref callback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        runner.stop_requested = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _heartbeat(store: Store, runner: Runner, token: str, claim: elite_json.OutClaim) -> Iterator[None]:
    """Renew the run's lease in the background while the search runs; flag the runner if it was taken over."""
    from evoengineer.store.store import LEASE_STALE_S

    done = threading.Event()

    def beat() -> None:
        while not done.wait(min(10.0, LEASE_STALE_S / 4)):
            claim.touch()
            try:
                if not store.heartbeat(runner.run.id, token):
                    runner.lease_lost = True
                    return
            except Exception:  # a busy or full store: try again at the next beat
                continue

    t = threading.Thread(target=beat, name="evoengineer-lease", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=5)


def _execute(store: Store, run: RunInfo, space: SearchSpace, evaluator: Evaluator, s: SearchSettings, out: Path, *,
             quiet: bool, token: str) -> int:
    """Drive the run while holding its lease (renewed in the background, released at the end) and the claim on
    its elite.json. A store or disk that fails mid-run ends it with one line (exit 1), resumable."""
    claim = elite_json.OutClaim(out, run.id, store.url)
    try:
        claim.acquire()
        return _drive(store, run, space, evaluator, s, out, quiet=quiet, token=token, claim=claim)
    except (SQLAlchemyError, StoreError, OSError) as exc:
        with contextlib.suppress(Exception):
            store.set_run_status(run.id, "interrupted", f"{type(exc).__name__}: {_first_line(exc)}")
        what = "the store" if isinstance(exc, (SQLAlchemyError, StoreError)) else "a file"
        print(f"error: run {run.id} stopped: {what} failed: {_first_line(exc)}; what was measured is stored; "
              f"once fixed, resume with: {resume_command(store.url, run.id)}", file=sys.stderr)
        return 1
    finally:
        claim.release()
        with contextlib.suppress(Exception):  # a store that fails here fails loudly elsewhere; the lease goes stale
            store.release_lease(run.id, token)


def _first_line(exc: BaseException) -> str:
    """An exception as one short line (SQLAlchemy's own text without its SQL and links)."""
    inner = getattr(exc, "orig", None) or exc
    text = str(inner) if not isinstance(inner, OSError) or not inner.strerror else \
        f"{inner.strerror}" + (f": {inner.filename}" if inner.filename else "")
    return " ".join(text.split())[:300] or type(exc).__name__


def _drive(store: Store, run: RunInfo, space: SearchSpace, evaluator: Evaluator, s: SearchSettings, out: Path, *,
           quiet: bool, token: str, claim: elite_json.OutClaim) -> int:
    printer = None if quiet else ProgressPrinter()
    runner = Runner(space=space, evaluator=evaluator, store=store, run=run, settings=s, out=out,
                    observers=[printer] if printer else [])
    if printer is not None:
        printer.start(runner)
    strategy = STRATEGIES[s.strategy](runner)
    try:
        with evaluator, _stop_on_sigint(runner), _heartbeat(store, runner, token, claim):
            evaluator.start()
            reason = strategy.run()
    except LeaseLost as exc:  # the run is someone else's now: write nothing more
        print(str(exc), file=sys.stderr)
        return 1
    except ClusterLost as exc:  # the scheduler is gone: what finished is stored, the rest is asked again on resume
        store.set_run_status(run.id, "interrupted", str(exc))
        print(f"error: run {run.id} stopped: {exc}; {runner.evaluations} evaluations are stored; once the "
              f"scheduler is back, resume with: {resume_command(store.url, run.id)} (--cluster ADDRESS for "
              "another)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        store.set_run_status(run.id, "interrupted", "interrupted by user")
        print(f"\ninterrupted: {runner.evaluations} evaluations are stored. Resume with:\n  "
              f"{resume_command(store.url, run.id)}", file=sys.stderr)
        return 130
    except BaseException as exc:
        store.set_run_status(run.id, "interrupted", f"{type(exc).__name__}: {exc}")
        raise
    store.set_run_status(run.id, "finished", reason)
    if not runner.elite_hashes:  # nothing correct: say why (per failure status, one reason each), not exit 0
        for line in no_correct_candidate(run.id, runner.records.values()):
            print(line, file=sys.stderr)
        return NO_CORRECT_CANDIDATE
    if not quiet:
        print(f"run {run.id} finished ({reason}): {runner.evaluations} evaluation"
              f"{'' if runner.evaluations == 1 else 's'}; elites in {out}",
              file=sys.stderr)
        builds = [r.metrics["build_s"] for r in runner.records.values()
                  if isinstance(r.metrics.get("build_s"), (int, float)) and not r.metrics.get("build_cached")]
        if builds:
            print(f"builds: {len(builds)} compiled, {sum(builds):.1f} s in all, {sum(builds) / len(builds):.2f} s "
                  f"per candidate (max {max(builds):.2f} s); "
                  f"{sum(1 for r in runner.records.values() if r.metrics.get('build_cached'))} from the cache",
                  file=sys.stderr)
        doc = elite_json.read(out)
        print(elite_json.format_table(doc["elites"]))
        if elite_json.format_search_best(doc.get("search_best")):  # the search's best, when it is not rank 1: why
            print(elite_json.format_search_best(doc.get("search_best")))
        if doc.get("shape_elites"):
            print(elite_json.format_shape_table(doc["shape_elites"]))
    return 0
