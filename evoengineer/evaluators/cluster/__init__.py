"""Evaluation on a Dask distributed cluster: every GPU of this host (`--cluster local`) or the workers of an existing
scheduler (`--cluster tcp://127.0.0.1:PORT`, `--cluster tls://HOST:PORT`).

Layout. A *GPU worker* is a Dask worker (under a Nanny) with one thread and the resource ``GPU=1``, pinned to one
device with CUDA_VISIBLE_DEVICES; it measures one candidate at a time through the evaluator the search would use on
one machine (local: the persistent, replaceable measuring subprocess, so a hang is `timeout`, a crash
`runtime_error`, and the Dask worker lives on; replay: the landscape). A *build worker* has one thread per build slot
and the resource ``BUILD=<slots>``; each candidate's compile is a task asking ``BUILD=1`` that fills the build cache
of its host. The measuring task then finds the build in the cache; on a host whose cache or toolchain differs
(another host) the cache key (toolchain fingerprint included) misses and it is built there, so a module is only ever
measured on a host whose toolchain built it.

Flow. The search process stays the only writer of the store. Asynchronously (`submit` / `poll`): a candidate's build
task is submitted the moment the search proposes it, its measuring task as soon as it is built and a GPU worker is
free (never more measuring tasks in flight than GPU workers alive, so a worker holds no queued candidate that its
death would wrongly implicate), and each result is handed on the moment it arrives; a thread of the search process
reacts to the finished tasks (``as_completed``). CPU spaces take turns: no build runs beside a measurement. A Dask
worker killed mid-candidate has its task re-run elsewhere by the scheduler; a candidate whose task was running on
two workers that died is a poison pill (the scheduler's ``allowed-failures`` = 1, set on an external scheduler too)
and is recorded as `runtime_error`. A lost scheduler raises ClusterLost: the driver stops the run, resumable.

Security. A Dask scheduler runs whatever code a connected client or worker sends. The local cluster listens on
127.0.0.1 only; any other address must be reached over TLS (certificates: docs/security.md, "Dask clusters"): a plain-TCP
address off this host is refused before anything connects.
"""

from __future__ import annotations

from evoengineer.evaluators.cluster.config import (
    ALLOWED_FAILURES,
    BUILD,
    CLOSE_TIMEOUT_S,
    DASK_CONFIG,
    GPU,
    WAIT_FOR_WORKERS_S,
    ClusterError,
    ClusterLost,
    ClusterOptions,
    TLSFiles,
    _one_line,
    check_address,
    configure_dask,
    is_loopback,
    quiet_dask_logs,
)
from evoengineer.evaluators.cluster.evaluator import ClusterEvaluator, _worker_of
from evoengineer.evaluators.cluster.hosts import (
    HostLayout,
    _end_processes,
    _start_local_cluster,
    host_layout,
    serve_workers,
    visible_gpus,
)
from evoengineer.evaluators.cluster.tasks import (
    _allowed_failures_setter,
    _close_worker_evaluators,
    _toolchain_key,
    _worker_evaluator,
    build_task,
    fingerprint_task,
    make_worker_evaluator,
    measure_task,
    prepare_task,
    retime_task,
    sanitize_task,
)

__all__ = ['GPU', 'BUILD', 'ALLOWED_FAILURES', 'DASK_CONFIG', 'CLOSE_TIMEOUT_S', 'WAIT_FOR_WORKERS_S', 'ClusterLost', 'ClusterError', 'TLSFiles', 'ClusterOptions', 'is_loopback', 'check_address', 'quiet_dask_logs', 'configure_dask', '_one_line', 'visible_gpus', 'HostLayout', 'host_layout', '_end_processes', '_start_local_cluster', 'serve_workers', 'make_worker_evaluator', 'prepare_task', 'build_task', 'measure_task', 'retime_task', 'sanitize_task', 'fingerprint_task', '_worker_evaluator', '_toolchain_key', '_allowed_failures_setter', '_close_worker_evaluators', 'ClusterEvaluator', '_worker_of']
