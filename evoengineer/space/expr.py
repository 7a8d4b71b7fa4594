"""Safe constraint expressions: parsed with `ast`, compiled to closures over a small whitelist.

Allowed: numbers, booleans, parameter names, strings only as a side of == or !=, + - * / // % **, unary - + not, comparisons (chained),
and/or, and calls to min/max. Nothing from the file is ever passed to eval/exec.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable, Iterable

Env = dict[str, Any]
Compiled = Callable[[Env], Any]

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_FUNCS = {"min": min, "max": max}


class ExprError(ValueError):
    """An expression outside the whitelist, or naming an unknown name."""


class Expression:
    """A compiled constraint. Call it with a name->value mapping; it returns the value of the expression."""

    def __init__(self, text: str, names: Iterable[str]):
        self.text = text
        self._known = set(names)
        self.names: set[str] = set()
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"syntax error in {text!r}: {exc.msg}") from None
        self._fn = self._compile(tree.body)

    def __call__(self, env: Env) -> Any:
        return self._fn(env)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def _operand(self, node: ast.AST, equality: bool) -> Compiled:
        # A string constant is allowed only as a side of == / != (to test a categorical string parameter).
        if equality and isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            return lambda env: value
        return self._compile(node)

    def _compile(self, node: ast.AST) -> Compiled:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or isinstance(node.value, (int, float)):
                value = node.value
                return lambda env: value
            raise ExprError(f"only numbers and booleans are allowed as constants, got {node.value!r}")
        if isinstance(node, ast.Name):
            name = node.id
            if name in ("True", "False"):
                value = name == "True"
                return lambda env: value
            if name not in self._known:
                raise ExprError(f"unknown name {name!r}")
            self.names.add(name)
            return lambda env: env[name]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            op, left, right = _BINOPS[type(node.op)], self._compile(node.left), self._compile(node.right)
            if isinstance(node.op, ast.Pow):
                def power(env: Env) -> Any:
                    exponent = right(env)
                    if abs(exponent) > 64:
                        raise ExprError(f"exponent {exponent} too large")
                    base = left(env)
                    # nested powers ((2**64)**64)**64... grow without bound: cap the size of an integer result
                    if isinstance(base, int) and isinstance(exponent, int) and base.bit_length() * abs(exponent) > 4096:
                        raise ExprError("power too large")
                    return base ** exponent
                return power
            return lambda env: op(left(env), right(env))
        if isinstance(node, ast.UnaryOp):
            operand = self._compile(node.operand)
            if isinstance(node.op, ast.USub):
                return lambda env: -operand(env)
            if isinstance(node.op, ast.UAdd):
                return lambda env: +operand(env)
            if isinstance(node.op, ast.Not):
                return lambda env: not operand(env)
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda env: all(p(env) for p in parts)
            return lambda env: any(p(env) for p in parts)
        if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
            equality = all(isinstance(o, (ast.Eq, ast.NotEq)) for o in node.ops)
            first = self._operand(node.left, equality)
            chain = [(_CMPOPS[type(o)], self._operand(c, equality)) for o, c in zip(node.ops, node.comparators)]

            def compare(env: Env) -> bool:
                left = first(env)
                for op, comp in chain:
                    right = comp(env)
                    if not op(left, right):
                        return False
                    left = right
                return True
            return compare
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
            if node.keywords or not node.args:
                raise ExprError(f"{node.func.id}() takes positional arguments only")
            fn, args = _FUNCS[node.func.id], [self._compile(a) for a in node.args]
            if len(args) == 1:
                raise ExprError(f"{node.func.id}() needs at least two arguments")
            return lambda env: fn(*(a(env) for a in args))
        raise ExprError(f"{type(node).__name__} is not allowed (arithmetic, comparisons, and/or/not, "
                        "names, numbers, min/max only)")
