"""Search-space files: parameter kinds, constraints (and their whitelist), errors, genome <-> params, `spaces`."""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest

from conftest import DATA
from evoengineer.errors import UserError
from evoengineer.space import Parameter, SearchSpace, load_space
from evoengineer.space.expr import Expression, ExprError

HEADER = 'name = "t"\ntemplate = "t.j2"\ntask = "t"\nbackend = "cpu"\n'


@pytest.fixture
def sdir(tmp_path: Path) -> Path:
    (tmp_path / "t.j2").write_text("{{ A }}\n")
    return tmp_path


def space_from(sdir: Path, body: str, header: str = HEADER) -> SearchSpace:
    path = sdir / "s.toml"
    path.write_text(header + body)
    return load_space(path)


def error_of(sdir: Path, body: str, header: str = HEADER) -> str:
    with pytest.raises(UserError) as ei:
        space_from(sdir, body, header)
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(sdir / "s.toml") in msg, msg  # every message names the file
    return msg


# ---- parameter kinds --------------------------------------------------------------------------------------------
def test_parameter_kinds(sdir: Path):
    s = space_from(sdir, """
[parameters]
A = [8, 2, 4]
B = { values = ["x", "y", "z"], ordered = false }
C = { type = "bool" }
D = { range = [1, 9], step = 4 }
E = { range = [3, 5] }
F = [0.5, 0.25]
G = { values = [1, 2] }
""")
    by = {p.name: p for p in s.parameters}
    assert s.names == ["A", "B", "C", "D", "E", "F", "G"]  # file order
    assert by["A"] == Parameter("A", (8, 2, 4), True)  # value order preserved, not sorted
    assert by["B"] == Parameter("B", ("x", "y", "z"), False)
    assert by["C"] == Parameter("C", (False, True), False)
    assert by["D"].values == (1, 5, 9)  # inclusive
    assert by["E"].values == (3, 4, 5)
    assert by["F"].values == (0.5, 0.25) and by["F"].ordinal
    assert by["G"].ordinal
    assert s.product_size == 3 * 3 * 2 * 3 * 3 * 2 * 2
    assert s.count_valid() == s.product_size  # no constraints
    assert all(type(v) is bool for v in by["C"].values)


def test_range_step_not_reaching_hi(sdir: Path):
    s = space_from(sdir, "[parameters]\nA = { range = [0, 10], step = 3 }\n")
    assert s.parameters[0].values == (0, 3, 6, 9)
    s = space_from(sdir, "[parameters]\nA = { range = [4, 4] }\n")
    assert s.parameters[0].values == (4,)


def test_bool_lists_are_categorical_unless_ordered(sdir: Path):
    s = space_from(sdir, "[parameters]\nA = [true, false]\nB = { values = [false, true] }\n"
                         "C = { values = [false, true], ordered = true }\n")
    assert [p.ordinal for p in s.parameters] == [False, False, True]


def test_ordered_false_on_a_range(sdir: Path):
    s = space_from(sdir, "[parameters]\nA = { range = [1, 3], ordered = false }\n")
    assert s.parameters[0] == Parameter("A", (1, 2, 3), False)


def test_toy_space_loads():
    s = load_space(DATA / "toy_space.toml")
    assert s.names == ["NUM_WARPS", "NUM_PRODUCER_WARPS", "STAGES", "QUERIES_PER_BLOCK", "D_STRIDE",
                       "USE_FAST_EXP", "LOOP_ORDER"]
    assert s.signature == {"D": 32}
    assert s.backend == "cuda" and s.arch == "sm_90"
    assert s.build_flags == ("-O3",)
    assert s.gates == {"max_registers": 128, "max_spill_bytes": 0}


