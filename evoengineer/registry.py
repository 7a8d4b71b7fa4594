"""Which kernel families exist, by reference, without importing any of them (a foundation module: the space layer
finds an installed family's templates here; evoengineer.families resolves references to classes)."""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

from evoengineer.errors import UserError

ENTRY_POINT_GROUP = "evoengineer.families"
#: shipped families, imported on first use
SHIPPED = {"msda": "evoengineer.families.msda.task:MSDATask",
           "sdpa": "evoengineer.families.sdpa.task:SDPATask",
           "decode": "evoengineer.families.decode.task:DecodeTask"}


def installed() -> dict[str, str]:
    """Families of installed packages: name -> "module:Class" (entry points of group evoengineer.families)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known() -> list[str]:
    return sorted({*SHIPPED, *installed()})


def is_file_ref(ref: str) -> bool:
    """Whether a ``...:Class`` reference names a file (``family.py:Class``) rather than a module."""
    file_part = ref.rpartition(":")[0]
    return file_part.endswith(".py") or "/" in file_part or "\\" in file_part


def family_file(ref: str, base_dir: Path | None, where: str) -> Path:
    """The real path of the file a ``family.py:Class`` reference names: inside `base_dir` (the space file's folder;
    no absolute path, no ``..``, symlinks resolved), as templates are. UserError saying what is wrong."""
    file_part = ref.rpartition(":")[0]
    if base_dir is None:
        raise UserError(f"{where}: {ref!r}: a family file is found next to a space file; this space has none")
    rel = Path(file_part)
    inside = f"a family file must lie inside the space file's folder ({base_dir})"
    if rel.is_absolute() or file_part.startswith("~"):
        raise UserError(f"{where}: {ref!r} is an absolute path; {inside}")
    if ".." in rel.parts:
        raise UserError(f"{where}: {ref!r} climbs out of its folder with '..'; {inside}")
    root = base_dir.resolve()
    path = root / rel
    if not path.is_file():
        raise UserError(f"{where}: {ref!r}: {path} not found")
    real = path.resolve()
    if not real.is_relative_to(root):
        raise UserError(f"{where}: {ref!r} is {path}, which resolves to {real}, outside {root} (a symlink?); {inside}")
    return real


def family_folder(ref: object, base_dir: Path | None) -> Path | None:
    """The folder of the family a space's ``task`` names (its templates may live there), found without running the
    family's code: a shipped or installed name or ``module:Class`` by the module's file, ``family.py:Class`` inside
    `base_dir`. None when it cannot be found (whoever needs the family says why)."""
    if not isinstance(ref, str) or not ref:
        return None
    if ":" not in ref:
        ref = SHIPPED.get(ref) or installed().get(ref) or ""
        if not ref:
            return None
    if is_file_ref(ref):
        try:
            return family_file(ref, base_dir, "task").parent
        except UserError:
            return None
    try:
        spec = importlib.util.find_spec(ref.rpartition(":")[0])
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return Path(spec.origin).resolve().parent
