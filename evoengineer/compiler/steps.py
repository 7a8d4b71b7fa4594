"""One build, run inside a builder process: cpp_extension compiles the candidate and links it to the binding.

Functions here take and return plain dicts so they cross process boundaries without pickling anything stored.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import time
import traceback
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


def dir_lock(out_dir: Path) -> Any:
    """Hold an exclusive lock on one build folder: processes sharing a cache (the builders of several Dask workers
    of one host) never write the same folder at once; the second finds the first one's outputs up to date. Holding
    it, torch's lock file of a build killed mid-way is removed (ops/runtime.py: build_folder_lock)."""
    from evoengineer.ops.runtime import build_folder_lock

    return build_folder_lock(out_dir)


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

    from evoengineer.ops.runtime import write_if_changed

    _set_arch(job)

    out_dir = Path(job["dir"])
    so = out_dir / f"{job['name']}.so"
    if so.exists():
        return {"status": "ok", "so": str(so)}
    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "binding.cpp"
    write_if_changed(source, job["source_text"])
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
    return {"status": "ok", "so": str(so), "build_s": time.perf_counter() - t0, "built": True}


def build_candidate(job: dict[str, Any]) -> dict[str, Any]:
    """Compile and link one candidate; import it once to prove it loads. Returns status, reason, log, build_s, and
    in its metrics the CPU seconds the build took (this process and its compilers; a binding built on the way
    excluded)."""
    cpu0 = _cpu_s()
    with dir_lock(Path(job["dir"])):
        r = _build_candidate(job)
    metrics = r.setdefault("metrics", {})
    metrics["build_cpu_s"] = round(_cpu_s() - cpu0 - metrics.pop("binding_cpu_s", 0.0), 3)
    return r


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cubin_compile_flags(job: dict[str, Any]) -> list[str]:
    """nvcc flags that reach a candidate's device code: cpp_extension's common nvcc flags, the space's target and
    flags. A device-only build compiles with these alone, so its cubin is the device code of a host-code build."""
    from torch.utils import cpp_extension

    from evoengineer.compiler.gate import nvcc_flags

    flags = [*cpp_extension.COMMON_NVCC_FLAGS, *nvcc_flags(list(job.get("cuda_cflags") or []), job["arch"])]
    if not any(f.startswith(("-std=", "--std")) for f in flags):
        flags.append("-std=c++17")
    return flags


def cuda_compile_flags(job: dict[str, Any]) -> list[str]:
    """nvcc flags for a candidate's kernel object, as cpp_extension would compile it (the device flags above, -fPIC,
    the torch and Python include folders), so the object and its ptxas report are those of the module the search
    measures and an exported package rebuilds."""
    import sysconfig

    from torch.utils import cpp_extension

    flags = [*cubin_compile_flags(job), "-Xcompiler", "-fPIC"]
    for inc in [*cpp_extension.include_paths(), sysconfig.get_path("include", scheme="posix_prefix")]:
        flags += ["-isystem", inc]
    if os.environ.get("CC"):
        flags = ["-ccbin", os.environ["CC"], *flags]
    return flags


def nvcc_path() -> str | None:
    from torch.utils import cpp_extension

    home = getattr(cpp_extension, "CUDA_HOME", None)
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return None  # compile_cuda looks on PATH


