"""Issue 52's first measurement: what a CUDA candidate's compile costs today against a device-only compile of the
same source, per shipped CUDA family (CPU only: nvcc, and NVRTC where a libnvrtc is given; no GPU).

Per genome (the space's random valid genomes, seeded), CPU seconds of the compiler processes (rusage of children)
or of this process (NVRTC, in-process):

- `today`: `nvcc -c -Xptxas -v` with the flags a build uses (host and device: cudafe++ and the host compiler over the
  CUDA runtime headers, torch's include folders on the path), the one step that is 92-94% of a build;
- `cubin`: `nvcc -cubin -Xptxas -v` of the same source with the space's device flags only;
- `nvrtc` (`--nvrtc LIB`): NVRTC of the same source, in this process: the templates keep their host code and
  headers from NVRTC (`#ifndef __CUDACC_RTC__`; templates/cuda/common/rtc_prelude.cuh.j2 gives the device code what
  nvcc's headers would); `--nvrtc-pch` also with NVRTC's automatic precompiled headers (`-pch`: the first compile of
  the process builds them, the later ones load them; the median leaves the first out).

Also checks that the device-only compile's ptxas report (registers, spills, shared memory) equals today's: the static
gate can read it instead.

    python experiments/scale/device_compile.py [--genomes 8] [--spaces cuda_msda_fp16,...] [--jobs 2]
        [--nvrtc /path/libnvrtc.so.13] [--tag T]

Writes experiments/scale/results/device_compile[_TAG].json and .md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "experiments" / "scale" / "results"
SPACES = "cuda_msda_fp16,sdpa_fp16_d64,sdpa_hopper_fp16_d128,decode_fp8kv_d128_paged"


def nvcc_cpu(cmd: list[str], cwd: Path) -> tuple[float, str, int]:
    """(CPU seconds of the compiler processes, their output, return code) of one nvcc run: measured by a small
    Python wrapper process (its children's rusage), so runs in parallel threads do not mix."""
    wrapper = [sys.executable, "-c", "import resource,subprocess,sys;p=subprocess.run(sys.argv[1:],capture_output=True,"
               "text=True);r=resource.getrusage(resource.RUSAGE_CHILDREN);sys.stdout.write(repr(r.ru_utime+r.ru_stime)"
               "+'\\n'+p.stdout+p.stderr);sys.exit(p.returncode)", *cmd]
    p = subprocess.run(wrapper, cwd=cwd, capture_output=True, text=True)
    first, _, rest = p.stdout.partition("\n")
    return float(first), rest + p.stderr, p.returncode


def report(text: str) -> dict:
    from evoengineer.compiler.gate import parse_ptxas

    r = parse_ptxas(text)
    return {k: r.get(k) for k in ("registers", "spill_bytes", "smem_bytes", "stack_bytes") if k in r}


class Nvrtc:
    """NVRTC through ctypes: compile a source to a cubin, CPU seconds of this process."""

    def __init__(self, lib: str, include: str):
        self.lib = ctypes.CDLL(lib)
        self.include = include

    def compile(self, source: str, options: list[str]) -> tuple[float, bool, str]:
        lib = self.lib
        prog = ctypes.c_void_p()
        c0 = time.process_time()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None)
        if rc != 0:
            return 0.0, False, f"nvrtcCreateProgram {rc}"
        opts = [o.encode() for o in [*options, f"-I{self.include}", f"-I{self.include}/cccl"]]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        if rc == 0:
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, buf)
        cpu = time.process_time() - c0
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return cpu, rc == 0, log.value.decode(errors="replace")


