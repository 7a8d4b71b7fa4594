"""Which kernel families exist, by reference, without importing any of them (a foundation module: the space layer
finds an installed family's templates here; evoengineer.families resolves references to classes)."""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from pathlib import Path

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
    file_part = ref.rpartition(":")[0]
    if file_part.endswith(".py") or "/" in file_part or "\\" in file_part:
        if base_dir is None or Path(file_part).is_absolute() or ".." in Path(file_part).parts:
            return None
        root = base_dir.resolve()
        real = (root / file_part).resolve()
        return real.parent if real.is_file() and real.is_relative_to(root) else None
    try:
        spec = importlib.util.find_spec(file_part)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return Path(spec.origin).resolve().parent
