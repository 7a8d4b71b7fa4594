"""The C++ source of a family's binding, as the builder takes it (a family's own file, or one generated from its
declared signature: compiler/generic_binding.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BindingSource:
    """The C++ source of a family's binding: a file of the family's own, or generated from its signature."""

    name: str
    text: str
    origin: str
    #: the binding launches device code and has no entry point to link against (a declared Launch): every candidate
    #: of the space's template builds to a cubin, whatever the builder was asked for
    launches: bool = False
