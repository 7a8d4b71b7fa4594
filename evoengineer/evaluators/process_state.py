"""The state a measuring process measures with, and what a candidate may not leave changed.

`StateGuard` records at start what the process measures with and, after every candidate, compares, restores and says
what changed:

* OpenMP, per runtime loaded in the process (libgomp, libomp, libiomp5): team size, dynamic adjustment, nesting
  levels and schedule of the calling thread (the thread that calls candidates);
* torch's own settings: its thread counts, TF32 / reduced-precision / cuDNN flags, deterministic algorithms, the
  default dtype;
* every thread's CPU affinity;
* the floating-point environment (rounding mode, flush-to-zero and denormals-are-zero) of the calling thread, and of
  every OpenMP worker thread where the CPU probe is available (evaluators/sentinel.py);
* the process environment as the C library sees it (what runtimes read: OMP_NUM_THREADS, ...);
* threads a candidate left running (these cannot be undone: the process is replaced);
* CUDA: the context's limits (stack, printf FIFO, malloc heap, persisting-L2 size, L2 fetch granularity, ...), its
  cache configuration and scheduling flags; persisting L2 lines are reset after every candidate, so lines a
  candidate marked persisting cannot survive into the next measurement (an L2 flush by memset does not evict them).
  The shared-memory bank configuration is not watched: devices since Volta ignore it. A kernel's own attributes
  (cudaFuncSetAttribute) belong to the candidate's module, which no other candidate calls.

A change found is restored and verified; one that cannot be restored is marked `restored=False`, and the worker is
replaced (evaluators/local.py).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_OMP_NAMES = ("libgomp", "libomp", "libiomp5", "libiomp")
_OMP_SCHEDULES = {1: "static", 2: "dynamic", 3: "guided", 4: "auto"}

# CUDA driver API: CUlimit values and their names
_CU_LIMITS = {0: "stack size", 1: "printf FIFO size", 2: "malloc heap size", 3: "device-runtime sync depth",
              4: "device-runtime pending launches", 5: "max L2 fetch granularity", 6: "persisting L2 cache size"}
_CU_STREAM_ATTR_ACCESS_POLICY_WINDOW = 1
_CU_CTX_LMEM_RESIZE_TO_MAX = 0x10
_LIBC = ctypes.CDLL(None)  # the C library (and, on glibc >= 2.34, libm's fenv functions)
#: environment variables not watched: pytest rewrites this one around every test of a process that hosts a Session
UNWATCHED_ENV = frozenset({"PYTEST_CURRENT_TEST"})


@dataclass
class Change:
    """One thing a candidate changed: what, the value the process measures with, the value found, and whether it
    was put back."""

    what: str
    before: Any
    after: Any
    restored: bool

    def __str__(self) -> str:
        return f"{self.what} {_show(self.before)} -> {_show(self.after)}" + ("" if self.restored else
                                                                              " (cannot be undone)")


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple, set, frozenset)) and len(v) > 6:
        items = sorted(v)
        return f"[{items[0]}..{items[-1]}: {len(items)}]"
    return repr(v) if isinstance(v, str) else str(v)


def _loaded_libraries() -> list[str]:
    """Paths of the shared objects mapped into this process."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            seen.setdefault(parts[5].strip(), None)
    return list(seen)


def _thread_ids() -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return [threading.get_native_id()]


def _thread_cpu_ns(tid: int) -> int | None:
    """CPU time of one thread in ns (schedstat), or from its stat line (clock ticks); None once it is gone."""
    try:
        return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 10_000_000
    except (OSError, ValueError, IndexError):
        return None


class _OpenMP:
    """One OpenMP runtime of the process, through its C API (the calling thread's ICVs)."""

    def __init__(self, path: str):
        self.name = Path(path).name
        mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
        self.lib = ctypes.CDLL(path, mode=mode)
        for fn in ("omp_get_max_threads", "omp_get_dynamic", "omp_get_max_active_levels"):
            getattr(self.lib, fn).restype = ctypes.c_int

    def state(self) -> dict[str, Any]:
        kind, chunk = ctypes.c_int(), ctypes.c_int()
        self.lib.omp_get_schedule(ctypes.byref(kind), ctypes.byref(chunk))
        k = kind.value & 0x7FFFFFFF  # the monotonic modifier bit aside
        return {"max threads": int(self.lib.omp_get_max_threads()), "dynamic": bool(self.lib.omp_get_dynamic()),
                "max active levels": int(self.lib.omp_get_max_active_levels()),
                "schedule": f"{_OMP_SCHEDULES.get(k, k)},{chunk.value}"}

    def restore(self, key: str, value: Any) -> None:
        if key == "max threads":
            self.lib.omp_set_num_threads(ctypes.c_int(value))
        elif key == "dynamic":
            self.lib.omp_set_dynamic(ctypes.c_int(int(value)))
        elif key == "max active levels":
            self.lib.omp_set_max_active_levels(ctypes.c_int(value))
        elif key == "schedule":
            name, chunk = value.split(",")
            kind = next((k for k, v in _OMP_SCHEDULES.items() if v == name), int(name) if name.isdigit() else 1)
            self.lib.omp_set_schedule(ctypes.c_int(kind), ctypes.c_int(int(chunk)))


