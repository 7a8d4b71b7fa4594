"""EvoEngineer: evolutionary search over Jinja2 kernel templates."""

from evoengineer.paths import ROOT, SPACES_DIR, TEMPLATES_DIR, shipped_space_files, space_file

__version__ = "0.1.0"
__all__ = ["ROOT", "SPACES_DIR", "TEMPLATES_DIR", "shipped_space_files", "space_file", "load", "tune", "__version__"]


def load(elite_json, rank: int = 1, **options):
    """The kernel of elite `rank` of an elite.json as a callable PyTorch op (see evoengineer.export.load)."""
    from evoengineer.export import load as _load

    return _load(elite_json, rank=rank, **options)


def tune(kernel, **options):
    """Tune one kernel from one call: its template text, entry, example args and outputs, reference and knobs;
    returns the elites and the fastest as a PyTorch op (see evoengineer.tuning.tune)."""
    from evoengineer.tuning import tune as _tune

    return _tune(kernel, **options)
