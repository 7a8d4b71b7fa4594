"""Kernel families outside the package (evoengineer.family contract): a family in a temporary folder is searched
with real builds, killed and resumed, exported and loaded, run under torch.compile; the same through module:Class
and an installed package's entry point; references that are not families, or that leave the space's folder, are
refused before anything of them runs; an elite.json naming another module imports nothing; the generated binding
refuses what the kernel was not compiled for; the core names no family."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import build_candidate, stored_count
from evoengineer.cli import main
from evoengineer.errors import UserError
from evoengineer.space import load_space

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "families" / "row_softmax"


def _family_dir(tmp: Path, task: str | None = None, budget: int = 8) -> Path:
    d = tmp / "rowsm"
    shutil.copytree(EXAMPLE, d)
    text = (d / "row_softmax.toml").read_text().replace("budget = 12", f"budget = {budget}")
    text = text.replace("repeats = 10", "repeats = 3").replace("rows = 512\ncols = 1024", "rows = 64\ncols = 256")
    if task is not None:
        text = text.replace('task = "family.py:RowSoftmax"', f'task = "{task}"')
    (d / "row_softmax.toml").write_text(text)
    return d


def _env(extra_path: Path | None = None) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def _search(d: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evoengineer", "search", "--space", "row_softmax.toml", "--db",
                           "sqlite:///run.db", "--out", "elite.json", "--seed", "3", *extra], cwd=d,
                          env=env or _env(), capture_output=True, text=True, timeout=600)


def _evaluated(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {r[0] for r in con.execute("select hash from candidates where run_id = 1")}
    finally:
        con.close()


def _check_function(fn, compiled: bool = True) -> None:
    x = torch.randn(9, 70)
    ref = torch.softmax(x.double() * 0.6, dim=-1)
    assert (fn(x, 0.6).double() - ref).abs().max() < 1e-5
    if compiled:
        c = torch.compile(fn, fullgraph=True)
        assert (c(x, 0.6).double() - ref).abs().max() < 1e-5
    xg = x.clone().requires_grad_()
    fn(xg, 0.6).pow(2).sum().backward()
    xr = x.clone().double().requires_grad_()
    torch.softmax(xr * 0.6, dim=-1).pow(2).sum().backward()
    assert (xg.grad.double() - xr.grad).abs().max() < 1e-5
    with pytest.raises(TypeError, match="x: dtype float64, but this kernel was compiled for float32"):
        fn(x.double(), 0.6)
    with pytest.raises(TypeError, match="scale"):
        fn(x, "0.6")
    with pytest.raises(ValueError, match="x: expected 2 dimensions"):
        fn(x[0], 0.6)


@pytest.mark.slow
def test_family_in_a_folder_search_kill_resume_export_load(tmp_path: Path, build_cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Random proposals (the same for a seed whatever was measured): a run killed after 3 evaluations and resumed
    evaluates what an uninterrupted run does; then export (--family file.py:Class) and load, eager and compiled."""
    whole = _family_dir(tmp_path / "whole")
    r = _search(whole, "--strategy", "random")
    assert r.returncode == 0, r.stderr
    cut = _family_dir(tmp_path / "cut")
    # its own process group: the kill -9 takes the builders' fork server, its pool processes and the resource
    # tracker too (killed with the search alone they would outlive the test suite, orphans blocked on their queue)
    proc = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", "--space", "row_softmax.toml", "--db",
                             "sqlite:///run.db", "--out", "elite.json", "--seed", "3", "--strategy", "random"],
                            cwd=cut, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while stored_count(cut / "run.db") < 3:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    done_before = _evaluated(cut / "run.db")
    assert 3 <= len(done_before) < 8
    r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///run.db"], cwd=cut,
                       env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert _evaluated(cut / "run.db") == _evaluated(whole / "run.db") and done_before < _evaluated(cut / "run.db")
    doc = json.loads((cut / "elite.json").read_text())
    recorded = doc["elites"][0]["build"]["family"]
    assert doc["task"] == "row_softmax" and {k: recorded[k] for k in ("name", "version")} == {"name": "row_softmax",
                                                                                              "version": "1"}
    assert len(recorded["source_sha256"]) == 64  # the family file the search ran
    assert "family.py" not in json.dumps(doc["elites"][0]["build"])  # a name and a version, never a path

    # export: the family is not installed, so it is named; from elsewhere its file is found relative to the cwd
    monkeypatch.chdir(cut)
    assert main(["export", "elite.json", "--out", str(tmp_path / "noname")]) == 2
    assert main(["export", "elite.json", "--out", str(tmp_path / "pkg"), "--family", "family.py:RowSoftmax"]) == 0
    (pkg,) = [p for p in (tmp_path / "pkg").iterdir() if p.is_dir()]
    sys.path.insert(0, str(tmp_path / "pkg"))
    try:
        mod = importlib.import_module(pkg.name)
        _check_function(mod.row_softmax)
        assert mod.kernel.kernel["build"]["family"]["name"] == "row_softmax"
    finally:
        sys.path.remove(str(tmp_path / "pkg"))
    import evoengineer

    with pytest.raises(UserError, match="not shipped or installed"):
        evoengineer.load(cut / "elite.json")
    fn = evoengineer.load(cut / "elite.json", family="family.py:RowSoftmax", build_root=tmp_path / "ops")
    assert fn.__name__ == "row_softmax"
    _check_function(fn, compiled=False)

    # from another folder, a relative family file is found beside the elite file
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(cut / "elite.json"), "--out", str(tmp_path / "pkg2"), "--family",
                 "family.py:RowSoftmax"]) == 0
    # another source of the same name and version is refused, in one line, unless accepted
    (cut / "family.py").write_text((cut / "family.py").read_text() + "\n# edited after the search\n")
    assert main(["export", str(cut / "elite.json"), "--out", str(tmp_path / "pkg3"), "--family",
                 "family.py:RowSoftmax"]) == 2
    assert main(["export", str(cut / "elite.json"), "--out", str(tmp_path / "pkg3"), "--family",
                 "family.py:RowSoftmax", "--accept-family-change"]) == 0


