"""Build an evaluator from CLI options (new run) or from a run's stored settings (resume)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evoengineer.errors import UserError
from evoengineer.evaluators.base import Evaluator
from evoengineer.evaluators.replay import ReplayEvaluator
from evoengineer.space.spec import SearchSpace

if TYPE_CHECKING:
    from evoengineer.evaluators.cluster import ClusterOptions
    from evoengineer.evaluators.replay import BuildTimeModel


def replay_delay() -> float:
    """Seconds each replayed measurement takes (EVOENGINEER_REPLAY_DELAY_S, default 0): simulates a device."""
    text = os.environ.get("EVOENGINEER_REPLAY_DELAY_S", "0")
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"EVOENGINEER_REPLAY_DELAY_S={text!r}: not a number") from None
    if not 0 <= value <= 60:
        raise UserError(f"EVOENGINEER_REPLAY_DELAY_S={text!r}: must be between 0 and 60")
    return value


def replay_log() -> str | None:
    """EVOENGINEER_REPLAY_LOG: a file the replay evaluator appends `hash status` to for every measurement it makes
    (an audit of what was measured, across interruptions and resumes)."""
    path = os.environ.get("EVOENGINEER_REPLAY_LOG") or None
    if path is not None and Path(path).is_dir():
        raise UserError(f"EVOENGINEER_REPLAY_LOG={path}: is a directory, not a file to append to")
    return path


def replay_builds() -> "BuildTimeModel | None":
    """EVOENGINEER_REPLAY_BUILDS="SLOTSxSECONDS" (e.g. 15x1.5; SECONDS may be "recorded": the landscape's build_s
    column, 0 where missing): a replay builds (simulated) on SLOTS slots as a local search would, builds ahead
    included. Unset: no builds, each candidate answered at once."""
    from evoengineer.evaluators.replay import BuildTimeModel

    text = os.environ.get("EVOENGINEER_REPLAY_BUILDS", "").strip()
    if not text:
        return None
    slots, sep, seconds = text.partition("x")
    try:
        if not sep:
            raise ValueError
        recorded = seconds == "recorded"
        return BuildTimeModel(int(slots), 0.0 if recorded else float(seconds), recorded=recorded)
    except ValueError:
        raise UserError(f"EVOENGINEER_REPLAY_BUILDS={text!r}: expected SLOTSxSECONDS (e.g. 15x1.5 or 15xrecorded), "
                        "slots >= 1, seconds >= 0") from None


def _local(space: SearchSpace, seed: int, build_jobs: int | None, cache_dir: str | None) -> Evaluator:
    from evoengineer.evaluators.local import LocalEvaluator

    if space.target.gpu:
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"space {space.name!r} is a cuda space and this machine has no usable GPU (render, "
                            "compile and gate its template here with `python -m evoengineer check --space "
                            f"{space.path or space.name}`; replay a landscape with --landscape, or pick a cpu space)")
    return LocalEvaluator(space, seed=seed, build_jobs=build_jobs, cache_dir=cache_dir)


def evaluator_for_search(space: SearchSpace, *, landscape: str | None = None, seed: int = 0,
                         build_jobs: int | None = None, cache_dir: str | None = None,
                         cluster: "ClusterOptions | None" = None) -> Evaluator:
    """A replay evaluator when a landscape is given, else real builds and runs for the space's backend; with
    `cluster`, that evaluator runs on the workers of a Dask cluster (evaluators/cluster/)."""
    if cluster is not None:
        if landscape is not None:
            with ReplayEvaluator(landscape, space) as ev:  # checked here, before anything starts
                inner = ev.describe()
        else:
            inner = _local_description(space, seed, build_jobs, cache_dir)
        return _on_cluster(space, inner, cluster)
    if landscape is not None:
        return ReplayEvaluator(landscape, space, delay_s=replay_delay(), log_path=replay_log(),
                               builds=replay_builds())
    return _local(space, seed, build_jobs, cache_dir)


def _local_description(space: SearchSpace, seed: int, build_jobs: int | None, cache_dir: str | None) -> dict:
    """What LocalEvaluator.describe() says, made without needing a GPU here (the cluster's workers measure)."""
    from evoengineer.evaluators.local import LocalEvaluator

    with LocalEvaluator(space, seed=seed, build_jobs=build_jobs, cache_dir=cache_dir) as ev:
        d = ev.describe()
    d["cache_dir"] = str(Path(d["cache_dir"]).expanduser().resolve())
    return d


def _on_cluster(space: SearchSpace, inner: dict[str, Any], cluster: "ClusterOptions") -> Evaluator:
    from evoengineer.evaluators.cluster import ClusterEvaluator

    extras: dict[str, Any] = {}
    if inner["kind"] == "replay":
        extras = {"delay_s": replay_delay(), "log_path": str(Path(replay_log()).resolve()) if replay_log() else None}
    elif inner["kind"] == "local":
        extras = {"cache_dir": inner["cache_dir"]}
    return ClusterEvaluator(space, inner, address=cluster.address, workers=cluster.workers,
                            build_jobs=cluster.build_jobs, tls=cluster.tls,
                            extras=extras)


def evaluator_for_resume(space: SearchSpace, described: dict[str, Any],
                         cluster: "ClusterOptions | None" = None) -> Evaluator:
    """Rebuild the evaluator a run started with; refuse if its inputs changed since. With `cluster` (a run that
    used one, or a new one given to `resume`), the same evaluator runs on that cluster's workers."""
    kind = described.get("kind")
    if kind == "dask" or cluster is not None:
        inner = described["inner"] if kind == "dask" else described
        if cluster is None:
            raise UserError("the run evaluated on a Dask cluster, and its cluster settings are missing")
        if inner.get("kind") == "replay":  # its landscape is still there and unchanged
            evaluator_for_resume(space, inner).close()
        elif inner.get("kind") != "local":
            raise UserError(f"run's evaluator {inner.get('kind')!r} cannot run on a cluster")
        return _on_cluster(space, inner, cluster)
    if kind == "replay":
        path = described["landscape"]
        if not Path(path).exists():
            raise UserError(f"{path}: the run's landscape file is gone")
        ev = ReplayEvaluator(path, space, delay_s=replay_delay(), log_path=replay_log(), builds=replay_builds())
        if ev.landscape.sha256 != described.get("landscape_sha256"):
            raise UserError(f"{path}: landscape changed since the run started; resuming would mix measurements")
        return ev
    if kind == "local":
        return _local(space, int(described.get("seed", 0)), described.get("build_jobs"), described.get("cache_dir"))
    raise UserError(f"run's evaluator {kind!r} is not available in this installation")
