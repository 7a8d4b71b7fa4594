"""Rendering a candidate: StrictUndefined, params validated first, and the identity hash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from evoengineer.candidate import CandidateFactory, candidate_hash, render, template_sha256
from evoengineer.errors import UserError
from evoengineer.space import SearchSpace, load_space

SPACE = """name = "r"
template = "k.j2"
task = "t"
backend = "cuda"
arch = "sm_90"
constraints = ["A * B <= 8"]

[signature]
D = 32

[parameters]
A = [1, 2, 4]
B = { values = [1, 2, 4], ordered = false }
F = { type = "bool" }
S = { values = ["x", "y"], ordered = false }
R = [0.5, 1.0]

[build]
flags = ["-O3"]
"""
TEMPLATE = "int a = {{ A }}; int b = {{ B }}; bool f = {{ 'true' if F else 'false' }}; // {{ S }} {{ R }} D={{ D }}\n"
PARAMS = {"A": 2, "B": 4, "F": True, "S": "y", "R": 0.5}


def make_space(d: Path, text: str = SPACE, template: str = TEMPLATE, name: str = "s.toml") -> SearchSpace:
    (d / "k.j2").write_text(template)
    (d / name).write_text(text)
    return load_space(d / name)


def factory_hash(d: Path, text: str = SPACE, template: str = TEMPLATE, params: dict = PARAMS) -> str:
    return CandidateFactory(make_space(d, text, template)).make(params).hash


def test_render_source_and_candidate_fields(tmp_path: Path):
    s = make_space(tmp_path)
    assert render(s, PARAMS) == "int a = 2; int b = 4; bool f = true; // y 0.5 D=32\n"
    c = CandidateFactory(s).make(PARAMS)
    assert c.source == render(s, PARAMS)
    assert c.params == PARAMS and list(c.params) == s.names
    assert c.space_name == "r" and c.backend == "cuda" and c.arch == "sm_90" and c.build_flags == ("-O3",)
    assert c.signature == {"D": 32}
    assert len(c.hash) == 64 and c.short == c.hash[:12]
    g = s.params_to_genome(PARAMS)
    assert CandidateFactory(s).from_genome(g) == c


# ---- StrictUndefined -------------------------------------------------------------------------------------------
def test_undefined_name_fails_naming_the_template(tmp_path: Path):
    s = make_space(tmp_path, template="int a = {{ A }};\nint x = {{ NOT_A_PARAM }};\n")
    with pytest.raises(UserError) as ei:
        render(s, PARAMS)
    msg = str(ei.value)
    assert str(s.template_path) in msg and "NOT_A_PARAM" in msg and "undefined" in msg
    with pytest.raises(UserError, match="NOT_A_PARAM"):
        CandidateFactory(s).make(PARAMS)


@pytest.mark.parametrize("template", [
    "{{ NOPE + 1 }}",
    "{% for i in range(NOPE) %}x{% endfor %}",
    "{{ A.nope }}",
    "{% if NOPE %}x{% endif %}",
])
def test_strict_undefined_in_every_use(tmp_path: Path, template: str):
    s = make_space(tmp_path, template=template)
    with pytest.raises(UserError, match="k.j2"):
        render(s, PARAMS)


def test_defined_test_is_allowed(tmp_path: Path):
    s = make_space(tmp_path, template="{% if NOPE is defined %}x{% else %}{{ A }}{% endif %}")
    assert render(s, PARAMS) == "2"


def test_template_syntax_error_names_template_and_line(tmp_path: Path):
    s = make_space(tmp_path, template="ok\nok\n{% if A %}never closed\n")
    with pytest.raises(UserError) as ei:
        render(s, PARAMS)
    assert f"{s.template_path}:" in str(ei.value) and "template error" in str(ei.value)
    with pytest.raises(UserError, match="k.j2"):
        CandidateFactory(s)


# ---- params validated before rendering ---------------------------------------------------------------------------
# The template would fail on render: the params error must come first, so nothing was rendered.
@pytest.mark.parametrize("params, words", [
    ({**PARAMS, "A": 3}, ["A=3", "not one of"]),
    ({**PARAMS, "S": "z"}, ["S='z'"]),
    ({**PARAMS, "F": 1}, ["F=1"]),
    ({k: v for k, v in PARAMS.items() if k != "B"}, ["missing ['B']"]),
    ({**PARAMS, "Z": 1}, ["unknown ['Z']"]),
    ({**PARAMS, "A": 4, "B": 4}, ["violates constraint", "A * B <= 8"]),
])
def test_params_validated_before_render(tmp_path: Path, params: dict, words: list[str]):
    s = make_space(tmp_path, template="{{ UNDEFINED_SO_RENDER_WOULD_FAIL }}")
    with pytest.raises(UserError) as ei:
        render(s, params)
    for w in words:
        assert w in str(ei.value)
    assert "UNDEFINED_SO_RENDER_WOULD_FAIL" not in str(ei.value)
    good = make_space(tmp_path)
    with pytest.raises(UserError) as ei:
        CandidateFactory(good).make(params)
    for w in words:
        assert w in str(ei.value)


# ---- the hash ------------------------------------------------------------------------------------------------------
def test_hash_is_stable(tmp_path: Path):
    s = make_space(tmp_path)
    h = CandidateFactory(s).make(PARAMS).hash
    assert CandidateFactory(s).make(PARAMS).hash == h
    assert CandidateFactory(load_space(tmp_path / "s.toml")).make(PARAMS).hash == h  # reloaded space
    assert CandidateFactory(s).make(dict(reversed(list(PARAMS.items())))).hash == h  # key order
    assert candidate_hash(s, PARAMS, template_sha256(s)) == h
    # the same space in another folder, same template text: the hash is about content, not paths
    other = tmp_path / "other"
    other.mkdir()
    assert factory_hash(other) == h
    # unrelated parts of the file do not change it
    assert factory_hash(other, SPACE.replace('name = "r"', 'name = "r"\ndescription = "words"')) == h
    assert factory_hash(other, SPACE + "\n[search]\npopulation = 4\nseed = 3\n") == h
    assert factory_hash(other, SPACE.replace("constraints = [", 'constraints = ["A >= 1", ')) == h


def test_hash_is_stable_across_processes(tmp_path: Path):
    s = make_space(tmp_path)
    h = CandidateFactory(s).make(PARAMS).hash
    code = ("import sys; from evoengineer.space import load_space; from evoengineer.candidate import CandidateFactory;"
            f"print(CandidateFactory(load_space(sys.argv[1])).make({PARAMS!r}).hash)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.toml")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == h


def test_equal_values_of_other_numeric_type_hash_alike(tmp_path: Path):
    s = make_space(tmp_path)
    f = CandidateFactory(s)
    a = f.make(PARAMS)
    b = f.make({**PARAMS, "R": 1})  # 1 for the space's 1.0
    c = f.make({**PARAMS, "R": 1.0})
    assert b.hash == c.hash and b.params == c.params and type(b.params["R"]) is float
    assert b.source == c.source
    assert a.hash != b.hash


@pytest.mark.parametrize("change", [
    "template", "param", "arch", "signature", "signature_added", "build_flags", "build_flags_order",
    "backend_template_same",
])
def test_hash_changes(tmp_path: Path, change: str):
    (tmp_path / "a").mkdir()
    base = factory_hash(tmp_path / "a")
    d = tmp_path / "b"
    d.mkdir()
    text, template, params = SPACE, TEMPLATE, PARAMS
    if change == "template":
        template = TEMPLATE + "// one more line\n"
    elif change == "param":
        params = {**PARAMS, "A": 1}
    elif change == "arch":
        text = SPACE.replace("sm_90", "sm_80")
    elif change == "signature":
        text = SPACE.replace("D = 32", "D = 64")
    elif change == "signature_added":
        text = SPACE.replace("D = 32", "D = 32\nE = 1")
    elif change == "build_flags":
        text = SPACE.replace('flags = ["-O3"]', 'flags = ["-O2"]')
    elif change == "build_flags_order":
        text = SPACE.replace('flags = ["-O3"]', 'flags = ["-O3", "-g"]')
    elif change == "backend_template_same":
        text = SPACE.replace('backend = "cuda"\narch = "sm_90"', 'backend = "cpu"')
    assert factory_hash(d, text, template, params) != base


@pytest.mark.parametrize("param", list(PARAMS))
def test_hash_changes_with_each_param(tmp_path: Path, param: str):
    s = make_space(tmp_path)
    f = CandidateFactory(s)
    others = [v for v in next(p for p in s.parameters if p.name == param).values if v != PARAMS[param]]
    changed = {**PARAMS, param: others[0]}
    if s.violated(changed):
        changed = {**changed, "A": 1}
    assert f.make(changed).hash != f.make(PARAMS).hash


def test_hash_changes_with_other_build_keys(tmp_path: Path):
    base = factory_hash(tmp_path)
    for extra in ('ldflags = ["-lm"]', 'cuda_flags = ["--use_fast_math"]'):
        d = tmp_path / extra[:6]
        d.mkdir()
        assert factory_hash(d, SPACE.replace('flags = ["-O3"]', f'flags = ["-O3"]\n{extra}')) != base


def test_hash_covers_included_templates(tmp_path: Path):
    (tmp_path / "part.j2").write_text("// part v1\n")
    main = TEMPLATE + '{% include "part.j2" %}'
    s = make_space(tmp_path, template=main)
    h1 = CandidateFactory(s).make(PARAMS)
    assert "part v1" in h1.source
    (tmp_path / "part.j2").write_text("// part v2\n")
    h2 = CandidateFactory(s).make(PARAMS)
    assert "part v2" in h2.source and h2.hash != h1.hash


def test_factory_source_always_matches_its_hash(tmp_path: Path):
    """A template edited during a run: the factory keeps rendering the text its hashes describe."""
    s = make_space(tmp_path)
    f = CandidateFactory(s)
    before = f.make(PARAMS)
    (tmp_path / "k.j2").write_text("// edited\n" + TEMPLATE)
    after = f.make(PARAMS)
    assert after.hash == before.hash and after.source == before.source
    fresh = CandidateFactory(s).make(PARAMS)
    assert fresh.hash != before.hash and fresh.source.startswith("// edited")
