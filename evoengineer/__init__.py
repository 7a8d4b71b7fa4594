"""EvoEngineer: evolutionary search over Jinja2 kernel templates."""

from pathlib import Path

__version__ = "0.1.0"

#: Repository root: holds templates/, search_spaces/, elite_store/ next to the package.
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "templates"
SPACES_DIR = ROOT / "search_spaces"
