"""A report over stored runs: best-so-far PNG per space (one line per run), elite tables, failures by status, and one
self-contained HTML page (the PNGs are embedded, so it opens offline from anywhere)."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evoengineer.store import CandidateRecord, RunInfo, Store
from evoengineer.elite_json import (certification, elite_rows, format_search_best, ranked_metrics, search_best,
                                    search_p50, table_notes)
from evoengineer.fileio import write_text_atomic
from evoengineer.report.convergence import Retimed, best_so_far, plot_convergence
from evoengineer.search.failures import failures_by_status


@dataclass
class RunSummary:
    run: RunInfo
    times: list[float]  # per evaluation, in order; inf for a failed candidate
    statuses: dict[str, int]
    first_reason: dict[str, str]  # one example reason per failure status
    elites: list[dict[str, Any]]
    best: float = math.inf
    label: str = ""
    search_times: list[float] = field(default_factory=list)  # the curve: the search's p50 as the search saw it
    retimed: list[Retimed] = field(default_factory=list)  # the finalists' re-timing, marked on the curve
    search_best: dict[str, Any] | None = None  # elite_json.search_best: the search's fastest, and why not rank 1


def strategy_name(run: RunInfo) -> str:
    """'ga', 'random', 'optuna/tpe', ..."""
    c = run.config
    return c.get("strategy", "ga") + (f"/{c['sampler']}" if c.get("sampler") else "")


def run_label(run: RunInfo) -> str:
    """'run 3: optuna/tpe seed 0' — what a legend or a heading calls a run."""
    return f"run {run.id}: {strategy_name(run)} seed {run.seed}"


def summarize_run(store: Store, run: RunInfo) -> RunSummary:
    recs: list[CandidateRecord] = store.candidates(run.id)
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    # the reason of the first of each failure status, on one line (as a search without a correct candidate prints)
    first_reason = {s: reason for s, (_, reason) in failures_by_status(recs).items()}
    # the sanitizer column says what the terminal's tables say ("not run", "pending", a verdict)
    elite_recs = store.elites(run.id)
    elites = [{"rank": i, "hash": e.hash, "params": e.params, "metrics": e.metrics, **certification(e, run.status)}
              for i, e in enumerate(elite_recs, start=1)]
    times = [r.time_us for r in recs]
    best = min(times, default=math.inf)
    first = ranked_metrics(elites[0]["metrics"]) if elites else {}
    if "search_time_us" in first:
        best = first["time_us"]  # rank 1, by the timing that ranked it
    top = search_best(recs, elite_recs)
    return RunSummary(run=run, times=times, statuses=statuses, first_reason=first_reason, elites=elites,
                      best=best, label=run_label(run), search_times=[search_p50(r) or math.inf for r in recs],
                      retimed=_retimed_marks(recs, elite_recs, top), search_best=top)


def _retimed_marks(recs: list[CandidateRecord], elites: list[CandidateRecord],
                   top: dict[str, Any] | None) -> list[Retimed]:
    """The finalists of the elites' re-timing session (and the search's best, when it is not rank 1) as marks on
    the convergence curve, at the evaluation each one was."""
    rt0 = elites[0].metrics.get("retime") if elites else None
    session = rt0.get("session") if isinstance(rt0, dict) else None
    rank1 = elites[0].hash if elites else None
    best = top["hash"] if top and top.get("rank") != 1 else None
    marks = []
    for i, r in enumerate(recs, start=1):
        t = search_p50(r)
        rt = r.metrics.get("retime")
        finalist = session is not None and isinstance(rt, dict) and rt.get("session") == session
        if t is None or not (finalist or r.hash == best):
            continue
        marks.append(Retimed(x=i, search_us=t, retimed_us=rt.get("p50_us") if finalist else None,
                             rank1=r.hash == rank1, search_best=r.hash == best))
    return marks


def _table(rows: list[tuple[Any, ...]]) -> str:
    """An HTML table: the first row is the header; numbers are right-aligned."""
    def cell(c: Any) -> str:
        num = isinstance(c, (int, float)) and not isinstance(c, bool)
        return f"<td{' class=num' if num else ''}>{html.escape(str(c))}</td>"

    head, body = rows[0], rows[1:]
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(cell(c) for c in r) + "</tr>" for r in body]
    out.append("</tbody></table>")
    return "\n".join(out)


def _fmt_us(t: float) -> str:
    return f"{t:.3f}" if math.isfinite(t) else "-"


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1.2em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; } .muted { color: #777; font-size: .9em; }
"""


