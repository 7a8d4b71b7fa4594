"""Static gate: the ptxas report (registers, shared memory, spills) of a CUDA candidate's one compile, and the check
of the space's limits against it.

A candidate is compiled once (`compile_cuda`: `nvcc -c -Xptxas -v`, nvcc alone, no GPU): the object it writes is
what the module links, and the report printed on the way is what the gate reads.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")

GATE_METRICS = {"max_registers": "registers", "max_smem_bytes": "smem_bytes", "max_spill_bytes": "spill_bytes",
                "max_stack_bytes": "stack_bytes"}


def parse_ptxas(text: str) -> dict[str, Any]:
    """Worst case over the entry functions in a `-Xptxas -v` report: registers, smem, stack, spill bytes."""
    kernels: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            current = kernels.setdefault(m.group(1), {"registers": 0, "smem_bytes": 0, "stack_bytes": 0,
                                                      "spill_bytes": 0})
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current["stack_bytes"] = int(m.group(1))
            current["spill_bytes"] = int(m.group(2)) + int(m.group(3))
        m = _USED.search(line)
        if m:
            current["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            current["smem_bytes"] = int(s.group(1)) if s else 0
    worst = {k: max((v[k] for v in kernels.values()), default=0)
             for k in ("registers", "smem_bytes", "stack_bytes", "spill_bytes")}
    return {**worst, "kernels": len(kernels)}


def check_gates(report: dict[str, Any], gates: dict[str, float]) -> str | None:
    """None if every gate holds, else the reason naming the first that does not."""
    for gate, limit in gates.items():
        key = GATE_METRICS[gate]
        if report.get(key, 0) > limit:
            return f"{key} {report[key]} > {gate} {limit:g}"
    return None


def nvcc_flags(cuda_flags: list[str], arch: str) -> list[str]:
    """The space's nvcc flags, with -arch added unless the space names its own target."""
    if any(f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code")) for f in cuda_flags):
        return list(cuda_flags)
    return [*cuda_flags, f"-arch={arch}"]


def ptxas_gate(source: Path, *, cuda_flags: list[str], arch: str, include_dirs: list[str] = (),
               timeout_s: float = 300) -> dict[str, Any]:
    """Compile the device code of `source` to a cubin beside it with the space's flags alone (the report a build's
    compile gives, without its host half). Returns status (ok | compile_error), reason and the report."""
    return compile_cuda(source, source.with_suffix(".gate.cubin"), flags=[*nvcc_flags(cuda_flags, arch),
                                                                          *(f"-I{d}" for d in include_dirs)],
                        timeout_s=timeout_s, device_only=True)


def compile_cuda(source: Path, obj: Path, *, flags: list[str], nvcc: str | None = None,
                 timeout_s: float = 300, device_only: bool = False) -> dict[str, Any]:
    """`nvcc -c -Xptxas -v` of `source` into `obj` (with `device_only`, `nvcc -cubin`: the device code alone, no
    host compile): status (ok | compile_error | build_error), reason, the ptxas report (worst case over the entry
    functions), the log and the compiler's CPU seconds."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        return {"status": "build_error", "reason": "nvcc not found on PATH"}
    cmd = [nvcc, "-cubin" if device_only else "-c", "-Xptxas", "-v", *flags, str(source), "-o", str(obj)]
    before = _children_cpu()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "compile_error", "reason": f"nvcc ran over {timeout_s:g} s"}
    cpu_s = _children_cpu() - before
    text = out.stdout + out.stderr
    if out.returncode != 0:
        errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
        return {"status": "compile_error", "reason": (errors[0] if errors else text.strip()[-300:])[:300],
                "log": text[-4000:], "compile_cpu_s": cpu_s}
    return {"status": "ok", "report": parse_ptxas(text), "log": text[-4000:], "compile_cpu_s": cpu_s}


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (nvcc and everything it ran)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
