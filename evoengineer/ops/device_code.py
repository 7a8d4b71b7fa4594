"""An exported CUDA kernel as device code (issue 52): the cubin `export` compiled (`kernel.cubin`, recorded in
kernel.json under `cubin`), loaded through the family binding, which is built once per binding source, settings and
torch and cached. Importing such a package compiles nothing of the kernel. A GPU the cubin cannot run on gets the
recorded source compiled to a cubin for it (device code only, `nvcc -cubin`, cached); an architecture-specific cubin
(sm_90a: wgmma, setmaxnreg) runs on its own architecture only and is refused elsewhere in one line.

Torch only, like runtime.py: an exported package carries a copy of this file."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import torch

try:  # an exported package carries its own copy of the flag whitelist
    from .flags import flag_problem
except ImportError:
    from evoengineer.space.flags import flag_problem

#: the file an exported kernel folder keeps its device code in
CUBIN_FILE = "kernel.cubin"
_ARCH = re.compile(r"sm_(\d+)(\d)([a-z]?)")


def cubin_runs_on(cubin_arch: str, device_arch: str) -> bool:
    """Whether a cubin built for `cubin_arch` runs on a GPU of `device_arch` (both sm_XY[a]): an
    architecture-specific cubin on exactly its architecture; another on GPUs of its major version whose minor
    version is at least its own (SASS compatibility)."""
    c, d = _ARCH.fullmatch(cubin_arch), _ARCH.fullmatch(device_arch)
    if c is None or d is None:
        return False
    if c.group(3):
        return (c.group(1), c.group(2)) == (d.group(1), d.group(2))
    return c.group(1) == d.group(1) and int(c.group(2)) <= int(d.group(2))


def device_arch(device: int) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cubin_for(folder: Path, kernel: dict[str, Any], root: Path, arch: str) -> Path:
    """The cubin of the kernel in `folder` that runs on a GPU of `arch`: the exported one, else the recorded source
    compiled for `arch` under `root`/cubins (once; cached by content). RuntimeError naming the kernel when the
    exported cubin was changed after the export, when it is architecture-specific to another GPU, or when no
    compiler can retarget it."""
    rec = kernel["cubin"]
    name = kernel["hash"][:12]
    if rec.get("file") != CUBIN_FILE:
        raise RuntimeError(f"kernel {name}: cubin.file {rec.get('file')!r}: expected {CUBIN_FILE!r} beside kernel.json")
    if cubin_runs_on(rec["arch"], arch):
        path = folder / rec["file"]
        if not path.is_file() or _sha256(path) != rec["sha256"]:
            raise RuntimeError(f"kernel {name}: {path} is missing or does not match the sha256 its kernel.json "
                               "records (changed after the export)")
        return path
    if not rec.get("retarget"):
        raise RuntimeError(f"kernel {name} was compiled for {rec['arch']} (architecture-specific code); this GPU is "
                           f"{arch}: it runs on {rec['arch']} GPUs only")
    for i, flag in enumerate(rec["nvcc_flags"]):
        why = flag_problem(flag)
        if why is not None:
            raise RuntimeError(f"kernel {name}: cubin.nvcc_flags[{i}]: flag {flag!r} refused: {why}")
    source = folder / kernel["source_file"]
    digest = hashlib.sha256(source.read_bytes())
    digest.update("\0".join([*rec["nvcc_flags"], arch]).encode())
    out = root / "cubins" / f"{kernel['module']}-{arch}-{digest.hexdigest()[:12]}" / CUBIN_FILE
    if out.is_file():
        return out
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError(f"kernel {name} was exported for {rec['arch']}; this GPU is {arch} and no nvcc is found "
                           "(CUDA_HOME or PATH) to compile its device code for it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    r = subprocess.run([nvcc, "-cubin", *rec["nvcc_flags"], f"-arch={arch}", str(source), "-o", str(tmp)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = (r.stderr or r.stdout).strip().splitlines()[-10:]
        raise RuntimeError(f"kernel {name}: compiling its device code for {arch} failed:\n" + "\n".join(tail))
    os.replace(tmp, out)
    return out


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def load_cubin(binding: Path, cubin: Path, kernel: dict[str, Any], device: int) -> Any:
    """The exported kernel's module on CUDA device `device` (`load_with_binding`)."""
    return load_with_binding(binding, kernel["module"], cubin, device, kernel["cubin"]["signature"])


def load_with_binding(binding: Path, name: str, cubin: Path, device: int, signature: str) -> Any:
    """Module `name` of a cubin on CUDA device `device`: the family binding (a shared library) loads the cubin into
    the device's primary context and returns a module with the functions of a host-code build, for the signature it
    was compiled for (ImportError naming the file when it does not load). The search's builds load theirs the same
    way (compiler/steps.py)."""
    try:
        lib = ctypes.PyDLL(str(binding))  # holds the GIL: the call makes Python objects
    except OSError as exc:
        raise ImportError(f"{binding}: the family binding does not load: {exc}") from None
    try:
        load = lib.evo_binding_load_cubin
    except AttributeError:
        raise ImportError(f"{binding}: this family's binding does not load device code (cubins)") from None
    load.restype = ctypes.py_object
    load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    return load(name.encode(), str(cubin).encode(), device, signature.encode())


class PerDeviceModule:
    """A device-code kernel's module on every GPU it is called on. A cubin is loaded into one device's context, so a
    call goes to the module of its first CUDA tensor's device (else the current device's), loaded when first needed;
    attributes that are not functions (`signature`) are the first module's."""

    def __init__(self, load: Callable[[int], Any], device: int):
        self._load = load
        self._modules: dict[int, Any] = {}
        self._first = self.on(device)  # now: a cubin that does not load says so at import, not mid-capture

    def on(self, device: int) -> Any:
        module = self._modules.get(device)
        if module is None:
            module = self._modules[device] = self._load(device)
        return module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._first, name)
        if not callable(value):
            return value
        modules, on = self._modules, self.on

        def call(*args):
            device = None
            for a in args:
                if isinstance(a, torch.Tensor) and a.is_cuda:
                    device = a.device.index
                    break
            if device is None:
                device = torch.cuda.current_device()
            module = modules.get(device)
            return getattr(module if module is not None else on(device), name)(*args)

        call.__name__ = name
        call.__doc__ = value.__doc__
        setattr(self, name, call)  # found without __getattr__ from now on
        return call