def _build_candidate(job: dict[str, Any]) -> dict[str, Any]:
    from torch.utils import cpp_extension

    from evoengineer.ops.runtime import write_if_changed

    _set_arch(job)
    out_dir = Path(job["dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    name, entry = job["name"], job["entry"]
    kernel = out_dir / f"kernel{job['suffix']}"
    write_if_changed(kernel, job["source"])
    metrics: dict[str, Any] = {}
    t0 = time.perf_counter()
    sources, objects = [str(kernel)], []
    if job["suffix"] == ".cu" and job.get("device_only"):
        return _build_cubin(job, out_dir, kernel, t0)
    if job["suffix"] == ".cu":
        # one compile: the object the module links, and on the way the ptxas report the gate reads
        obj = out_dir / "kernel.o"
        failed, metrics = _compile_gated(job, kernel, obj, t0, device_only=False)
        if failed:
            return failed
        sources, objects = [], [str(obj)]
    shim = out_dir / "shim.cpp"
    write_if_changed(shim, shim_source(name, entry, job["signature"]))
    binding = _binding_measured(job, metrics)
    if binding["status"] != "ok":
        return {**binding, "build_s": time.perf_counter() - t0, "metrics": metrics}
    binding_dir = str(Path(binding["so"]).parent)
    ldflags = [*objects, *job.get("ldflags", []), f"-L{binding_dir}", f"-l:{Path(binding['so']).name}",
               f"-Wl,-rpath,{binding_dir}", "-Wl,--no-undefined"]
    try:
        # a CUDA candidate hands cpp_extension its object and the shim: only the shim is compiled here
        cpp_extension.load(name=name, sources=[*sources, str(shim)], extra_cflags=job["cflags"],
                           extra_cuda_cflags=job.get("cuda_cflags"), extra_ldflags=ldflags,
                           build_directory=str(out_dir), is_python_module=True, verbose=False,
                           with_cuda=job["suffix"] == ".cu")
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


def _build_cubin(job: dict[str, Any], out_dir: Path, kernel: Path, t0: float) -> dict[str, Any]:
    """A device-only build: the kernel's device code compiled to `kernel.cubin` (its ptxas report gated as an
    object's is), and the family binding that loads and launches it. `kernel.load.json` says which binding and
    signature (load_module reads it); nothing is linked or loaded here (a builder has no CUDA context)."""
    import struct

    from evoengineer.compiler.cubin import cubin_traits
    from evoengineer.ops.runtime import write_if_changed

    cubin = out_dir / "kernel.cubin"
    failed, metrics = _compile_gated(job, kernel, cubin, t0, device_only=True)
    if failed:
        return failed
    try:
        metrics["launch_traits"] = cubin_traits(cubin)  # what the family's launcher will read (recorded)
    except (OSError, ValueError, struct.error) as exc:
        return {"status": "build_error", "reason": f"kernel.cubin: {exc}", "build_s": time.perf_counter() - t0,
                "metrics": metrics}
    binding = _binding_measured(job, metrics)
    if binding["status"] != "ok":
        return {**binding, "build_s": time.perf_counter() - t0, "metrics": metrics}
    write_if_changed(out_dir / "kernel.load.json", json.dumps({"binding": binding["so"],
                                                                "signature": job["signature"]}))
    return {"status": "ok", "so": str(cubin), "build_s": time.perf_counter() - t0, "metrics": metrics}


def compile_checked(job: dict[str, Any]) -> dict[str, Any]:
    """A CUDA candidate compiled and gated, nothing linked or loaded (`evoengineer check`: no GPU, no family binding
    needed): an object with host code, or with `device_only` a cubin (and its launch traits). Status, reason, log,
    build_s and the ptxas report in metrics."""
    from evoengineer.ops.runtime import write_if_changed

    _set_arch(job)
    out_dir = Path(job["dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    kernel = out_dir / f"kernel{job['suffix']}"
    write_if_changed(kernel, job["source"])
    t0 = time.perf_counter()
    device_only = bool(job.get("device_only"))
    out = out_dir / ("kernel.cubin" if device_only else "kernel.o")
    failed, metrics = _compile_gated(job, kernel, out, t0, device_only=device_only)
    if failed:
        return failed
    if device_only:
        import struct

        from evoengineer.compiler.cubin import cubin_traits

        try:
            metrics["launch_traits"] = cubin_traits(out)
        except (OSError, ValueError, struct.error) as exc:
            return {"status": "build_error", "reason": f"kernel.cubin: {exc}", "metrics": metrics,
                    "build_s": time.perf_counter() - t0}
    return {"status": "ok", "build_s": time.perf_counter() - t0, "metrics": metrics}


def _compile_gated(job: dict[str, Any], kernel: Path, out: Path, t0: float, *,
                   device_only: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """nvcc of `kernel` into `out` (an object with host code, or a cubin), its ptxas report against the space's
    gates: (the build's failed result, or None; the report and compile CPU as metrics)."""
    from evoengineer.compiler.gate import check_gates, compile_cuda

    flags = cubin_compile_flags(job) if device_only else cuda_compile_flags(job)
    compiled = compile_cuda(kernel, out, flags=flags, nvcc=nvcc_path(), device_only=device_only)
    if compiled["status"] != "ok":
        return {**compiled, "build_s": time.perf_counter() - t0}, {}
    metrics = {**compiled["report"], "compile_cpu_s": round(compiled["compile_cpu_s"], 3)}
    broken = check_gates(metrics, (job.get("gate") or {}).get("gates", {}))
    if broken:
        return {"status": "gate_failed", "reason": broken, "metrics": metrics, "log": compiled.get("log", ""),
                "build_s": time.perf_counter() - t0}, metrics
    return None, metrics


def _binding_measured(job: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The family binding (_binding_for); the CPU it took when this build made it goes to `binding_cpu_s`."""
    cpu_before = _cpu_s()
    binding = _binding_for(job)
    if binding.get("built"):
        metrics["binding_cpu_s"] = _cpu_s() - cpu_before
    return binding


def _binding_for(job: dict[str, Any]) -> dict[str, Any]:
    """The family binding a candidate links: built by whichever build of this session gets its folder's lock first
    (the others wait there, their kernels already compiled), found by the rest. A failure is noted in the folder
    for this session only, so the other candidates report it instead of building it again."""
    b = job["binding"]
    with dir_lock(Path(b["dir"])):
        failed = Path(b["dir"]) / f"failed-{b['session']}.json"
        if failed.exists():
            return json.loads(failed.read_text())
        r = _build_binding(b)
        if r["status"] != "ok":
            failed.write_text(json.dumps({k: r[k] for k in ("status", "reason", "log") if k in r}))
        return r


def load_module(so_path: str, name: str):
    """Import a built candidate by file path (its module name is baked into PyInit_<name>); a device-only build
    (a cubin) is loaded on the current CUDA device by the family binding its build names."""
    if so_path.endswith(".cubin"):
        return _load_cubin(Path(so_path), name)
    spec = importlib.util.spec_from_file_location(name, so_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_cubin(cubin: Path, name: str):
    import torch

    from evoengineer.ops.device_code import load_with_binding

    try:
        info = json.loads((cubin.parent / "kernel.load.json").read_text())
        binding, signature = Path(info["binding"]), str(info["signature"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImportError(f"{cubin}: its binding does not load: {exc}") from None
    return load_with_binding(binding, name, cubin, torch.cuda.current_device(), signature)


def safe(fn, job: dict[str, Any]) -> dict[str, Any]:
    """Run a build function; any Python error becomes build_error instead of breaking the pool."""
    try:
        return fn(job)
    except Exception:
        return {"status": "build_error", "reason": traceback.format_exc(limit=3).splitlines()[-1][:300],
                "log": traceback.format_exc()}


#: how much lower than the search's own processes the builders run (nice)
BUILDER_NICENESS = 5


def builder_init(env: dict[str, str] | None = None) -> None:
    """Builder processes ignore Ctrl-C (the parent handles it), keep ninja's parallelism modest, and leave when
    their parent is gone (a pool's processes would otherwise wait for work forever, e.g. under a Dask worker that
    was killed). `env`: the pool owner's environment when it made the pool (a process forked from a fork server
    would otherwise have the server's, from whenever it started)."""
    import signal

    from evoengineer.liveness import exit_with_parent

    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("MAX_JOBS", "1")
    # builds yield the CPU to the measuring worker and the search (the GPU is what must not wait); compilers
    # started from here inherit it
    try:
        os.nice(BUILDER_NICENESS)
    except OSError:
        pass
    importlib.import_module("torch.utils.cpp_extension")  # once per process, not in the first build's time
    exit_with_parent(poll_s=2.0)
