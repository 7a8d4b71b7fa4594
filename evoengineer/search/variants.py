"""Signature variants: a space whose [signature] gives lists (``DTYPE = ["float16", "bfloat16"]``) is searched once per
variant, one run after another in one store and one command, each with its own elites and shape elites in its own
file (``elite.<label>.json`` beside --out); the file --out names then lists the variants (`SCHEMA`), which is what
`export` and `load` read to make one op that dispatches on its inputs. A group interrupted inside a variant resumes
that run and then starts the variants not yet run (`resume`, as for any run); killed between two variants, `resume`
starts the next.

Each variant's run records in its options (config["variant"]) the group, its label and values, the space file's text
with the lists, and the settings the group was started with: everything a resume needs.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace

SCHEMA = "evoengineer.variants/1"
#: exit codes after which the next variant still runs (done, or done without a correct kernel)
_GO_ON = (0, 3)


def variant_out(out: str | Path, label: str) -> Path:
    """A variant's elite file beside the group's: elite.json -> elite.bfloat16.json."""
    p = Path(out)
    return p.with_name(f"{p.stem}.{label}{p.suffix or '.json'}")


def is_variants_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == SCHEMA


def start_variants(space: SearchSpace, *, space_path: Path, db: str, out: str, force: bool, quiet: bool,
                   cluster: Any = None, **settings: Any) -> int:
    """Search every variant of `space` in turn (driver.start_space each) and write the group's file at `out`."""
    out_path = Path(out).resolve()
    if out_path.exists() and not force:
        try:
            doc = json.loads(out_path.read_text())
        except (OSError, ValueError):
            doc = None
        if not (is_variants_doc(doc) and doc.get("space") == space.name):
            raise UserError(f"--out {out}: exists and is not this space's variants file (--force replaces it)")
    variants = space.variants()
    for v in variants:  # every variant's space loads (and renders) before anything runs
        from evoengineer.candidate import CandidateFactory

        concrete = space.variant(v)
        CandidateFactory(concrete).from_genome(concrete.valid_genomes()[0])
    info = {"group": uuid.uuid4().hex[:12], "of": len(variants), "base_text": space.text,
            "space_path": str(space_path), "out": str(out_path), "force": force,
            "settings": {k: v for k, v in settings.items() if v is not None},
            "cluster": cluster.to_dict() if cluster is not None else None}
    if not quiet:
        print(f"space {space.name}: {len(variants)} signature variants ("
              f"{', '.join(SearchSpace.variant_label(v) for v in variants)}), one search each", file=sys.stderr)
    return _run_variants(space, variants, info, db=db, quiet=quiet, cluster=cluster)


def _run_variants(space: SearchSpace, todo: list[dict[str, Any]], info: dict[str, Any], *, db: str, quiet: bool,
                  cluster: Any) -> int:
    from evoengineer.search.driver import start_space

    worst = 0
    all_variants = space.variants()
    for v in todo:
        label = SearchSpace.variant_label(v)
        index = next(i for i, x in enumerate(all_variants) if SearchSpace.variant_label(x) == label)
        if not quiet:
            print(f"variant {index + 1} of {len(all_variants)}: {label}", file=sys.stderr)
        variant = {**info, "index": index, "label": label, "values": v}
        code = start_space(space.variant(v), space_path=Path(info["space_path"]), db=db,
                           out=str(variant_out(info["out"], label)), force=info.get("force", False), quiet=quiet,
                           cluster=cluster, variant=variant, **info["settings"])
        worst = max(worst, code)
        if code not in _GO_ON:  # interrupted or failed: resume carries on from there
            write_group_file(space, info, db)
            return code
    write_group_file(space, info, db)
    return worst


def _group_runs(store: Any, group: str) -> dict[str, Any]:
    """The runs of a variant group in `store`, by label (the newest of each)."""
    found: dict[str, Any] = {}
    for r in store.runs():
        v = (r.config or {}).get("variant") or {}
        if v.get("group") == group:
            found[v["label"]] = r
    return found


def continue_variants(store: Any, info: dict[str, Any], *, db: str, quiet: bool, cluster: Any = None) -> int:
    """After a group's run was resumed (or when it was killed between variants): the variants not yet run."""
    space = SearchSpace.from_text(info["base_text"], info["space_path"])
    if cluster is None and info.get("cluster"):
        from evoengineer.evaluators.cluster import ClusterOptions

        cluster = ClusterOptions.from_dict(info["cluster"])
    done = _group_runs(store, info["group"])
    todo = [v for v in space.variants() if SearchSpace.variant_label(v) not in done]
    if todo and not quiet:
        print(f"variants not yet searched: {', '.join(SearchSpace.variant_label(v) for v in todo)}", file=sys.stderr)
    return _run_variants(space, todo, info, db=db, quiet=quiet, cluster=cluster)


def unfinished_group(store: Any) -> dict[str, Any] | None:
    """The newest run's variant group when some of its variants have no run yet (killed between two), else None."""
    run = store.latest_run()
    info = ((run.config or {}).get("variant") if run is not None else None) or None
    if not info:
        return None
    return info if len(_group_runs(store, info["group"])) < int(info["of"]) else None


def write_group_file(space: SearchSpace, info: dict[str, Any], db: str) -> Path:
    """The group's file at info["out"]: per variant its label, values, signature, elite file and run."""
    from evoengineer.search.driver import open_store

    runs = _group_runs(open_store(db, create=False), info["group"])
    out = Path(info["out"])
    rows = []
    for v in space.variants():
        label = SearchSpace.variant_label(v)
        f = variant_out(out, label)
        run = runs.get(label)
        elites = None
        if f.is_file():
            try:
                elites = len(json.loads(f.read_text()).get("elites") or [])
            except (OSError, ValueError):
                elites = None
        rows.append({"label": label, "values": v, "signature": dict(space.variant(v).signature), "file": f.name,
                     "run_id": run.id if run is not None else None,
                     "run_status": run.status if run is not None else "not started", "elites": elites})
    doc = {"schema": SCHEMA, "space": space.name, "space_file": info["space_path"], "group": info["group"],
           "store": db, "variants": rows}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, out)
    return out


def read_group(path: str | Path) -> tuple[dict[str, Any], list[tuple[dict[str, Any], Path]]]:
    """A group file and, per variant with an elite file, (its row, that file's path); UserError when none has."""
    path = Path(path)
    doc = json.loads(path.read_text())
    if not is_variants_doc(doc) or not isinstance(doc.get("variants"), list):
        raise UserError(f"{path}: not a variants file ({SCHEMA})")
    found = []
    for row in doc["variants"]:
        name = str(row.get("file", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise UserError(f"{path}: variant {row.get('label')!r}: file {name!r} is not a file name beside it")
        f = path.parent / name
        if f.is_file():
            found.append((row, f))
    if not found:
        raise UserError(f"{path}: no variant has an elite file yet (resume the search)")
    return doc, found
