"""The command line (`python -m evoengineer --help` lists its commands)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from evoengineer.store import DEFAULT_URL
from evoengineer.errors import UsageError, UserError

GPU_DEFAULT_SPACE = "cuda_msda_fp16"
CPU_DEFAULT_SPACE = "cpu_msda"


def default_space() -> Path:
    """The CUDA MSDA space when a GPU is present (and shipped), else the CPU MSDA space."""
    from evoengineer.paths import space_dirs, space_file

    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    for name in ([GPU_DEFAULT_SPACE] if gpu else []) + [CPU_DEFAULT_SPACE]:
        p = space_file(f"{name}.toml")
        if p.exists():
            return p
    raise UserError(f"no default space found in {', '.join(str(d) for d in space_dirs())}; pass --space FILE")


def install_command(folder: "str | Path") -> str:
    """`pip install` of an exported folder, spelled as a path: pip reads a bare `op` as a project on the index."""
    text = str(folder)
    where = text if Path(text).is_absolute() or text.startswith(("./", "../")) else f"./{text}"
    return f"pip install {shlex.quote(where)}"


def run_state(status: str, reason: str | None) -> str:
    """A run's status and why it stopped, without saying the same word twice ("interrupted by user")."""
    reason = (reason or "").strip()
    return reason if reason.startswith(status) else f"{status} {reason}".strip()


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {v}")
    return v


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the error and where to read more), not the whole usage text."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m evoengineer", epilog="python -m evoengineer COMMAND --help: the command's options; "
                                                         "README.md: a guide; docs/: the reference")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("search", help="start a new search run")
    s.add_argument("--space", help="space file or shipped space name (default: GPU space if a GPU is present, "
                                   "else the CPU space)")
    s.add_argument("--landscape", help="replay measurements from a recorded landscape CSV instead of running")
    s.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL of the store (default {DEFAULT_URL})")
    s.add_argument("--out", default="elite.json", help="elite.json path (default elite.json)")
    s.add_argument("--strategy", default="ga", help="ga (default), surrogate, random, grid or optuna")
    s.add_argument("--sampler", help="with --strategy optuna: tpe (default), cmaes, gp, nsga2, random or qmc")
    s.add_argument("--no-warm-start", action="store_true",
                   help="start cold: do not seed the first proposals with the best configurations that earlier runs "
                        "in the store found for the same family and template")
    s.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy option (repeatable), e.g. --option cxpb=0.8 for the GA; stored with the run "
                        "(the options and defaults: python -m evoengineer options)")
    s.add_argument("--seed", type=_positive_int)
    s.add_argument("--population", type=_positive_int)
    s.add_argument("--generations", type=_positive_int, help="generations after the initial one")
    s.add_argument("--elite", type=_positive_int, help="elites carried into each generation (default 3)")
    s.add_argument("--budget", type=_positive_int, help="most distinct evaluations")
    s.add_argument("--build-jobs", type=_positive_int, help="parallel builds (default: CPU cores)")
    s.add_argument("--cache-dir", help="build cache (default $EVOENGINEER_CACHE or ~/.cache/evoengineer)")
    _cluster_args(s)
    s.add_argument("--force", action="store_true", help="overwrite --out even if it holds another space's elites")
    s.add_argument("--quiet", action="store_true")

    r = sub.add_parser("resume", help="continue the newest unfinished run (or --run ID)")
    r.add_argument("--db", default=DEFAULT_URL)
    r.add_argument("--run", type=_positive_int)
    r.add_argument("--from-scratch", action="store_true",
                   help="ignore the run's proposal log (e.g. after a strategy changed): propose anew; "
                        "stored measurements are reused, not repeated")
    _cluster_args(r, resume=True)
    r.add_argument("--quiet", action="store_true")

    w = sub.add_parser("worker", help="serve this host's GPUs (and build slots) to a Dask scheduler")
    w.add_argument("--scheduler", required=True, help="tcp://127.0.0.1:PORT, or tls://HOST:PORT with the --tls-* "
                                                      "options")
    w.add_argument("--gpus", help="comma-separated CUDA_VISIBLE_DEVICES values, one GPU worker each (default: "
                                  "every visible GPU)")
    w.add_argument("--simulate", type=_positive_int, metavar="N",
                   help="N GPU workers without a device instead (replays, CPU spaces, tests)")
    w.add_argument("--build-jobs", type=_positive_int, help="build slots (default: the cores left over by the GPU "
                                                            "workers; 0: none)")
    w.add_argument("--cache-dir", help="build cache of these workers (default $EVOENGINEER_CACHE or "
                                       "~/.cache/evoengineer)")
    w.add_argument("--name", help="worker name prefix (default: the host name)")
    _tls_args(w)

    i = sub.add_parser("inspect", help="show an elite.json")
    i.add_argument("file")
    i.add_argument("--json", action="store_true", help="print the elite list as JSON")
    i.add_argument("--source", type=_positive_int, metavar="RANK", help="print the rendered source of an elite")

    e = sub.add_parser("elites", help="show a run's elites from the store")
    e.add_argument("--db", default=DEFAULT_URL)
    e.add_argument("--run", type=_positive_int, help="run id (default: newest run)")
    e.add_argument("--json", action="store_true")

    c = sub.add_parser("check", help="render, compile and gate a few genomes of a space (no GPU needed, no search)")
    c.add_argument("--space", required=True, help="space file or shipped space name")
    c.add_argument("--genomes", type=_positive_int, default=3, help="how many genomes, drawn at random (default 3)")
    c.add_argument("--seed", type=_positive_int, default=0, help="which genomes (default 0)")
    c.add_argument("--cache-dir", help="build cache (default $EVOENGINEER_CACHE or ~/.cache/evoengineer)")

    sub.add_parser("spaces", help="list the shipped spaces with their number of valid configurations")
    sub.add_parser("families", help="list the shipped and installed kernel families with their templates")
    sub.add_parser("options", help="list each search strategy's options (--option KEY=VALUE) with type and default")

    ls = sub.add_parser("landscape", help="export a run's measurements as a landscape CSV (replay format)")
    ls.add_argument("--db", default=DEFAULT_URL)
    ls.add_argument("--run", type=_positive_int, help="run id (default: newest run)")
    ls.add_argument("--out", required=True, help="CSV file to write")

    rp = sub.add_parser("report", help="best-so-far PNG, elite tables, failures by status and an HTML page")
    rp.add_argument("--db", default=DEFAULT_URL)
    rp.add_argument("--run", type=_positive_int, nargs="+", action="extend", metavar="ID",
                    help="runs to report (default: every run in the store)")
    rp.add_argument("--out", default="report", help="output folder (default report/)")

    x = sub.add_parser("export", help="write an elite as a pip-installable PyTorch op package")
    x.add_argument("file", help="elite.json")
    x.add_argument("--rank", type=_positive_int, default=1, help="which elite (default 1, the fastest)")
    x.add_argument("--out", required=True, help="package folder to write")
    x.add_argument("--force", action="store_true", help="replace --out if it exists")
    x.add_argument("--per-shape", action="store_true",
                   help="package the fastest kernel of each timed shape (elite.json's shape_elites); each call "
                        "runs the one whose shape is nearest to its inputs")
    x.add_argument("--family", default=None, metavar="REF",
                   help="where the elite's kernel family is, when it is not shipped or installed: module:Class, or "
                        "family.py:Class relative to the working folder or else to elite.json's folder (it must be "
                        "the family and version elite.json records)")
    x.add_argument("--accept-family-change", action="store_true",
                   help="export through a family whose source file differs from the one the search recorded "
                        "(same name and version)")
    # the description names every command there is (it is made from them, so it cannot fall behind)
    ap.description = f"EvoEngineer: evolutionary search for fast kernels. Commands: {', '.join(sub.choices)}."
    return ap