def test_family_by_module_and_by_entry_point(tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch):
    """task = "module:Class" (importable) and task = "<name>" of an installed package's entry point: both search;
    the entry point's family exports without being told where it is."""
    site = tmp_path / "site"
    (site / "rowsm_family").mkdir(parents=True)
    shutil.copy(EXAMPLE / "family.py", site / "rowsm_family" / "__init__.py")
    dist = site / "rowsm_family-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rowsm-family\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[evoengineer.families]\nrow_softmax = rowsm_family:RowSoftmax\n")
    env = _env(site)
    by_module = _family_dir(tmp_path / "m", task="rowsm_family:RowSoftmax", budget=4)
    r = _search(by_module, "--population", "4", env=env)
    assert r.returncode == 0, r.stderr
    by_name = _family_dir(tmp_path / "n", task="row_softmax", budget=4)
    r = _search(by_name, "--population", "4", env=env)
    assert r.returncode == 0, r.stderr
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    from evoengineer.families import family_class, find_family, known

    assert "row_softmax" in known() and find_family("row_softmax", "1").__module__ == "rowsm_family"
    assert family_class("rowsm_family:RowSoftmax") is find_family("row_softmax")
    assert main(["export", str(by_name / "elite.json"), "--out", str(tmp_path / "pkg")]) == 0
    (pkg,) = [p for p in (tmp_path / "pkg").iterdir() if p.is_dir()]
    assert "find_family('row_softmax', '1')" in (pkg / "__init__.py").read_text()
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    _check_function(importlib.import_module(pkg.name).row_softmax, compiled=False)
    with pytest.raises(UserError, match="version 1 here, the kernel was searched with version 0"):
        find_family("row_softmax", "0")


def test_references_that_are_not_families_are_refused_before_use(tmp_path: Path):
    d = _family_dir(tmp_path)
    marker = tmp_path / "ran"
    (d / "notfam.py").write_text(f"class Thing:\n    pass\n\nclass Bad:\n    def __init__(self, *a):\n"
                                 f"        open({str(marker)!r}, 'w').write('x')\n")
    outside = tmp_path / "outside.py"
    outside.write_text("raise SystemExit('imported')\n")
    (d / "link.py").symlink_to(outside)
    from evoengineer.families import get_task

    cases = {"notfam.py:Thing": "is not a kernel family", "notfam.py:Bad": "is not a kernel family",
             "notfam.py:Missing": "has no Missing", "../outside.py:X": "climbs out",
             f"{outside}:X": "absolute path", "link.py:X": "outside", "json:JSONDecoder": "is not a kernel family",
             "no_such_module_xyz:X": "cannot import", "rmsnorm_nowhere": "not shipped or installed",
             "a b:C": "expected module:Class"}
    for ref, why in cases.items():
        text = (d / "row_softmax.toml").read_text()
        text = re.sub(r'task = "[^"]*"', f'task = "{ref}"', text)
        (d / "s.toml").write_text(text)
        with pytest.raises(UserError, match=why):
            get_task(load_space(d / "s.toml"))
    assert not marker.exists()


