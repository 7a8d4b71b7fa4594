"""Cluster addresses, TLS, options and the Dask settings of every process that starts workers or a scheduler."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from evoengineer.errors import UserError

GPU, BUILD = "GPU", "BUILD"
#: a task may be running on one worker that dies; on the second it is a poison pill (Dask's KilledWorker)
ALLOWED_FAILURES = 1
#: Dask settings for the processes we start: workers run builder process pools, so they must not be daemonic; no
#: statistical profiler or GIL sampling in the workers (threads waking every few ms: CPU taken from the builds and
#: noise beside CPU timings, for profiles of tasks that only wait on a subprocess)
#: Dask settings of every process of ours that starts workers or a scheduler. Dask's nannies set OMP_NUM_THREADS,
#: MKL_NUM_THREADS and OPENBLAS_NUM_THREADS to 1 in their workers by default: the measuring processes would inherit
#: them, CPU kernels would be timed on one thread and every CPU step of measuring a GPU candidate (inputs,
#: references, checks) would run single-threaded (measured: a cached cpu_msda candidate 1.9 s on a cluster worker
#: against 1.0 s in the local evaluator). Workers keep the environment they were started with.
DASK_CONFIG = {"distributed.worker.daemon": False, "distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
               "distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.gil.enabled": False,
               # None unsets a variable of Dask's defaults (merged into this when distributed is imported)
               "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None,
                                                       "OPENBLAS_NUM_THREADS": None}}
#: how long a new search waits for the first GPU worker of an external scheduler
#: seconds a local cluster has to close before its processes are killed
CLOSE_TIMEOUT_S = 30
WAIT_FOR_WORKERS_S = float(os.environ.get("EVOENGINEER_CLUSTER_WAIT_S", "60"))


class ClusterLost(Exception):
    """The Dask scheduler went away mid-search. What was measured is stored; the run can be resumed."""


class ClusterError(UserError):
    """The cluster cannot do this run (no GPU worker, a worker that cannot set up the evaluator, ...)."""


# ---- addresses and TLS ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TLSFiles:
    """CA certificate, this side's certificate and key (PEM files), for Dask's Security on tls:// addresses."""

    ca_file: str
    cert: str
    key: str

    @classmethod
    def from_options(cls, ca_file: str | None, cert: str | None, key: str | None) -> "TLSFiles | None":
        given = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
        if not any(given.values()):
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise UserError(f"TLS needs all of --tls-ca-file, --tls-cert and --tls-key (missing {', '.join(missing)})")
        paths = {}
        for k, v in given.items():
            p = Path(str(v)).expanduser().resolve()
            try:
                with open(p, "rb"):
                    pass
            except OSError as exc:
                raise UserError(f"{k} {v}: cannot read: {exc.strerror or exc}") from None
            paths[k] = str(p)
        return cls(paths["--tls-ca-file"], paths["--tls-cert"], paths["--tls-key"])

    def to_dict(self) -> dict[str, str]:
        return {"ca_file": self.ca_file, "cert": self.cert, "key": self.key}

    def security(self) -> Any:
        from distributed.security import Security

        return Security(tls_ca_file=self.ca_file, tls_client_cert=self.cert, tls_client_key=self.key,
                        tls_scheduler_cert=self.cert, tls_scheduler_key=self.key, tls_worker_cert=self.cert,
                        tls_worker_key=self.key, require_encryption=True)


@dataclass(frozen=True)
class ClusterOptions:
    """Where a search's evaluations run: `address` ('local' or a scheduler), a local cluster's GPU workers and
    build slots, TLS files. Stored with the run (config["cluster"]) so `resume` finds the cluster again."""

    address: str
    workers: int | None = None
    build_jobs: int | None = None
    tls: TLSFiles | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "workers": self.workers, "build_jobs": self.build_jobs,
                "tls": self.tls.to_dict() if self.tls else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterOptions":
        tls = d.get("tls")
        return cls(address=d["address"], workers=d.get("workers"), build_jobs=d.get("build_jobs"),
                   tls=TLSFiles.from_options(tls["ca_file"], tls["cert"], tls["key"]) if tls else None)


def is_loopback(host: str) -> bool:
    """True when `host` is this machine only (127.0.0.0/8, ::1, or a name resolving to nothing else)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_address(address: str, tls: TLSFiles | None, *, option: str = "--cluster") -> None:
    """Refuse, before anything connects, an address that would hand our code to another host in clear."""
    if address == "local":
        if tls is not None:
            raise UserError(f"{option} local listens on 127.0.0.1 only: the --tls-* options are for a tls:// "
                            "scheduler")
        return
    url = urlparse(address)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme not in ("tcp", "tls") or not url.hostname or not port:
        raise UserError(f"{option} {address!r}: expected 'local', tcp://127.0.0.1:PORT or tls://HOST:PORT")
    if url.scheme == "tls":
        if tls is None:
            raise UserError(f"{option} {address}: tls:// needs --tls-ca-file, --tls-cert and --tls-key "
                            "(certificates: docs/security.md)")
        return
    if tls is not None:
        raise UserError(f"{option} {address}: TLS files given for a plain tcp:// address; use tls://{url.netloc}")
    if not is_loopback(url.hostname):
        raise UserError(f"{option} {address}: refused: a Dask scheduler runs whatever code its clients send, so one "
                        "off this host must be reached over TLS (tls://HOST:PORT with --tls-ca-file, --tls-cert, "
                        "--tls-key; docs/security.md); plain tcp:// only on 127.0.0.1")


def quiet_dask_logs() -> None:
    """Dask's own log lines (reconnect attempts, worker deaths we handle) stay out of the search's stderr: what
    matters reaches the user as one line of ours."""
    import distributed  # noqa: F401  (its logging set-up first, then ours over it)

    for name in ("distributed", "tornado", "asyncio"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        for h in logger.handlers:
            h.setLevel(logging.CRITICAL + 1)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def configure_dask() -> None:
    import dask
    import distributed  # noqa: F401  (its defaults first: they are merged into whatever was set before)

    dask.config.set(DASK_CONFIG)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