def _tls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca-file", help="CA certificate (PEM) for a tls:// scheduler")
    p.add_argument("--tls-cert", help="this side's certificate (PEM) for a tls:// scheduler")
    p.add_argument("--tls-key", help="this side's private key (PEM) for a tls:// scheduler")


def _cluster_args(p: argparse.ArgumentParser, resume: bool = False) -> None:
    p.add_argument("--cluster", help=("measure on this Dask cluster instead of the run's: " if resume else
                                      "measure on a Dask cluster: ") +
                   "'local' (a worker per GPU of this host, build slots on the other cores), tcp://127.0.0.1:PORT or "
                   "tls://HOST:PORT (an existing scheduler; start workers with `python -m evoengineer worker`)")
    p.add_argument("--cluster-workers", type=_positive_int, metavar="N",
                   help="with --cluster local: GPU workers to start (default: one per GPU; without a GPU, for "
                        "replays and CPU spaces: N simulated ones, default 1)")
    _tls_args(p)


def _cluster_options(a: argparse.Namespace):
    """ClusterOptions from --cluster and friends; None without --cluster (the other options then refused)."""
    from evoengineer.evaluators.cluster import ClusterOptions, TLSFiles, check_address

    tls = TLSFiles.from_options(a.tls_ca_file, a.tls_cert, a.tls_key)
    if a.cluster is None:
        if a.cluster_workers is not None or tls is not None:
            raise UsageError("--cluster-workers and --tls-* go with --cluster")
        return None
    if a.cluster_workers is not None and a.cluster != "local":
        raise UsageError("--cluster-workers: only with --cluster local (an external scheduler has its own workers)")
    if a.cluster_workers == 0:
        raise UsageError("--cluster-workers: must be at least 1")
    check_address(a.cluster, tls)  # refused before anything starts or connects
    return ClusterOptions(address=a.cluster, workers=a.cluster_workers, tls=tls)