def test_tampered_elite_json_imports_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """elite.json names a family by name and version only: a file whose build record names a module, a path or an
    unknown family is refused in one line, and no module is imported."""
    victim = tmp_path / "evil_family_mod.py"
    victim.write_text("import pathlib\npathlib.Path(__file__).with_suffix('.ran').write_text('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = {"schema": 3, "space": "s", "elites": [{"rank": 1, "hash": "0" * 64, "source": "int f();",
                                                  "build": {"task": "evil_family_mod:Family", "signature": {},
                                                            "backend": "cpu"}}]}
    for task, family in (("evil_family_mod:Family", None), ("evil_family_mod", None),
                         ("msda", {"name": "evil_family_mod.py:X", "version": "1"}),
                         ("row_softmax", {"name": "evil_family_mod", "version": "1"})):
        doc["elites"][0]["build"] = {"task": task, "signature": {}, "backend": "cpu",
                                     **({"family": family} if family else {})}
        path = tmp_path / "elite.json"
        path.write_text(json.dumps(doc))
        from evoengineer import export as export_mod

        with pytest.raises(UserError):
            export_mod.check_buildable(doc["elites"][0], "elite")
        assert main(["export", str(path), "--out", str(tmp_path / "pkg")]) == 2
        assert "evil_family_mod" not in sys.modules and not (tmp_path / "evil_family_mod.ran").exists()


def test_generated_binding_checks_every_argument(tmp_path: Path, build_cache: Path):
    """The binding generated from the signature: right calls work, wrong ones are one Python error each (never a
    crash), naming the argument and both values."""
    d = _family_dir(tmp_path)
    space = load_space(d / "row_softmax.toml")
    task, mod = build_candidate(space, space.valid_genomes()[0], build_cache, jobs=1)
    x = torch.randn(5, 33)
    out = torch.full_like(x, float("nan"))
    assert mod.forward(x, 0.5, out) == 0 and torch.allclose(out, torch.softmax(x * 0.5, -1), atol=1e-6)
    assert mod.forward(x=x, out=out, scale=0.5) == 0
    assert mod.signature == {"DTYPE": "float32"}
    cases = [((x.double(), 0.5, out), TypeError, "x: dtype float64, but this kernel was compiled for float32"),
             ((x, 0.5, out[:4]), ValueError, r"out: size 0 \(rows, from x\) is 4, expected 5"),
             ((x, 0.5, out[:, :3]), ValueError, "out: must be contiguous"),
             ((x.t(), 0.5, out.t().contiguous()), ValueError, "x: must be contiguous"),
             ((x[0], 0.5, out), ValueError, r"x: expected 2 dimensions \[rows, cols\], got 1"),
             ((x, "a", out), TypeError, "scale: expected a number, got str"),
             ((x, True, out), TypeError, "scale: expected a number, got bool"),
             ((x, 0.5, "out"), TypeError, "out: expected a tensor, got str"),
             ((x, 0.5), TypeError, "missing argument 'out'"),
             ((x, 0.5, out, 1), TypeError, "takes 3 arguments, got 4")]
    for args, kind, msg in cases:
        with pytest.raises(kind, match=msg):
            mod.forward(*args)
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        mod.forward(x, 0.5, out=out, y=1)
    assert task.new_output({"x": x, "scale": 0.5}).isnan().all()

    # tensors reach the binding through their `_cdata` (no torch Python headers in it): subclasses work as plain
    # tensors, an impostor with a `_cdata` of its own is not a tensor, and the call leaves no reference behind
    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return super().__torch_function__(func, types, args, kwargs or {})

    for given in (torch.nn.Parameter(x.clone(), requires_grad=False), x.clone().as_subclass(Logged)):
        out.fill_(float("nan"))
        assert mod.forward(given, 0.5, out) == 0
        assert torch.allclose(out, torch.softmax(x * 0.5, -1), atol=1e-6)

    class Impostor:
        _cdata = x._cdata

    with pytest.raises(TypeError, match="x: expected a tensor, got Impostor"):
        mod.forward(Impostor(), 0.5, out)
    before = sys.getrefcount(x)
    for _ in range(100):
        mod.forward(x, 0.5, out)
    assert sys.getrefcount(x) == before
    y = torch.randn(5, 33)
    ref = torch.softmax(y * 0.5, -1)
    mod.forward(y, 0.5, out)
    del y  # the binding's reference to it is gone with the call: the tensor is freed, its result kept
    assert torch.allclose(out, ref, atol=1e-6)