def write_report(store: Store, runs: list[RunInfo], out_dir: str | Path) -> tuple[Path, list[RunSummary]]:
    """Write convergence_<space>.png per space, and index.html; returns the HTML's path and the runs' summaries."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarize_run(store, r) for r in runs]
    by_space: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_space.setdefault(s.run.space_name, []).append(s)

    parts = [f"<h1>EvoEngineer report</h1><p class=muted>store {html.escape(store.url)} &middot; "
             f"{len(runs)} run(s) &middot; written {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</p>"]
    overview = [("run", "space", "strategy", "seed", "status", "stop", "evaluations", "ok", "best us (rank 1)",
                 "evaluator")]
    for s in summaries:
        c = s.run.config
        overview.append((s.run.id, s.run.space_name, strategy_name(s.run), s.run.seed, s.run.status,
                         s.run.stop_reason or "-",
                         len(s.times), s.statuses.get("ok", 0), _fmt_us(s.best),
                         (c.get("evaluator") or {}).get("kind", "-")))
    parts.append("<h2>Runs</h2>" + _table(overview))

    for space, group in by_space.items():
        png = out / f"convergence_{_safe(space)}.png"
        series = {s.label: best_so_far(s.search_times) for s in group if s.times}
        if series:
            plot_convergence(series, png, title=f"{space}: best time vs distinct evaluations",
                             ylabel="best search p50 (us); marks: re-timing",
                             retimed={s.label: s.retimed for s in group if s.retimed})
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            img = f'<img alt="best-so-far of {html.escape(space)}" src="data:image/png;base64,{data}">'
        else:
            img = "<p class=muted>no evaluations yet</p>"
        notes = [f"{s.label}: {format_search_best(s.search_best)}" for s in group if format_search_best(s.search_best)]
        legend = ("the curve: the best search p50 so far; o: a finalist re-timed at the end of the run (a segment "
                  "from its search p50), *: rank 1 (its re-timed p50 dotted to the end), X: the search's best when "
                  "it is not rank 1") if any(s.retimed for s in group) else ""
        parts.append(f"<h2>Space {html.escape(space)}</h2>{img}"
                     + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
                     + (f"<p class=muted>{html.escape(legend)}</p>" if legend else "")
                     + f"<p class=muted>also saved as {html.escape(png.name)}</p>")
        statuses = sorted({k for s in group for k in s.statuses})
        fail_rows: list[tuple[Any, ...]] = [("run", *statuses, "first reason of each failure status")]
        for s in group:
            reasons = "; ".join(f"{k}: {v}" for k, v in s.first_reason.items()) or "-"
            fail_rows.append((s.run.id, *(s.statuses.get(k, 0) for k in statuses), reasons))
        parts.append("<h3>Evaluations by status</h3>" + _table(fail_rows))
        for s in group:
            rows = elite_rows(s.elites)
            notes = "".join(f"<p class=muted>{html.escape(n)}</p>" for n in table_notes(s.elites))
            body = _table(rows) + notes if s.elites else "<p class=muted>no correct candidate yet</p>"
            parts.append(f"<h3>Elites of {html.escape(s.label)}</h3>{body}")

    page = ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>EvoEngineer report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    index = out / "index.html"
    write_text_atomic(index, page)
    return index, summaries


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