def cmd_worker(a: argparse.Namespace) -> int:
    from evoengineer.evaluators.cluster import TLSFiles, check_address, host_layout, serve_workers

    tls = TLSFiles.from_options(a.tls_ca_file, a.tls_cert, a.tls_key)
    check_address(a.scheduler, tls, option="--scheduler")
    if a.gpus is not None and a.simulate:
        raise UsageError("--gpus and --simulate: one or the other")
    gpus = [g.strip() for g in a.gpus.split(",") if g.strip()] if a.gpus is not None else None
    if gpus is not None and not gpus:
        raise UsageError("--gpus: no GPU named")
    cache = str(Path(a.cache_dir).expanduser().resolve()) if a.cache_dir else None
    layout = host_layout(gpus=gpus, simulate=a.simulate, build_jobs=a.build_jobs, builds=a.build_jobs != 0,
                         cache_dir=cache, what="worker")
    return serve_workers(a.scheduler, layout, tls, name=a.name,
                         announce=lambda text: print(text, file=sys.stderr, flush=True))


def cmd_search(a: argparse.Namespace) -> int:
    from evoengineer.search.driver import start_search
    from evoengineer.space.spec import resolve_space_arg

    space = resolve_space_arg(a.space) if a.space else default_space()
    return start_search(space_path=space, db=a.db, out=a.out, landscape=a.landscape, strategy=a.strategy,
                        sampler=a.sampler,
                        force=a.force, quiet=a.quiet, build_jobs=a.build_jobs or None, cache_dir=a.cache_dir,
                        cluster=_cluster_options(a), seed=a.seed, population=a.population,
                        generations=a.generations, elite=a.elite, budget=a.budget, options=a.option,
                        warm_start=not a.no_warm_start)


def cmd_check(a: argparse.Namespace) -> int:
    from evoengineer.check import check_space
    from evoengineer.space.spec import load_space, resolve_space_arg

    if a.genomes < 1:
        raise UserError("--genomes: at least 1")
    space = load_space(resolve_space_arg(a.space))
    return check_space(space, genomes=a.genomes, seed=a.seed, cache_dir=a.cache_dir,
                       say=lambda text: print(text, flush=True))


def cmd_resume(a: argparse.Namespace) -> int:
    from evoengineer.search.driver import resume_search

    return resume_search(db=a.db, run_id=a.run, quiet=a.quiet, from_scratch=a.from_scratch,
                         cluster=_cluster_options(a))


