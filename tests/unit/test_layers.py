"""The import graph of evoengineer/ (ARCHITECTURE.md): every import, at module level or inside a function, goes to
the same layer or one below; no package is imported by one of its own dependencies (no circle); no shipped family
imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "evoengineer"

#: lowest first; a unit is a top-level module or subpackage of evoengineer (the package root is the facade on top)
LAYERS = [
    {"errors", "fileio", "liveness", "fingerprint", "paths", "registry", "status"},
    {"space", "settings"},
    {"candidate"},
    {"ops"},
    {"compiler"},
    {"family"},
    {"families"},
    {"evaluators", "store"},
    {"elite_json"},
    {"search"},
    {"export", "report", "check", "tuning"},
    {"cli", "__main__", ""},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported evoengineer module, line) for every import statement in `path`, relative ones resolved."""
    mod = _module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from evoengineer import x` may name a submodule
            names = [f"{target}.{a.name}" for a in node.names] if target == "evoengineer" else [target]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(n, node.lineno) for n in names if n == "evoengineer" or n.startswith("evoengineer.")]
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in _sources()}
    assert units <= set(RANK), f"give these a layer in tests/unit/test_layers.py and ARCHITECTURE.md: {units - set(RANK)}"


def test_no_import_runs_up_a_layer():
    bad = []
    for path in _sources():
        here = _unit(_module_name(path))
        for target, line in _imports(path):
            there = _unit(target)
            if there in RANK and here in RANK and RANK[there] > RANK[here]:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({here}, layer {RANK[here]}) imports {target} "
                           f"(layer {RANK[there]})")
    assert not bad, "\n".join(bad)


def test_no_circle_between_units():
    graph: dict[str, set[str]] = {}
    for path in _sources():
        here = _unit(_module_name(path))
        graph.setdefault(here, set()).update(_unit(t) for t, _ in _imports(path) if _unit(t) != here)
    seen: dict[str, int] = {}

    def visit(u: str, trail: list[str]) -> None:
        seen[u] = 1
        for v in sorted(graph.get(u, ())):
            if seen.get(v) == 1:
                pytest.fail("import circle: " + " -> ".join([*trail[trail.index(v):], v]) if v in trail
                            else f"import circle through {v}")
            if v not in seen:
                visit(v, [*trail, v])
        seen[u] = 2

    for u in sorted(graph):
        if u not in seen:
            visit(u, [u])


def test_no_family_imports_another():
    families = PKG / "families"
    shipped = [p.name for p in families.iterdir() if (p / "task.py").is_file()]
    bad = []
    for name in shipped:
        for path in sorted((families / name).rglob("*.py")):
            for target, line in _imports(path):
                other = target.split(".")[2] if target.startswith("evoengineer.families.") else None
                if other and other != name and other in shipped:
                    bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_backends_are_asked_what_they_mean_not_compared_by_name():
    """What a backend means (GPU, device compiler, builds beside measuring) lives in evoengineer/space/backend.py;
    nothing else compares a backend's name."""
    import re

    pattern = re.compile(r"""backend\s*[!=]=\s*["'](cuda|cpu)["']|["'](cuda|cpu)["']\s*[!=]=\s*\w*backend""")
    bad = [f"{p.relative_to(PKG.parent)}:{i}" for p in _sources() if p.name != "backend.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, bad
