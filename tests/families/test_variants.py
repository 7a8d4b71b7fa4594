"""Signature variants: `DTYPE = ["float32", "float64"]` in [signature] is one search per variant in one command, each
with its own elites; the variants file lists them; export/load give one op that dispatches on the inputs' dtypes; a
group killed midway resumes and finishes every variant."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evoengineer.cli import main
from evoengineer.errors import UserError
from evoengineer.space.spec import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "variants"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _search(d: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evoengineer", "search", "--space", "variants.toml", "--db",
                           "sqlite:///run.db", "--out", "elite.json", "--strategy", "grid", *extra], cwd=d,
                          env=_env(), capture_output=True, text=True, timeout=900)


def test_variant_lists_become_concrete_spaces(tmp_path: Path):
    text = (DATA / "variants.toml").read_text().replace(
        'DTYPE = ["float32", "float64"]   # the variants',
        'DTYPE = [\n  "float32",  # [not a table]\n  "float64",\n]\nWIDTH = [1, 2]')
    (tmp_path / "v.toml").write_text(text)
    for f in ("family.py", "scale.cpp.j2"):
        shutil.copy(DATA / f, tmp_path / f)
    space = SearchSpace.from_text(text, tmp_path / "v.toml")
    assert space.variant_axes == {"DTYPE": ["float32", "float64"], "WIDTH": [1, 2]}
    assert space.signature == {"DTYPE": "float32", "WIDTH": 1}
    assert [SearchSpace.variant_label(v) for v in space.variants()] == ["float32-1", "float32-2", "float64-1",
                                                                        "float64-2"]
    one = space.variant({"DTYPE": "float64", "WIDTH": 2})
    assert one.signature == {"DTYPE": "float64", "WIDTH": 2} and not one.variant_axes
    assert SearchSpace.from_text(one.text, tmp_path / "v.toml").signature == one.signature  # its text rebuilds it
    with pytest.raises(UserError, match="not one of its variants"):
        space.variant({"DTYPE": "float16", "WIDTH": 1})
    for bad in ("DTYPE = []", 'DTYPE = ["float32", "float32"]'):
        with pytest.raises(UserError, match="non-empty list of distinct"):
            SearchSpace.from_text(text.replace('WIDTH = [1, 2]', bad.replace("DTYPE", "OTHER")),
                                  tmp_path / "v.toml")


@pytest.mark.slow
def test_one_command_searches_every_variant_and_one_op_dispatches(tmp_path: Path, build_cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, capsys):
    d = tmp_path / "v"
    shutil.copytree(DATA, d)
    r = _search(d)
    assert r.returncode == 0, r.stderr
    assert "2 signature variants (float32, float64)" in r.stderr
    group = json.loads((d / "elite.json").read_text())
    assert group["schema"] == "evoengineer.variants/1"
    assert [(v["label"], v["run_id"], v["run_status"]) for v in group["variants"]] == [
        ("float32", 1, "finished"), ("float64", 2, "finished")]
    for v in group["variants"]:
        doc = json.loads((d / v["file"]).read_text())
        assert doc["elites"] and {e["build"]["signature"]["DTYPE"] for e in doc["elites"]} == {v["label"]}
        assert doc["shape_elites"]  # per-variant shape elites too
    monkeypatch.chdir(d)
    assert main(["inspect", "elite.json"]) == 0
    shown = capsys.readouterr().out
    assert "== variant float32 ==" in shown and "== variant float64 ==" in shown
    assert main(["export", "elite.json", "--out", str(tmp_path / "pkg"), "--family", "family.py:Scale"]) == 0
    (pkg,) = [p for p in (tmp_path / "pkg").iterdir() if p.is_dir()]
    sys.path.insert(0, str(tmp_path / "pkg"))
    try:
        mod = importlib.import_module(pkg.name)
    finally:
        sys.path.remove(str(tmp_path / "pkg"))
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(41, dtype=dtype)
        y = mod.scale_variants(x, 0.5)
        assert y.dtype == dtype and torch.allclose(y, x * 0.5)
    assert sorted(mod.kernel.calls.values()) == [1, 1]  # each call ran its own variant's kernel
    with pytest.raises(TypeError, match="dtype float16"):
        mod.scale_variants(torch.randn(4, dtype=torch.float16), 0.5)
    import evoengineer

    fn = evoengineer.load(d / "elite.json", family="family.py:Scale", build_root=tmp_path / "ops")
    x = torch.randn(9, dtype=torch.float64)
    assert torch.allclose(fn(x, 2.0), 2 * x)

    # as if killed between the two variants (run 2 never created): resume starts the second variant
    with sqlite3.connect(d / "run.db") as con:
        for table in ("elites", "proposals", "checkpoints", "leases", "candidates"):
            con.execute(f"delete from {table} where run_id = 2")
        con.execute("delete from runs where id = 2")
    (d / "elite.float64.json").unlink()
    r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///run.db"], cwd=d,
                       env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "variants not yet searched: float64" in r.stderr
    group = json.loads((d / "elite.json").read_text())
    assert [(v["label"], v["run_status"]) for v in group["variants"]] == [("float32", "finished"),
                                                                         ("float64", "finished")]
    assert (d / "elite.float64.json").is_file()


def test_a_group_killed_midway_resumes_every_variant(tmp_path: Path, build_cache: Path):
    d = tmp_path / "v"
    shutil.copytree(DATA, d)
    proc = subprocess.Popen([sys.executable, "-m", "evoengineer", "search", "--space", "variants.toml", "--db",
                             "sqlite:///run.db", "--out", "elite.json", "--strategy", "grid"], cwd=d, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while True:  # the first variant's run has measured something: kill the whole group there
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        if (d / "run.db").exists():
            try:
                with sqlite3.connect(d / "run.db") as con:
                    if con.execute("select count(*) from candidates").fetchone()[0] >= 1:
                        break
            except sqlite3.Error:
                pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    r = subprocess.run([sys.executable, "-m", "evoengineer", "resume", "--db", "sqlite:///run.db"], cwd=d,
                       env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    group = json.loads((d / "elite.json").read_text())
    assert [v["run_status"] for v in group["variants"]] == ["finished", "finished"]
    with sqlite3.connect(d / "run.db") as con:
        per_run = dict(con.execute("select run_id, count(*) from candidates group by run_id").fetchall())
    assert per_run == {1: 4, 2: 4}  # every configuration of each variant, none measured twice
