"""Search-space files (TOML): parameters, constraints, gates, shapes, and the template they drive."""

from __future__ import annotations

import functools
import keyword
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from evoengineer.paths import TEMPLATES_DIR
from evoengineer.errors import UserError
from evoengineer.space.expr import Expression, ExprError
from evoengineer.space.flags import ARCH, check_flags
from evoengineer.space.backend import BACKENDS, Backend

Value = Any  # int | float | bool | str
Genome = list[int]

KNOWN_GATES = ("max_registers", "max_smem_bytes", "max_spill_bytes", "max_stack_bytes")
BUILD_KEYS = ("flags", "cuda_flags", "ldflags")
SEARCH_KEYS = ("population", "generations", "elite", "budget", "seed")
TOP_KEYS = ("name", "description", "template", "task", "backend", "arch", "signature", "parameters",
            "constraints", "gates", "shapes", "build", "search", "evaluation")
ENUMERATION_LIMIT = 5_000_000


@dataclass(frozen=True)
class Parameter:
    """One gene: an ordered list of allowed values. Ordinal genes mutate to neighbours; categorical ones resample."""

    name: str
    values: tuple[Value, ...]
    ordinal: bool
    # the value of a genome recorded before this gene existed (one that renders the kernel it was then); None: such
    # genomes are refused as incomplete
    default: Value | None = None

    def index(self, value: Value) -> int:
        """Position of `value` in this parameter's list (exact type match: True is not 1)."""
        for i, v in enumerate(self.values):
            if type(v) is type(value) and v == value:
                return i
            if isinstance(v, float) and isinstance(value, int) and not isinstance(value, bool) and v == value:
                return i
        raise KeyError(value)

    def canonical(self, value: Value) -> str:
        """Text form used in landscape CSVs and hashes."""
        return canonical_text(value)