def test_declared_signatures_are_checked():
    from evoengineer.family import Scalar, Signature, Tensor

    for args, why in [((Tensor("x", "float32", ("n",)),), "no tensor is written"),
                      ((Tensor("x", "float32", ("n",), output=True, inout=True),), "output or inout"),
                      ((Tensor("i", "int64", ("n",), inout=True, bounds=(0, 4)),), "cannot have bounds"),
                      ((Tensor("o", "float32", (3,), output=True),), "no input tensor"),
                      ((Tensor("x", "float33", ("n",)), Tensor("o", "float32", ("n",), output=True)), "dtype"),
                      ((Tensor("x", "float32", ("n",)), Tensor("o", "float32", ("m",), output=True)), "'m'"),
                      ((Tensor("x", "float32", ("n",)), Tensor("x", "float32", ("n",), output=True)), "repeated"),
                      ((Scalar("s", "complex"), Tensor("o", "float32", (3,), output=True)), "scalar dtype"),
                      ((Tensor("X y", "float32", ("n",)), Tensor("o", "float32", ("n",), output=True)), "name"),
                      ((Tensor("x", "float32", ("n",), align=12), Tensor("o", "float32", ("n",), output=True)),
                       "power of two")]:
        with pytest.raises(ValueError, match=why):
            Signature(args=args)
    sig = Signature(args=(Tensor("v", "float16", ("N", "S", "M", "D")), Scalar("eps", "float64"),
                          Tensor("o", "float16", ("N", "M*D"), output=True)), fixed={"D": 32})
    assert sig.c_prototype("f") == ('extern "C" int f(const void* v, void* o, int64_t N, int64_t S, int64_t M, '
                                    'double eps, void* stream)')


def test_core_modules_name_no_family():
    """The search, evaluators, compiler, export and op runtime are family-agnostic: every family is found through
    evoengineer.families."""
    core = [*(ROOT / "evoengineer" / d for d in ("search", "evaluators", "compiler", "store", "space", "report")),
            ROOT / "evoengineer" / "export.py", ROOT / "evoengineer" / "ops" / "runtime.py",
            ROOT / "evoengineer" / "family.py", ROOT / "evoengineer" / "elite_json.py",
            ROOT / "evoengineer" / "candidate.py"]
    names = re.compile(r"\b(msda|sdpa|decode_attention|ms_deform_attn|MSDATask|SDPATask|DecodeTask)\b",
                       re.IGNORECASE)
    hits = []
    for p in core:
        for f in ([p] if p.is_file() else sorted(p.rglob("*.py"))):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if names.search(line):
                    hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_each_family_names_its_templates(capsys):
    """A family's templates are found from the family: every shipped space renders a template its family declares,
    and `evoengineer families` lists them."""
    from evoengineer import families
    from evoengineer.space.spec import shipped_spaces

    for name in families.SHIPPED:
        paths = families.find_family(name).template_paths()
        assert paths and all(p.is_file() for p in paths), (name, paths)
    for path in shipped_spaces():
        space = load_space(path)
        declared = [p.resolve() for p in families.family_class(space.task).template_paths()]
        assert space.template_path in declared, (path.name, space.template_path)
    for folder in ("row_softmax", "rmsnorm_cuda"):
        space_file = next((ROOT / "examples" / "families" / folder).glob("*.toml"))
        space = load_space(space_file)
        cls = families.family_class(space.task, base_dir=space_file.parent)
        assert [p.resolve() for p in cls.template_paths()] == [space.template_path]
    assert main(["families"]) == 0
    out = capsys.readouterr().out
    assert "sdpa_hopper.cu.j2" in out and "msda.cpp.j2" in out and "missing" not in out


STRIDED_FAMILY = '''
import torch
from evoengineer.family import Family, Signature, Tensor


class Scale(Family):
    name, version, entry = "strided_scale", "1", "evo_strided_scale"

    @classmethod
    def call_signature(cls, constants):
        return Signature(args=(Tensor("x", "float32", ("rows", "cols"), strided=True),
                               Tensor("out", "float32", ("rows", "cols"), output=True, strided=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(shape.cols, shape.rows, generator=g).t()}  # a transposed view

    def reference(self, inputs):
        return inputs["x"].double() * 2
'''
STRIDED_TEMPLATE = '''#include <cstdint>
extern "C" int evo_strided_scale(const float* x, float* out, const int64_t* xs, const int64_t* os, int64_t rows,
                                 int64_t cols, void* stream) {
  (void)stream;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += {{ STEP }})
      for (int64_t k = c; k < c + {{ STEP }} && k < cols; ++k) out[r * os[0] + k * os[1]] = 2.0f * x[r * xs[0] + k * xs[1]];
  return 0;
}
'''


