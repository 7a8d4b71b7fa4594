"""Where the shipped data lives (a foundation module: it imports nothing of EvoEngineer)."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    """A shipped data folder: inside the package in an installed wheel (evoengineer/data/NAME, copied there at build
    time), else the checkout's top-level NAME/ (editable install, or the repository on PYTHONPATH)."""
    packaged = _HERE / "data" / name
    return packaged if packaged.is_dir() else _HERE.parent / name


ROOT = _HERE.parent
#: what families share: the CUDA building blocks (templates/cuda/common/) and the bindings' headers
TEMPLATES_DIR = _data_dir("templates")
#: spaces of no shipped family's own, searched after the families' (search_spaces/README.md)
SPACES_DIR = _data_dir("search_spaces")
#: the shipped families, one folder each: class, reference, op adapter, binding, templates (cuda/, cpu/), spaces/
FAMILIES_DIR = _HERE / "families"


def shipped_family_dirs() -> list[Path]:
    """The shipped families' folders (their templates: `cuda/...`, `cpu/...`, as a space or an include names them)."""
    return sorted(p for p in FAMILIES_DIR.iterdir() if (p / "__init__.py").is_file())


def space_dirs() -> list[Path]:
    """The folders of shipped space files: each shipped family's spaces/, then search_spaces/."""
    return [*sorted(p for p in FAMILIES_DIR.glob("*/spaces") if p.is_dir()), SPACES_DIR]


def shipped_space_files(pattern: str = "*.toml") -> list[Path]:
    """The shipped space files matching `pattern`, by file name."""
    return sorted((p for d in space_dirs() for p in d.glob(pattern) if p.is_file()), key=lambda p: p.name)


def space_file(name: str) -> Path:
    """The shipped space file called `name` (e.g. "cpu_msda.toml"), wherever its family keeps it; a path in
    search_spaces/ that does not exist when no family has it."""
    for d in space_dirs():
        if (d / name).is_file():
            return d / name
    return SPACES_DIR / name
