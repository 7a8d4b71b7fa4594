"""The README against the code (issue 54): following its commands leaves nothing untracked that git does not ignore;
the modules, commands and options it names exist."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _commands() -> list[tuple[Path, list[str]]]:
    """(folder relative to the checkout, argv) of every command in the README's bash blocks, `cd` followed."""
    out = []
    for block in _blocks("bash"):
        cwd = Path(".")
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            for part in re.split(r"&&|;|\|\|", line):
                argv = shlex.split(part.replace("$TLS", ""))
                if not argv:
                    continue
                if argv[0] == "cd":
                    cwd = cwd / argv[1]
                else:
                    out.append((cwd, argv))
    return out


def _opt(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def written_paths() -> list[Path]:
    """What the README's commands write, relative to the checkout: stores (and SQLite's companions), elite.json (and
    its lock and temp files), exported packages, reports, the TLS example's keys and certificates."""
    paths: list[Path] = []
    for cwd, argv in _commands():
        if argv[:3] in (["python", "-m", "evoengineer"], ["python3", "-m", "evoengineer"]):
            cmd, rest = argv[3], argv[4:]
            if cmd == "search":
                db = _opt(rest, "--db", "sqlite:///elite_store/evoengineer.db")
                assert db.startswith("sqlite:///") and not db.startswith("sqlite:////"), db
                db_file = cwd / db[len("sqlite:///"):]
                out = cwd / _opt(rest, "--out", "elite.json")
                paths += [db_file, db_file.with_name(db_file.name + "-wal"), db_file.with_name(db_file.name + "-shm"),
                          out, out.with_name(f".{out.name}.lock"), out.with_name(f".{out.name}.1a2b3c.tmp")]
            elif cmd == "export":
                folder = cwd / _opt(rest, "--out")
                paths += [folder / "pyproject.toml", folder / "pkg_module" / "__init__.py"]
            elif cmd == "report":
                paths += [cwd / _opt(rest, "--out", "report") / "index.html"]
        elif argv[0] == "openssl":
            paths += [cwd / argv[i + 1] for i, a in enumerate(argv) if a in ("-out", "-keyout")]
            if "-CAcreateserial" in argv:
                paths.append(cwd / Path(_opt(argv, "-CA")).with_suffix(".srl"))
    return paths


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_what_the_readmes_commands_write_is_ignored_by_git():
    paths = written_paths()
    names = {str(p) for p in paths}
    # the commands this must cover are found (the parsing kept up with the README)
    for expected in ("elite.json", "elite_store/evoengineer.db", "examples/families/row_softmax/run.db",
                     "examples/families/row_softmax/elite.json", "examples/families/row_softmax/pkg/pyproject.toml",
                     "msda_op/pyproject.toml", "ca.key", "node.key", "ca.srl"):
        assert expected in names, (expected, sorted(names))
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-v", "-n"], cwd=ROOT, text=True,
                       capture_output=True, input="\n".join(str(p) for p in paths) + "\n")
    not_ignored = [ln.split("\t")[-1] for ln in r.stdout.splitlines() if ln.startswith("::")]
    assert not not_ignored, f"following the README leaves these untracked and not ignored: {not_ignored}"


# ---- what the README names exists -------------------------------------------------------------------------------
ROOTS = ("evoengineer/", "elite_store/", "templates/", "search_spaces/", "experiments/", "examples/", "tests/")


def test_the_files_and_modules_the_readme_names_exist():
    import importlib

    missing = []
    for ref in sorted(set(re.findall(r"`([^`\s]+)`", README))):
        ref = ref.rstrip(".,:;")
        if ref.startswith(ROOTS) and not any(c in ref for c in "<>*{}$"):
            if ref.startswith("evoengineer/data/") or ref.endswith(".db"):  # made by a wheel's build, by a search
                continue
            if not (ROOT / ref).exists():
                missing.append(ref)
        elif re.fullmatch(r"(evoengineer|elite_store)(\.\w+)+", ref):
            parts = ref.split(".")
            for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(ref)
                break
            else:
                missing.append(ref)
    assert not missing, f"the README names what does not exist: {missing}"


def test_the_cli_synopsis_has_every_command_and_option():
    from evoengineer.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    block = re.search(r"## CLI\n\n```\n(.*?)```", README, re.S).group(1)
    lines = {}
    for chunk in re.split(r"\n(?=python -m evoengineer )", block.strip()):
        lines[chunk.split()[3]] = chunk
    assert set(lines) == set(sub.choices), (sorted(lines), sorted(sub.choices))
    missing = []
    for name, parser in sub.choices.items():
        for action in parser._actions:
            for opt in action.option_strings:
                if not opt.startswith("--") or opt == "--help":
                    continue
                if opt not in lines[name] and not (opt.startswith("--tls-") and "--tls-*" in lines[name]):
                    missing.append(f"{name} {opt}")
    assert not missing, f"options missing from the README's CLI synopsis: {missing}"
    for strategy in __import__("evoengineer.search", fromlist=["STRATEGIES"]).STRATEGIES:
        assert strategy in lines["search"].split("--strategy ")[1].split("]")[0]


def test_help_names_every_command():
    from evoengineer.cli import COMMANDS, build_parser

    text = " ".join(build_parser().format_help().split())
    described = text.split("Commands: ")[1].split(".")[0]
    assert [c.strip() for c in described.split(",")] == list(build_parser()._subparsers._group_actions[0].choices)
    assert set(COMMANDS) <= set(c.strip() for c in described.split(","))


def test_the_evaluation_keys_are_all_named():
    from evoengineer.tasks.settings import EVALUATION_DEFAULTS

    table = README[README.index("[evaluation]  "):README.index("[[shapes]]", README.index("[evaluation]  "))]
    assert [k for k in EVALUATION_DEFAULTS if k not in table] == []


def test_usage_errors_point_to_the_commands_help(tmp_path, monkeypatch, capsys):
    from evoengineer.cli import main

    monkeypatch.chdir(tmp_path)
    for argv, command in ((["search", "--elite", "0"], "search"), (["search", "--strategy", "annealing"], "search"),
                          (["export", "e.json", "--out", "x", "--rank", "0"], "export"),
                          (["resume", "--cluster-workers", "2"], "resume")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.endswith(f"(see python -m evoengineer {command} --help)"), err
    assert not list(tmp_path.iterdir())
