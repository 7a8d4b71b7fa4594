"""A space file is code from anyone: its template must stay inside its folder (or the shipped templates), its build
flags must be single whitelisted tokens (ninja hands them to /bin/sh), and rendering is sandboxed."""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path

import pytest

from conftest import DATA, ROOT
from evoengineer.candidate import CandidateFactory, render
from evoengineer.cli import main
from evoengineer.errors import UserError
from evoengineer.paths import shipped_space_files
from evoengineer.space import SearchSpace, load_space
from evoengineer.space.flags import flag_problem

HEADER = 'name = "t"\ntemplate = {template}\ntask = "t"\nbackend = "cpu"\n'
PARAMS = "[parameters]\nA = [1, 2]\n"


def write_space(d: Path, template: str = '"t.j2"', build: str = "", name: str = "s.toml") -> Path:
    path = d / name
    path.write_text(HEADER.format(template=template) + build + PARAMS)
    return path


def refused(path: Path, *words: str) -> str:
    with pytest.raises(UserError) as ei:
        load_space(path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


@pytest.fixture
def sdir(tmp_path: Path) -> Path:
    d = tmp_path / "space"
    d.mkdir()
    (d / "t.j2").write_text("int a = {{ A }};\n")
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    p = tmp_path / "secret.txt"
    p.write_text("top secret {{ A }}\n")
    return p


# ---- template containment -------------------------------------------------------------------------------------
@pytest.mark.parametrize("template", ["../../etc/passwd", "/etc/passwd", "../secret.txt", "sub/../../secret.txt",
                                      "~/secret.txt"])
def test_template_outside_the_folder_is_refused(sdir: Path, outside: Path, template: str):
    msg = refused(write_space(sdir, f'"{template}"'), "template", repr(template))
    assert "must lie inside the space file's folder, the shipped templates folder" in msg


def test_absolute_template_inside_the_folder_is_refused_too(sdir: Path):
    # absolute paths are refused outright, even one naming a file of the space's own folder
    refused(write_space(sdir, f'"{sdir / "t.j2"}"'), "absolute path")


def test_symlink_out_of_the_folder_is_refused(sdir: Path, outside: Path):
    (sdir / "evil.j2").symlink_to(outside)
    msg = refused(write_space(sdir, '"evil.j2"'), "'evil.j2'", str(outside), "outside")
    assert "symlink" in msg
    (sdir / "linkdir").symlink_to(outside.parent, target_is_directory=True)  # a symlinked folder, too
    refused(write_space(sdir, '"linkdir/secret.txt"'), "'linkdir/secret.txt'", "outside")


def test_symlink_to_a_shipped_template_from_the_space_folder_is_refused(sdir: Path):
    # the space folder's own file wins; that it points at a shipped template does not make it inside the space folder
    (sdir / "m.j2").symlink_to(ROOT / "evoengineer" / "families" / "msda" / "cpu" / "msda.cpp.j2")
    refused(write_space(sdir, '"m.j2"'), "outside")


def test_templates_inside_the_folder_or_shipped_are_accepted(sdir: Path):
    (sdir / "kernels").mkdir()
    (sdir / "kernels" / "k.j2").write_text("int k = {{ A }};\n")
    (sdir / "link.j2").symlink_to(sdir / "t.j2")  # a symlink that stays inside
    for template, path in [("t.j2", sdir / "t.j2"), ("kernels/k.j2", sdir / "kernels" / "k.j2"),
                           ("./t.j2", sdir / "t.j2"), ("link.j2", sdir / "t.j2")]:
        s = load_space(write_space(sdir, f'"{template}"'))
        assert s.template_path == path.resolve()
        assert render(s, {"A": 2}).startswith("int ")
    # a shipped family's template, found in its family's folder (the space names the family)
    (sdir / "m.toml").write_text(HEADER.format(template='"cpu/msda.cpp.j2"').replace('task = "t"', 'task = "msda"')
                                 + PARAMS)
    shipped = SearchSpace.from_text((sdir / "m.toml").read_text(), sdir / "m.toml", check_valid=False)
    assert shipped.template_path == (ROOT / "evoengineer" / "families" / "msda" / "cpu" / "msda.cpp.j2").resolve()
    # and a file of the shipped templates folder (what families share)
    block = load_space(write_space(sdir, '"cuda/common/smem.cuh.j2"'))
    assert block.template_path == (ROOT / "templates" / "cuda" / "common" / "smem.cuh.j2").resolve()


def test_the_template_is_never_read_from_outside(sdir: Path, outside: Path):
    # nothing from outside reaches a candidate: refused before any source is rendered or stored
    with pytest.raises(UserError):
        CandidateFactory(load_space(write_space(sdir, '"../secret.txt"')))


# ---- {% include %} / {% extends %} ----------------------------------------------------------------------------
@pytest.mark.parametrize("stmt", ['{% include "../secret.txt" %}', '{% include "/etc/passwd" %}',
                                  '{% extends "../secret.txt" %}', '{% include "evil.j2" %}',
                                  '{% include "sub/../../secret.txt" %}'])
def test_includes_cannot_escape(sdir: Path, outside: Path, stmt: str):
    (sdir / "evil.j2").symlink_to(outside)
    (sdir / "t.j2").write_text(f"int a = {{{{ A }}}};\n{stmt}\n")
    space = load_space(write_space(sdir))
    for attempt in (lambda: CandidateFactory(space), lambda: render(space, {"A": 1})):
        with pytest.raises(UserError) as ei:
            attempt()
        msg = str(ei.value)
        assert "\n" not in msg and "template error" in msg and "top secret" not in msg, msg


def test_symlinked_include_names_where_it_leads(sdir: Path, outside: Path):
    (sdir / "evil.j2").symlink_to(outside)
    (sdir / "t.j2").write_text('{% include "evil.j2" %}\n')
    with pytest.raises(UserError) as ei:
        CandidateFactory(load_space(write_space(sdir)))
    assert "'evil.j2'" in str(ei.value) and str(outside) in str(ei.value) and "outside" in str(ei.value)


def test_includes_inside_the_folder_and_shipped_still_work(sdir: Path):
    (sdir / "part.j2").write_text("int p = {{ A }};\n")
    (sdir / "link.j2").symlink_to(sdir / "part.j2")
    (sdir / "t.j2").write_text('{% include "part.j2" %}{% include "link.j2" %}'
                               '{% include "bindings/candidate_module.h" %}\n')
    source = CandidateFactory(load_space(write_space(sdir))).make({"A": 2}).source
    assert source.count("int p = 2;") == 2 and "#" in source


def test_rendering_is_sandboxed(sdir: Path):
    (sdir / "t.j2").write_text("{{ A.__class__.__mro__[1].__subclasses__() }}\n")
    space = load_space(write_space(sdir))
    with pytest.raises(UserError) as ei:
        CandidateFactory(space).make({"A": 1})
    assert "template error" in str(ei.value) and "\n" not in str(ei.value)


# ---- build flags ------------------------------------------------------------------------------------------------
BAD_FLAGS = ["-DX=1;touch /tmp/x;true", "-O3 -DX", "$(id)", "-I`x`", "-DX=\"a b\"", "-DX='a'", "-DX=a\\b", "-DX=a|b",
             "-DX=a&b", "-DX=a>b", "-DX=a<b", "-DX=*", "-DX=?", "-DX=a\nb", "-DX=a\tb", "@/etc/passwd", "-o", "x.o",
             "/tmp/evil.so", "-B/tmp", "-fplugin=/tmp/evil.so", "-specs=/tmp/s", "-Wl,-plugin,/tmp/x.so",
             "-Xcompiler=-fplugin=/tmp/x.so", "-Xlinker=--plugin=/tmp/x.so", "-Wp,-x", "-D", "", "-Xcompiler",
             "-Xcompiler=-O3,", "-DX=${HOME}", "--foo"]


@pytest.mark.parametrize("key", ["flags", "cuda_flags", "ldflags"])
@pytest.mark.parametrize("flag", BAD_FLAGS)
def test_bad_flags_are_refused_at_load(sdir: Path, key: str, flag: str):
    toml_flag = flag.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    path = sdir / "s.toml"
    path.write_text(HEADER.format(template='"t.j2"') + f'[build]\n{key} = ["-O2", "{toml_flag}"]\n' + PARAMS)
    msg = refused(path, f"build.{key}[1]", repr(flag), "refused")
    assert flag_problem(flag) in msg


@pytest.mark.parametrize("flag", ["-O3", "-O0", "-Os", "-Ofast", "-g", "-march=native", "-fopenmp", "-ffast-math",
                                  "-fvisibility=hidden", "-DNDEBUG", "-DX=1", "-DX=a,b", "-UNDEBUG", "-I/opt/x/include",
                                  "-Iinclude", "-L/opt/x/lib", "-lm", "-l:libfoo.so", "-Wall", "-Wno-unused-variable",
                                  "-Werror=return-type", "-Wl,-rpath,/opt/x/lib", "-Wl,--as-needed", "-std=c++17",
                                  "-pthread", "-arch=sm_90", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo",
                                  "-maxrregcount=120", "--use_fast_math", "-use_fast_math", "--expt-relaxed-constexpr",
                                  "-Xptxas=-v", "-Xptxas=-O3,--warn-on-spills", "-Xcompiler=-O3,-fopenmp",
                                  "--ptxas-options=-v", "-G", "--ftz=true", "-diag-suppress=177"])
def test_ordinary_flags_are_accepted(sdir: Path, flag: str):
    path = sdir / "s.toml"
    path.write_text(HEADER.format(template='"t.j2"') + f'[build]\nflags = ["{flag}"]\ncuda_flags = ["{flag}"]\n'
                    f'ldflags = ["{flag}"]\n' + PARAMS)
    s = load_space(path)
    assert s.build_flags == s.cuda_flags == s.ldflags == (flag,)


def test_every_shipped_and_test_space_loads():
    files = [str(p) for p in shipped_space_files()]
    files += sorted(glob.glob(str(DATA / "**" / "*.toml"), recursive=True))
    assert len(files) > 10
    for f in files:
        s = load_space(f)
        assert all(flag_problem(x) is None for x in (*s.build_flags, *s.cuda_flags, *s.ldflags))


def test_stored_space_text_is_checked_too(sdir: Path):
    # resume, landscape, elites and the workers rebuild the space from the text stored with the run
    text = HEADER.format(template='"t.j2"') + '[build]\nflags = ["-DX=1;id"]\n' + PARAMS
    with pytest.raises(UserError, match=r"build\.flags\[0\].*'-DX=1;id'"):
        SearchSpace.from_text(text, sdir / "s.toml")
    text = HEADER.format(template='"/etc/passwd"') + PARAMS
    with pytest.raises(UserError, match="absolute path"):
        SearchSpace.from_text(text, sdir / "s.toml")


def test_bad_arch_is_refused(sdir: Path):
    path = sdir / "s.toml"
    path.write_text(HEADER.format(template='"t.j2"').replace('"cpu"', '"cuda"') + 'arch = "sm_90;id"\n' + PARAMS)
    refused(path, "arch", "'sm_90;id'")


def test_builder_refuses_flags_of_a_space_made_without_load(sdir: Path):
    from evoengineer.compiler.builder import Builder

    space = dataclasses.replace(load_space(write_space(sdir)), build_flags=("-DX=1;touch /tmp/x;true",))
    with pytest.raises(UserError, match=r"build\.flags\[0\]"):
        Builder(space, entry="e", binding="bindings/msda_binding.cpp", signature="", cache_dir=sdir / "cache")
    assert not (sdir / "cache").exists()


# ---- the command line -------------------------------------------------------------------------------------------
def cli_fails(capsys, argv: list[str], *words: str) -> str:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("change, words", [
    (('template = "toy.cpp.j2"', 'template = "../../../../../../etc/passwd"'),
     ["template", "'../../../../../../etc/passwd'"]),
    (('template = "toy.cpp.j2"', 'template = "/etc/passwd"'), ["template", "'/etc/passwd'", "absolute"]),
    (('flags = ["-O3"]', 'flags = ["-DX=1;touch /tmp/x;true"]'), ["build.flags[0]", "'-DX=1;touch /tmp/x;true'"]),
    (('flags = ["-O3"]', 'flags = ["-O3 -DX"]'), ["build.flags[0]", "'-O3 -DX'", "a space"]),
    (('flags = ["-O3"]', 'flags = ["-O3"]\nldflags = ["$(id)"]'), ["build.ldflags[0]", "'$(id)'"]),
    (('flags = ["-O3"]', 'flags = ["-O3"]\ncuda_flags = ["-I`x`"]'), ["build.cuda_flags[0]", "'-I`x`'"]),
])
def test_cli_search_refuses_a_bad_space(toy_dir: Path, monkeypatch, capsys, change, words):
    monkeypatch.chdir(toy_dir)
    text = (toy_dir / "toy_space.toml").read_text()
    assert change[0] in text
    (toy_dir / "bad.toml").write_text(text.replace(change[0], change[1]))
    before = sorted(os.listdir(toy_dir))
    line = cli_fails(capsys, ["search", "--space", "bad.toml", "--landscape", "landscape.csv", "--db",
                              "sqlite:///s.db", "--out", "elite.json", "--budget", "5"], "bad.toml", *words)
    assert "root:" not in line  # nothing of /etc/passwd
    assert sorted(os.listdir(toy_dir)) == before  # no store, no elite.json
