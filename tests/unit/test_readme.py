"""The README and docs/ against the code (issues 54, 55): following their commands leaves nothing untracked that git
does not ignore; the modules, commands and options they name exist; the CLI reference (docs/cli.md) has every command
and option; every relative link points to a file of the repository; the README stays a guide (at most 250 lines)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()
SPACE_DOC = (ROOT / "docs" / "space-format.md").read_text()
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _blocks(lang: str) -> list[str]:
    return [b for text in DOCS.values() for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S)]


def _commands() -> list[tuple[Path, list[str]]]:
    """(folder relative to the checkout, argv) of every command in the bash blocks of the README and docs/, `cd`
    followed within a block."""
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


def _evoengineer_commands() -> list[tuple[Path, list[str]]]:
    return [(cwd, argv[3:]) for cwd, argv in _commands()
            if argv[:3] in (["python", "-m", "evoengineer"], ["python3", "-m", "evoengineer"])]


def _opt(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def written_paths() -> list[Path]:
    """What the documented commands write, relative to the checkout: stores (and SQLite's companions), elite.json
    (and its lock and temp files), exported packages, reports, the TLS example's keys and certificates."""
    paths: list[Path] = []
    for cwd, (cmd, *rest) in _evoengineer_commands():
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
    for cwd, argv in _commands():
        if argv[0] == "openssl":
            paths += [cwd / argv[i + 1] for i, a in enumerate(argv) if a in ("-out", "-keyout")]
            if "-CAcreateserial" in argv:
                paths.append(cwd / Path(_opt(argv, "-CA")).with_suffix(".srl"))
    return paths


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_what_the_documented_commands_write_is_ignored_by_git():
    paths = written_paths()
    names = {str(p) for p in paths}
    # the commands this must cover are found (the parsing kept up with the README and docs/)
    for expected in ("elite.json", "elite_store/evoengineer.db", "examples/families/row_softmax/run.db",
                     "examples/families/row_softmax/elite.json", "examples/families/row_softmax/pkg/pyproject.toml",
                     "msda_op/pyproject.toml", "report/index.html", "ca.key", "node.key", "ca.srl"):
        assert expected in names, (expected, sorted(names))
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-v", "-n"], cwd=ROOT, text=True,
                       capture_output=True, input="\n".join(str(p) for p in paths) + "\n")
    not_ignored = [ln.split("\t")[-1] for ln in r.stdout.splitlines() if ln.startswith("::")]
    assert not not_ignored, f"following the README or docs/ leaves these untracked and not ignored: {not_ignored}"


def test_the_documented_commands_parse():
    """Every `python -m evoengineer ...` line of the README's and docs/'s bash blocks is a real command with real
    options (parsed by the CLI's own parser, nothing run)."""
    from evoengineer.cli import build_parser

    commands = _evoengineer_commands()
    assert {argv[0] for _, argv in commands} >= {"search", "worker", "inspect", "report", "export", "check"}
    bad = []
    for _, argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            bad.append(" ".join(argv))
    assert not bad, f"documented commands the CLI refuses: {bad}"


# ---- what the README and docs/ name exists ----------------------------------------------------------------------
ROOTS = ("evoengineer/", "elite_store/", "templates/", "search_spaces/", "experiments/", "examples/", "tests/")


def test_the_files_and_modules_the_docs_name_exist():
    import importlib

    missing = []
    for path, text in DOCS.items():
        for ref in sorted(set(re.findall(r"`([^`\s]+)`", text))):
            ref = ref.rstrip(".,:;")
            where = f"{path.relative_to(ROOT)}: {ref}"
            if ref.startswith(ROOTS) and not any(c in ref for c in "<>*{}$"):
                if ref.startswith("evoengineer/data/") or ref.endswith(".db"):  # made by a wheel's build, a search
                    continue
                if not (ROOT / ref).exists():
                    missing.append(where)
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
                        missing.append(where)
                    break
                else:
                    missing.append(where)
    assert not missing, f"the README or docs/ name what does not exist: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_relative_link_points_to_a_file_of_the_repository():
    """Links of README.md and docs/*.md: the file exists inside the checkout, an anchor names a heading of it, and a
    link into experiments/ goes to a study's README.md only (raw logs and results there come and go)."""
    bad = []
    for path, text in DOCS.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}: {target}"
            if not dest.is_relative_to(ROOT) or not dest.exists():
                bad.append(f"{where} (no such file)")
                continue
            rel = dest.relative_to(ROOT).as_posix()
            if rel.startswith("experiments/") and not re.fullmatch(r"experiments/[\w-]+/README\.md", rel):
                bad.append(f"{where} (into experiments/ only a study's README.md)")
            if anchor and (dest.suffix != ".md" or anchor not in _anchors(dest.read_text())):
                bad.append(f"{where} (no heading #{anchor})")
    assert not bad, bad


def test_the_link_check_sees_links():
    links = re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", README))
    assert "docs/README.md" in links and "docs/cli.md" in links
    assert _slug("One call: `evoengineer.tune`") == "one-call-evoengineertune"


def test_the_readme_is_a_guide():
    """At most 250 lines; it shows how to install and how to run the tests (CI's .ci/run runs the same command) and
    points to the reference in docs/."""
    assert len(README.splitlines()) <= 250
    assert "python3 -m pip install -e '.[test]' && python3 -m pytest -q" in README
    assert "pytest -q" in (ROOT / ".ci" / "run").read_text()
    for page in ("docs/README.md", "docs/cli.md"):
        assert f"]({page}" in README, page


# ---- the CLI reference (docs/cli.md) ----------------------------------------------------------------------------
def test_the_cli_synopsis_has_every_command_and_option():
    from evoengineer.cli import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    block = re.search(r"## Synopsis\n\n```\n(.*?)```", CLI_DOC, re.S).group(1)
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
    assert not missing, f"options missing from docs/cli.md's synopsis: {missing}"
    for strategy in __import__("evoengineer.search", fromlist=["STRATEGIES"]).STRATEGIES:
        assert strategy in lines["search"].split("--strategy ")[1].split("]")[0]
    # the command table beside the synopsis names every command too
    assert {c for c in sub.choices if f"| `{c}` |" not in CLI_DOC} == set()


def test_help_names_every_command():
    from evoengineer.cli import COMMANDS, build_parser

    text = " ".join(build_parser().format_help().split())
    described = text.split("Commands: ")[1].split(".")[0]
    assert [c.strip() for c in described.split(",")] == list(build_parser()._subparsers._group_actions[0].choices)
    assert set(COMMANDS) <= set(c.strip() for c in described.split(","))


def test_the_evaluation_keys_are_all_named():
    from evoengineer.settings import EVALUATION_DEFAULTS

    table = SPACE_DOC[SPACE_DOC.index("[evaluation]  "):SPACE_DOC.index("[[shapes]]", SPACE_DOC.index("[evaluation]  "))]
    assert [k for k in EVALUATION_DEFAULTS if k not in table] == []
    keys = SPACE_DOC[SPACE_DOC.index("### `[evaluation]`"):]
    assert [k for k in EVALUATION_DEFAULTS if f"`{k}`" not in keys] == []


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
