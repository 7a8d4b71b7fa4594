"""Where kernel families come from (the contract is evoengineer.family.Family):

* shipped: the folders beside this file (msda, sdpa, decode), by name;
* installed: an entry point of group ``evoengineer.families`` (name = the family's name, value = ``module:Class``);
* named by a space file: ``task = "module:Class"`` (importable) or ``task = "family.py:Class"``, a file inside the
  space file's folder (no absolute path, no ``..``, symlinks resolved), as templates are.

A reference resolves to a class before anything of it is called, and the class must be a subclass of `Family`.
elite.json records a family's name and version only: `export` and `load` find it by name among the shipped and
installed families (`find_family`), or are told where it is; nothing read from an elite file is imported.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from evoengineer.errors import UserError
from evoengineer.registry import ENTRY_POINT_GROUP, SHIPPED, family_file, installed, is_file_ref, known

__all__ = ["ENTRY_POINT_GROUP", "SHIPPED", "installed", "known", "family_class", "find_family", "check_version",
           "get_task", "op_adapter_for", "family_source_file", "family_source_sha256"]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _contract() -> type:
    from evoengineer.family import Family

    return Family


def _checked(obj: Any, ref: str, where: str) -> type:
    """`obj` if it is a family class (a proper subclass of Family), else UserError: nothing of it is called."""
    Family = _contract()
    if not (isinstance(obj, type) and issubclass(obj, Family) and obj is not Family):
        raise UserError(f"{where}: {ref!r} is not a kernel family (a subclass of evoengineer.Family), it is "
                        f"{type(obj).__name__ if not isinstance(obj, type) else 'the class ' + obj.__qualname__}")
    return obj


def _from_module(ref: str, where: str) -> type:
    module_name, _, cls_name = ref.partition(":")
    if not _MODULE.fullmatch(module_name) or not _CLASS.fullmatch(cls_name):
        raise UserError(f"{where}: {ref!r}: expected module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"{where}: {ref!r}: cannot import {module_name}: {exc}") from None
    if not hasattr(module, cls_name):
        raise UserError(f"{where}: {ref!r}: module {module_name} has no {cls_name}")
    return _checked(getattr(module, cls_name), ref, where)


def _from_file(ref: str, base_dir: Path | None, where: str) -> type:
    cls_name = ref.rpartition(":")[2]
    if not _CLASS.fullmatch(cls_name):
        raise UserError(f"{where}: {ref!r}: expected family.py:Class")
    real = family_file(ref, base_dir, where)
    # one module per file (by its real path): the search, its worker processes and export see the same classes
    name = "evoengineer_family_" + hashlib.sha256(str(real).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, real)
        if spec is None or spec.loader is None:
            raise UserError(f"{where}: {ref!r}: cannot load {real}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise UserError(f"{where}: {ref!r}: {real} failed to import: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, cls_name):
        raise UserError(f"{where}: {ref!r}: {real.name} has no {cls_name}")
    return _checked(getattr(module, cls_name), ref, where)


def family_class(ref: str, *, base_dir: Path | None = None, where: str = "task") -> type:
    """The family a space's ``task`` names: a shipped or installed family's name, ``module:Class`` or
    ``family.py:Class`` (inside `base_dir`, the space file's folder)."""
    if not isinstance(ref, str) or not ref:
        raise UserError(f"{where}: expected a family name, module:Class or family.py:Class")
    if ":" in ref:
        return _from_file(ref, base_dir, where) if is_file_ref(ref) else _from_module(ref, where)
    return find_family(ref, where=where)


def find_family(name: str, version: str | None = None, *, where: str = "family") -> type:
    """A shipped or installed family by its name (and version, when given); UserError naming the known ones."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UserError(f"{where}: {name!r} is not a family name")
    ref = SHIPPED.get(name) or installed().get(name)
    if ref is None:
        raise UserError(f"{where}: family {name!r} is not shipped or installed (known: {', '.join(known())}); "
                        "name its class with module:Class or family.py:Class")
    cls = _from_module(ref, f"{where} {name!r}")
    return check_version(cls, name, version, where)


def check_version(cls: type, name: str, version: str | None, where: str) -> type:
    if cls.name != name:
        raise UserError(f"{where}: {cls.describe()} is family {cls.name!r}, not {name!r}")
    if version is not None and str(cls.version) != str(version):
        raise UserError(f"{where}: family {name!r} is version {cls.version} here, the kernel was searched with "
                        f"version {version}: refusing to run it through another contract")
    return cls


def get_task(space: Any) -> Any:
    """The family instance for a space (checks its signature constants, shapes and settings)."""
    base = space.path.parent if getattr(space, "path", None) is not None else None
    cls = family_class(space.task, base_dir=base, where=f"{space.path or space.name}: task")
    return cls(space)


def family_source_file(cls: type) -> Path:
    """The file that defines a family class."""
    import inspect

    return Path(inspect.getfile(cls)).resolve()


def family_source_sha256(cls: type) -> str:
    """The sha256 of the file that defines the family class (what elite.json records beside name and version)."""
    from evoengineer.candidate import sha256_text

    try:
        return sha256_text(family_source_file(cls).read_text())
    except (OSError, TypeError, UnicodeDecodeError):
        return ""


def op_adapter_for(kernel: dict[str, Any]) -> Any:
    """The op adapter of an exported kernel's family, found by the name (and version) its build record gives."""
    build = kernel["build"]
    family = build.get("family") or {"name": build["task"], "version": None}
    cls = find_family(family["name"], family.get("version"), where=f"kernel {kernel.get('hash', '?')[:12]}")
    if cls.op_module:
        return cls.own_op_adapter()
    return cls(constants=build["signature"], backend=build.get("backend", "cpu")).op_adapter()
