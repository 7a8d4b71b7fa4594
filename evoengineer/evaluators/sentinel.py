"""A fixed reference workload timed when the measuring process starts and after every candidate.

If a candidate changed how this process (or device) runs work in a way `StateGuard` does not see or cannot undo, the
sentinel's time moves: the worker reports the drift, the evaluator replaces the process and measures that candidate
again in a fresh one (evaluators/local.py). Every candidate, because it is cheap: on a GPU two small workloads of
11 calls each (2 ms per candidate on an H200 against 0.24 s of worker time); on the CPU a few ms of an OpenMP
loop built with the candidates' compiler (so it runs on the same OpenMP runtime, thread team and affinity as they do).

Workloads (each timed as the fastest of `REPEATS` calls after `WARM` untimed ones: the question is whether the
machine can still run it as fast as it did, and the fastest call is the one transient interference, clock ramps or
the previous candidate's leftover dirty lines touch least):
* CUDA: `l2` a copy whose source and destination fit in a quarter of L2 (slows when L2 is set aside for persisting
  lines or polluted by them), `hbm` a copy twice the L2 size (memory clock, bandwidth; a kernel left running
  slows both). A matrix product was tried and dropped: on an H200 its fastest call moved by up to 1.47x between
  honest candidates (SM clocks under the previous candidate's power draw);
* CPU: `omp` an OpenMP loop over every thread of the team (thread count, affinity), `torch` a torch reduction on its
  own thread pool.

The tolerance is measured per workload: the start-up runs' spread, times 4, at least 30% (a 40-candidate search on
an H200 with a 25% floor and the matrix product re-measured 3 honest candidates). A drift of the
honest twin after the planted poisoners was 1.3x-12x.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

PROBE_SOURCE = r"""
// EvoEngineer's CPU probe: a sentinel workload on the OpenMP team, and the team's floating-point environment.
#include <cfenv>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>

extern "C" double evo_probe_work(int64_t n, int inner) {
    static std::vector<float> x, y;
    if ((int64_t)x.size() != n) {
        x.assign(n, 0.0f);
        y.assign(n, 0.0f);
        for (int64_t i = 0; i < n; ++i) x[i] = 1.0f + (float)(i % 97) * 0.01f;
    }
    float* xp = x.data();
    float* yp = y.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        float a = xp[i], acc = 0.0f;
        for (int k = 0; k < inner; ++k) acc = acc * 0.999f + a * (float)k;
        yp[i] = acc;
    }
    double s = 0.0;
    for (int64_t i = 0; i < n; i += 1024) s += yp[i];
    return s;
}

// Each OpenMP thread's fenv_t (bytes) into out[thread * stride]; returns the team size (at most cap).
extern "C" int evo_probe_team_fenv(unsigned char* out, int stride, int cap) {
    int team = 0;
#pragma omp parallel
    {
        const int t = omp_get_thread_num();
#pragma omp single
        team = omp_get_num_threads();
        if (t < cap) {
            fenv_t env;
            fegetenv(&env);
            std::memcpy(out + (int64_t)t * stride, &env, sizeof(env) < (size_t)stride ? sizeof(env) : stride);
        }
    }
    return team < cap ? team : cap;
}

