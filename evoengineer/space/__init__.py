"""Search spaces: the TOML format, safe constraint expressions, genome <-> parameter mapping."""

from evoengineer.space.spec import Parameter, SearchSpace, load_space, resolve_space_arg, shipped_spaces

__all__ = ["Parameter", "SearchSpace", "load_space", "resolve_space_arg", "shipped_spaces"]
