"""Machine fingerprint stored with each run: where the numbers were measured."""

from __future__ import annotations

import platform
import shutil
import subprocess
from functools import lru_cache
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


@lru_cache(maxsize=1)
def machine_fingerprint() -> dict[str, Any]:
    """GPU name, compute capability, driver, CUDA and torch versions, CPU, OS (None where absent)."""
    fp: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": __import__("os").cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": None, "cuda": None, "gpu": None, "compute_capability": None, "driver": None,
    }
    try:
        import torch
    except ImportError:
        return fp
    fp["torch"] = torch.__version__
    fp["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        fp["gpu"] = props.name
        fp["compute_capability"] = f"{props.major}.{props.minor}"
        fp["driver"] = _driver_version()
    return fp