def canonical_text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass
class SearchSpace:
    """A parsed space file. Build with `load_space(path)` or `SearchSpace.from_text(text, path)`."""

    name: str
    description: str
    template: str
    template_path: Path
    task: str
    backend: str
    arch: str | None
    parameters: list[Parameter]
    signature: dict[str, Value]
    constraints: list[Expression]
    gates: dict[str, float]
    shapes: list[dict[str, Any]]
    build_flags: tuple[str, ...]
    cuda_flags: tuple[str, ...]
    ldflags: tuple[str, ...]
    search: dict[str, Any]
    evaluation: dict[str, Any]
    path: Path | None = None
    text: str = ""
    #: signature keys given as lists: the variants searched (one run each; `signature` holds the first values)
    variant_axes: dict[str, list[Value]] = field(default_factory=dict)
    _valid: list[tuple[int, ...]] | None = field(default=None, repr=False)
    _validity: dict[tuple[int, ...], bool] = field(default_factory=dict, repr=False, compare=False)

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str, path: Path | str | None = None, *, check_valid: bool = True) -> "SearchSpace":
        """`check_valid=False` skips enumerating the valid configurations (seconds for 10^6 of them) to refuse a
        space with none: for processes handed a space their parent loaded already (measuring worker, sanitizer),
        which never ask for the valid set."""
        where = str(path) if path is not None else "<space>"
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{where}: malformed TOML: {exc}") from None
        if "extends" in data:  # the merged document and its text (what a run stores: no base file needed again)
            from evoengineer.space import extends

            data, text = extends.resolve(data, Path(path) if path is not None else None, where)
        return _parse(data, text, Path(path) if path is not None else None, where, check_valid)

    # ---- signature variants --------------------------------------------------------------------------------------
    def variants(self) -> list[dict[str, Value]]:
        """Every combination of the variant axes (signature keys given as lists), in file order; [] without."""
        combos: list[dict[str, Value]] = [{}]
        for k, values in self.variant_axes.items():
            combos = [{**c, k: v} for c in combos for v in values]
        return combos if self.variant_axes else []

    def variant(self, values: dict[str, Value]) -> "SearchSpace":
        """The space of one variant: the same file with each variant list replaced by one of its values (so the
        text stored with its run rebuilds it)."""
        where = str(self.path or self.name)
        if set(values) != set(self.variant_axes):
            raise UserError(f"{where}: variant {values}: expected a value for each of {sorted(self.variant_axes)}")
        for k, v in values.items():
            if canonical_text(v) not in {canonical_text(x) for x in self.variant_axes[k]}:
                raise UserError(f"{where}: signature.{k}: {v!r} is not one of its variants {self.variant_axes[k]}")
        text = _with_signature_values(self.text, values, where)
        return SearchSpace.from_text(text, self.path)

    @staticmethod
    def variant_label(values: dict[str, Value]) -> str:
        """A variant's name in file names and messages: its values joined ("bfloat16", "float16-4096")."""
        return "-".join(str(canonical_text(v)).strip('"') for v in values.values())

    @property
    def target(self) -> Backend:
        """What this space's backend means (evoengineer/space/backend.py)."""
        return BACKENDS[self.backend]

    # ---- genome <-> params ---------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def genome_to_params(self, genome: Sequence[int]) -> dict[str, Value]:
        return {p.name: p.values[g] for p, g in zip(self.parameters, genome)}

    def params_to_genome(self, params: dict[str, Value]) -> list[int]:
        params = self.with_defaults(params)
        self.check_params(params)
        return [p.index(params[p.name]) for p in self.parameters]

    def with_defaults(self, params: dict[str, Value]) -> dict[str, Value]:
        """`params` with every missing gene that declares a default set to it (genomes recorded before a gene was
        added); anything else is left for check_params to judge."""
        missing = {p.name: p.default for p in self.parameters if p.default is not None and p.name not in params}
        return {**params, **missing} if missing else params

    def check_params(self, params: dict[str, Value], where: str = "params") -> None:
        """Raise UserError unless `params` names every parameter (or leaves out one that declares a default) with an
        allowed value and meets the constraints."""
        params = self.with_defaults(params)
        missing = [n for n in self.names if n not in params]
        extra = [n for n in params if n not in self.names]
        if missing or extra:
            raise UserError(f"{where}: space {self.name!r} expects parameters {self.names}; "
                            f"missing {missing}, unknown {extra}")
        for p in self.parameters:
            try:
                p.index(params[p.name])
            except KeyError:
                raise UserError(f"{where}: {p.name}={params[p.name]!r} is not one of {list(p.values)}") from None
        broken = self.violated(params)
        if broken:
            raise UserError(f"{where}: {params} violates constraint {broken[0]!r} of space {self.name!r}")

    def env(self, params: dict[str, Value]) -> dict[str, Value]:
        return {**self.signature, **self.with_defaults(params)}

    def violated(self, params: dict[str, Value]) -> list[str]:
        env = self.env(params)
        return [c.text for c in self.constraints if not _holds(c, env)]

    def is_valid_genome(self, genome: Sequence[int]) -> bool:
        key = tuple(genome)
        known = self._validity.get(key)
        if known is None:  # remembered: the GA asks about the same genomes many times per generation
            known = self._validity[key] = self._check_genome(key)
        return known

    def _check_genome(self, genome: tuple[int, ...]) -> bool:
        if len(genome) != len(self.parameters):
            return False
        if any(not 0 <= g < len(p.values) for g, p in zip(genome, self.parameters)):
            return False
        env = self.env(self.genome_to_params(genome))
        return all(_holds(c, env) for c in self.constraints)

    # ---- the valid set -----------------------------------------------------------------------------------------
    @property
    def product_size(self) -> int:
        return math.prod(len(p.values) for p in self.parameters)

    def valid_genomes(self) -> list[tuple[int, ...]]:
        """Every genome meeting the constraints, in lexicographic order (cached)."""
        if self._valid is None:
            levels = self._valid_rows
            self._valid = list(map(tuple, levels.tolist())) if levels is not None else list(self._enumerate())
        return self._valid

    def count_valid(self) -> int:
        if self._valid is None:
            levels = self._valid_rows  # counted without making 10^6 tuples (loading a space counts)
            if levels is not None:
                return len(levels)
        return len(self.valid_genomes())

    @functools.cached_property
    def _valid_rows(self) -> Any:
        """The valid genomes as a numpy array (rows), or None where the depth-first walk must decide."""
        return self._enumerate_by_level()

    def random_valid_genome(self, rng: random.Random | None = None) -> list[int]:
        rng = rng or random
        valid = self.valid_genomes()
        return list(valid[rng.randrange(len(valid))])

    def _constraint_levels(self) -> tuple[list[list[Expression]], list[list[int]]]:
        """Each constraint checked at the depth of its last-bound name; the depths (genes) each depth's checks
        read."""
        depth_of = {n: i for i, n in enumerate(self.names)}
        checks: list[list[Expression]] = [[] for _ in self.names]
        for c in self.constraints:
            depths = [depth_of[n] for n in c.names if n in depth_of]
            checks[max(depths) if depths else 0].append(c)
        deps = [sorted({depth_of[n] for c in cs for n in c.names if n in depth_of}) for cs in checks]
        return checks, deps

    def _enumerate_by_level(self) -> Any:
        """The valid genomes in lexicographic order, built a gene at a time over every valid prefix at once (numpy
        rows; many times faster than the depth-first walk for spaces of 10^6 configurations). A depth's checks read
        only some genes: their verdict is computed once per combination of those. None when the prefixes of some
        depth would outgrow the enumeration limit (the depth-first walk then decides)."""
        import numpy as np

        if not self.names:
            return np.zeros((0, 0), dtype=np.int32)
        checks, deps = self._constraint_levels()
        env: dict[str, Value] = dict(self.signature)
        prefixes = np.zeros((1, 0), dtype=np.int32)
        for d, p in enumerate(self.parameters):
            n = len(p.values)
            earlier = [k for k in deps[d] if k < d]
            if not checks[d]:
                allowed, key_of_row = np.ones((1, n), dtype=bool), np.zeros(len(prefixes), dtype=np.int64)
            else:
                # one key per combination of the earlier genes the checks read, and its verdict for each value
                radix = [len(self.parameters[k].values) for k in earlier]
                weights = np.array([math.prod(radix[j + 1:]) for j in range(len(earlier))], dtype=np.int64)
                codes = prefixes[:, earlier].astype(np.int64) @ weights
                keys, key_of_row = np.unique(codes, return_inverse=True)
                key_of_row = key_of_row.reshape(-1)
                allowed = np.zeros((len(keys), n), dtype=bool)
                for r, code in enumerate(keys.tolist()):
                    for k, w, m in zip(earlier, weights.tolist(), radix):
                        q = self.parameters[k]
                        env[q.name] = q.values[(code // w) % m]
                    for i, v in enumerate(p.values):
                        env[p.name] = v
                        allowed[r, i] = all(_holds(c, env) for c in checks[d])
            mask = allowed[key_of_row]  # rows x values, row-major: each prefix, then its values in order
            if int(mask.sum()) > 4 * ENUMERATION_LIMIT:
                return None
            rows, values = np.nonzero(mask)
            prefixes = np.concatenate([prefixes[rows], values[:, None].astype(np.int32)], axis=1)
        if len(prefixes) > ENUMERATION_LIMIT:
            raise UserError(f"space {self.name!r} has more than {ENUMERATION_LIMIT} valid configurations")
        return prefixes

    def _enumerate(self) -> Iterator[tuple[int, ...]]:
        # Depth-first over parameters in order; each constraint is checked as soon as its last name is bound,
        # so whole subtrees are pruned early.
        order = self.names
        # The checks made at depth d depend only on the genes their constraints name (the signature is fixed), so
        # their verdict is remembered by those genes' indices: a space of 10^6 configurations then evaluates each
        # expression a few hundred times instead of millions (loading such a space took 15-20 s before).
        checks, deps = self._constraint_levels()
        memo: list[dict[tuple[int, ...], bool]] = [{} for _ in order]
        env: dict[str, Value] = dict(self.signature)
        genome = [0] * len(order)
        count = 0

        def walk(d: int) -> Iterator[tuple[int, ...]]:
            nonlocal count
            p = self.parameters[d]
            cs, dd, seen = checks[d], deps[d], memo[d]
            for i, v in enumerate(p.values):
                env[p.name] = v
                genome[d] = i
                if cs:
                    key = tuple(genome[k] for k in dd)
                    ok = seen.get(key)
                    if ok is None:
                        ok = seen[key] = all(_holds(c, env) for c in cs)
                    if not ok:
                        continue
                if d + 1 == len(order):
                    count += 1
                    if count > ENUMERATION_LIMIT:
                        raise UserError(f"space {self.name!r} has more than {ENUMERATION_LIMIT} valid configurations")
                    yield tuple(genome)
                else:
                    yield from walk(d + 1)

        if order:
            yield from walk(0)


def _holds(expr: Expression, env: dict[str, Value]) -> bool:
    try:
        return bool(expr(env))
    except (ZeroDivisionError, OverflowError, ValueError, TypeError):
        return False


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a space file; every problem is a UserError naming the file and key."""
    path = Path(path)
    return SearchSpace.from_text(read_space_text(path, f"{path}: cannot read space file"), path)


def read_space_text(path: Path, cannot: str) -> str:
    """A space file's text; a missing or unreadable file is a UserError starting with `cannot`."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{cannot}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: malformed TOML: not UTF-8 text (byte {exc.start})") from None


def resolve_space_arg(arg: str) -> Path:
    """A space given on the command line: a path, or the name of a shipped space (a family's spaces/, or
    search_spaces/)."""
    from evoengineer.paths import space_file

    p = Path(arg)
    if p.exists() or p.suffix == ".toml" or "/" in arg:
        return p
    candidate = space_file(f"{arg}.toml")
    if candidate.exists():
        return candidate
    known = ", ".join(q.stem for q in shipped_spaces())
    raise UserError(f"--space {arg}: no such file, and not a shipped space (known: {known}; "
                    "python -m evoengineer spaces lists them)")


def shipped_spaces() -> list[Path]:
    from evoengineer.paths import shipped_space_files

    return shipped_space_files()


# ---- parsing ----------------------------------------------------------------------------------------------------
def _scalar_ok(v: Any) -> bool:
    return isinstance(v, (bool, int, float, str))


def _parse_parameter(name: str, spec: Any, where: str) -> Parameter:
    key = f"{where}: parameters.{name}"
    if not name.isidentifier() or keyword.iskeyword(name):
        raise UserError(f"{key}: parameter names must be identifiers (and not Python keywords)")
    if name in TOP_KEYS:
        raise UserError(f"{key}: {name!r} is a top-level key; in TOML every key after [parameters] belongs to "
                        "that table, so write it above the first [table] header")
    ordinal = True
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, dict):
        unknown = set(spec) - {"values", "ordered", "type", "range", "step", "default"}
        if unknown:
            raise UserError(f"{key}: unknown key(s) {sorted(unknown)}")
        kinds_given = [k for k in ("values", "type", "range") if k in spec]
        if len(kinds_given) > 1:
            raise UserError(f"{key}: give only one of values, range or type (got {', '.join(kinds_given)})")
        if "step" in spec and "range" not in spec:
            raise UserError(f"{key}: step only goes with range = [lo, hi]")
        if spec.get("type") == "bool":
            values, ordinal = [False, True], False
        elif "type" in spec:
            raise UserError(f"{key}: type must be \"bool\" (got {spec['type']!r})")
        elif "range" in spec:
            rng, step = spec["range"], spec.get("step", 1)
            if (not isinstance(rng, list) or len(rng) != 2 or not all(type(x) is int for x in rng)
                    or type(step) is not int or step <= 0 or rng[0] > rng[1]):
                raise UserError(f"{key}: range must be [lo, hi] integers with lo <= hi and a positive integer step")
            values = list(range(rng[0], rng[1] + 1, step))
        elif "values" in spec:
            values = spec["values"]
        else:
            raise UserError(f"{key}: give values = [...], range = [lo, hi] (with step), or type = \"bool\"")
        if "ordered" in spec:
            if not isinstance(spec["ordered"], bool):
                raise UserError(f"{key}: ordered must be true or false")
            ordinal = spec["ordered"]
    else:
        raise UserError(f"{key}: expected a list of values or a table")
    if not isinstance(values, list) or not values:
        raise UserError(f"{key}: needs at least one value")
    if not all(_scalar_ok(v) for v in values):
        raise UserError(f"{key}: values must be numbers, booleans or strings")
    kinds = {bool if isinstance(v, bool) else (float if isinstance(v, (int, float)) else str) for v in values}
    if len(kinds) > 1:
        raise UserError(f"{key}: values mix types {sorted(k.__name__ for k in kinds)}")
    texts = [canonical_text(v) for v in values]
    # 1 and 1.0 are one value too: they would name the same configuration twice
    numeric = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(set(texts)) != len(texts) or len(set(numeric)) != len(numeric):
        raise UserError(f"{key}: repeated values")
    if kinds == {bool} and not (isinstance(spec, dict) and "ordered" in spec):
        ordinal = False
    param = Parameter(name, tuple(values), ordinal)
    if isinstance(spec, dict) and "default" in spec:
        try:
            param = Parameter(name, tuple(values), ordinal, values[param.index(spec["default"])])
        except KeyError:
            raise UserError(f"{key}: default {spec['default']!r} is not one of its values {values}") from None
    return param


def _parse(data: dict, text: str, path: Path | None, where: str, check_valid: bool = True) -> SearchSpace:
    unknown = set(data) - set(TOP_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {sorted(unknown)} (known: {', '.join(TOP_KEYS)})")
    for req in ("name", "template", "task", "backend", "parameters"):
        if req not in data:
            raise UserError(f"{where}: missing required key {req!r}")
    for key in ("name", "template", "task", "backend"):
        if not isinstance(data[key], str) or not data[key]:
            raise UserError(f"{where}: {key} must be a non-empty string")
    backend = data["backend"]
    if backend not in BACKENDS:
        raise UserError(f"{where}: backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    arch = data.get("arch")
    if BACKENDS[backend].needs_arch and not (isinstance(arch, str) and ARCH.fullmatch(arch)):
        raise UserError(f"{where}: arch: a {backend} space needs arch = \"sm_XX\" (e.g. \"sm_90\", \"sm_90a\"), "
                        f"got {arch!r}")
    if not BACKENDS[backend].needs_arch and arch is not None:
        raise UserError(f"{where}: arch: only spaces of a backend with a device compiler (cuda) take an arch")

    template_path = _resolve_template(data["template"], path, where, task=data.get("task"))

    if not isinstance(data["parameters"], dict) or not data["parameters"]:
        raise UserError(f"{where}: parameters must be a non-empty table")
    parameters = [_parse_parameter(n, s, where) for n, s in data["parameters"].items()]

    signature = data.get("signature", {})
    if not isinstance(signature, dict) or not all(_scalar_ok(v) or isinstance(v, list) for v in signature.values()):
        raise UserError(f"{where}: signature must be a table of numbers, booleans or strings")
    variant_axes: dict[str, list[Value]] = {}
    for k, v in signature.items():  # a list: one variant per value (searched one after another, elites per variant)
        if not isinstance(v, list):
            continue
        if not v or not all(_scalar_ok(x) for x in v) or len({canonical_text(x) for x in v}) != len(v):
            raise UserError(f"{where}: signature.{k}: variants are a non-empty list of distinct numbers, booleans or "
                            "strings")
        variant_axes[k] = list(v)
    signature = {k: (v[0] if isinstance(v, list) else v) for k, v in signature.items()}
    clash = set(signature) & {p.name for p in parameters}
    if clash:
        raise UserError(f"{where}: signature: {sorted(clash)} are also parameters")

    names = [p.name for p in parameters] + list(signature)
    raw_constraints = data.get("constraints", [])
    if not isinstance(raw_constraints, list) or not all(isinstance(c, str) for c in raw_constraints):
        raise UserError(f"{where}: constraints must be a list of strings")
    constraints = []
    for i, c in enumerate(raw_constraints):
        try:
            constraints.append(Expression(c, names))
        except ExprError as exc:
            raise UserError(f"{where}: constraints[{i}] {c!r}: {exc}") from None

    gates = data.get("gates", {})
    if not isinstance(gates, dict):
        raise UserError(f"{where}: gates must be a table")
    for k, v in gates.items():
        if k not in KNOWN_GATES:
            raise UserError(f"{where}: gates.{k}: unknown gate (known: {', '.join(KNOWN_GATES)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise UserError(f"{where}: gates.{k}: must be a non-negative number")

    shapes = data.get("shapes", [])
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        raise UserError(f"{where}: shapes must be an array of tables ([[shapes]])")
    seen = set()
    for i, s in enumerate(shapes):
        if not isinstance(s.get("name"), str):
            raise UserError(f"{where}: shapes[{i}]: needs a name")
        if s["name"] in seen:
            raise UserError(f"{where}: shapes[{i}]: repeated name {s['name']!r}")
        seen.add(s["name"])

    build = data.get("build", {})
    if not isinstance(build, dict) or set(build) - set(BUILD_KEYS):
        raise UserError(f"{where}: build: allowed keys are {', '.join(BUILD_KEYS)}")
    for k in BUILD_KEYS:
        v = build.get(k, [])
        if not isinstance(v, list) or not all(isinstance(f, str) for f in v):
            raise UserError(f"{where}: build.{k} must be a list of strings")
        check_flags(v, where, k)  # they reach /bin/sh through ninja: one whitelisted token each

    search = data.get("search", {})
    if not isinstance(search, dict):
        raise UserError(f"{where}: search must be a table")
    for k, v in search.items():
        if k not in SEARCH_KEYS:
            raise UserError(f"{where}: search.{k}: unknown key (known: {', '.join(SEARCH_KEYS)})")
        if type(v) is not int or v < 0:
            raise UserError(f"{where}: search.{k}: must be a non-negative integer")
    evaluation = data.get("evaluation", {})
    if not isinstance(evaluation, dict):
        raise UserError(f"{where}: evaluation must be a table")

    space = SearchSpace(
        name=data["name"], description=str(data.get("description", "")), template=data["template"],
        template_path=template_path, task=data["task"], backend=backend, arch=arch, parameters=parameters,
        signature=dict(signature), constraints=constraints, gates=dict(gates), shapes=shapes,
        build_flags=tuple(build.get("flags", [])), cuda_flags=tuple(build.get("cuda_flags", [])),
        ldflags=tuple(build.get("ldflags", [])), search=dict(search), evaluation=dict(evaluation), path=path, text=text,
        variant_axes=variant_axes)
    if check_valid and constraints and space.count_valid() == 0:
        raise UserError(f"{where}: constraints exclude every configuration of the {space.product_size} in the space")
    return space


def _array_end(text: str, start: int) -> int:
    """The index just past the TOML array opening at text[start] ('['), strings and comments skipped."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            quote = ch
            i += 1
            while i < n and text[i] != quote:
                i += 2 if (text[i] == "\\" and quote == '"') else 1
        elif ch == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _with_signature_values(text: str, values: dict[str, Value], where: str) -> str:
    """`text` with each [signature] list named in `values` replaced by that value, checked by parsing it back."""
    import re

    from evoengineer.space.extends import toml_value

    header = re.search(r"^[ \t]*\[signature\][ \t]*(#.*)?$", text, re.M)
    if header is None:
        raise UserError(f"{where}: variants need a [signature] table")
    end_match = re.compile(r"^[ \t]*\[", re.M).search(text, header.end())
    body_end = end_match.start() if end_match else len(text)
    out = text
    for k, v in values.items():
        body = out[header.end():body_end]
        m = re.search(rf"^([ \t]*{re.escape(k)}[ \t]*=[ \t]*)\[", body, re.M)
        if m is None:
            raise UserError(f"{where}: signature.{k}: write its variants as {k} = [...] inside [signature]")
        start = header.end() + m.end() - 1
        stop = _array_end(out, start)
        if stop < 0:
            raise UserError(f"{where}: signature.{k}: unterminated list")
        new = toml_value(v)
        out = out[:start] + new + out[stop:]
        body_end += len(new) - (stop - start)
    try:
        data, orig = tomllib.loads(out), tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: signature variants: {exc}") from None
    want = {k: (values[k] if k in values else v) for k, v in orig.get("signature", {}).items()}
    if data.get("signature") != want or {k: v for k, v in data.items() if k != "signature"} != \
            {k: v for k, v in orig.items() if k != "signature"}:
        raise UserError(f"{where}: signature variants: could not write the variant {values} (write each list "
                        "on its own line inside [signature])")
    return out


def _family_folder(task: Any, path: Path | None) -> Path | None:
    """The folder of the family a space's `task` names (an installed family's templates live there), or None when
    it cannot be found (the search says why when it needs the family)."""
    from evoengineer.registry import family_folder

    return family_folder(task, path.parent if path is not None else None)


def _resolve_template(template: str, path: Path | None, where: str, task: Any = None) -> Path:
    """The template file: relative to the space file's folder, else to the shipped templates folder, else to the
    folder of the space's family (an installed family brings its templates), else to a shipped family's folder (where
    the shipped templates live, `cuda/NAME.cu.j2`), and inside that folder once symlinks
    are resolved. A space file may come from anyone, and its template becomes the kernel source (stored,
    exported): an absolute path, a '..' or a symlink out of the folder could make it any file at all."""
    from evoengineer.paths import shipped_family_dirs

    roots = ([path.parent.resolve()] if path is not None else []) + [TEMPLATES_DIR.resolve()]
    t = Path(template)
    if not any((r / t).exists() for r in roots) and not t.is_absolute() and ".." not in t.parts:
        folder = _family_folder(task, path)
        # the space's family first, then every shipped family (a space may render a shipped template by its name)
        for extra in [folder, *(d.resolve() for d in shipped_family_dirs())]:
            if extra is not None and extra not in roots:
                roots.append(extra)
    inside = ("a template must lie inside the space file's folder, the shipped templates folder "
              f"({TEMPLATES_DIR.resolve()}) or its family's folder")
    if t.is_absolute() or template.startswith("~"):
        raise UserError(f"{where}: template: {template!r} is an absolute path; {inside}")
    if ".." in t.parts:
        raise UserError(f"{where}: template: {template!r} climbs out of its folder with '..'; {inside}")
    for root in roots:
        c = root / t
        if not (c.exists() or c.is_symlink()):
            continue
        real = c.resolve()
        if not real.is_relative_to(root):
            raise UserError(f"{where}: template: {template!r} is {c}, which resolves to {real}, outside {root} "
                            f"(a symlink?); {inside}")
        if real.is_file():
            return real
    raise UserError(f"{where}: template: {template!r} not found (looked in {', '.join(str(r) for r in roots)})")
