"""`python -m evoengineer check`: a space's template rendered, compiled and gated for a few genomes, with no search,
no measuring and no GPU (nvcc alone for a CUDA space), so a template can be iterated on at a laptop.

CPU spaces are built as a search builds them (compiled, linked to the family binding, imported); CUDA spaces are
compiled and gated only (an object with host code, or the cubin of a device-only build), since the binding and a
load need the CUDA runtime of a GPU host. The report per genome: status, the ptxas report (registers, shared
memory, spills, stack) and compile time; before it, the entry point's C prototype of a declared family.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from evoengineer.space.spec import SearchSpace

#: metrics printed per genome (ptxas report of a CUDA compile)
REPORT = (("registers", "regs"), ("smem_bytes", "smem B"), ("spill_bytes", "spill B"), ("stack_bytes", "stack B"))


def pick_genomes(space: SearchSpace, n: int, seed: int) -> list[list[int]]:
    """Up to `n` distinct valid genomes, drawn with `seed` (fewer when the space has fewer)."""
    rng = random.Random(seed)
    picked: list[list[int]] = []
    for _ in range(50 * max(n, 1)):
        if len(picked) >= min(n, space.count_valid()):
            break
        g = space.random_valid_genome(rng)
        if g not in picked:
            picked.append(g)
    return picked


def prototype(task: Any) -> str:
    """The entry point a template must define: a declared family's C prototype, or what its own binding takes."""
    try:
        return task.signature.c_prototype(task.entry) + ";"
    except NotImplementedError:
        return f'extern "C" int {task.entry}(...);  (the family\'s own binding: {task.binding_file})'


def check_space(space: SearchSpace, *, genomes: int = 3, seed: int = 0, cache_dir: str | Path | None = None,
                jobs: int | None = None, say: Callable[[str], None] = print) -> int:
    """Render, compile and gate `genomes` genomes of `space`; print one line each. Returns 0 when every one built
    and passed the gates, else 1 (a template that does not render raises UserError)."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder, default_cache_dir, usable_cpus
    from evoengineer.compiler.steps import compile_checked, safe
    from evoengineer.evaluators.local import device_only_builds
    from evoengineer.families import get_task

    if space.variant_axes:  # each signature variant in turn
        codes = []
        for v in space.variants():
            say(f"== variant {space.variant_label(v)} ==")
            codes.append(check_space(space.variant(v), genomes=genomes, seed=seed, cache_dir=cache_dir, jobs=jobs,
                                     say=say))
        return max(codes)
    task = get_task(space)
    say(f"space {space.name} ({space.backend}, {space.count_valid()} valid configurations), family {task.name}, "
        f"template {space.template}")
    say(f"entry point: {prototype(task)}")
    factory = CandidateFactory(space)
    candidates = [factory.from_genome(g) for g in pick_genomes(space, genomes, seed)]  # renders: Jinja errors here
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    jobs = max(1, jobs or usable_cpus())
    device_only = device_only_builds(task)
    if space.target.device_compiler:
        # compiled and gated only: the binding (torch's CUDA headers) and a load need a GPU host
        builder = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                          cache_dir=cache, jobs=jobs, device_only=device_only)
        say(f"compiling {'device code only (cubins)' if device_only else 'kernel objects'} with nvcc, "
            f"{space.arch}; no link, no load")

        def one(c: Any) -> dict[str, Any]:
            return safe(compile_checked, builder.compile_job(c, cache / "check" / c.hash[:2] / c.hash))

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, candidates))
    else:
        builder = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                          cache_dir=cache, jobs=jobs)
        try:
            results = [vars(f.result()) for f in [builder.submit(c) for c in candidates]]
        finally:
            builder.close()
    bad = 0
    for c, r in zip(candidates, results):
        m = r.get("metrics") or {}
        params = " ".join(f"{k}={v}" for k, v in c.params.items())
        report = "  ".join(f"{label} {m[key]}" for key, label in REPORT if key in m)
        took = f"{r.get('build_s', 0.0):.1f} s" if not r.get("cached") else "cached"
        line = f"{c.short}  {r['status']:<13} {report + '  ' if report else ''}{took}  {params}"
        if r["status"] != "ok":
            bad += 1
            line += f"\n    {r.get('reason', '')}"
        say(line)
    say(f"{len(results) - bad} of {len(results)} built and passed the gates" if results else "no valid genome")
    return 1 if bad or not results else 0