@pytest.mark.parametrize("body, words", [
    ("A = []\n", ["parameters.A", "at least one value"]),
    ("A = 3\n", ["parameters.A", "list of values or a table"]),
    ("A = [1, true]\n", ["parameters.A", "mix types"]),
    ("A = [1, \"x\"]\n", ["parameters.A", "mix types"]),
    ("A = [[1], [2]]\n", ["parameters.A", "numbers, booleans or strings"]),
    ("A = [1, 2, 1]\n", ["parameters.A", "repeated"]),
    ("A = [1, 1.0]\n", ["parameters.A", "repeated"]),
    ("A = { range = [3, 1] }\n", ["parameters.A", "range"]),
    ("A = { range = [1, 3], step = 0 }\n", ["parameters.A", "step"]),
    ("A = { range = [1, 3], step = -1 }\n", ["parameters.A", "step"]),
    ("A = { range = [1.5, 3] }\n", ["parameters.A", "integers"]),
    ("A = { range = [1] }\n", ["parameters.A", "range"]),
    ("A = { type = \"int\" }\n", ["parameters.A", "type"]),
    ("A = { values = [1, 2], colour = 1 }\n", ["parameters.A", "colour"]),
    ("A = { values = [1, 2], ordered = \"yes\" }\n", ["parameters.A", "ordered"]),
    ("A = { values = [1, 2], range = [1, 3] }\n", ["parameters.A", "only one"]),
    ("A = { type = \"bool\", values = [1, 2] }\n", ["parameters.A", "only one"]),
    ("A = { values = [1, 2], step = 2 }\n", ["parameters.A", "step"]),
    ("A = { ordered = true }\n", ["parameters.A", "values"]),
    ("A = { values = [1, 2], default = 3 }\n", ["parameters.A", "default 3", "not one of"]),
    ("A = { type = \"bool\", default = 1 }\n", ["parameters.A", "default 1"]),
    ("\"A-B\" = [1, 2]\n", ["parameters.A-B", "identifier"]),
    ("if = [1, 2]\n", ["parameters.if", "keyword"]),
    ("A = [1, 2]\nconstraints = [\"A > 1\"]\n", ["parameters.constraints", "top-level key"]),
])
def test_bad_parameters(sdir: Path, body: str, words: list[str]):
    msg = error_of(sdir, "[parameters]\n" + body)
    for w in words:
        assert w in msg, msg


# ---- file-level errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["name", "template", "task", "backend", "parameters"])
def test_missing_required_key(sdir: Path, key: str):
    lines = [l for l in HEADER.splitlines() if not l.startswith(key)]
    body = "" if key == "parameters" else "[parameters]\nA = [1, 2]\n"
    msg = error_of(sdir, body, "\n".join(lines) + "\n")
    assert f"missing required key {key!r}" in msg


@pytest.mark.parametrize("text, words", [
    ("name = \"t\"\nname = \"u\"\n", ["malformed TOML"]),
    ("name = \n", ["malformed TOML"]),
    ("[parameters\nA = [1]\n", ["malformed TOML"]),
    ("A = [1, 2\n", ["malformed TOML"]),
])
def test_malformed_toml(sdir: Path, text: str, words: list[str]):
    msg = error_of(sdir, text, header="")
    for w in words:
        assert w in msg
    assert "line" in msg or "end of document" in msg  # where in the file


def test_not_utf8_is_a_user_error(sdir: Path):
    p = sdir / "s.toml"
    p.write_bytes(b"name = \"\xff\xfe\"\n")
    with pytest.raises(UserError, match="s.toml"):
        load_space(p)


def test_unreadable_file(sdir: Path):
    with pytest.raises(UserError, match="nope.toml: cannot read space file"):
        load_space(sdir / "nope.toml")
    with pytest.raises(UserError, match="cannot read space file"):
        load_space(sdir)  # a directory


@pytest.mark.parametrize("extra, words", [
    ("colour = 1\n", ["unknown key", "colour"]),
    ("backend2 = 1\n", ["unknown key"]),
])
def test_unknown_top_level_key(sdir: Path, extra: str, words: list[str]):
    msg = error_of(sdir, extra + "[parameters]\nA = [1, 2]\n")
    for w in words:
        assert w in msg