def test_strided_tensors_reach_the_kernel_with_their_strides(tmp_path: Path, build_cache: Path):
    """A tensor declared strided is passed as it is, its element strides beside it (no copy to contiguous); an
    output that overlaps itself is refused."""
    d = tmp_path / "strided"
    d.mkdir()
    (d / "family.py").write_text(STRIDED_FAMILY)
    (d / "t.cpp.j2").write_text(STRIDED_TEMPLATE)
    (d / "s.toml").write_text('name = "strided"\ntemplate = "t.cpp.j2"\ntask = "family.py:Scale"\nbackend = "cpu"\n'
                              '[parameters]\nSTEP = [1, 4]\n[build]\nflags = ["-O2"]\n'
                              '[[shapes]]\nname = "a"\nrows = 5\ncols = 7\ntime = true\n')
    space = load_space(d / "s.toml")
    task, mod = build_candidate(space, {"STEP": 4}, build_cache, jobs=1)
    assert task.signature.c_prototype(task.entry) == (
        'extern "C" int evo_strided_scale(const void* x, void* out, const int64_t* x_strides, '
        'const int64_t* out_strides, int64_t rows, int64_t cols, void* stream)')
    x = torch.randn(7, 5).t()
    out = torch.full((7, 5), float("nan")).t()  # a transposed output: dense, strided
    assert not x.is_contiguous() and mod.forward(x, out) == 0
    assert torch.equal(out, x * 2)
    with pytest.raises(ValueError, match="out: its elements overlap"):
        mod.forward(x, torch.zeros(5, 1).expand(5, 7))
    inputs = task.make_inputs(task.entries[0].shape, 0)
    got = task.new_output(inputs)
    task.launch(mod, inputs, got)
    assert torch.equal(got, inputs["x"] * 2)


def test_a_baseline_that_misses_the_reference_is_reported_before_the_search(tmp_path: Path, build_cache: Path):
    """The family's baselines are checked once per shape with the candidates' tolerance: one that misses says so in
    one line (here a baseline that forgets the scale), and the search goes on."""
    d = _family_dir(tmp_path, budget=2)
    fam = d / "family.py"
    text = fam.read_text()
    assert 'torch.softmax(inputs["x"] * inputs["scale"], dim=-1)}' in text
    fam.write_text(text.replace('torch.softmax(inputs["x"] * inputs["scale"], dim=-1)}',
                                'torch.softmax(inputs["x"], dim=-1)}'))
    r = _search(d, "--strategy", "random", "--budget", "2")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: baseline torch misses the reference")]
    shapes = {ln.split("on shape ")[1].split(":")[0] for ln in lines}
    assert shapes == {"odd", "one_row", "timed"}, r.stderr
    assert "max abs err" in lines[0] and "check make_inputs and reference" in lines[0]
    assert r.stderr.index(lines[0]) < r.stderr.index("evaluated 2/2")


def test_an_installed_familys_templates_are_found_through_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A space elsewhere names an importable family (module:Class) and a template that lives only in the family's
    folder: found there (and its includes beside it)."""
    pkg = tmp_path / "site" / "rowsm_pkg"
    pkg.mkdir(parents=True)
    shutil.copy(EXAMPLE / "family.py", pkg / "__init__.py")
    shutil.copy(EXAMPLE / "row_softmax.cpp.j2", pkg / "row_softmax.cpp.j2")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    text = (EXAMPLE / "row_softmax.toml").read_text().replace('task = "family.py:RowSoftmax"',
                                                              'task = "rowsm_pkg:RowSoftmax"')
    (spaces / "rs.toml").write_text(text)
    space = load_space(spaces / "rs.toml")
    assert space.template_path == (pkg / "row_softmax.cpp.j2").resolve()
    from evoengineer.candidate import CandidateFactory

    assert "softmax_row" in CandidateFactory(space).from_genome(space.valid_genomes()[0]).source
    (spaces / "rs.toml").write_text(text.replace('template = "row_softmax.cpp.j2"', 'template = "nowhere.cpp.j2"'))
    with pytest.raises(UserError, match="nowhere.cpp.j2.*not found"):
        load_space(spaces / "rs.toml")
