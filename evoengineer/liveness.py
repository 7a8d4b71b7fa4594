"""Whether the holder of a lease (a run's lease in the store, a run's claim on its elite.json) is still alive."""

from __future__ import annotations

import os
import socket
import time

#: a holder on another host that gave no sign of life for this long is taken over
STALE_AFTER_S = float(os.environ.get("EVOENGINEER_LEASE_STALE_S", "60"))


def holder_alive(host: object, pid: object, last_seen: float, stale_after_s: float | None = None) -> bool:
    """On this host: the process `pid` still exists (this process's own leftovers count as dead). Elsewhere: its
    last sign of life (`last_seen`, time.time()) is recent."""
    stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
    if host == socket.gethostname() and isinstance(pid, int):
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return time.time() - last_seen < stale_after_s


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Leave (os._exit(1)) as soon as this process's parent is gone: a daemon thread polls the parent pid. For
    helper processes (builder pool, measuring worker) whose parent may be killed with -9, e.g. a search or a Dask
    worker: they would otherwise wait for work, or hold a device, for nobody.

    A process that a multiprocessing fork server started (a builder pool's) has the server as its parent, and the
    server outlives the pool's owner (each of its children keeps it alive): such a process watches the owner too
    (multiprocessing's parent process), so a kill -9 of the search leaves no fork server, pool process or resource
    tracker behind."""
    import multiprocessing
    import threading

    parent = os.getppid()
    owner = multiprocessing.parent_process()  # the process that asked for this one (None: not multiprocessing's)
    if owner is not None and owner.pid == parent:
        owner = None  # a plain fork or spawn: the parent is the owner

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent or (owner is not None and not owner.is_alive()):
                os._exit(1)

    threading.Thread(target=watch, name="evoengineer-parent-watch", daemon=True).start()