class _FloatEnv:
    """The calling thread's floating-point environment through the C library (fegetenv / fesetenv)."""

    SIZE = 64  # fenv_t is 32 bytes on x86-64 and 8 on aarch64: room to spare

    def __init__(self):
        self.libm = _LIBC
        try:
            self.libm.fegetround  # noqa: B018  (present in libc on glibc >= 2.34; else in libm)
        except AttributeError:
            self.libm = ctypes.CDLL("libm.so.6")
        self.x86 = platform.machine() in ("x86_64", "AMD64")

    def save(self) -> ctypes.Array:
        buf = ctypes.create_string_buffer(self.SIZE)
        self.libm.fegetenv(buf)
        return buf

    def describe(self, buf: ctypes.Array) -> dict[str, Any]:
        """The controls (not the sticky exception flags) of a saved environment."""
        raw = bytes(buf)
        if self.x86:
            mxcsr = int.from_bytes(raw[28:32], "little")  # glibc x86-64 fenv_t: __mxcsr at byte 28
            x87 = int.from_bytes(raw[0:2], "little")
            return {"rounding": ("nearest", "down", "up", "toward zero")[(mxcsr >> 13) & 3],
                    "flush-to-zero": bool(mxcsr & 0x8000), "denormals-are-zero": bool(mxcsr & 0x40),
                    "exception masks": hex((mxcsr >> 7) & 0x3F), "x87 control": hex(x87 & 0x1F3F)}
        return {"rounding": int(self.libm.fegetround()), "control": raw[:8].hex()}

    def restore(self, buf: ctypes.Array) -> None:
        self.libm.fesetenv(buf)


class _CudaContext:
    """The current CUDA context's limits, cache configuration and flags, through the driver API."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.limits = {}
        for k, name in _CU_LIMITS.items():
            v = ctypes.c_size_t()
            if self.cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(k)) == 0:
                self.limits[k] = name
        self.has_flags = hasattr(self.cu, "cuCtxGetFlags") and hasattr(self.cu, "cuCtxSetFlags")

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, name in self.limits.items():
            v = ctypes.c_size_t()
            if self.cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(k)) == 0:
                out[f"limit {name}"] = int(v.value)
        cfg = ctypes.c_int()
        if self.cu.cuCtxGetCacheConfig(ctypes.byref(cfg)) == 0:
            out["cache config"] = int(cfg.value)
        if self.has_flags:
            flags = ctypes.c_uint()
            if self.cu.cuCtxGetFlags(ctypes.byref(flags)) == 0:
                # CU_CTX_LMEM_RESIZE_TO_MAX (0x10) is set by the driver itself once a kernel needed more local
                # memory: not a candidate's doing
                out["context flags"] = int(flags.value) & ~_CU_CTX_LMEM_RESIZE_TO_MAX
        return out

    def restore(self, key: str, value: Any) -> bool:
        if key.startswith("limit "):
            k = next(k for k, n in self.limits.items() if f"limit {n}" == key)
            return self.cu.cuCtxSetLimit(ctypes.c_int(k), ctypes.c_size_t(value)) == 0
        if key == "cache config":
            return self.cu.cuCtxSetCacheConfig(ctypes.c_int(value)) == 0
        if key == "context flags":
            flags = ctypes.c_uint()
            self.cu.cuCtxGetFlags(ctypes.byref(flags))
            return self.cu.cuCtxSetFlags(ctypes.c_uint(value | (flags.value & _CU_CTX_LMEM_RESIZE_TO_MAX))) == 0
        return False

    def reset_persisting_l2(self) -> None:
        self.cu.cuCtxResetPersistingL2Cache()

    def access_policy_bytes(self, stream_handle: int) -> int:
        """Bytes of the access-policy window set on a stream (0: none)."""
        value = ctypes.create_string_buffer(64)  # CUstreamAttrValue (a union; the window is 32 bytes)
        if self.cu.cuStreamGetAttribute(ctypes.c_void_p(stream_handle), ctypes.c_int(
                _CU_STREAM_ATTR_ACCESS_POLICY_WINDOW), value) != 0:
            return 0
        return int.from_bytes(bytes(value)[8:16], "little")


def _torch_settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """torch's process-wide switches a C++ candidate could flip through at::globalContext(), with their setters."""
    import torch

    b = torch.backends
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "torch intra-op threads": (torch.get_num_threads, torch.set_num_threads),
        "torch inter-op threads": (torch.get_num_interop_threads, lambda v: None),  # settable once: not restorable
        "torch deterministic algorithms": (torch.are_deterministic_algorithms_enabled,
                                           torch.use_deterministic_algorithms),
        "torch default dtype": (lambda: str(torch.get_default_dtype()),
                                lambda v: torch.set_default_dtype(getattr(torch, v.split(".")[-1]))),
        "torch float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "cuDNN TF32": (lambda: b.cudnn.allow_tf32, lambda v: setattr(b.cudnn, "allow_tf32", v)),
        "cuDNN benchmark": (lambda: b.cudnn.benchmark, lambda v: setattr(b.cudnn, "benchmark", v)),
        "cuDNN deterministic": (lambda: b.cudnn.deterministic, lambda v: setattr(b.cudnn, "deterministic", v)),
    }
    m = b.cuda.matmul
    for attr in ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        if hasattr(m, attr):
            out[f"cuBLAS {attr}"] = (lambda a=attr: getattr(m, a), lambda v, a=attr: setattr(m, a, v))
    return out


