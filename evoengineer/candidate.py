"""A candidate kernel: validated params, its rendered source, and its identity hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace, canonical_text


@dataclass(frozen=True)
class Candidate:
    """One point of a space, rendered. `hash` identifies it across runs and machines."""

    space_name: str
    params: dict[str, Any]
    hash: str
    source: str
    template: str
    backend: str
    arch: str | None
    build_flags: tuple[str, ...]
    signature: dict[str, Any]

    @property
    def short(self) -> str:
        return self.hash[:12]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def template_sha256(space: SearchSpace) -> str:
    return sha256_text(space.template_path.read_text())


def candidate_hash(space: SearchSpace, params: dict[str, Any], template_sha: str) -> str:
    """Hash of template source, params, signature, backend/arch and build flags."""
    ident = {
        "template_sha256": template_sha,
        "params": {k: canonical_text(params[k]) for k in space.names},
        "signature": {k: canonical_text(v) for k, v in sorted(space.signature.items())},
        "backend": space.backend,
        "arch": space.arch,
        "build_flags": list(space.build_flags),
    }
    return sha256_text(json.dumps(ident, sort_keys=True))


@lru_cache(maxsize=32)
def _environment(template_dir: str) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(space: SearchSpace, params: dict[str, Any]) -> str:
    """Render the space's template for `params` (validated first) plus the signature constants."""
    space.check_params(params)
    path: Path = space.template_path
    env = _environment(str(path.parent))
    try:
        return env.get_template(path.name).render(**space.env(params))
    except jinja2.TemplateError as exc:
        line = getattr(exc, "lineno", None)
        at = f":{line}" if line else ""
        raise UserError(f"{path}{at}: template error: {exc}") from None


class CandidateFactory:
    """Makes candidates for one space, reading the template once."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self.template_sha = template_sha256(space)

    def make(self, params: dict[str, Any]) -> Candidate:
        source = render(self.space, params)
        s = self.space
        return Candidate(space_name=s.name, params=dict(params), hash=candidate_hash(s, params, self.template_sha),
                         source=source, template=s.template, backend=s.backend, arch=s.arch,
                         build_flags=s.build_flags, signature=dict(s.signature))

    def from_genome(self, genome) -> Candidate:
        return self.make(self.space.genome_to_params(genome))
