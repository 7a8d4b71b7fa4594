"""elite.json: the K best correct kernels of a run, written atomically after every generation."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterable

from evoengineer.errors import UserError
from evoengineer.fileio import atomic_open, umask
from evoengineer.liveness import holder_alive
from evoengineer.candidate import sha256_text
from evoengineer.status import Status

SCHEMA = "evoengineer/elite-v1"


def build_document(*, run: Any, space: Any, elites: list[Any], generation: int, evaluations: int,
                   run_status: str, retime_note: str = "",
                   shape_elites: list[tuple[str, dict[str, Any], Any]] | None = None,
                   records: Iterable[Any] | None = None) -> dict[str, Any]:
    """The elite.json content for `run` (a RunInfo), `space` (a SearchSpace) and its elites (CandidateRecords).
    A finished run's elites are ranked by their re-timed p50 when they were re-timed (`retiming` says how, or why
    not: `retime_note`). `shape_elites` (from `shape_elites`: shape name, spec, record with its source) adds the
    per-shape bests. `records` (all the run's evaluations) adds `search_best`: the search's fastest and, when it is
    not rank 1, why (`search_best`), and the re-timing's flags over every finalist."""
    records = list(records) if records is not None else None
    best = search_best(records, elites) if records is not None else None
    common = {"space": space.name, "template": space.template, "run_id": run.id, "fingerprint": run.fingerprint,
              "build": build_record(space, run)}
    ranks = {e.hash: i for i, e in enumerate(elites, start=1)}
    warm = run.config.get("warm_start") or {}
    per_shape = {} if shape_elites is None else {"shape_elites": [
        _shape_entry(name, spec, r, ranks.get(r.hash), run_status, common) for name, spec, r in shape_elites]}
    return {
        "schema": SCHEMA,
        "space": space.name,
        "space_file": run.space_path,
        "task": common["build"]["task"],
        "backend": space.backend,
        "arch": space.arch,
        "template": space.template,
        "template_sha256": run.template_sha256,
        "run_id": run.id,
        "seed": run.seed,
        "strategy": run.config.get("strategy", "ga"),
        **({"sampler": run.config["sampler"]} if run.config.get("sampler") else {}),
        "evaluator": run.config.get("evaluator", {}),
        # the first proposals, taken from earlier runs of the store (search/warm_start.py)
        "warm_start": {"runs": list(warm.get("runs", [])), "seeds": len(warm.get("seeds", []))},
        "run_status": run_status,
        "generation": generation,
        "evaluations": evaluations,
        "fingerprint": run.fingerprint,
        "retiming": _retiming(elites, run_status, retime_note, records),
        **({"search_best": best} if best is not None else {}),
        "elites": [
            {"rank": i, "hash": e.hash, "params": e.params, "metrics": ranked_metrics(e.metrics), "status": e.status,
             "generation": e.generation, **certification(e, run_status), **_timing(e), **common,
             "source_sha256": sha256_text(e.source), "source": e.source}
            for i, e in enumerate(elites, start=1)
        ],
        **per_shape,
    }


def _shape_entry(name: str, spec: dict[str, Any], r: Any, rank: int | None, run_status: str,
                 common: dict[str, Any]) -> dict[str, Any]:
    """One shape_elites entry: the shape, the fastest correct kernel on it and what a build needs."""
    cert = certification(r, run_status)  # shape winners are certified with the elites when the run finishes
    return {"shape": name, "shape_spec": spec, "hash": r.hash, "params": r.params, "p50_us": _shape_p50(r, name),
            "objective_us": r.metrics.get("time_us"), "rank": rank, "status": r.status, "generation": r.generation,
            "metrics": r.metrics, **cert, **common, "source_sha256": sha256_text(r.source), "source": r.source}


def timed_shape_names(space: Any) -> list[str]:
    """Names of the shapes the space times, in space order."""
    return [d["name"] for d in space.shapes if d.get("time") is True]


def _shape_p50(rec: Any, name: str) -> float | None:
    t = ((rec.metrics.get("shapes") or {}).get(name) or {}).get("p50_us")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t == t and t > 0 else None


def shape_winners(space: Any, records: Iterable[Any]) -> list[tuple[str, Any]] | None:
    """For a space that times 2 or more shapes, per timed shape (in space order) the correct record with the
    lowest p50 on that shape (ties by hash); shapes no correct record was timed on are left out. None for a space
    that times fewer shapes (its objective is that one shape's time)."""
    names = timed_shape_names(space)
    if len(names) < 2:
        return None
    ok = [r for r in records if r.status == Status.OK]
    out = []
    for name in names:
        timed = [(t, r.hash, r) for r in ok if (t := _shape_p50(r, name)) is not None]
        if timed:
            out.append((name, min(timed, key=lambda x: x[:2])[2]))
    return out


def shape_specs(space: Any) -> dict[str, dict[str, Any]]:
    """Each timed shape's parameters as the family parses them (symbolic sizes resolved), by name; the space's
    table less name/checks/time/fresh if the task cannot be made here."""
    from dataclasses import asdict, is_dataclass

    from evoengineer.settings import GENERIC_SHAPE_KEYS

    try:
        from evoengineer.families import get_task  # imports torch: only asked for when there are per-shape bests

        parsed = {e.name: e.shape for e in get_task(space).entries if e.time}
    except (ImportError, UserError):
        parsed = {}
    out = {}
    for d in space.shapes:
        if d.get("time") is not True:
            continue
        shape = parsed.get(d["name"])
        spec = asdict(shape) if is_dataclass(shape) else dict(d)
        out[d["name"]] = json.loads(json.dumps({k: v for k, v in spec.items()
                                                if k != "name" and k not in GENERIC_SHAPE_KEYS}))
    return out


def shape_elites(space: Any, records: Iterable[Any], fetch: Callable[[str], Any],
                 specs: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any], Any]] | None:
    """`build_document`'s shape_elites: (shape name, spec, winner with its source) per `shape_winners`, sources
    fetched by hash (`fetch`: hash -> record with source); None for a space timing fewer than 2 shapes."""
    winners = shape_winners(space, records)
    if winners is None:
        return None
    if winners and specs is None:
        specs = shape_specs(space)
    fetched: dict[str, Any] = {}
    out = []
    for name, rec in winners:
        if rec.hash not in fetched:
            fetched[rec.hash] = fetch(rec.hash) or rec
        out.append((name, (specs or {}).get(name, {}), fetched[rec.hash]))
    return out


