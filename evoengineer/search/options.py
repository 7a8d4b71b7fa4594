"""Strategy options, in one place: each strategy that has any declares them as one dataclass (`params_cls`: the GA's
GAParams, the surrogate's SurrogateParams), whose fields are the options, their types and defaults. A search sets
them with ``--option KEY=VALUE`` (repeatable); they are checked here, stored with the run (its config's
``options``) and given to the strategy again on resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from evoengineer.errors import UsageError

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def fields_of(params_cls: type | None) -> dict[str, tuple[type, Any]]:
    """Option name -> (type, default) of a strategy's params dataclass (none: no options)."""
    if params_cls is None:
        return {}
    out = {}
    for f in dataclasses.fields(params_cls):
        kind = _TYPES.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
        if kind is None:
            raise TypeError(f"{params_cls.__name__}.{f.name}: an option must be int, float, bool or str")
        out[f.name] = (kind, f.default)
    return out


def _known(strategy: str, fields: Mapping[str, Any]) -> str:
    return ", ".join(sorted(fields)) if fields else f"the {strategy} strategy takes no options"


def _value(strategy: str, key: str, kind: type, raw: Any) -> Any:
    """`raw` (a CLI string, or a value stored with a run) as the option's type; UsageError naming both."""
    where = f"--option {key}={raw}" if isinstance(raw, str) else f"option {key} = {raw!r}"
    if isinstance(raw, str) and kind is not str:
        text = raw.strip().lower()
        if kind is bool:
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise UsageError(f"{where}: {strategy} option {key} is true or false")
        try:
            return kind(text)
        except ValueError:
            raise UsageError(f"{where}: {strategy} option {key} is {'an integer' if kind is int else 'a number'}") \
                from None
    if kind is float and type(raw) is int:
        return float(raw)
    if type(raw) is not kind:
        raise UsageError(f"{where}: {strategy} option {key} is {kind.__name__}, got {type(raw).__name__}")
    return raw


def check(strategy: str, params_cls: type | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options typed and known to `strategy`; UsageError for an unknown name or a wrong value."""
    fields = fields_of(params_cls)
    out: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in fields:
            raise UsageError(f"--option {key}: unknown to the {strategy} strategy (known: {_known(strategy, fields)})")
        out[key] = _value(strategy, key, fields[key][0], raw)
    if params_cls is not None:
        try:
            build(params_cls, out)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--option: {strategy}: {exc}") from None
    return dict(sorted(out.items()))


def parse(strategy: str, params_cls: type | None, items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (the CLI's --option) as checked options; a key given twice: the last one."""
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option {item!r}: expected KEY=VALUE")
        raw[key.strip()] = value
    return check(strategy, params_cls, raw)


def build(params_cls: type, options: Mapping[str, Any]) -> Any:
    """The params dataclass with `options` over its defaults."""
    return params_cls(**dict(options))


def describe(strategy: str, params_cls: type | None) -> list[str]:
    """One line per option: name, type, default (for `python -m evoengineer options`)."""
    return [f"{strategy:10s} {name:24s} {kind.__name__:6s} {default!r}"
            for name, (kind, default) in fields_of(params_cls).items()]
