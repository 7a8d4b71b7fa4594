"""A candidate kernel: validated params, its rendered source, and its identity hash."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from evoengineer.paths import TEMPLATES_DIR
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


def template_sources(space: SearchSpace) -> dict[str, str]:
    """The template and every template it includes or extends (recursively), by loader name."""
    return {name: source for name, (source, _) in _template_files(space).items()}


def _template_files(space: SearchSpace) -> dict[str, tuple[str, str | None]]:
    """name -> (source, filename) for the template and everything it includes or extends."""
    env = _environment(str(space.template_path.parent))
    seen: dict[str, tuple[str, str | None]] = {}
    todo: list[tuple[str, str | None]] = [(space.template_path.name, None)]  # (name, the file that includes it)
    while todo:
        name, includer = todo.pop()
        if name in seen:
            continue
        try:
            source, filename, _ = env.loader.get_source(env, name)
            parsed = env.parse(source)
        except (jinja2.TemplateNotFound, TemplateOutsideFolder) as exc:
            if includer is None:
                raise _template_error(space.template_path, exc) from None
            why = (str(exc) if isinstance(exc, TemplateOutsideFolder) else
                   f"included template {name!r} not found in {space.template_path.parent}, {TEMPLATES_DIR / 'cuda'}, "
                   f"{TEMPLATES_DIR} or a shipped family's folder "
                   "(an include names a file inside the template's folder, the shipped templates folder or a "
                   "shipped family's: no '..', no absolute path)")
            raise UserError(f"{includer}: template error: {why}") from None
        except jinja2.TemplateError as exc:
            raise _template_error(space.template_path if includer is None else Path(name), exc) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{space.template_path}: cannot read template {name!r}: {exc}") from None
        seen[name] = (source, filename)
        todo.extend((n, filename or name) for n in jinja2.meta.find_referenced_templates(parsed) if n is not None)
    return seen


def _sources_sha256(sources: dict[str, str]) -> str:
    return sha256_text(json.dumps(sorted(sources.items())))


def template_sha256(space: SearchSpace) -> str:
    """Hash of the template and every template it includes or extends (recursively)."""
    return _sources_sha256(template_sources(space))


def normalize_params(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """`params` in space order, each value replaced by the space's own value (1 given for 1.0 becomes 1.0), so
    equal configurations hash and render alike (a missing gene that declares a default takes it). Values must be
    allowed ones (see SearchSpace.check_params)."""
    params = space.with_defaults(params)
    return {p.name: p.values[p.index(params[p.name])] for p in space.parameters}


def candidate_hash(space: SearchSpace, params: dict[str, Any], template_sha: str) -> str:
    """Hash of template source, params, signature, task, backend/arch, build flags and static gates (a gate decides
    whether a build passes, so relaxing one must not find the old verdict in the build cache)."""
    params = normalize_params(space, params)
    ident = {
        "template_sha256": template_sha,
        "task": space.task,
        "gates": {k: canonical_text(v) for k, v in sorted(space.gates.items())},
        "params": {k: canonical_text(params[k]) for k in space.names},
        "signature": {k: canonical_text(v) for k, v in sorted(space.signature.items())},
        "backend": space.backend,
        "arch": space.arch,
        "build_flags": list(space.build_flags),
        "cuda_flags": list(space.cuda_flags),
        "ldflags": list(space.ldflags),
    }
    return sha256_text(json.dumps(ident, sort_keys=True))


class TemplateOutsideFolder(jinja2.TemplateError):
    """An {% include %} / {% extends %} that resolves (through a symlink) outside the folder it was found in."""


class ContainedLoader(jinja2.FileSystemLoader):
    """FileSystemLoader that also refuses a file whose real path (symlinks resolved) leaves its search folder.
    Jinja already refuses '..' pieces and roots absolute names at the search folder."""

    def get_source(self, environment: jinja2.Environment, template: str):
        try:
            pieces = jinja2.loaders.split_template_path(template)
        except jinja2.TemplateNotFound:
            raise jinja2.TemplateNotFound(template, f"{template!r}: a template name may not climb out with '..'") \
                from None
        for searchpath in self.searchpath:
            filename = posixpath.join(searchpath, *pieces)
            if not os.path.isfile(filename):
                continue
            root, real = os.path.realpath(searchpath), os.path.realpath(filename)
            if os.path.commonpath([root, real]) != root:
                raise TemplateOutsideFolder(f"{template!r} is {filename}, which resolves to {real}, outside {root} "
                                            "(a symlink?); templates may include only files inside their folder or "
                                            "the shipped templates folder")
            with open(real, encoding=self.encoding) as f:
                contents = f.read()
            mtime = os.path.getmtime(real)

            def uptodate() -> bool:
                try:
                    return os.path.getmtime(real) == mtime
                except OSError:
                    return False

            return contents, os.path.normpath(filename), uptodate
        raise jinja2.TemplateNotFound(template, f"{template!r} not found in search paths: "
                                                f"{', '.join(repr(p) for p in self.searchpath)}")


def _new_environment(loader: jinja2.BaseLoader, **options: Any) -> jinja2.Environment:
    # Sandboxed: rendering a template from a space file cannot reach Python internals (obj.__class__...) or run code;
    # StrictUndefined: a misspelt name is an error, never an empty string.
    return jinja2.sandbox.SandboxedEnvironment(loader=loader, undefined=jinja2.StrictUndefined,
                                               keep_trailing_newline=True, autoescape=False, **options)


@lru_cache(maxsize=32)
def _environment(template_dir: str) -> jinja2.Environment:
    # The template's own folder first, then templates/cuda/ (the shared CUDA building blocks, `common/...`, for a
    # family's template wherever it lives), then templates/, then the shipped families' folders (so a template can
    # include a shipped one by its name, `cpu/NAME.cpp.j2`).
    from evoengineer.paths import shipped_family_dirs

    roots = [template_dir, str(TEMPLATES_DIR / "cuda"), str(TEMPLATES_DIR), *(str(d) for d in shipped_family_dirs())]
    return _new_environment(ContainedLoader(roots))


def render(space: SearchSpace, params: dict[str, Any], *, env: jinja2.Environment | None = None) -> str:
    """Render the space's template for `params` (validated first) plus the signature constants.
    `env` (default: one loading from the template's folder) is where the template is looked up. Missing genes that
    declare a default take it (check_params and normalize_params fill them)."""
    space.check_params(params)
    params = normalize_params(space, params)
    path: Path = space.template_path
    env = env or _environment(str(path.parent))
    try:
        return env.get_template(path.name).render(**space.env(params))
    except jinja2.TemplateError as exc:
        raise _template_error(path, exc) from None
    except Exception as exc:  # e.g. range(UNDEFINED), 1 / 0, a filter on the wrong type: still the template's fault
        where, line = _template_frame(exc, path)
        at = f":{line}" if line else ""
        raise UserError(f"{where}{at}: template error: {type(exc).__name__}: {exc}") from None


def _template_error(path: Path, exc: jinja2.TemplateError) -> UserError:
    line = getattr(exc, "lineno", None)
    where = getattr(exc, "filename", None) or path
    if line is None:
        where, line = _template_frame(exc, path)
    at = f":{line}" if line else ""
    return UserError(f"{where}{at}: template error: {exc}")


def _template_frame(exc: BaseException, path: Path) -> tuple[str, int | None]:
    """The innermost template file and line in `exc`'s traceback (Jinja maps its frames to template lines)."""
    where, line = str(path), None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.endswith((".j2", ".jinja", ".jinja2", ".tmpl")) or name == str(path) or name == "<template>":
            where, line = (str(path) if name == "<template>" else name), tb.tb_lineno
        tb = tb.tb_next
    return where, line


class CandidateFactory:
    """Makes candidates for one space, reading the template (and what it includes) once: every source it renders
    comes from the very text its hashes are computed from, even if the files change on disk meanwhile."""

    def __init__(self, space: SearchSpace):
        self.space = space
        files = _template_files(space)
        self.sources = {name: source for name, (source, _) in files.items()}
        self.template_sha = _sources_sha256(self.sources)
        fallback = _environment(str(space.template_path.parent)).loader  # dynamic includes, if any
        snapshot = jinja2.FunctionLoader(lambda name: (*files[name], lambda: True) if name in files else None)
        self._env = _new_environment(jinja2.ChoiceLoader([snapshot, fallback]), auto_reload=False)

    def make(self, params: dict[str, Any]) -> Candidate:
        source = render(self.space, params, env=self._env)  # (a gene missing from an old genome: its default)
        s = self.space
        params = normalize_params(s, params)
        return Candidate(space_name=s.name, params=params, hash=candidate_hash(s, params, self.template_sha),
                         source=source, template=s.template, backend=s.backend, arch=s.arch,
                         build_flags=s.build_flags, signature=dict(s.signature))

    def from_genome(self, genome) -> Candidate:
        return self.make(self.space.genome_to_params(genome))


def fixed_candidate(space: SearchSpace, template: str, label: str, path: Path) -> Candidate:
    """A kernel with no genes (e.g. a baseline) rendered from `template` (the file at `path`: where its family
    finds it, `Family.template_path`) with the space's signature, built with the space's flags like any candidate."""
    env = _environment(str(path.parent))
    try:
        source = env.get_template(path.name).render(**space.signature)
    except (jinja2.TemplateError, OSError) as exc:
        raise UserError(f"{path}: template error: {exc}") from None
    ident = {"fixed": label, "source_sha256": sha256_text(source), "backend": space.backend, "arch": space.arch,
             "build_flags": list(space.build_flags), "cuda_flags": list(space.cuda_flags),
             "ldflags": list(space.ldflags)}
    return Candidate(space_name=space.name, params={}, hash=sha256_text(json.dumps(ident, sort_keys=True)),
                     source=source, template=template, backend=space.backend, arch=space.arch,
                     build_flags=space.build_flags, signature=dict(space.signature))