def nvrtc_options(cubin_flags: list[str], arch: str) -> list[str]:
    """NVRTC's options for the device flags of an nvcc -cubin build: the target, defines, line info, fast math and
    register caps carried over; -O3 (a host flag) and --expt-relaxed-constexpr (NVRTC: -default-device, unannotated
    constexpr helpers become device functions) replaced; the ptxas report asked for as nvcc's -Xptxas -v does."""
    opts = [f"-arch={arch}", "-default-device", "--ptxas-options=-v"]
    for f in cubin_flags:
        if f.startswith(("-D", "-U", "-std=", "--std=", "-lineinfo", "--use_fast_math", "-use_fast_math",
                         "-maxrregcount", "--maxrregcount")):
            opts.append(f)
    if not any(o.startswith(("-std=", "--std=")) for o in opts):
        opts.append("-std=c++17")
    return opts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--genomes", type=int, default=8)
    ap.add_argument("--spaces", default=SPACES)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nvrtc", help="libnvrtc.so to measure NVRTC with")
    ap.add_argument("--nvrtc-pch", action="store_true", help="NVRTC with its automatic precompiled headers (-pch)")
    ap.add_argument("--cuda-include", help="the CUDA toolkit's include folder (for NVRTC; default: found)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)

    from evoengineer.candidate import CandidateFactory
    from evoengineer.compiler.steps import cubin_compile_flags, cuda_compile_flags
    from evoengineer.space import load_space, resolve_space_arg

    nvcc = shutil.which("nvcc")
    if not nvcc:
        print("nvcc not found", file=sys.stderr)
        return 2
    from torch.utils import cpp_extension

    homes = [cpp_extension.CUDA_HOME, Path(nvcc).resolve().parent.parent, *sorted(Path("/usr/local").glob("cuda*"))]
    cuda_include = a.cuda_include or next((str(Path(h) / "include") for h in homes
                                           if h and (Path(h) / "include" / "cuda_fp16.h").is_file()), "")
    rtc = Nvrtc(a.nvrtc, cuda_include) if a.nvrtc else None
    work = Path(tempfile.mkdtemp(prefix="evo-devcompile-"))
    rows = []
    for space_name in a.spaces.split(","):
        space = load_space(resolve_space_arg(space_name))
        factory = CandidateFactory(space)
        rng = random.Random(a.seed)
        cands = [factory.from_genome(space.random_valid_genome(rng)) for _ in range(a.genomes)]
        job = {"cuda_cflags": [*space.cuda_flags, "-DEVO_WITH_CUDA"], "arch": space.arch}
        today, dev = cuda_compile_flags(job), cubin_compile_flags(job)

        def one(k: int, c) -> dict:
            d = work / f"{space_name}_{k}"
            d.mkdir()
            (d / "kernel.cu").write_text(c.source)
            t_cpu, t_log, t_rc = nvcc_cpu([nvcc, "-c", "-Xptxas", "-v", *today, "kernel.cu", "-o", "kernel.o"], d)
            c_cpu, c_log, c_rc = nvcc_cpu([nvcc, "-cubin", "-Xptxas", "-v", *dev, "kernel.cu", "-o",
                                           "kernel.cubin"], d)
            row = {"space": space_name, "hash": c.hash[:12], "today_cpu_s": round(t_cpu, 3),
                   "cubin_cpu_s": round(c_cpu, 3), "today_ok": t_rc == 0, "cubin_ok": c_rc == 0}
            if t_rc == 0 and c_rc == 0:
                row["same_report"] = report(t_log) == report(c_log)
                row["report"] = report(c_log)
            return row

        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            got = list(pool.map(lambda kc: one(*kc), enumerate(cands)))
        if rtc:  # in this process, one genome after another (NVRTC's precompiled headers live per process)
            opts = nvrtc_options(dev, space.arch)
            for row, c in zip(got, cands):
                for key, extra in (("nvrtc", []), *((("nvrtc_pch", ["-pch"]),) if a.nvrtc_pch else ())):
                    cpu, ok, log = rtc.compile(c.source, [*opts, *extra])
                    row[f"{key}_cpu_s"], row[f"{key}_ok"] = round(cpu, 3), ok
                    if ok:
                        row[f"{key}_same_report"] = report(log) == row.get("report")
                    else:
                        row[f"{key}_log"] = log[-400:]
        rows += got
        for r in got:
            print(json.dumps(r), flush=True)
    summary = []
    for space_name in a.spaces.split(","):
        rs = [r for r in rows if r["space"] == space_name and r["today_ok"] and r["cubin_ok"]]
        if not rs:
            continue
        s = {"space": space_name, "genomes": len(rs),
             "today_cpu_s": round(statistics.median(r["today_cpu_s"] for r in rs), 3),
             "cubin_cpu_s": round(statistics.median(r["cubin_cpu_s"] for r in rs), 3),
             "today_over_cubin": round(statistics.median(r["today_cpu_s"] / r["cubin_cpu_s"] for r in rs), 2),
             "same_report": sum(1 for r in rs if r.get("same_report")), }
        for key in ("nvrtc", "nvrtc_pch"):
            nv = [r for r in rs if r.get(f"{key}_ok")]
            if nv:
                later = nv[1:] if key == "nvrtc_pch" and len(nv) > 1 else nv  # the first builds the PCH
                s[f"{key}_cpu_s"] = round(statistics.median(r[f"{key}_cpu_s"] for r in later), 3)
                s[f"{key}_over_cubin"] = round(statistics.median(r[f"{key}_cpu_s"] / r["cubin_cpu_s"] for r in later),
                                               2)
                s[f"{key}_ok"] = len(nv)
                s[f"{key}_same_report"] = sum(1 for r in nv if r.get(f"{key}_same_report"))
        summary.append(s)
    tag = f"_{a.tag}" if a.tag else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"device_compile{tag}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1)
                                                       + "\n")
    lines = ["| space | genomes | today (nvcc -c) CPU s | nvcc -cubin CPU s | today / cubin | NVRTC CPU s (/ cubin) | "
             "NVRTC -pch CPU s (/ cubin) | same ptxas report: cubin, NVRTC, NVRTC -pch |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        rtc_cells = [f"{s[k + '_cpu_s']} ({s[k + '_over_cubin']}x)" if k + "_cpu_s" in s else "-"
                     for k in ("nvrtc", "nvrtc_pch")]
        same = [f"{s['same_report']}/{s['genomes']}",
                *(f"{s[k + '_same_report']}/{s[k + '_ok']}" if k + "_ok" in s else "-" for k in ("nvrtc", "nvrtc_pch"))]
        lines.append(f"| {s['space']} | {s['genomes']} | {s['today_cpu_s']} | {s['cubin_cpu_s']} | "
                     f"{s['today_over_cubin']} | {rtc_cells[0]} | {rtc_cells[1]} | {', '.join(same)} |")
    (RESULTS / f"device_compile{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
