"""Device-only MSDA builds on a GPU (issue 52; skipped without CUDA): genomes of every launch path (registers,
shared metadata, persistent grids, staged values, the small-level cache, head-major value through its workspace,
the query-window paths 4 and 5) built as a cubin each and launched by the family binding pass every check, and time
as the same genomes built with host code do (one evaluator each, in turn)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from evoengineer import SPACES_DIR  # noqa: E402
from evoengineer.candidate import CandidateFactory  # noqa: E402
from evoengineer.space import load_space  # noqa: E402


def _picks(space, rnd: random.Random) -> list:
    valid = space.valid_genomes()
    picks = set(rnd.sample(valid, 4))
    for gene in ("STAGE_VALUES", "CACHE_SMALL_LEVEL", "SHARED_META", "HEAD_MAJOR", "PERSISTENT"):
        picks.add(rnd.choice([g for g in valid if space.genome_to_params(g)[gene]]))
    for stages in (0, 2):  # path 4 and path 5
        picks.add(rnd.choice([g for g in valid if space.genome_to_params(g)["WINDOW_TILE"] > 0
                              and (space.genome_to_params(g)["WINDOW_STAGES"] > 0) == (stages > 0)]))
    return sorted(picks)


def test_device_only_msda_builds_pass_the_checks_and_keep_their_time(build_cache: Path, monkeypatch):
    from evoengineer.evaluators.local import LocalEvaluator

    space = load_space(SPACES_DIR / "cuda_msda_fp16.toml")
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in _picks(space, random.Random(5))]
    results = {}
    for mode in ("0", "1", "0", "1"):  # alternated: drift of the machine hits both alike
        monkeypatch.setenv("EVOENGINEER_DEVICE_ONLY", mode)
        with LocalEvaluator(space, cache_dir=build_cache) as ev:
            assert ev.builder.device_only == (mode == "1")
            for c, m in ev.evaluate_many(cands):
                results.setdefault((mode, c.hash), []).append(m)
    for c in cands:
        host, dev = results[("0", c.hash)], results[("1", c.hash)]
        assert [m.status for m in dev] == [m.status for m in host], (c.params, host[0].reason, dev[0].reason)
        if host[0].status != "ok":
            continue
        assert all(m.metrics["max_abs_err"] == host[0].metrics["max_abs_err"] for m in dev), c.params
        assert "launch_traits" in dev[0].metrics or dev[0].metrics.get("build_cached")
        t_host = min(m.time_us for m in host)
        t_dev = min(m.time_us for m in dev)
        print(f"{c.hash[:10]} host-code build {t_host:.2f} us, device-only {t_dev:.2f} us ({t_dev / t_host:.3f})")
        assert 0.9 < t_dev / t_host < 1.1, (c.params, t_host, t_dev)