def _c_environ() -> dict[str, str]:
    """The environment as the C library holds it (setenv from a candidate changes this, not os.environ)."""
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(_LIBC, "environ")
    out: dict[str, str] = {}
    i = 0
    while env[i]:
        k, _, v = env[i].decode(errors="replace").partition("=")
        if k not in UNWATCHED_ENV:
            out[k] = v
        i += 1
    return out


class StateGuard:
    """Records the process's state at construction; `check()` after each candidate says what changed, puts it back
    and verifies. `probe`: the CPU probe (per-thread floating-point environment of the OpenMP team), or None."""

    #: a thread the candidate left behind that used more than this share of a core while we watched is "running"
    BUSY_SHARE = 0.25
    WATCH_S = 0.02

    def __init__(self, device: str, probe: Any = None):
        self.device = device
        self.probe = probe
        self.fenv = _FloatEnv()
        self._fenv_saved = self.fenv.save()
        self._fenv = self.fenv.describe(self._fenv_saved)
        self.cuda = _CudaContext() if device == "cuda" else None
        self._torch = _torch_settings()
        self._omp: dict[str, _OpenMP] = {}
        self._omp_state: dict[str, dict[str, Any]] = {}
        self._find_openmp()
        self._torch_state = {k: get() for k, (get, _) in self._torch.items()}
        self._cuda_state = self.cuda.state() if self.cuda else {}
        self._environ = _c_environ()
        self._affinity: dict[int, frozenset[int]] = {}
        self._threads = set(_thread_ids())
        self._note_affinity()

    # ---- what is recorded ----------------------------------------------------------------------------------------
    def _find_openmp(self) -> None:
        """Runtimes loaded since the last look are recorded as first seen (a runtime a candidate brings along)."""
        for path in _loaded_libraries():
            base = Path(path).name
            if path in self._omp or not base.startswith(_OMP_NAMES):
                continue
            try:
                rt = _OpenMP(path)
                self._omp_state[path] = rt.state()
            except (OSError, AttributeError):
                continue
            self._omp[path] = rt

    def _note_affinity(self) -> None:
        for tid in _thread_ids():
            if tid not in self._affinity:
                try:
                    self._affinity[tid] = frozenset(os.sched_getaffinity(tid))
                except OSError:
                    pass

    def _team_controls(self) -> list[dict[str, Any]] | None:
        if self.probe is None:
            return None
        return [self.fenv.describe(b) for b in self.probe.team_fenv()]

    def snapshot(self) -> dict[str, Any]:
        """What is recorded, as data (for the worker's log and tests)."""
        return {"openmp": {Path(p).name: s for p, s in self._omp_state.items()}, "torch": dict(self._torch_state),
                "fenv": dict(self._fenv), "cuda": dict(self._cuda_state), "threads": len(self._threads)}

    # ---- after a candidate ---------------------------------------------------------------------------------------
    def check(self, streams: tuple[int, ...] = ()) -> list[Change]:
        """Compare with the recorded state, restore and verify; the changes found (empty: nothing changed).
        `streams`: CUDA stream handles the candidate was given (an access-policy window set on one is reported)."""
        changes: list[Change] = []
        self._check_openmp(changes)
        self._check_torch(changes)
        self._check_fenv(changes)
        self._check_environ(changes)
        self._check_affinity(changes)
        if self.cuda is not None:
            self._check_cuda(changes, streams)
        self._check_threads(changes)
        return changes

    def _check_openmp(self, changes: list[Change]) -> None:
        for path, rt in list(self._omp.items()):
            now = rt.state()
            for key, was in self._omp_state[path].items():
                if now[key] != was:
                    rt.restore(key, was)
                    changes.append(Change(f"OpenMP ({rt.name}) {key}", was, now[key], rt.state()[key] == was))
        self._find_openmp()

    def _check_torch(self, changes: list[Change]) -> None:
        for key, (get, set_) in self._torch.items():
            was, now = self._torch_state[key], get()
            if now != was:
                try:
                    set_(was)
                except (RuntimeError, ValueError, TypeError):
                    pass
                changes.append(Change(key, was, now, get() == was))

    def _check_fenv(self, changes: list[Change]) -> None:
        now = self.fenv.describe(self.fenv.save())
        if now != self._fenv:
            self.fenv.restore(self._fenv_saved)
            back = self.fenv.describe(self.fenv.save()) == self._fenv
            for key, was in self._fenv.items():
                if now.get(key) != was:
                    changes.append(Change(f"floating-point environment: {key}", was, now.get(key), back))
        if self.probe is not None:
            team = self._team_controls() or []
            off = [i for i, t in enumerate(team) if t != self._fenv]
            if off:
                self.probe.set_team_fenv(self._fenv_saved)
                back = all(t == self._fenv for t in (self._team_controls() or []))
                first = team[off[0]]
                what = ", ".join(f"{k} {first.get(k)}" for k, v in self._fenv.items() if first.get(k) != v)
                changes.append(Change(f"floating-point environment of OpenMP threads {off}", "as the process's",
                                      what, back))

    def _check_environ(self, changes: list[Change]) -> None:
        now = _c_environ()
        if now == self._environ:
            return
        for key in sorted(set(now) | set(self._environ)):
            was, got = self._environ.get(key), now.get(key)
            if was == got:
                continue
            if was is None:
                _LIBC.unsetenv(key.encode())
            else:
                _LIBC.setenv(key.encode(), was.encode(), 1)
            changes.append(Change(f"environment variable {key}", was, got, _c_environ().get(key) == was))

    def _check_affinity(self, changes: list[Change]) -> None:
        for tid, was in list(self._affinity.items()):
            try:
                now = frozenset(os.sched_getaffinity(tid))
            except OSError:  # the thread is gone
                del self._affinity[tid]
                continue
            if now != was:
                try:
                    os.sched_setaffinity(tid, was)
                    back = frozenset(os.sched_getaffinity(tid)) == was
                except OSError:
                    back = False
                changes.append(Change(f"CPU affinity of thread {tid}", sorted(was), sorted(now), back))

    def _check_cuda(self, changes: list[Change], streams: tuple[int, ...]) -> None:
        assert self.cuda is not None
        now = self.cuda.state()
        for key, was in self._cuda_state.items():
            if now.get(key) != was:
                ok = self.cuda.restore(key, was)
                changes.append(Change(f"CUDA {key}", was, now.get(key), ok and self.cuda.state().get(key) == was))
        for s in streams:
            window = self.cuda.access_policy_bytes(s)
            if window:
                # the stream was the candidate's alone and is dropped with it: nothing carries over
                changes.append(Change("CUDA access-policy window (persisting L2) on its stream", 0, window, True))
        # lines marked persisting survive an L2 flush by memset: every candidate leaves with none
        self.cuda.reset_persisting_l2()

    def _check_threads(self, changes: list[Change]) -> None:
        """Threads that appeared since the last look and keep a core busy: a candidate's work left running (or a
        background thread finishing its output late). Idle new threads (an OpenMP team grown to a new size) are
        noted as known."""
        now = set(_thread_ids())
        new = sorted(now - self._threads)
        if new:
            time.sleep(self.WATCH_S / 4)  # an OpenMP team spins briefly after its last parallel region
            t0, c0 = time.perf_counter(), {t: _thread_cpu_ns(t) for t in new}
            time.sleep(self.WATCH_S)
            dt, c1 = time.perf_counter() - t0, {t: _thread_cpu_ns(t) for t in new}
            busy = [t for t in new if c0[t] is not None and c1[t] is not None and
                    (c1[t] - c0[t]) / 1e9 > self.BUSY_SHARE * dt]
            if busy:
                changes.append(Change("threads left running", len(self._threads), len(self._threads) + len(busy),
                                      False))
                return
        self._threads = now
        self._note_affinity()