def space_family(space: Any) -> Any:
    """The family class a space names (its module is imported: the search runs it anyway)."""
    from evoengineer.families import family_class

    path = getattr(space, "path", None)
    return family_class(space.task, base_dir=path.parent if path is not None else None,
                        where=f"{path or space.name}: task")


def build_record(space: Any, run: Any) -> dict[str, Any]:
    """What an elite's source was compiled with, in a form a loader can check and rebuild from: the task and its
    signature (the shapes and dtypes the kernel accepts), backend, arch, build flags, gates, the template and its
    hash, and the toolchain."""
    try:
        family = space_family(space)
        from evoengineer.families import family_source_sha256

        named: dict[str, Any] = {"task": family.name, "family": {"name": family.name, "version": str(family.version),
                                                                "source_sha256": family_source_sha256(family)}}
    except (UserError, ImportError):  # e.g. a landscape replayed where its family is not: nothing to export
        named = {"task": space.task}
    return {**named, "signature": dict(space.signature), "backend": space.backend, "arch": space.arch,
            "flags": list(space.build_flags), "cuda_flags": list(space.cuda_flags), "ldflags": list(space.ldflags),
            "gates": dict(space.gates), "template": space.template, "template_sha256": run.template_sha256,
            "toolchain": (run.fingerprint or {}).get("toolchain")}


_SESSION_KEYS = ("finalists", "rounds", "rounds_done", "repeats", "baseline", "baseline_calls", "baseline_rounds",
                 "budget_s", "expected_s", "seconds", "noise_cv", "cache", "pinning", "replay")


