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