@pytest.mark.parametrize("header, words", [
    (HEADER.replace('"cpu"', '"fpga"'), ["backend"]),
    (HEADER.replace('"cpu"', '"cuda"'), ["arch"]),
    (HEADER.replace('"cpu"', '"cuda"') + 'arch = "90"\n', ["arch"]),
    (HEADER + 'arch = "sm_90"\n', ["arch"]),
    (HEADER.replace('name = "t"', 'name = ""'), ["name"]),
    (HEADER.replace('name = "t"', 'name = 3'), ["name"]),
    (HEADER + "parameters = []\n", ["parameters"]),
    (HEADER + "constraints = \"A > 1\"\n", ["constraints must be a list of strings"]),
    (HEADER + "constraints = [1]\n", ["constraints must be a list of strings"]),
    (HEADER + "[signature]\nA = 3\n", ["signature", "A"]),
    (HEADER + "[signature]\nX = { a = 1 }\n", ["signature"]),
    (HEADER + "[gates]\nmax_cats = 1\n", ["gates.max_cats"]),
    (HEADER + "[gates]\nmax_registers = -1\n", ["gates.max_registers"]),
    (HEADER + "[search]\npopulation = -1\n", ["search.population"]),
    (HEADER + "[search]\npopulation = true\n", ["search.population"]),
    (HEADER + "[search]\nspeed = 1\n", ["search.speed"]),
    (HEADER + "[build]\nflags = \"-O3\"\n", ["build.flags"]),
    (HEADER + "[build]\ncolour = [\"x\"]\n", ["build"]),
    (HEADER + "[[shapes]]\nN = 1\n", ["shapes[0]", "name"]),
    (HEADER + "[[shapes]]\nname = \"a\"\n[[shapes]]\nname = \"a\"\n", ["shapes[1]", "repeated"]),
])
def test_bad_top_level_values(sdir: Path, header: str, words: list[str]):
    # tables in the header come after its top-level keys; the [parameters] table is appended last
    body = "" if "parameters = []" in header else "[parameters]\nA = [1, 2]\n"
    msg = error_of(sdir, body, header)
    for w in words:
        assert w in msg, msg


def test_missing_template(sdir: Path):
    msg = error_of(sdir, "[parameters]\nA = [1, 2]\n", HEADER.replace('"t.j2"', '"missing.j2"'))
    assert "template" in msg and "missing.j2" in msg and "not found" in msg