def _retiming(elites: list[Any], run_status: str, note: str, records: list[Any] | None = None) -> dict[str, Any]:
    """How the elites were ranked: by the re-timed p50 of the finalists timed together at the end of the run
    (with the session's settings and the machine's noise: the CV of the baseline's per-round p50), or by the
    search's own p50 (and why). `flagged` counts the elites whose re-timing disagrees with the search's timing
    beyond the noise; `finalists_flagged` (with `records`) every finalist's, the ones that fell out included."""
    infos = [e.metrics.get("retime") for e in elites]
    if infos and all(isinstance(i, dict) and "p50_us" in i for i in infos):
        first = infos[0]
        out = {"ranked_by": "re-timed p50", "ties": "finalists within the noise of each other (retiming.tied) take "
               "their ranks in the order of their hashes, a fixed key: the same finalists give the same elites",
               **{k: first[k] for k in _SESSION_KEYS if k in first},
               "flagged": sum(1 for i in infos if i.get("flag"))}
        if records is not None:
            session = [r.metrics["retime"] for r in records if isinstance(r.metrics.get("retime"), dict)
                       and r.metrics["retime"].get("session") == first.get("session")]
            out["finalists_flagged"] = sum(1 for i in session if i.get("flag"))
            out["finalists_dropped"] = sum(1 for i in session if i.get("dropped"))
        return out
    why = note or ("pending: the finalists are re-timed when the run finishes" if run_status != "finished"
                   else "not re-timed (retime_finalists = 0, or no correct candidate)")
    return {"ranked_by": "search p50", "reason": why}


def search_p50(rec: Any) -> float | None:
    """The search's p50 of a candidate the search counted as correct: one still `ok`, or one that was until the
    finished run's re-timing or sanitizer found it wrong (what the progress line showed as best)."""
    m = rec.metrics
    overturned = (isinstance(m.get("retime"), dict) and m["retime"].get("dropped")) or \
        (isinstance(m.get("sanitizer"), dict) and m["sanitizer"].get("status") == "failed")
    t = m.get("time_us")
    if (rec.status != Status.OK and not overturned) or isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    return float(t) if t == t and t > 0 else None


def search_best(records: Iterable[Any], elites: list[Any]) -> dict[str, Any] | None:
    """The search's fastest candidate (by the search's own p50; ties by hash): its hash, params, search p50, its rank
    among the elites (None: not an elite), its re-timing, and when it is not rank 1 why not (`not_rank_1`): re-timed
    slower (by how much, beyond the noise or within it), dropped by the re-timing or the sanitizer. None without a
    timed candidate."""
    timed = [(t, r.hash, r) for r in records if (t := search_p50(r)) is not None]
    if not timed:
        return None
    t, _, rec = min(timed, key=lambda x: x[:2])
    rank = next((i for i, e in enumerate(elites, start=1) if e.hash == rec.hash), None)
    out: dict[str, Any] = {"hash": rec.hash, "params": rec.params, "search_p50_us": t, "rank": rank,
                           "status": rec.status}
    rt = rec.metrics.get("retime")
    if isinstance(rt, dict) and "p50_us" in rt:
        out["retimed"] = {"p50_us": rt["p50_us"], "ratio": rt.get("ratio"), "tolerance": rt.get("tolerance"),
                          "beyond_noise": bool(rt.get("flag"))}
    if rank != 1:
        out["not_rank_1"] = _why_not_rank_1(rec, rt, rank, elites)
    return out


def _why_not_rank_1(rec: Any, rt: Any, rank: int | None, elites: list[Any]) -> str:
    where = f"rank {rank}" if rank is not None else "not an elite"
    if rec.status != Status.OK:
        return f"{rec.status} at the end of the run: {rec.reason}"[:400]
    if isinstance(rt, dict) and "p50_us" in rt:
        ratio, tol = rt.get("ratio"), rt.get("tolerance")
        if isinstance(ratio, (int, float)) and ratio == ratio and ratio > 0:
            how = f"{ratio:.2f}x slower" if ratio >= 1 else f"{1 / ratio:.2f}x faster"
        else:
            how = "slower"
        noise = "beyond the noise" if rt.get("flag") else "within the noise"
        if isinstance(tol, (int, float)):
            noise += f" (+-{tol:.0%})"
        first = ranked_metrics(elites[0].metrics).get("time_us") if elites else None
        vs = f" (rank 1: {first:.3f} us re-timed)" if isinstance(first, (int, float)) else ""
        return f"re-timed {how} ({rt['p50_us']:.3f} us), {noise}; {where}{vs}"
    return f"{where} (not re-timed)"


