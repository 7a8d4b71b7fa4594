"""Proof that a template refactor changed no kernel: the same genomes of every shipped CUDA space rendered and
compiled to PTX before and after, compared (nvcc alone; no GPU needed).

    # in a checkout of the commit before the refactor, then in this one:
    python experiments/templates/ptx_equivalence.py dump --out /tmp/ptx_before [--genomes 6] [--spaces a,b]
    python experiments/templates/ptx_equivalence.py dump --out /tmp/ptx_after
    python experiments/templates/ptx_equivalence.py compare /tmp/ptx_before /tmp/ptx_after

`dump` renders the genomes (seeded: the same genomes in both trees while the spaces are the same), writes the
rendered source (blank and comment lines dropped) and the PTX of its device code (the search's device flags, no
line info). `compare` prints, per space, how many kernels have identical PTX (and how many the same source too: a
template's host code is compared by its source) and the first differing lines of the others. Identical PTX is
identical SASS (ptxas is deterministic): the refactor moved code without changing what runs on the GPU; a
difference is a kernel to test on one.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shipped_cuda_spaces() -> list[Path]:
    from evoengineer.space import load_space
    from evoengineer.space.spec import shipped_spaces

    return [f for f in shipped_spaces() if load_space(f).target.device_compiler]


def _ptx(job: dict, work: Path) -> str:
    """The PTX of a candidate's device code (the search's device flags, without line info, for the space's virtual
    architecture), with comment, file and line directives dropped. The same PTX is the same SASS: ptxas is
    deterministic."""
    from evoengineer.compiler.steps import cubin_compile_flags, nvcc_path

    arch = re.sub(r"^sm_", "compute_", job["arch"])
    flags = [f for f in cubin_compile_flags(job) if f != "-lineinfo" and not f.startswith(
        ("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code"))]
    work.mkdir(parents=True, exist_ok=True)
    src, out = work / "kernel.cu", work / "kernel.ptx"
    src.write_text(job["source"])
    p = subprocess.run([nvcc_path() or "nvcc", "-ptx", f"-arch={arch}", *flags, str(src), "-o", str(out)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return "compile_error: " + next((ln for ln in (p.stdout + p.stderr).splitlines() if "error" in ln),
                                        p.stderr[-300:]) + "\n"
    keep = [re.sub(r"\s+", " ", ln.strip()) for ln in out.read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith(("//", ".file", ".loc"))]
    return "\n".join(keep) + "\n"


def _normalized(source: str) -> str:
    """Rendered source without blank lines, comment-only lines and indentation (what moving code cannot change)."""
    keep = [re.sub(r"\s+", " ", ln.strip()) for ln in source.splitlines()]
    return "\n".join(ln for ln in keep if ln and not ln.startswith("//")) + "\n"


def dump(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from evoengineer.candidate import CandidateFactory
    from evoengineer.check import pick_genomes
    from evoengineer.compiler.builder import Builder
    from evoengineer.evaluators.local import device_only_builds
    from evoengineer.families import get_task
    from evoengineer.space import load_space

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="evo-ptx-"))
    wanted = set(args.spaces.split(",")) if args.spaces else None
    jobs = []
    for f in shipped_cuda_spaces():
        space = load_space(f)
        if wanted and space.name not in wanted:
            continue
        for v in (space.variants() if space.variant_axes else [None]):
            sp = space.variant(v) if v is not None else space
            label = sp.name if v is None else f"{sp.name}.{sp.variant_label(v)}"
            task = get_task(sp)
            builder = Builder(sp, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                              cache_dir=work / "cache", jobs=1, device_only=device_only_builds(task))
            factory = CandidateFactory(sp)
            for i, g in enumerate(pick_genomes(sp, args.genomes, args.seed)):
                c = factory.from_genome(g)
                jobs.append((label, i, c.params, builder.compile_job(c, work / label / str(i))))

    def one(item):
        label, i, params, job = item
        d = out / label
        d.mkdir(exist_ok=True)
        (d / f"{i}.json").write_text(json.dumps({"params": params}, indent=1, sort_keys=True, default=str))
        (d / f"{i}.src").write_text(_normalized(job["source"]))
        ptx = _ptx(job, work / label / str(i))
        (d / f"{i}.ptx").write_text(ptx)
        return label, i, ptx.split(":")[0] if ptx.startswith("compile_error") else "ok"

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for label, i, status in pool.map(one, jobs):
            print(f"{label} {i} {status}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def compare(args: argparse.Namespace) -> int:
    a, b = Path(args.before), Path(args.after)
    differ = 0
    for d in sorted(p for p in a.iterdir() if p.is_dir()):
        same, same_source, changed = 0, 0, []
        for rec in sorted(d.glob("*.json"), key=lambda p: int(p.stem)):
            other = b / d.name / rec.name
            if not other.exists():
                changed.append(f"{rec.stem}: missing after")
                continue
            ra, rb = json.loads(rec.read_text()), json.loads(other.read_text())
            if ra["params"] != rb["params"]:
                changed.append(f"{rec.stem}: other genes (the space changed)")
                continue
            src_same = rec.with_suffix(".src").read_text() == other.with_suffix(".src").read_text()
            ta, tb = ("\n".join(re.sub(r"\s+", " ", ln.strip()) for ln in f.with_suffix(".ptx").read_text().splitlines())
                      for f in (rec, other))
            if ta == tb:
                same += 1
                same_source += src_same
                continue
            diff = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), lineterm="", n=0))[2:8]
            changed.append(f"{rec.stem}: PTX differs" + "".join(f"\n      {x}" for x in diff))
        differ += len(changed)
        print(f"{d.name}: {same} identical PTX ({same_source} of them the same source too), {len(changed)} differ")
        for c in changed:
            print(f"    {c}")
    print("PTX identical for every genome" if not differ else f"{differ} kernels differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--out", required=True)
    d.add_argument("--genomes", type=int, default=6)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--spaces", default=None, help="comma-separated space names (default: every shipped CUDA space)")
    d.add_argument("--jobs", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    return dump(args) if args.cmd == "dump" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