def _show_elites(elites: list[dict], as_json: bool, source_rank: int | None, where: str,
                 shape_elites: list[dict] | None = None, best: dict | None = None) -> int:
    from evoengineer.elite_json import format_search_best, format_shape_table, format_table

    if source_rank is not None:
        match = [e for e in elites if e.get("rank") == source_rank]
        if not match:
            raise UserError(f"{where}: no elite of rank {source_rank} (ranks 1..{len(elites)})")
        sys.stdout.write(match[0].get("source", ""))
        return 0
    if as_json:
        print(json.dumps(elites, indent=2))
    else:
        print(format_table(elites))
        if format_search_best(best):  # the search's best, when it is not rank 1: why
            print(format_search_best(best))
        if shape_elites:
            print(format_shape_table(shape_elites))
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from evoengineer import elite_json

    from evoengineer.search.variants import is_variants_doc, read_group

    try:
        group = is_variants_doc(json.loads(Path(a.file).read_text()))
    except (OSError, ValueError):
        group = False
    if group:  # a variants file: each variant's elite file in turn
        doc, found = read_group(a.file)
        if a.json:
            print(json.dumps(doc, indent=2))
            return 0
        for row in doc["variants"]:
            print(f"variant {row['label']} ({', '.join(f'{k}={v}' for k, v in row['values'].items())}): "
                  f"{row['file']}, run {row['run_id']} ({row['run_status']})")
        code = 0
        for row, f in found:
            print(f"\n== variant {row['label']} ==")
            sub = argparse.Namespace(**{**vars(a), "file": str(f)})
            code = max(code, cmd_inspect(sub))
        return code
    doc = elite_json.read(a.file)
    if not a.json and a.source is None:
        print(f"space {doc['space']} | run {doc['run_id']} ({doc['run_status']}) | generation {doc['generation']} "
              f"| {doc['evaluations']} evaluations | {doc['fingerprint'].get('gpu') or doc['fingerprint'].get('cpu')}")
    return _show_elites(doc["elites"], a.json, a.source, a.file, doc.get("shape_elites"), doc.get("search_best"))


def cmd_elites(a: argparse.Namespace) -> int:
    from evoengineer.elite_json import build_document, shape_elites
    from evoengineer.search.driver import open_store
    from evoengineer.space.spec import SearchSpace
    from evoengineer.store import StoreError

    store = open_store(a.db, create=False)
    try:
        run = store.get_run(a.run) if a.run is not None else store.latest_run()
    except StoreError as exc:
        raise UserError(f"--run {a.run}: {exc}") from None
    if run is None:
        raise UserError(f"--db {a.db}: the store holds no runs")
    space = SearchSpace.from_text(run.space_text, run.space_path)
    elites = store.elites(run.id)
    with_source = {e.hash: e for e in elites}
    records = store.candidates(run.id)
    shapes = shape_elites(space, records, lambda h: with_source.get(h) or store.find_candidate(run.id, h))
    doc = build_document(run=run, space=space, elites=elites, generation=-1,
                         evaluations=store.count_candidates(run.id), run_status=run.status, shape_elites=shapes,
                         records=records)
    if not a.json:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(store.status_counts(run.id).items()))
        print(f"run {run.id} | space {run.space_name} | {run_state(run.status, run.stop_reason)} | {counts}")
    return _show_elites(doc["elites"], a.json, None, a.db, doc.get("shape_elites"), doc.get("search_best"))


