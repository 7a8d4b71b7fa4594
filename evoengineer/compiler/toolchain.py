"""Toolchain fingerprint: what must match for a cached build to be reused."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from functools import lru_cache
from typing import Any

from evoengineer.space.backend import backend_of


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity (taskset, a cgroup cpuset), not the host's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _first_line(cmd: list[str]) -> str | None:
    exe = shutil.which(cmd[0])
    if not exe:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    return lines[-1].strip() if cmd[0] == "nvcc" and lines else (lines[0].strip() if lines else None)


@lru_cache(maxsize=None)
def toolchain(backend: str) -> dict[str, Any]:
    """Compiler, CUDA, torch and Python versions, and the host CPU (builds may use -march=native)."""
    import torch

    from evoengineer.fingerprint import _cpu_model

    tc: dict[str, Any] = {
        "cxx": _first_line(["c++", "--version"]),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "machine": platform.machine(),
    }
    if backend_of(backend).device_compiler:
        tc["nvcc"] = _first_line(["nvcc", "--version"])
        tc["cuda"] = torch.version.cuda
    return tc
