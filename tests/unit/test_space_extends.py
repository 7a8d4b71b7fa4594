"""`extends` in space files (issue 55): a space written as the difference from another; the text a run stores is the
merged document, which rebuilds the space without the base file; misuse refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evoengineer.errors import UserError
from evoengineer.space import SearchSpace, load_space

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "evoengineer" / "families"

BASE = '''name = "base"
template = "k.cpp.j2"
task = "msda"
backend = "cpu"
constraints = ["BLOCK >= 2 * UNROLL"]

[signature]
L = 4
P = 4
D = 32

[parameters]
BLOCK = [2, 4, 8]
UNROLL = { values = [1, 2], ordered = false }

[evaluation]
warmup = 2
repeats = 5

[[shapes]]
name = "small"
N = 1
Lq = 8
Hs = [8, 4, 2, 1]
Ws = [8, 4, 2, 1]
M = 2
time = true
'''


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "k.cpp.j2").write_text("// {{ BLOCK }} {{ UNROLL }}\n")
    (tmp_path / "base.toml").write_text(BASE)
    return tmp_path


def _child(folder: Path, text: str, name: str = "child.toml") -> Path:
    p = folder / name
    p.write_text(text)
    return p


def test_tables_merge_key_by_key_and_values_replace_whole(folder: Path):
    p = _child(folder, 'extends = "base.toml"\nname = "child"\n\n[signature]\nD = 64\n\n[parameters]\n'
                       'UNROLL = [1, 2, 4]\n\n[evaluation]\nrepeats = 9\n')
    s, base = load_space(p), load_space(folder / "base.toml")
    assert s.name == "child" and s.signature == {"L": 4, "P": 4, "D": 64}
    assert s.names == base.names == ["BLOCK", "UNROLL"]  # file order kept: the base's
    unroll = {p.name: p for p in s.parameters}["UNROLL"]
    assert unroll.values == (1, 2, 4) and unroll.ordinal  # the whole parameter replaced (was categorical)
    assert s.evaluation["repeats"] == 9 and s.evaluation["warmup"] == 2
    assert [c.text for c in s.constraints] == ["BLOCK >= 2 * UNROLL"] and s.shapes == base.shapes


def test_the_stored_text_rebuilds_the_space_without_the_base_file(folder: Path):
    p = _child(folder, 'extends = "base.toml"\nname = "child"\n\n[signature]\nD = [32, 64]\n')
    s = load_space(p)
    assert "extends =" not in s.text and "merged: child.toml <- base.toml" in s.text
    (folder / "base.toml").unlink()
    again = SearchSpace.from_text(s.text, p)
    assert again.names == s.names and again.signature == s.signature and again.shapes == s.shapes
    assert again.variant_axes == {"D": [32, 64]}
    assert again.variant({"D": 64}).signature["D"] == 64  # variants rewrite the merged text


def test_a_chain_of_files_and_a_circle(folder: Path):
    _child(folder, 'extends = "base.toml"\nname = "mid"\n\n[parameters]\nBLOCK = [4, 8]\n', "mid.toml")
    top = _child(folder, 'extends = "mid.toml"\nname = "top"\n\n[evaluation]\nwarmup = 7\n', "top.toml")
    s = load_space(top)
    assert {p.name: p for p in s.parameters}["BLOCK"].values == (4, 8) and s.evaluation["warmup"] == 7
    assert "top.toml <- mid.toml <- base.toml" in s.text
    _child(folder, 'extends = "b.toml"\nname = "a"\n', "a.toml")
    _child(folder, 'extends = "a.toml"\nname = "b"\n', "b.toml")
    with pytest.raises(UserError, match=r"extends: a circle: a.toml -> b.toml -> a.toml"):
        load_space(folder / "a.toml")


@pytest.mark.parametrize("ref,words", [
    ("/etc/base.toml", "is an absolute path"),
    ("../base.toml", "climbs out of its folder"),
    ("missing.toml", "'missing.toml' not found"),
    ("", "expected the file name of another space file"),
])
def test_where_the_base_may_lie(folder: Path, ref: str, words: str):
    sub = folder / "sub"
    sub.mkdir()
    p = _child(sub, f'extends = "{ref}"\nname = "child"\n')
    with pytest.raises(UserError, match=words) as e:
        load_space(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
def test_a_symlink_out_of_the_folder_is_refused(folder: Path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "base.toml"
    outside.write_text(BASE)
    sub = folder / "sub"
    sub.mkdir()
    (sub / "link.toml").symlink_to(outside)
    with pytest.raises(UserError, match=r"outside .*\(a symlink\?\)"):
        load_space(_child(sub, 'extends = "link.toml"\nname = "child"\n'))


def test_an_extending_space_needs_its_own_name_and_a_folder(folder: Path):
    with pytest.raises(UserError, match="needs a name of its own"):
        load_space(_child(folder, 'extends = "base.toml"\n\n[evaluation]\nrepeats = 3\n'))
    with pytest.raises(UserError, match="a space given as text has no folder"):
        SearchSpace.from_text('extends = "base.toml"\nname = "x"\n')


def test_a_malformed_base_is_named(folder: Path):
    (folder / "bad.toml").write_text("name = \n")
    with pytest.raises(UserError, match=r"bad\.toml: malformed TOML"):
        load_space(_child(folder, 'extends = "bad.toml"\nname = "child"\n'))


def test_the_merged_space_is_checked_like_any_other(folder: Path):
    with pytest.raises(UserError, match="UNKNOWN|unknown name"):
        load_space(_child(folder, 'extends = "base.toml"\nname = "child"\nconstraints = ["UNKNOWN > 1"]\n'))


def test_shipped_spaces_that_extend_another_load_and_store_merged_text():
    extending = [p for p in sorted(SPACES.glob("*/spaces/*.toml")) if "\nextends = " in "\n" + p.read_text()]
    assert len(extending) >= 8
    for p in extending:
        s = load_space(p)
        assert "extends =" not in s.text and s.name == p.stem
        assert SearchSpace.from_text(s.text, p).names == s.names