def test_template_found_next_to_the_space_file_never_absolute(sdir: Path, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere")
    (other / "abs.j2").write_text("{{ A }}")
    # an absolute path could make any file the kernel source (see test_space_security.py)
    msg = error_of(sdir, "[parameters]\nA = [1, 2]\n", HEADER.replace('"t.j2"', f'"{other / "abs.j2"}"'))
    assert "template" in msg and repr(str(other / "abs.j2")) in msg and "absolute path" in msg
    s = space_from(sdir, "[parameters]\nA = [1, 2]\n")
    assert s.template_path == (sdir / "t.j2").resolve()


# ---- constraints ------------------------------------------------------------------------------------------------
CONSTRAINED = """
constraints = [
  "A * B <= 32",
  "1 <= C < D or not E",
  "min(A, B) >= 2 or max(A, C, D) == 8",
  "(A + B) % 3 != 1 and A // 2 - B ** 2 / 4 > -20",
  "A - K < 6",
]
[signature]
K = 2
[parameters]
A = [1, 2, 4, 8]
B = { range = [1, 6] }
C = { values = [0, 1, 2, 3], ordered = false }
D = [1, 4]
E = { type = "bool" }
"""


def brute_force_valid(values: dict[str, tuple], sig: dict) -> list[dict]:
    out = []
    for combo in itertools.product(*values.values()):
        p = dict(zip(values, combo))
        A, B, C, D, E, K = p["A"], p["B"], p["C"], p["D"], p["E"], sig["K"]
        ok = (A * B <= 32 and (1 <= C < D or not E) and (min(A, B) >= 2 or max(A, C, D) == 8)
              and ((A + B) % 3 != 1 and A // 2 - B ** 2 / 4 > -20) and A - K < 6)
        if ok:
            out.append(p)
    return out


def test_count_valid_equals_brute_force(sdir: Path):
    s = space_from(sdir, CONSTRAINED)
    values = {p.name: p.values for p in s.parameters}
    expected = brute_force_valid(values, {"K": 2})
    assert 0 < len(expected) < s.product_size
    assert s.count_valid() == len(expected)
    got = [s.genome_to_params(g) for g in s.valid_genomes()]
    assert got == expected  # same configurations, in lexicographic (product) order
    # every genome of the product: is_valid_genome agrees with the brute force
    valid_keys = {tuple(p.values()) for p in expected}
    for g in itertools.product(*(range(len(p.values)) for p in s.parameters)):
        params = s.genome_to_params(g)
        assert s.is_valid_genome(g) == (tuple(params.values()) in valid_keys)
        assert (s.violated(params) == []) == (tuple(params.values()) in valid_keys)


def test_count_valid_toy_space_brute_force():
    s = load_space(DATA / "toy_space.toml")
    n = 0
    for combo in itertools.product(*(p.values for p in s.parameters)):
        nw, npw, st, q, ds, fe, lo = combo
        D = 32
        n += (npw < nw and st * q * 8 * ds * 2 <= 1024 and (npw == 0 or st >= 2) and D % ds == 0)
    assert s.count_valid() == n == 3732


def test_strings_only_as_a_side_of_equality(sdir: Path):
    s = space_from(sdir, 'constraints = ["L != \'b\' or A == 1", "\'c\' == L == \'c\' or L != \'c\'"]\n'
                         '[parameters]\nA = [1, 2]\nL = { values = ["a", "b", "c"], ordered = false }\n')
    assert [s.genome_to_params(g) for g in s.valid_genomes()] == [
        {"A": 1, "L": "a"}, {"A": 1, "L": "b"}, {"A": 1, "L": "c"}, {"A": 2, "L": "a"}, {"A": 2, "L": "c"}]


def test_constraint_on_signature_only(sdir: Path):
    s = space_from(sdir, 'constraints = ["K > 1"]\n[signature]\nK = 2\n[parameters]\nA = [1, 2]\n')
    assert s.count_valid() == 2
    msg = error_of(sdir, 'constraints = ["K > 2"]\n[signature]\nK = 2\n[parameters]\nA = [1, 2]\n')
    assert "exclude every configuration" in msg


def test_constraint_errors_at_evaluation_count_as_violated(sdir: Path):
    s = space_from(sdir, 'constraints = ["8 / A >= 1", "2 ** B < 100"]\n[parameters]\nA = [0, 1, 16]\nB = [1, 90]\n')
    # A = 0 divides by zero and B = 90 is an exponent beyond the limit: both just fail the constraint
    assert [s.genome_to_params(g) for g in s.valid_genomes()] == [{"A": 1, "B": 1}]


def test_constraints_exclude_everything(sdir: Path):
    msg = error_of(sdir, 'constraints = ["A > 2", "A < 2"]\n[parameters]\nA = [1, 2, 3]\nB = [1, 2]\n')
    assert "constraints exclude every configuration" in msg and "6" in msg
    msg = error_of(sdir, 'constraints = ["False"]\n[parameters]\nA = [1, 2]\n')
    assert "exclude every configuration" in msg


@pytest.mark.parametrize("expr", [
    "A + B * 2 - 1 <= 20", "A / B > 0.5", "A // B == 0", "A % B == 1", "A ** 2 < 50", "-A < +B",
    "1 < A <= B < 10", "A == 1 != B", "A > 1 and B > 1", "A > 1 or not B > 1", "not (A == B)",
    "min(A, B) < 3", "max(A, B, 4) >= 4", "True", "A > 1.5", "(A < B) == True",
])
def test_whitelist_accepts(sdir: Path, expr: str):
    s = space_from(sdir, f'constraints = ["{expr}"]\n[parameters]\nA = [1, 2, 3]\nB = [1, 2, 4]\n')
    expected = 0
    for A in (1, 2, 3):
        for B in (1, 2, 4):
            expected += bool(eval(expr, {"min": min, "max": max}, {"A": A, "B": B}))  # the test's own evaluation
    assert s.count_valid() == expected


@pytest.mark.parametrize("expr, what", [
    ("A.real > 0", "Attribute"),
    ("A.__class__ == 1", "Attribute"),
    ("B[0] > 1", "Subscript"),
    ("abs(A) > 0", "Call"),
    ("len(B) > 0", "Call"),
    ("__import__('os') == 1", "Call"),
    ("eval('1') == 1", "Call"),
    ("min.__call__(A, B) > 0", "Call"),
    ("A < 'x'", "constants"),
    ("A + 'x' == 1", "constants"),
    ("min('x', A) == 1", "constants"),
    ("'x' < A == 'x'", "constants"),
    ("A == b'x'", "constants"),
    ("A == None", "constants"),
    ("A == 1j", "constants"),
    ("(lambda: 1)() == 1", "Call"),
    ("(lambda x: x) == 1", "Lambda"),
    ("[x for x in range(3)] == 1", "ListComp"),
    ("{x for x in B} == 1", "SetComp"),
    ("sum(x for x in B) > 1", "Call"),
    ("A if B else 0", "IfExp"),
    ("(A, B) == 1", "Tuple"),
    ("[A] == 1", "List"),
    ("{A: 1} == 1", "Dict"),
    ("A in [1, 2]", "Compare"),
    ("A is 1", "Compare"),
    ("A & B", "BinOp"),
    ("A << 2 > 1", "BinOp"),
    ("~A > 1", "UnaryOp"),
    ("f'{A}' == 1", "JoinedStr"),
    ("(A := 2) > 1", "NamedExpr"),
    ("min(A) > 0", "two arguments"),
    ("min(A, B, key=A) > 0", "positional"),
    ("A >", "syntax error"),
    ("A = 1", "syntax error"),
    ("import os", "syntax error"),
    ("", "syntax error"),
])
def test_whitelist_rejects(sdir: Path, expr: str, what: str):
    toml_expr = expr.replace("\\", "\\\\").replace('"', '\\"')
    msg = error_of(sdir, f'constraints = ["A > 0", "{toml_expr}"]\n[parameters]\nA = [1, 2, 3]\nB = [1, 2, 4]\n')
    assert f"constraints[1] {expr!r}" in msg, msg  # names the constraint
    assert what in msg, msg


def test_unknown_name_in_constraint(sdir: Path):
    msg = error_of(sdir, 'constraints = ["A < NUM_WARPZ"]\n[parameters]\nA = [1, 2]\n')
    assert "constraints[0] 'A < NUM_WARPZ'" in msg and "unknown name 'NUM_WARPZ'" in msg
    msg = error_of(sdir, 'constraints = ["A < 3", "os > 1"]\n[parameters]\nA = [1, 2]\n')
    assert "constraints[1]" in msg and "'os'" in msg


def test_expression_is_never_evaluated_by_python(sdir: Path, monkeypatch):
    import builtins

    def boom(*a, **k):
        raise AssertionError("eval/exec used")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    e = Expression("1 < A * 2 <= max(A, 3)", ["A"])
    assert e({"A": 1}) is True and e({"A": 2}) is False


def test_expression_power_is_bounded():
    e = Expression("((((2 ** 64) ** 64) ** 64) ** 64) ** 64 > 1", [])
    with pytest.raises(ExprError):
        e({})
    with pytest.raises(ExprError):
        Expression("2 ** 65 > 1", [])({})
    assert Expression("2 ** 64 > 1", [])({}) is True


# ---- genome <-> params ------------------------------------------------------------------------------------------
def test_genome_params_round_trip(sdir: Path):
    s = space_from(sdir, CONSTRAINED)
    for g in s.valid_genomes():
        params = s.genome_to_params(g)
        assert list(params) == s.names
        assert s.params_to_genome(params) == list(g)
        s.check_params(params)
    rng = random.Random(3)
    for _ in range(50):
        g = s.random_valid_genome(rng)
        assert s.is_valid_genome(g)
        assert tuple(g) in set(s.valid_genomes())


def test_params_to_genome_rejects_bad_params(sdir: Path):
    s = space_from(sdir, CONSTRAINED)
    good = s.genome_to_params(s.valid_genomes()[0])
    with pytest.raises(UserError, match="missing"):
        s.params_to_genome({k: v for k, v in good.items() if k != "A"})
    with pytest.raises(UserError, match="unknown"):
        s.params_to_genome({**good, "Z": 1})
    with pytest.raises(UserError, match="A=3"):
        s.params_to_genome({**good, "A": 3})
    with pytest.raises(UserError, match="E="):
        s.params_to_genome({**good, "E": 1})  # a bool gene: 1 is not True
    bad = next(dict(zip(s.names, c)) for c in itertools.product(*(p.values for p in s.parameters))
               if s.violated(dict(zip(s.names, c))))
    with pytest.raises(UserError, match="violates constraint"):
        s.params_to_genome(bad)


def test_a_default_fills_genomes_recorded_before_its_gene(sdir: Path):
    """A gene added to a space with `default` lets genomes recorded without it load as that value (checks, genome,
    constraints, rendering, hash); a gene without a default stays required."""
    from evoengineer.candidate import CandidateFactory, render

    (sdir / "t.j2").write_text("{{ A }} {{ NEW }}\n")
    s = space_from(sdir, "constraints = [\"NEW == 'old' or A > 1\"]\n[parameters]\nA = [1, 2]\n"
                         "NEW = { values = [\"new\", \"old\"], ordered = false, default = \"old\" }\n")
    assert s.parameters[1] == Parameter("NEW", ("new", "old"), False, "old")
    assert s.with_defaults({"A": 1}) == {"A": 1, "NEW": "old"}
    assert s.with_defaults({"A": 1, "NEW": "new"})["NEW"] == "new"
    s.check_params({"A": 1})
    assert s.params_to_genome({"A": 1}) == [0, 1]
    assert not s.violated({"A": 1}) and s.violated({"A": 1, "NEW": "new"})
    assert render(s, {"A": 2}).strip() == "2 old"
    factory = CandidateFactory(s)
    assert factory.make({"A": 2}).hash == factory.make({"A": 2, "NEW": "old"}).hash
    assert factory.make({"A": 2}).params == {"A": 2, "NEW": "old"}
    with pytest.raises(UserError, match="missing"):
        s.check_params({"NEW": "old"})  # A has no default
    assert Parameter("B", (1, 2), True).default is None


def test_is_valid_genome_bounds(sdir: Path):
    s = space_from(sdir, "[parameters]\nA = [1, 2]\nB = [1, 2, 3]\n")
    assert s.is_valid_genome([1, 2])
    assert not s.is_valid_genome([2, 0])
    assert not s.is_valid_genome([-1, 0])
    assert not s.is_valid_genome([0])
    assert not s.is_valid_genome([0, 0, 0])


def test_float_parameter_accepts_int_value(sdir: Path):
    s = space_from(sdir, "[parameters]\nA = [1.0, 2.5]\n")
    assert s.params_to_genome({"A": 1}) == [0]
    assert s.params_to_genome({"A": 2.5}) == [1]


# ---- `spaces` command -------------------------------------------------------------------------------------------
def test_spaces_lists_shipped_spaces(capsys):
    from evoengineer import shipped_space_files
    from evoengineer.cli import main

    assert main(["spaces"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["space", "task", "backend"]
    shipped = sorted(shipped_space_files("*.toml"))
    assert len(out) == 1 + len(shipped)
    for p in shipped:
        s = load_space(p)
        line = next(l for l in out[1:] if l.endswith(p.name))
        assert line.split()[0] == s.name
        assert str(s.count_valid()) in line.split()


def test_spaces_lists_a_folder_of_spaces(tmp_path: Path, monkeypatch, capsys):
    import evoengineer.paths
    from evoengineer.cli import main

    for name in ("toy_space.toml", "toy.cpp.j2"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "b.toml").write_text((DATA / "toy_space.toml").read_text().replace('name = "toy"', 'name = "toy_b"'))
    monkeypatch.setattr(evoengineer.paths, "SPACES_DIR", tmp_path)
    monkeypatch.setattr(evoengineer.paths, "FAMILIES_DIR", tmp_path / "no_families")  # only that folder
    assert main(["spaces"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [l.split()[0] for l in out] == ["space", "toy_b", "toy"]  # by file name
    assert out[2].split() == ["toy", "toy", "cuda/sm_90", "7", "5760", "3732", "toy_space.toml"]


def test_spaces_module_entry_point(tmp_path: Path):
    """`python -m evoengineer spaces` (one subprocess: the entry point itself)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, "-m", "evoengineer", "spaces"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("space")
