"""`extends = "other.toml"` in a space file: the other file's tables, with this file's keys over them.

A space that differs from another in a few keys (its name, a signature value, the timed shape) names that space
and writes only what differs, so a constraint formula or a parameter list lives in one file. The merge: top-level
tables ([signature], [parameters], [gates], [build], [search], [evaluation]) merge key by key; every value this
file gives (a string, an array, an inline table such as one parameter's, the [[shapes]] array of tables) replaces
the base's whole. The base may extend another (at most MAX_DEPTH files, no circles); it lies in the extending
file's folder or below it (no absolute path, no '..', no symlink out of it).

The space's text, stored with every run and handed to workers, is the merged document written out as TOML (with a
comment naming the files it came from), so a run never needs the base file again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evoengineer.errors import UserError
from evoengineer.space.spec import read_space_text, tomllib

MAX_DEPTH = 8


def resolve(data: dict[str, Any], path: Path | None, where: str) -> tuple[dict[str, Any], str]:
    """(the merged document, its text) of a space file that extends another."""
    merged, chain = _resolve(data, path, where, [])
    note = " <- ".join(str(p.name) for p in chain)
    return merged, f"# merged: {note} (`extends`); the text a run stores\n" + dumps(merged)


def _resolve(data: dict[str, Any], path: Path | None, where: str,
             seen: list[Path]) -> tuple[dict[str, Any], list[Path]]:
    ref = data.get("extends")
    if not isinstance(ref, str) or not ref.strip():
        raise UserError(f"{where}: extends: expected the file name of another space file, got {ref!r}")
    if path is None:
        raise UserError(f"{where}: extends: a space given as text has no folder to find {ref!r} in")
    if "name" not in data:
        raise UserError(f"{where}: extends: a space that extends another needs a name of its own")
    folder = path.parent.resolve()
    rel = Path(ref)
    inside = "the file it extends must lie in its folder or below it"
    if rel.is_absolute() or ref.startswith("~"):
        raise UserError(f"{where}: extends: {ref!r} is an absolute path; {inside}")
    if ".." in rel.parts:
        raise UserError(f"{where}: extends: {ref!r} climbs out of its folder with '..'; {inside}")
    base = folder / rel
    real = base.resolve()
    if not real.is_relative_to(folder):
        raise UserError(f"{where}: extends: {ref!r} resolves to {real}, outside {folder} (a symlink?); {inside}")
    here = path.resolve()
    chain = [*seen, here]
    if real in chain:
        raise UserError(f"{where}: extends: a circle: {' -> '.join(p.name for p in chain)} -> {real.name}")
    if len(chain) >= MAX_DEPTH:
        raise UserError(f"{where}: extends: more than {MAX_DEPTH} files deep")
    if not real.exists():
        raise UserError(f"{where}: extends: {ref!r} not found in {folder}")
    text = read_space_text(real, f"{where}: extends: cannot read {real}")
    try:
        base_data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{real}: malformed TOML: {exc}") from None
    if "extends" in base_data:
        base_data, below = _resolve(base_data, real, str(real), chain)
    else:
        below = [real]
    return merge(base_data, {k: v for k, v in data.items() if k != "extends"}), [here, *below]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Top-level tables merged key by key; any other value of `over` replaces the base's (file order kept: the
    base's keys first, new ones after)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


# ---- TOML out (the subset a space file uses) ---------------------------------------------------------------------
def dumps(doc: dict[str, Any]) -> str:
    """`doc` as TOML: keys with plain values first, then a [table] per table, then [[name]] per array of tables;
    checked by reading it back."""
    lines: list[str] = []
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in doc.items() if _is_table_array(v)}
    for k, v in doc.items():
        if k not in tables and k not in arrays:
            lines.append(f"{_key(k)} = {toml_value(v)}")
    for k, v in tables.items():
        lines += ["", f"[{_key(k)}]"] + [f"{_key(a)} = {toml_value(b)}" for a, b in v.items()]
    for k, v in arrays.items():
        for item in v:
            lines += ["", f"[[{_key(k)}]]"] + [f"{_key(a)} = {toml_value(b)}" for a, b in item.items()]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != doc:  # a value this writer cannot express (it would be a bug here, not the user's)
        raise UserError("space file: the merged space could not be written back as TOML")
    return text


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) else _string(k)


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # JSON's escapes are TOML basic-string escapes


def toml_value(v: Any) -> str:
    """One value as TOML (strings with JSON's escapes, which are TOML's)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(a)} = {toml_value(b)}" for a, b in v.items()) + " }"
    raise UserError(f"space file: cannot write {type(v).__name__} values back as TOML")
