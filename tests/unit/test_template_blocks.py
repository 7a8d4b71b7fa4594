"""Fitness of the shipped templates (issue 55): every file short enough to read, every PTX instruction wrapped once
(in templates/cuda/common/ when two templates need it), every include found. The proof that moving code into
blocks changed no kernel is experiments/templates/ptx_equivalence.py (the same PTX before and after)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"  # what families share (templates/cuda/common/)
FAMILIES = ROOT / "evoengineer" / "families"  # each shipped family's own templates (cuda/, cpu/)
MAX_LINES = 800
ASM = re.compile(r'asm\s*(?:volatile\s*)?\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')  # adjacent literals: one string
INCLUDE = re.compile(r'{%-?\s*include\s+"([^"]+)"')


def _files() -> list[Path]:
    """Every shipped template file: the shared ones and each family's."""
    shared = [p for p in TEMPLATES.rglob("*") if p.is_file()]
    own = [p for p in FAMILIES.glob("*/*/**/*") if p.is_file() and p.suffix == ".j2"]
    return sorted(p for p in shared + own if "__pycache__" not in p.parts)


def _instructions(asm_text: str) -> tuple[str, ...]:
    """The PTX instructions an asm statement issues, in order (scoping braces and scratch register declarations
    left out): two asm statements with the same sequence wrap the same thing."""
    out = []
    for stmt in re.split(r"\\n|;", asm_text):
        s = stmt.replace("\\t", " ").strip().lstrip("{").strip()
        if s and not s.startswith((".reg", "}")):
            out.append(s.split()[0])
    return tuple(out)


def test_no_template_file_is_longer_than_800_lines():
    long = {str(p.relative_to(ROOT)): n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by kernel path into included files: {long}"


def test_each_ptx_instruction_is_wrapped_in_one_file():
    where: dict[str, set[str]] = defaultdict(set)
    for p in _files():
        for m in ASM.finditer(p.read_text()):
            text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
            where[" ; ".join(_instructions(text))].add(str(p.relative_to(ROOT)))
    twice = {k: sorted(v) for k, v in where.items() if k and len(v) > 1}
    assert not twice, f"one helper per instruction (templates/cuda/common/): {twice}"


def test_the_instruction_parser_sees_through_braces_and_scratch_registers():
    assert _instructions(r"{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         r" selp.u32 %0, 1, 0, p;\n}") == ("mbarrier.try_wait.parity.shared::cta.b64", "selp.u32")
    assert _instructions(r"cp.async.commit_group;\n") == ("cp.async.commit_group",)


def test_every_include_names_a_file_of_the_template_folders():
    """An include resolves as the renderer's loader resolves it: the including template's folder (a family's
    template: its family's cuda/ or cpu/ folder), templates/cuda/ (the shared blocks), templates/."""
    missing = []
    for p in _files():
        top = next((parent for parent in p.parents if parent.parent.parent == FAMILIES), p.parent)
        roots = [top, TEMPLATES / "cuda", TEMPLATES]
        for name in INCLUDE.findall(p.read_text()):
            if not any((r / name).is_file() for r in roots):
                missing.append(f"{p.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_common_blocks_are_guarded():
    """A block included twice (directly and through another block) defines its helpers once."""
    for p in sorted((TEMPLATES / "cuda" / "common").glob("*.cuh.j2")):
        text = p.read_text()
        if "__device__" in text and p.name != "launch_traits.cuh.j2":
            assert re.search(r"#ifndef EVO_COMMON_\w+\n#define EVO_COMMON_\w+", text), p.name