def format_search_best(best: dict[str, Any] | None) -> str:
    """One line on the search's best when it is not rank 1 ("" when it is, or there is none)."""
    if not best or best.get("rank") == 1 or not best.get("not_rank_1"):
        return ""
    return (f"the search's best, {_num(best.get('search_p50_us'))} us ({str(best.get('hash', ''))[:12]}), is not "
            f"rank 1: {best['not_rank_1']}")


#: the timing keys that the ranking's timing replaces; the search's own keep them under "search_" + key
_SEARCH_KEYS = ("time_us", "time_p90_us", "time_p99_us", "speedup")


def ranked_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A candidate's metrics as users read them: `time_us` (p50), `time_p90_us`, `time_p99_us` and `speedup` are
    the timing its rank was decided by - the re-timing of the finalists when it was re-timed, else the search's.
    The search's own timing stays under `search_time_us`, `search_time_p90_us`, ... The speedup is then the
    baseline's p50 in the same re-timing over the re-timed p50 (an older re-timing that did not keep the baseline's
    p50: the search's baseline over the re-timed p50). Idempotent."""
    rt = metrics.get("retime")
    if "search_time_us" in metrics or not (isinstance(rt, dict) and "p50_us" in rt):
        return metrics
    out = {k: v for k, v in metrics.items() if k not in _SEARCH_KEYS}
    out.update({f"search_{k}": metrics[k] for k in _SEARCH_KEYS if k in metrics})
    out["time_us"] = rt["p50_us"]
    for k in ("p90_us", "p99_us"):
        if k in rt:
            out[f"time_{k}"] = rt[k]
    base = rt.get("baseline_p50_us") or metrics.get("baseline_us")
    if isinstance(base, (int, float)) and rt["p50_us"] > 0:
        out["speedup"] = base / rt["p50_us"]
    return out


def _timing(e: Any) -> dict[str, Any]:
    """Both timings of an elite: the search's p50 and, if it was re-timed, the re-timed p50 with its spread."""
    info = e.metrics.get("retime")
    out: dict[str, Any] = {"search_p50_us": e.metrics.get("time_us")}
    if isinstance(info, dict) and "p50_us" in info:
        out["retimed"] = {k: info[k] for k in ("p50_us", "p10_us", "p90_us", "p99_us", "median_ci95_us", "ratio",
                                               "round_cv", "baseline_p50_us",
                                               "tolerance", "flag", "calls", "tied_with") if k in info}
    return out


def certification(e: Any, run_status: str) -> dict[str, Any]:
    """`certified`: the elite ran clean under compute-sanitizer; `sanitizer`: what was run and found (or why
    nothing was: pending until the run finishes, or no sanitizer for this evaluator)."""
    verdict = e.metrics.get("sanitizer")
    if isinstance(verdict, dict):
        return {"certified": verdict.get("status") == "clean",
                "sanitizer": {k: verdict[k] for k in ("status", "tools", "reason", "seconds") if k in verdict}}
    why = "pending: elites are certified when the run finishes" if run_status != "finished" else \
        "not run: no sanitizer for this evaluator or backend (compute-sanitizer, CUDA spaces only)"
    return {"certified": False, "sanitizer": {"status": "not run", "reason": why}}