def cmd_spaces(a: argparse.Namespace) -> int:
    from evoengineer.space.spec import load_space, shipped_spaces

    rows = [("space", "task", "backend", "params", "product", "valid", "file")]
    for p in shipped_spaces():
        s = load_space(p)
        rows.append((s.name, s.task, s.backend + (f"/{s.arch}" if s.arch else ""), str(len(s.parameters)),
                     str(s.product_size), str(s.count_valid()), p.name))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_families(a: argparse.Namespace) -> int:
    from evoengineer import families

    rows = [("family", "version", "from", "entry", "templates")]
    for name in families.known():
        origin = "shipped" if name in families.SHIPPED else "installed"
        try:
            cls = families.find_family(name)
        except UserError as exc:
            rows.append((name, "?", origin, "", str(exc)))
            continue
        found = [str(p) if p.is_file() else f"{p} (missing)" for p in cls.template_paths()]
        rows.append((name, str(cls.version), origin, cls.entry, ", ".join(found) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_options(a: argparse.Namespace) -> int:
    from evoengineer.search import STRATEGIES
    from evoengineer.search.options import describe

    print(f"{'strategy':10s} {'option':24s} {'type':6s} default")
    for name, cls in STRATEGIES.items():
        lines = describe(name, cls.params_cls)
        print("\n".join(lines) if lines else f"{name:10s} (no options)")
    return 0


def cmd_landscape(a: argparse.Namespace) -> int:
    from evoengineer.evaluators.replay import write_landscape
    from evoengineer.search.driver import open_store
    from evoengineer.space.spec import SearchSpace
    from evoengineer.store import StoreError

    store = open_store(a.db, create=False)
    try:
        run = store.get_run(a.run) if a.run is not None else store.latest_run()
    except StoreError as exc:
        raise UserError(f"--run {a.run}: {exc}") from None
    if run is None:
        raise UserError(f"--db {a.db}: the store holds no runs")
    space = SearchSpace.from_text(run.space_text, run.space_path)
    out = Path(a.out)
    if out.parent and not out.parent.exists():
        raise UserError(f"--out {out}: directory {out.parent} does not exist")
    n = write_landscape(space, store.candidates(run.id), out)
    print(f"wrote {n} rows of run {run.id} ({space.name}, {space.count_valid()} valid configurations) to {out}",
          file=sys.stderr)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from evoengineer.report import write_report
    from evoengineer.search.driver import open_store
    from evoengineer.store import StoreError

    store = open_store(a.db, create=False)
    if a.run:
        runs = []
        for rid in dict.fromkeys(a.run):
            try:
                runs.append(store.get_run(rid))
            except StoreError as exc:
                raise UserError(f"--run {rid}: {exc}") from None
    else:
        runs = store.runs()
    if not runs:
        raise UserError(f"--db {a.db}: the store holds no runs")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    if not out.parent.exists():
        raise UserError(f"--out {out}: directory {out.parent} does not exist")
    index, summaries = write_report(store, runs, out)
    for sm in summaries:
        r = sm.run
        print(f"{sm.label} | {r.space_name} | {run_state(r.status, r.stop_reason)} | {len(sm.times)} evaluations")
    print(f"report: {index}", file=sys.stderr)
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from evoengineer.export import export

    if a.rank < 1:
        raise UsageError("--rank: must be at least 1")
    if a.per_shape and a.rank != 1:
        raise UsageError("--rank and --per-shape: one or the other (--per-shape packages the best of each shape)")
    folder, package, notes = export(a.file, a.out, rank=a.rank, force=a.force, per_shape=a.per_shape,
                                    family=a.family, accept_family_change=a.accept_family_change)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if a.per_shape:
        function = json.loads((folder / package / "dispatch.json").read_text())["function"]
    else:
        function = re.search(r"^(\w+) = kernel\.function$", (folder / package / "__init__.py").read_text(),
                             re.M).group(1)
    print(f"wrote {folder}/ (package {package}): {install_command(folder)}   then   from {package} import {function}")
    return 0


COMMANDS = {"search": cmd_search, "resume": cmd_resume, "inspect": cmd_inspect, "elites": cmd_elites,
            "spaces": cmd_spaces, "families": cmd_families, "landscape": cmd_landscape, "report": cmd_report,
            "export": cmd_export, "worker": cmd_worker, "check": cmd_check, "options": cmd_options}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        text = f"error: {exc}"
        if isinstance(exc, UsageError) and "--help" not in text:  # a flag's fault: where the flags are explained
            text += f" (see python -m evoengineer {args.command} --help)"
        print(text, file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
