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
