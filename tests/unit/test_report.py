"""Best-so-far curves and the convergence PNG."""

from __future__ import annotations

import math

from evoengineer.report import best_so_far, plot_convergence


def test_best_so_far_ignores_failures_and_keeps_the_minimum():
    inf = math.inf
    assert best_so_far([inf, 5.0, 7.0, inf, 3.0, 4.0, float("nan")]) == [inf, 5.0, 5.0, 5.0, 3.0, 3.0, 3.0]
    assert best_so_far([]) == []


def test_convergence_png_is_written(tmp_path):
    out = plot_convergence({"ga": best_so_far([9, 8, 8.5, 6]), "random": best_so_far([math.inf, 7, 7.5])},
                           tmp_path / "c.png", title="t", optimum=5.0)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert not list(tmp_path.glob("*.tmp"))


# ---- python -m evoengineer report ------------------------------------------------------------------------------------
def _two_runs(toy_dir, monkeypatch):
    from evoengineer.cli import main

    monkeypatch.chdir(toy_dir)
    base = ["search", "--space", "toy_space.toml", "--landscape", "landscape.csv", "--db", "sqlite:///r.db",
            "--budget", "60", "--quiet"]
    assert main([*base, "--out", "ga.json"]) == 0
    assert main([*base, "--out", "tpe.json", "--strategy", "optuna", "--seed", "3"]) == 0
    return main


def test_report_writes_png_tables_and_an_offline_page(toy_dir, monkeypatch, capsys):
    import json
    from html.parser import HTMLParser

    main = _two_runs(toy_dir, monkeypatch)
    capsys.readouterr()
    assert main(["report", "--db", "sqlite:///r.db", "--out", "rep"]) == 0
    printed = capsys.readouterr().out
    assert "run 1: ga seed 0" in printed and "run 2: optuna/tpe seed 3" in printed
    page = (toy_dir / "rep" / "index.html").read_text()
    png = (toy_dir / "rep" / "convergence_toy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in page and "http" not in page.replace("http-equiv", "")  # nothing to fetch
    for name in ("ga.json", "tpe.json"):  # each run's elites, and the failures by status of the toy landscape
        for e in json.loads((toy_dir / name).read_text())["elites"]:
            assert e["hash"][:12] in page
    assert "Evaluations by status" in page and "gate_failed" in page and "planted" in page

    class Checker(HTMLParser):  # tags balance: the page is well-formed enough for any browser
        def __init__(self):
            super().__init__()
            self.stack = []

        def handle_starttag(self, tag, attrs):
            if tag not in ("meta", "img", "br"):
                self.stack.append(tag)

        def handle_endtag(self, tag):
            assert self.stack.pop() == tag

    c = Checker()
    c.feed(page)
    assert c.stack == []


def test_report_selected_runs_and_bad_input(toy_dir, monkeypatch, capsys):
    main = _two_runs(toy_dir, monkeypatch)
    assert main(["report", "--db", "sqlite:///r.db", "--run", "2", "--out", "only2"]) == 0
    page = (toy_dir / "only2" / "index.html").read_text()
    assert "run 2: optuna/tpe" in page and "run 1: ga" not in page
    capsys.readouterr()
    assert main(["report", "--db", "sqlite:///r.db", "--run", "2", "9", "--out", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --run 9: run 9 not found in sqlite:///r.db" and not (toy_dir / "x").exists()
    assert main(["report", "--db", "sqlite:///missing.db"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (toy_dir / "afile").write_text("")
    assert main(["report", "--db", "sqlite:///r.db", "--out", "afile"]) == 2
    assert "is not a folder" in capsys.readouterr().err