def write_atomic(path: str | Path, doc: dict[str, Any]) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename over `path` (mode from the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")


def read(path: str | Path) -> dict[str, Any]:
    """Load and check an elite.json; UserError on anything that is not one."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not an elite.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not JSON: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("elites"), list):
        raise UserError(f"{path}: not an elite.json (schema {SCHEMA!r} expected)")
    for key, kind in _REQUIRED.items():
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            raise UserError(f"{path}: elite.json key {key!r} is missing or not a {kind.__name__}")
    for i, e in enumerate(doc["elites"]):
        if not isinstance(e, dict) or not isinstance(e.get("params"), dict) or not isinstance(e.get("metrics"), dict):
            raise UserError(f"{path}: elites[{i}]: needs params and metrics tables")
    shapes = doc.get("shape_elites")  # absent in files of older versions and of spaces timing one shape
    if shapes is not None:
        if not isinstance(shapes, list):
            raise UserError(f"{path}: shape_elites: expected a list")
        for i, e in enumerate(shapes):
            if not isinstance(e, dict) or not isinstance(e.get("shape"), str) or not isinstance(e.get("params"), dict):
                raise UserError(f"{path}: shape_elites[{i}]: needs a shape name and a params table")
    return doc


_REQUIRED = {"space": str, "run_id": int, "run_status": str, "generation": int, "evaluations": int,
             "fingerprint": dict}


class OutClaim:
    """This run writes `path`: a lock file beside it (.NAME.lock: host, pid, run, store) while the run is driven.
    Another live run holding it is refused (one line naming it); a dead holder's claim is taken over, and the temp
    files killed writers of `path` left behind (.NAME.*.tmp) are removed then."""

    def __init__(self, path: str | Path, run_id: int, store_url: str):
        self.path = Path(path).absolute()
        self.lock = self.path.parent / f".{self.path.name}.lock"
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "run": run_id, "store": store_url}
        self.held = False

    def acquire(self) -> None:
        for _ in range(5):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666 & ~umask())
            except FileExistsError:
                holder = self._holder()
                if holder and holder_alive(holder.get("host"), holder.get("pid"), self._last_touched()):
                    raise UserError(f"--out {self.path}: being written by run {holder.get('run')} (pid "
                                    f"{holder.get('pid')} on {holder.get('host')}, store {holder.get('store')}); "
                                    "choose another --out or stop that run")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.lock)  # a dead (or our own earlier) holder's claim
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(self.me, f)
            except BaseException:  # e.g. a full file system: leave no empty claim behind
                with contextlib.suppress(OSError):
                    os.unlink(self.lock)
                raise
            self.held = True
            for tmp in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # left by killed writers of this file
                with contextlib.suppress(OSError):
                    tmp.unlink()
            return
        raise UserError(f"--out {self.path}: could not claim it (other runs keep claiming it)")

    def _last_touched(self) -> float:
        try:
            return self.lock.stat().st_mtime
        except OSError:
            return 0.0

    def touch(self) -> None:
        """A sign of life (the lock's mtime) for claims read from another host."""
        with contextlib.suppress(OSError):
            os.utime(self.lock)

    def release(self) -> None:
        holder = self._holder()
        ours = holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == self.me["host"]
        if ours or (self.held and holder == {}):  # ours, or ours and since made unreadable (a full disk)
            with contextlib.suppress(OSError):
                os.unlink(self.lock)
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.lock.read_text())
            return data if isinstance(data, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: a writer killed mid-write; treated as dead


def check_writable(path: str | Path, space_name: str, *, force: bool = False) -> None:
    """Refuse to overwrite a file that is not an elite.json, or one from another space (unless forced)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory")
    # the folder must exist (as --db's must: a missing one is refused, never made) and be writable: found out now,
    # not after the run has started
    parent = path.absolute().parent
    found = parent
    while not found.exists() and found != found.parent:
        found = found.parent
    if not found.is_dir():
        raise UserError(f"--out {path}: {found} is not a directory")
    if found != parent:
        raise UserError(f"--out {path}: directory {path.parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {path}: cannot write in {parent}")
    if not path.exists() or force:
        return
    try:
        doc = read(path)
    except UserError:
        raise UserError(f"--out {path}: exists and is not an elite.json; refusing to overwrite it") from None
    if doc.get("space") != space_name:
        raise UserError(f"--out {path}: holds elites of space {doc.get('space')!r}, not {space_name!r}; "
                        "choose another --out (or --force)")


def elite_rows(elites: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Header and one row per elite: rank, the p50/p90 and speedup the ranking used, the search's p50 (`!` when
    the two disagree beyond the noise), errors, sanitizer verdict, hash, params (text cells)."""
    rows = [("rank", "p50 us", "p90 us", "speedup", "search p50", "max err", "sanitizer", "hash", "params")]
    for e in elites:
        m = ranked_metrics(e.get("metrics", {}))
        verdict = e.get("sanitizer") or m.get("sanitizer") or {}
        rt = e.get("retimed") or m.get("retime") or {}
        search = _num(m.get("search_time_us")) + (" !" if rt.get("flag") else "") if "search_time_us" in m else "-"
        rows.append((str(e.get("rank")), _num(m.get("time_us")), _num(m.get("time_p90_us")), _num(m.get("speedup")),
                     search, _num(m.get("max_abs_err"), ".1e"), str(verdict.get("status", "-")),
                     str(e.get("hash", ""))[:12], " ".join(f"{k}={v}" for k, v in e.get("params", {}).items())))
    return rows


#: above this machine noise (CV of the baseline's per-round p50 in the re-timing) the run says its ranking is weak
NOISY_CV = 0.05


def table_notes(elites: list[dict[str, Any]]) -> list[str]:
    """What the elite table's columns mean (its markers included) and, where the machine was too noisy to rank
    the elites, a warning in words."""
    if not elites:
        return []
    ms = [ranked_metrics(e.get("metrics", {})) for e in elites]
    rts = [e.get("metrics", {}).get("retime") or e.get("retimed") or {} for e in elites]
    retimed = [("search_time_us" in m) for m in ms]
    if not any(retimed):
        return ["p50/p90 us, speedup: the search's timing (ranked by it; not re-timed)"]
    notes = ["p50/p90 us, speedup: the finalists' re-timing at the end of the run (the ranking); search p50: the "
             "candidate's timing during the search"
             + ("" if all(retimed) else "; a row without a search p50 was not re-timed (its p50 is the search's)")]
    tol = max((r.get("tolerance") or 0.0 for r in rts), default=0.0)
    tied = [str(e.get("rank")) for e, r in zip(elites, rts) if r.get("tied_with")]
    if tied:
        notes.append(f"note: rank{'s' if len(tied) > 1 else ''} {', '.join(tied)} placed by hash ahead of faster "
                     "finalists tied with them within the noise (retimed.tied_with): a fixed key, so the same "
                     "finalists give the same order")
    if any(r.get("flag") for r in rts):
        notes.append(f"!: the re-timing and the search's timing disagree by more than the machine's noise allows "
                     f"(+-{tol:.0%})")
    noise = max((r.get("noise_cv") or 0.0 for r in rts), default=0.0)
    cis = [r.get("median_ci95_us") for r in rts]
    overlap = any(isinstance(a, list) and isinstance(b, list) and a[1] >= b[0] for a, b in zip(cis, cis[1:]))
    if noise > NOISY_CV:
        notes.append(f"warning: this machine was noisy (the baseline varied by {noise:.0%} between re-timing "
                     "rounds): differences between these elites smaller than that are not meaningful"
                     + ("; the 95% intervals of neighbouring ranks overlap, so their order is not settled"
                        if overlap else ""))
    elif overlap:
        notes.append("note: the 95% intervals of some neighbouring ranks overlap: their order is within the noise")
    return notes


def format_table(elites: list[dict[str, Any]]) -> str:
    """A plain-text table of `elite_rows`, then what its columns mean (`table_notes`)."""
    if not elites:
        return "(no elites)"
    rows = elite_rows(elites)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    return "\n".join([*lines, *table_notes(elites)])


def format_shape_table(shape_elites: list[dict[str, Any]] | None) -> str:
    """The per-shape bests as a short plain-text section ("" without any)."""
    if not shape_elites:
        return ""
    rows = [("shape", "best p50 us", "hash", "elite")]
    for e in shape_elites:
        rank = e.get("rank")
        rows.append((str(e.get("shape")), _num(e.get("p50_us")), str(e.get("hash", ""))[:12],
                     f"rank {rank}" if rank is not None else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(["per shape (the fastest correct kernel on each timed shape):", *lines])


def _num(v: Any, fmt: str = ".3f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"
