"""EvoEngineer: evolutionary search over Jinja2 kernel templates."""

from pathlib import Path

__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    """A shipped data folder: inside the package in an installed wheel (evoengineer/data/NAME, copied there at build
    time), else the checkout's top-level NAME/ (editable install, or the repository on PYTHONPATH)."""
    packaged = _HERE / "data" / name
    return packaged if packaged.is_dir() else _HERE.parent / name


#: Folder that holds the `evoengineer` package (put on PYTHONPATH of the worker processes).
ROOT = _HERE.parent
TEMPLATES_DIR = _data_dir("templates")
SPACES_DIR = _data_dir("search_spaces")


def load(elite_json, rank: int = 1, **options):
    """The kernel of elite `rank` of an elite.json as a callable PyTorch op (see evoengineer.export.load)."""
    from evoengineer.export import load as _load

    return _load(elite_json, rank=rank, **options)


def tune(kernel, **options):
    """Tune one kernel from one call: its template text, entry, example args and outputs, reference and knobs;
    returns the elites and the fastest as a PyTorch op (see evoengineer.tuning.tune)."""
    from evoengineer.tuning import tune as _tune

    return _tune(kernel, **options)
