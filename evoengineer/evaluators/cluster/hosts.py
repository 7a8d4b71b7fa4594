"""The workers of one host: its GPUs, the layout of GPU and build workers, starting and ending them (a local
cluster, `python -m evoengineer worker`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from evoengineer.compiler.toolchain import usable_cpus
from evoengineer.errors import UserError
from evoengineer.evaluators.cluster.config import (
    ALLOWED_FAILURES,
    BUILD,
    GPU,
    TLSFiles,
    check_address,
    configure_dask,
    quiet_dask_logs,
)


# ---- workers of one host ----------------------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """This host's GPUs as CUDA_VISIBLE_DEVICES values (that variable's order if set), without starting CUDA here."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode == 0:
                return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


@dataclass
class HostLayout:
    """The Dask workers of one host: GPU workers (one per device, or simulated ones) and build slots."""

    gpus: list[str | None]  # CUDA_VISIBLE_DEVICES value per GPU worker; None: simulated (no device)
    build_slots: int  # 0: no build worker (replays build nothing)
    cache_dir: str | None = None  # EVOENGINEER_CACHE for every worker (None: the workers' own default)

    def nanny_options(self, *, host: str | None, name: str, security: Any = None) -> list[dict[str, Any]]:
        """Keyword arguments of one distributed.Nanny per worker."""
        # the workers' HTTP endpoints (metrics, health) listen where the workers do: 127.0.0.1 for a local cluster
        common: dict[str, Any] = {"host": host, "dashboard_address": f"{host}:0" if host else None,
                                  "silence_logs": logging.CRITICAL + 1,
                                  "memory_limit": 0, "security": security}
        base_env = {"EVOENGINEER_CACHE": self.cache_dir} if self.cache_dir else {}
        out = []
        for i, gpu in enumerate(self.gpus):
            env = dict(base_env)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            out.append({**common, "nthreads": 1, "resources": {GPU: 1}, "env": env,
                        "name": f"{name}-gpu{i}" + ("" if gpu is not None else "-simulated")})
        if self.build_slots:
            out.append({**common, "nthreads": self.build_slots, "resources": {BUILD: self.build_slots},
                        "env": dict(base_env), "name": f"{name}-build"})
        return out


def host_layout(*, gpus: Sequence[str] | None, simulate: int | None, build_jobs: int | None, builds: bool,
                cache_dir: str | None = None, what: str = "--cluster local") -> HostLayout:
    """One GPU worker per GPU in `gpus` (default: every visible GPU), or `simulate` workers without a device; build
    slots on the remaining cores (or `build_jobs`)."""
    if simulate:
        ids: list[str | None] = [None] * simulate
    else:
        ids = list(gpus) if gpus is not None else list(visible_gpus())
        if not ids:
            raise UserError(f"{what}: this host shows no GPU (CUDA_VISIBLE_DEVICES, nvidia-smi); simulated GPU "
                            "workers (replays, CPU spaces, tests) with --cluster-workers N / worker --simulate N")
    slots = 0
    if builds:
        slots = build_jobs if build_jobs else max(1, usable_cpus() - len(ids))
    return HostLayout(gpus=ids, build_slots=slots, cache_dir=cache_dir)


def _end_processes(pids: list[int], grace_s: float) -> None:
    """Processes `pids` and their descendants: terminated if still running, killed after `grace_s`."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _start_local_cluster(layout: HostLayout) -> Any:
    """A SpecCluster on 127.0.0.1: the scheduler in this process (allowed-failures 1), a Nanny per worker."""
    from distributed import Nanny, Scheduler, SpecCluster

    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0",
                                               "allowed_failures": ALLOWED_FAILURES}}
    workers = {o["name"]: {"cls": Nanny, "options": o}
               for o in layout.nanny_options(host="127.0.0.1", name="local")}
    return SpecCluster(scheduler=scheduler, workers=workers, silence_logs=logging.CRITICAL + 1, name="evoengineer")


# ---- `python -m evoengineer worker` -----------------------------------------------------------------------------
def serve_workers(scheduler: str, layout: HostLayout, tls: TLSFiles | None, *, name: str | None = None,
                  announce: Callable[[str], None] = print) -> int:
    """Start this host's workers (a Nanny each) for `scheduler` and run until interrupted (SIGINT/SIGTERM)."""
    import asyncio
    import signal

    from distributed import Nanny

    check_address(scheduler, tls, option="--scheduler")
    configure_dask()
    quiet_dask_logs()
    url = urlparse(scheduler)
    # listen where the scheduler can reach us: loopback for a loopback scheduler, else every interface (TLS only)
    listen = "127.0.0.1" if url.scheme == "tcp" else None
    security = tls.security() if tls else None
    label = name or socket.gethostname().split(".")[0]

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        nannies = [Nanny(scheduler, **o) for o in layout.nanny_options(host=listen, name=label, security=security)]
        await asyncio.gather(*nannies)
        gpu = sum(1 for g in layout.gpus if g is not None)
        announce(f"{len(layout.gpus)} GPU worker(s) ({gpu} pinned to a device, {len(layout.gpus) - gpu} simulated) "
                 f"and {layout.build_slots} build slot(s) serving {scheduler}; Ctrl-C stops them")
        finished = asyncio.ensure_future(asyncio.gather(*(n.finished() for n in nannies)))
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait([finished, waiter], return_when=asyncio.FIRST_COMPLETED)
        stopped = stop.is_set()
        await asyncio.gather(*(n.close() for n in nannies), return_exceptions=True)
        waiter.cancel()
        finished.cancel()
        if not stopped:  # Dask workers close once their scheduler is gone for good
            announce(f"error: the workers lost the scheduler at {scheduler} and stopped; start them again with it")
            return 1
        return 0

    return asyncio.run(main())
