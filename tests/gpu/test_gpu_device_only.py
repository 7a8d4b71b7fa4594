"""Device-only builds on a GPU (issue 52; skipped without CUDA): genomes of every launch path built as a cubin each
and launched by the family binding pass every check, and time as the same genomes built with host code do (one
evaluator each, in turn). MSDA: registers, shared metadata, persistent grids, staged values, the small-level cache,
head-major value through its workspace, the query-window paths 4 and 5. Decode: every load path x combine (TMA maps
of a contiguous cache and of a page pool, clusters, programmatic dependent launches). SDPA: both templates (Hopper:
cluster sizes x schedulers, persistent or not; plain: persistent or not)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from evoengineer import space_file  # noqa: E402
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
    space = load_space(space_file("cuda_msda_fp16.toml"))
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in _picks(space, random.Random(5))]
    _host_code_vs_device_only(space, cands, build_cache, monkeypatch, "cuda_msda_fp16", rounds=4)


def _decode_picks(space, rnd: random.Random) -> list:
    """A genome of each of these load path x combine pairs the space allows: every load path (TMA maps of a
    contiguous cache or of a page pool) and every combine (clusters, programmatic-dependent, in-kernel, separate)."""
    valid = space.valid_genomes()
    picks = []
    for path, combine in (("tma", "cluster"), ("tma", "separate"), ("bulk", "dependent"), ("cp_async", "in_kernel"),
                          ("bulk", "separate")):
        fits = [g for g in valid if space.genome_to_params(g)["LOAD_PATH"] == path
                and space.genome_to_params(g)["COMBINE"] == combine]
        if fits:
            picks.append(rnd.choice(fits))
    return picks


def _sdpa_picks(space, rnd: random.Random) -> list:
    """Hopper: a genome of each cluster size x scheduler (dynamic: counter slots in Params and the module) and a
    non-persistent one; plain: persistent CTAs (the module's work counter) and not."""
    valid = space.valid_genomes()
    params = space.genome_to_params
    if "hopper" in space.template:
        wanted = [lambda q, c=c, d=d: q["CLUSTER_SIZE"] == c and (q.get("SCHEDULER") == "dynamic") == d
                  for c in (1, 2) for d in (False, True)] + [lambda q: not q["PERSISTENT"]]
    else:
        wanted = [lambda q, d=d: q["USE_PERSISTENT_CTA"] == d for d in (True, False)]
    picks = []
    for want in wanted:
        fits = [g for g in valid if want(params(g))]
        if fits:
            picks.append(rnd.choice(fits))
    return picks


def _host_code_vs_device_only(space, cands, build_cache: Path, monkeypatch, label: str, rounds: int = 2) -> None:
    """Each candidate measured by a host-code build, then a device-only one (twice each, alternated, for MSDA:
    `rounds` 4), with the same statuses and max errors and times within 10%. Two rounds for the other families:
    their evaluators' start (paged KV caches, baselines) made four rounds of paged decode take 317 s on an H200."""
    from evoengineer.evaluators.local import LocalEvaluator

    results = {}
    for mode in ("0", "1") * (rounds // 2):  # alternated: drift of the machine hits both alike
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
        print(f"{label} {c.hash[:10]} host-code build {t_host:.2f} us, device-only {t_dev:.2f} us "
              f"({t_dev / t_host:.3f})")
        assert 0.9 < t_dev / t_host < 1.1, (c.params, t_host, t_dev)


@pytest.mark.parametrize("space_name", ["decode_fp8kv_d128_paged", "decode_fp16_d128"])
def test_device_only_decode_builds_pass_the_checks_and_keep_their_time(build_cache: Path, monkeypatch,
                                                                      space_name: str):
    space = load_space(space_file(f"{space_name}.toml"))
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in _decode_picks(space, random.Random(7))]
    _host_code_vs_device_only(space, cands, build_cache, monkeypatch, space_name)


@pytest.mark.parametrize("space_name", ["sdpa_hopper_fp16_d128", "sdpa_hopper_fp8_d128", "sdpa_fp16_d64"])
def test_device_only_sdpa_builds_pass_the_checks_and_keep_their_time(build_cache: Path, monkeypatch,
                                                                    space_name: str):
    space = load_space(space_file(f"{space_name}.toml"))
    factory = CandidateFactory(space)
    cands = [factory.from_genome(g) for g in _sdpa_picks(space, random.Random(11))]
    _host_code_vs_device_only(space, cands, build_cache, monkeypatch, space_name)
