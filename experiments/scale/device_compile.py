"""Issue 52's first measurement: what a CUDA candidate's compile costs today against a device-only compile of the
same source, per shipped CUDA family (CPU only: nvcc, and NVRTC where a libnvrtc is given; no GPU).

Per genome (the space's random valid genomes, seeded), CPU seconds of the compiler processes (rusage of children)
or of this process (NVRTC, in-process):

- `today`: `nvcc -c -Xptxas -v` with the flags a build uses (host and device: cudafe++ and the host compiler over the
  CUDA runtime headers, torch's include folders on the path), the one step that is 92-94% of a build;
- `cubin`: `nvcc -cubin -Xptxas -v` of the same source with the space's device flags only;
- `nvrtc` (`--nvrtc LIB`, MSDA only): NVRTC of the device code (the host launch code cut off at its marker, the
  runtime header replaced by what NVRTC provides), in this process.

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
SPACES = "cuda_msda_fp16,sdpa_hopper_fp16_d128,decode_fp8kv_d128_paged"
#: where the MSDA template's host launch code starts (what NVRTC cannot compile)
MSDA_HOST_MARKER = "// Launch preparation of one kernel"


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


def msda_device_only(source: str) -> str:
    head, found, _ = source.partition(MSDA_HOST_MARKER)
    if not found:
        raise ValueError("host marker not found")
    # NVRTC has no C++ standard library headers: libcu++'s, under std (measurement only)
    head = head.replace("#include <cuda_runtime.h>", "#include <cuda_fp16.h>\n#include <cuda_bf16.h>")
    head = head.replace("#include <cstdint>", "#include <cuda/std/cstdint>")
    head = head.replace("#include <type_traits>",
                        "#include <cuda/std/type_traits>\nnamespace std { using namespace cuda::std; }")
    # the namespace the host part would have closed
    return head + "\n}  // namespace evo_msda\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--genomes", type=int, default=8)
    ap.add_argument("--spaces", default=SPACES)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nvrtc", help="libnvrtc.so to measure NVRTC with (MSDA only)")
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
        if rtc and space.template.endswith("msda.cu.j2"):
            opts = ["-std=c++17", f"--gpu-architecture={space.arch}", "-default-device", "-DEVO_WITH_CUDA",
                    *[f for f in space.cuda_flags if f.startswith(("-lineinfo", "--use_fast_math", "-D"))],
                    *(["-pch"] if a.nvrtc_pch else [])]
            for row, c in zip(got, cands):
                cpu, ok, log = rtc.compile(msda_device_only(c.source), opts)
                row["nvrtc_cpu_s"], row["nvrtc_ok"] = round(cpu, 3), ok
                if not ok:
                    row["nvrtc_log"] = log[-400:]
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
        nv = [r for r in rs if r.get("nvrtc_ok")]
        if nv:
            s["nvrtc_cpu_s"] = round(statistics.median(r["nvrtc_cpu_s"] for r in nv), 3)
            s["nvrtc_over_cubin"] = round(statistics.median(r["nvrtc_cpu_s"] / r["cubin_cpu_s"] for r in nv), 2)
            s["nvrtc_ok"] = len(nv)
        summary.append(s)
    tag = f"_{a.tag}" if a.tag else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"device_compile{tag}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1)
                                                       + "\n")
    lines = ["| space | genomes | today (nvcc -c) CPU s | nvcc -cubin CPU s | today / cubin | NVRTC CPU s | "
             "NVRTC / cubin | same ptxas report |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['space']} | {s['genomes']} | {s['today_cpu_s']} | {s['cubin_cpu_s']} | "
                     f"{s['today_over_cubin']} | {s.get('nvrtc_cpu_s', '-')} | {s.get('nvrtc_over_cubin', '-')} | "
                     f"{s['same_report']}/{s['genomes']} |")
    (RESULTS / f"device_compile{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
