"""One build, run inside a builder process: cpp_extension compiles the candidate and links it to the binding.

Functions here take and return plain dicts so they cross process boundaries without pickling anything stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import re
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHIM = """// Generated: hands this candidate's kernel entry, and the signature it was compiled for, to the family binding
// as Python module {name}.
extern "C" void {entry}();
extern "C" void* evo_binding_make_module(const char* name, void* entry, const char* signature);
extern "C" __attribute__((visibility("default"))) void* PyInit_{name}() {{
  return evo_binding_make_module("{name}", reinterpret_cast<void*>(&{entry}), "{signature}");
}}
"""


def shim_source(name: str, entry: str, signature: str) -> str:
    """The shim of one candidate module. `signature` is "KEY=VALUE;..." (names, digits, dtype names only)."""
    if not all(ch.isalnum() or ch in "_=;.-+" for ch in signature):
        raise ValueError(f"signature {signature!r}: unexpected characters")
    return SHIM.format(name=name, entry=entry, signature=signature)

_COMPILE_ERROR = re.compile(r"\.(?:cpp|cc|cu|cuh|h|hpp)(?:\(\d+\)|:\d+(?::\d+)?): (?:fatal )?error", re.IGNORECASE)
_LINK_MARKERS = ("undefined reference", "ld returned", "undefined symbol", "multiple definition", "cannot find -l")


def _log_tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if _COMPILE_ERROR.search(line) or any(m in line for m in _LINK_MARKERS):
            return line.strip()[:300]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else "unknown build failure"


@contextlib.contextmanager
def dir_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on one build folder: processes sharing a cache (the builders of several Dask workers
    of one host) never write the same folder at once; the second finds the first one's outputs up to date."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".evo-build.lock", "a") as f:  # inside: the cache's folders hold builds only
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_if_changed(path: Path, text: str) -> None:
    """Rewrite a source only when it changed: a new mtime would make ninja rebuild what is up to date."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)


def _set_arch(job: dict[str, Any]) -> None:
    """cpp_extension picks CUDA targets from TORCH_CUDA_ARCH_LIST: pin it to the space's arch (sm_90 -> 9.0)."""
    from evoengineer.ops.runtime import arch_list

    arch = arch_list(job.get("arch"))
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch


def build_binding(job: dict[str, Any]) -> dict[str, Any]:
    """Compile the family binding into a shared library (once per family and toolchain)."""
    with dir_lock(Path(job["dir"])):
        return _build_binding(job)


def _build_binding(job: dict[str, Any]) -> dict[str, Any]:
    from torch.utils import cpp_extension

    _set_arch(job)

    out_dir = Path(job["dir"])
    so = out_dir / f"{job['name']}.so"
    if so.exists():
        return {"status": "ok", "so": str(so)}
    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "binding.cpp"
    _write_if_changed(source, job["source_text"])
    t0 = time.perf_counter()
    try:
        cpp_extension.load(name=job["name"], sources=[str(source)], extra_cflags=job["cflags"],
                           extra_include_paths=[job["include"]],
                           extra_cuda_cflags=job.get("cuda_cflags"), extra_ldflags=job.get("ldflags"),
                           build_directory=str(out_dir), is_python_module=False, verbose=False,
                           with_cuda=bool(job.get("with_cuda")))
    except Exception as exc:  # the binding itself is broken: every candidate of the family fails to build
        return {"status": "build_error", "reason": f"family binding failed to build: {_first_error(str(exc))}",
                "log": _log_tail(str(exc))}
    return {"status": "ok", "so": str(so), "build_s": time.perf_counter() - t0}


def build_candidate(job: dict[str, Any]) -> dict[str, Any]:
    """Compile and link one candidate; import it once to prove it loads. Returns status, reason, log, build_s."""
    with dir_lock(Path(job["dir"])):
        return _build_candidate(job)


def _build_candidate(job: dict[str, Any]) -> dict[str, Any]:
    from torch.utils import cpp_extension

    from evoengineer.compiler.gate import check_gates, ptxas_gate

    _set_arch(job)
    out_dir = Path(job["dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    name, entry = job["name"], job["entry"]
    kernel = out_dir / f"kernel{job['suffix']}"
    _write_if_changed(kernel, job["source"])
    metrics: dict[str, Any] = {}
    t0 = time.perf_counter()
    if job.get("gate") is not None:  # CUDA: ptxas report first, a second instead of a full build
        g = job["gate"]
        gate = ptxas_gate(kernel, cuda_flags=g["cuda_flags"], arch=g["arch"])
        if gate["status"] != "ok":
            return {**gate, "build_s": time.perf_counter() - t0}
        metrics = gate["report"]
        broken = check_gates(metrics, g["gates"])
        if broken:
            return {"status": "gate_failed", "reason": broken, "metrics": metrics, "log": gate.get("log", ""),
                    "build_s": time.perf_counter() - t0}
    shim = out_dir / "shim.cpp"
    _write_if_changed(shim, shim_source(name, entry, job["signature"]))
    binding_dir = str(Path(job["binding_so"]).parent)
    ldflags = [*job.get("ldflags", []), f"-L{binding_dir}", f"-l:{Path(job['binding_so']).name}",
               f"-Wl,-rpath,{binding_dir}", "-Wl,--no-undefined"]
    try:
        cpp_extension.load(name=name, sources=[str(kernel), str(shim)], extra_cflags=job["cflags"],
                           extra_cuda_cflags=job.get("cuda_cflags"), extra_ldflags=ldflags,
                           build_directory=str(out_dir), is_python_module=True, verbose=False)
    except ImportError as exc:
        return {"status": "link_error", "reason": f"does not load: {str(exc)[:300]}", "log": str(exc),
                "build_s": time.perf_counter() - t0, "metrics": metrics}
    except Exception as exc:
        text = str(exc)
        if _COMPILE_ERROR.search(text):
            status = "compile_error"
        elif any(m in text for m in _LINK_MARKERS):
            status = "link_error"
        else:
            status = "build_error"
        return {"status": status, "reason": _first_error(text), "log": _log_tail(text),
                "build_s": time.perf_counter() - t0, "metrics": metrics}
    build_s = time.perf_counter() - t0
    so = out_dir / f"{name}.so"
    if not so.exists():
        return {"status": "build_error", "reason": f"{so.name} missing after build", "build_s": build_s}
    return {"status": "ok", "so": str(so), "build_s": build_s, "metrics": metrics}


def load_module(so_path: str, name: str):
    """Import a built candidate by file path (its module name is baked into PyInit_<name>)."""
    spec = importlib.util.spec_from_file_location(name, so_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def safe(fn, job: dict[str, Any]) -> dict[str, Any]:
    """Run a build function; any Python error becomes build_error instead of breaking the pool."""
    try:
        return fn(job)
    except Exception:
        return {"status": "build_error", "reason": traceback.format_exc(limit=3).splitlines()[-1][:300],
                "log": traceback.format_exc()}


def builder_init() -> None:
    """Builder processes ignore Ctrl-C (the parent handles it), keep ninja's parallelism modest, and leave when
    their parent is gone (a pool's processes would otherwise wait for work forever, e.g. under a Dask worker that
    was killed)."""
    import signal

    from evoengineer.liveness import exit_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("MAX_JOBS", "1")
    exit_with_parent(poll_s=2.0)