extern "C" void evo_probe_set_team_fenv(const unsigned char* env) {
#pragma omp parallel
    {
        fenv_t e;
        std::memcpy(&e, env, sizeof(e));
        fesetenv(&e);
    }
}
"""

WARM, REPEATS = 2, 9
START_RUNS = 5
MIN_TOLERANCE = {"cuda": 0.30, "cpu": 0.30}


class CpuProbe:
    """The probe library, built once per compiler into the build cache (None where there is no compiler)."""

    FENV_BYTES = 64

    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        self.lib.evo_probe_work.restype = ctypes.c_double
        self.lib.evo_probe_work.argtypes = [ctypes.c_int64, ctypes.c_int]
        self.lib.evo_probe_team_fenv.restype = ctypes.c_int
        self.lib.evo_probe_team_fenv.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]

    @classmethod
    def build(cls, cache_dir: Path) -> "CpuProbe | None":
        """Built with the compiler candidates are built with ($CXX, else c++), keyed like their builds by the
        toolchain fingerprint."""
        from evoengineer.compiler.steps import dir_lock
        from evoengineer.compiler.toolchain import toolchain
        from evoengineer.ops.runtime import write_if_changed

        cxx = os.environ.get("CXX") or shutil.which("c++")
        if not cxx:
            return None
        key = hashlib.sha256(f"{PROBE_SOURCE}\n{cxx}\n{toolchain('cpu')['cxx']}".encode()).hexdigest()[:16]
        out = Path(cache_dir) / "probe" / key
        so = out / "evo_probe.so"
        with dir_lock(out):
            if not so.exists():
                src = out / "evo_probe.cpp"
                write_if_changed(src, PROBE_SOURCE)
                tmp = out / f"evo_probe.{os.getpid()}.so"
                try:
                    r = subprocess.run([cxx, "-O2", "-fopenmp", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                                       capture_output=True, text=True, timeout=300)
                except (OSError, subprocess.SubprocessError):
                    return None
                if r.returncode != 0:
                    return None
                os.replace(tmp, so)
        try:
            return cls(so)
        except OSError:
            return None

    def work(self, n: int, inner: int) -> None:
        self.lib.evo_probe_work(n, inner)

    def team_fenv(self) -> list[ctypes.Array]:
        cap = 1024
        raw = ctypes.create_string_buffer(cap * self.FENV_BYTES)
        n = self.lib.evo_probe_team_fenv(raw, self.FENV_BYTES, cap)
        out = []
        for t in range(n):
            b = ctypes.create_string_buffer(self.FENV_BYTES)
            ctypes.memmove(b, ctypes.byref(raw, t * self.FENV_BYTES), self.FENV_BYTES)
            out.append(b)
        return out

    def set_team_fenv(self, env: ctypes.Array) -> None:
        self.lib.evo_probe_set_team_fenv(env)


class Sentinel:
    """The reference workload of one backend: `start()` records its times and noise; `check()` says whether it
    drifted beyond the noise since."""

    def __init__(self, device: str, probe: CpuProbe | None = None):
        import torch

        self.torch = torch
        self.device = device
        self.probe = probe
        self.workloads = self._workloads()
        self.base: dict[str, float] = {}
        self.tolerance: dict[str, float] = {}

    def _workloads(self) -> dict[str, Any]:
        torch = self.torch
        if self.device == "cuda":
            l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size or (40 << 20)
            small = torch.empty(max(l2 // 8, 1 << 16), dtype=torch.uint8, device="cuda")
            small_dst = torch.empty_like(small)
            big = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
            big_dst = torch.empty_like(big)
            small.random_(0, 255)
            big.random_(0, 255)
            return {"l2": lambda: small_dst.copy_(small), "hbm": lambda: big_dst.copy_(big)}
        x = torch.randn(1 << 20)
        loads: dict[str, Any] = {"torch": lambda: x.sum()}
        if self.probe is not None:
            probe = self.probe
            loads = {"omp": lambda: probe.work(1 << 15, 64), **loads}
        return loads

    def measure(self) -> dict[str, float]:
        """Microseconds of the fastest timed call per workload (timed as candidates are, L2 warm)."""
        from evoengineer.evaluators.timing import time_samples

        return {name: min(time_samples(fn, device=self.device, warmup=WARM, repeats=REPEATS, flush_l2=False))
                for name, fn in self.workloads.items()}

    def start(self) -> dict[str, Any]:
        """Time the workloads START_RUNS times: their medians are the reference, their spread the tolerance."""
        runs = [self.measure() for _ in range(START_RUNS)]
        self.base = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for k, base in self.base.items():
            spread = (max(r[k] for r in runs) - min(r[k] for r in runs)) / base if base > 0 else 0.0
            self.tolerance[k] = max(MIN_TOLERANCE[self.device], 4 * spread)
        return {"us": {k: round(v, 2) for k, v in self.base.items()},
                "tolerance": {k: round(v, 3) for k, v in self.tolerance.items()}}

    def check(self) -> tuple[str | None, dict[str, float]]:
        """(what drifted or None, the times now). A first drift is measured once more before it counts: one
        interrupted run is not drift."""
        now = self.measure()
        drift = self._drift(now)
        if drift:
            now = self.measure()
            drift = self._drift(now)
        return drift, now

    def _drift(self, now: dict[str, float]) -> str | None:
        off = []
        for k, base in self.base.items():
            r, tol = (now[k] / base if base > 0 else 1.0), self.tolerance[k]
            if r > 1 + tol or r < 1 / (1 + tol):
                off.append(f"{k} {base:.1f} -> {now[k]:.1f} us ({r:.2f}x, noise +-{tol:.0%})")
        if not off:
            return None
        return "sentinel workload drifted beyond the noise: " + ", ".join(off)
