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
TEMPLATES_DIR = _data_dir("templates")
SPACES_DIR = _data_dir("search_spaces")
