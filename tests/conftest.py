"""Shared fixtures: the toy space and a synthetic landscape over it."""

from __future__ import annotations

import csv
import hashlib
import math
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def toy_measure(p: dict) -> tuple[str, float | None]:
    """A smooth synthetic cost with planted failures; deterministic."""
    if p["NUM_WARPS"] == 16 and p["D_STRIDE"] == 8:
        return "gate_failed", None
    if p["NUM_PRODUCER_WARPS"] == 3 and p["STAGES"] == 2:
        return "timeout", None
    if p["USE_FAST_EXP"] and p["D_STRIDE"] == 8 and p["QUERIES_PER_BLOCK"] == 8:
        return "wrong", None
    t = 100.0
    t *= 1 + 0.3 * abs(math.log2(p["NUM_WARPS"] / 8))
    t *= 1 + 0.2 * abs(p["STAGES"] - 3)
    t *= 1 + 0.15 * abs(math.log2(p["QUERIES_PER_BLOCK"] / 4))
    t *= 1 + 0.25 * abs(math.log2(p["D_STRIDE"] / 4))
    t *= 1 + 0.1 * abs(p["NUM_PRODUCER_WARPS"] - 2)
    t *= 0.9 if p["USE_FAST_EXP"] else 1.0
    t *= {"a": 1.0, "b": 1.1, "c": 0.95}[p["LOOP_ORDER"]]
    noise = int(hashlib.sha256(repr(sorted(p.items())).encode()).hexdigest()[:6], 16) / 0xFFFFFF
    return "ok", round(t * (1 + 0.02 * noise), 4)


def write_toy_landscape(space, path: Path, *, drop: int = 0) -> Path:
    names = space.names
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names + ["status", "time_us", "reason"])
        for i, g in enumerate(space.valid_genomes()):
            if i < drop:
                continue
            p = space.genome_to_params(g)
            status, t = toy_measure(p)
            cells = [("true" if v else "false") if isinstance(v, bool) else v for v in p.values()]
            w.writerow(cells + [status, "" if t is None else t, "" if status == "ok" else "planted"])
    return path


@pytest.fixture
def toy_dir(tmp_path: Path) -> Path:
    """A folder with the toy space, its template and a full landscape (landscape.csv)."""
    d = tmp_path / "toy"
    d.mkdir()
    for name in ("toy_space.toml", "toy.cpp.j2"):
        shutil.copy(DATA / name, d / name)
    from evoengineer.space import load_space

    write_toy_landscape(load_space(d / "toy_space.toml"), d / "landscape.csv")
    return d


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    """One build cache for the whole test session: the family binding is compiled once ($EVOENGINEER_CACHE if set,
    so CI and the GPU host reuse it across sessions)."""
    given = os.environ.get("EVOENGINEER_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("evocache")


def build_result(space, params, cache_dir: Path, jobs: int | None = None):
    """(task, candidate, build result) of one candidate (params dict or genome) of `space`, built through the real
    Builder; the build must succeed."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.builder import Builder
    from evoengineer.families import get_task

    task = get_task(space)
    factory = CandidateFactory(space)
    cand = factory.make(params) if isinstance(params, dict) else factory.from_genome(params)
    b = Builder(space, entry=task.entry, binding=task.binding, signature=task.binding_signature(),
                cache_dir=cache_dir, **({"jobs": jobs} if jobs else {}))
    try:
        r = b.submit(cand).result()
    finally:
        b.close()
    assert r.status == "ok", (cand.params, r.status, r.reason)
    return task, cand, r


def build_candidate(space, params, cache_dir: Path, jobs: int | None = None):
    """(task, module) of one candidate (params dict or genome) of `space`, built through the real Builder; the
    build must succeed."""
    from evoengineer.compiler.steps import load_module

    task, _, r = build_result(space, params, cache_dir, jobs)
    return task, load_module(r.so, r.module)


def assert_right(task, inputs, out) -> None:
    """`out` (synchronized first) is within the task's tolerance of its reference on `inputs`, and all finite."""
    import torch

    atol, rtol = task.tolerance()
    torch.cuda.synchronize()
    ref = task.reference(inputs)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).abs() <= atol + rtol * ref.abs()).all(), float((out.double() - ref).abs().max())


def assert_right_call_after_call(task, module, big, small) -> None:
    """An SDPA kernel gives the right answer (within the task's tolerance, all finite) on every call: twice on `big`,
    after a call on `small` (another grid), and from two replays of a CUDA graph of a call on `big` (output
    NaN-poisoned before each replay). For persistent kernels, whose per-launch state must not leak."""
    import torch

    for inputs in (big, big, small, big):
        out = task.new_output(inputs)
        task.launch(module, inputs, out)
        assert_right(task, inputs, out)
    out = task.new_output(big)
    task.launch(module, big, out)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        task.launch(module, big, out)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        assert_right(task, big, out)


@pytest.fixture
def faults_dir(tmp_path: Path) -> Path:
    """A folder with the test-only faults space and template."""
    d = tmp_path / "faults"
    shutil.copytree(DATA / "faults", d)
    return d



from evoengineer.evaluators import Evaluator, Measurement  # noqa: E402  (after the sys.path set-up above)


class CheckingEvaluator(Evaluator):
    """Wraps an evaluator: counts calls, and asserts each candidate is a valid, never-seen configuration."""

    kind = "checking"

    def __init__(self, inner: Evaluator, space):
        self.inner, self.space = inner, space
        self.calls: list[str] = []
        self.keys: set[tuple] = set()

    def describe(self) -> dict:
        return self.inner.describe()

    def evaluate(self, candidate) -> Measurement:
        genome = self.space.params_to_genome(candidate.params)  # raises unless every value is allowed
        assert self.space.is_valid_genome(genome), candidate.params
        assert not self.space.violated(candidate.params)
        key = tuple(genome)
        assert key not in self.keys, f"evaluated twice: {candidate.params}"
        assert candidate.hash not in self.calls
        self.keys.add(key)
        self.calls.append(candidate.hash)
        return self.inner.evaluate(candidate)


def stored_count(db: Path) -> int:
    """Evaluations committed to a store that another process is writing (0 while it does not exist yet)."""
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("select count(*) from candidates").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def planted_cheats(folder: Path, cache: Path, cheats, space_file: str = "cheats_space.toml", **genes):
    """(evaluator, honest candidate, {cheat: candidate}) of a planted-cheats family copied to `folder` (from
    tests/data/<folder's name>), every build made first (a build beside a CPU measurement is noise). Genes other
    than CHEAT are `genes`; the caller closes the evaluator."""
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.space import load_space

    shutil.copytree(DATA / folder.name, folder)
    space = load_space(folder / space_file)
    f = CandidateFactory(space)
    ev = LocalEvaluator(space, cache_dir=cache, build_jobs=2)
    honest = f.make({"CHEAT": "none", **genes})
    planted = {c: f.make({"CHEAT": c, **genes}) for c in cheats}
    for c in [honest, *planted.values()]:
        assert ev.build(c)["status"] == "ok", c.params
    return ev, honest, planted

