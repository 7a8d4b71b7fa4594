"""Certify a built CUDA candidate under NVIDIA compute-sanitizer (memcheck, racecheck, synccheck).

A race between warps or an out-of-bounds access can pass every numerical check; the sanitizer sees the accesses
themselves. Each tool runs the candidate once, in its own process, on the smallest checked shape of the space, and
the output is still compared with the float64 reference (a race that the sanitizer's scheduling exposes shows up as
a wrong result). Every (candidate, tool) pair runs side by side: startup (torch, the CUDA context under the tool)
is most of each run's time.

    python -m evoengineer.evaluators.sanitizer JOB.json     (what each tool runs; not for users)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evoengineer.paths import ROOT
from evoengineer.compiler.toolchain import usable_cpus

#: compute-sanitizer's exit code when it reported errors (--error-exitcode), and ours for a wrong output.
FOUND_EXIT = 86
WRONG_EXIT = 87
#: Lines of the tool's report kept as the reason.
REPORT_LINES = 8


def find_tool() -> str | None:
    """compute-sanitizer: $EVOENGINEER_SANITIZER, else on PATH, else in the CUDA toolkit torch builds with."""
    given = os.environ.get("EVOENGINEER_SANITIZER")
    if given:
        return given if Path(given).is_file() else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - torch without cpp_extension
        return None
    if CUDA_HOME:
        p = Path(CUDA_HOME) / "bin" / "compute-sanitizer"
        if p.is_file():
            return str(p)
    return None


def _report(text: str) -> str:
    """The tool's first report lines (those it prefixes with '========='), without the banner and summary."""
    lines = []
    for ln in text.splitlines():
        if not ln.startswith("========="):
            continue
        body = ln.removeprefix("=========").strip()
        if not body or body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "Host Frame",
                                        "Saved host backtrace", "Device Frame")):
            continue
        lines.append(body)
        if len(lines) >= REPORT_LINES:
            break
    return " | ".join(lines)


def _run_tool(exe: str, tool: str, job_path: str, timeout_s: float) -> dict[str, Any]:
    cmd = [exe, "--tool", tool, "--error-exitcode", str(FOUND_EXIT), "--print-limit", "10"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "hazard"]
    cmd += [sys.executable, "-m", "evoengineer.evaluators.sanitizer", job_path]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "verdict": "timeout", "seconds": time.perf_counter() - t0,
                "reason": f"{tool}: no answer within {timeout_s:g} s"}
    seconds = time.perf_counter() - t0
    out = (p.stdout or "") + "\n" + (p.stderr or "")
    if p.returncode == 0:
        return {"tool": tool, "verdict": "clean", "seconds": seconds}
    if p.returncode == FOUND_EXIT:
        return {"tool": tool, "verdict": "found", "seconds": seconds,
                "reason": f"{tool}: {_report(out) or 'errors reported'}"[:1200]}
    tail = " | ".join(ln.strip() for ln in out.splitlines() if ln.strip())[-600:]
    if p.returncode == WRONG_EXIT:
        return {"tool": tool, "verdict": "found", "seconds": seconds,
                "reason": f"{tool}: wrong output under the tool: {tail}"}
    return {"tool": tool, "verdict": "error", "seconds": seconds,
            "reason": f"{tool}: exited with code {p.returncode}: {tail}"}


def certify(candidates: list[dict[str, str]], *, space_text: str, space_path: str, tools: list[str],
            timeout_s: float, exe: str | None = None) -> dict[str, dict[str, Any]]:
    """Run each candidate ({"hash", "so", "module"}) under each tool, all side by side. Returns per hash
    {"status": "clean" | "failed" | "unknown", "tools", "reason", "seconds", "per_tool"}: failed when a tool
    reported something (or the output was wrong under it), unknown when a tool gave no answer (timeout, the tool
    itself failing)."""
    exe = exe or find_tool()
    if exe is None:
        return {c["hash"]: {"status": "unknown", "tools": tools, "reason": "compute-sanitizer not found",
                            "seconds": 0.0} for c in candidates}
    jobs = {}
    for c in candidates:
        fd, jobs[c["hash"]] = tempfile.mkstemp(prefix="evo-sanitize-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"space_text": space_text, "space_path": space_path, "so": c["so"], "module": c["module"],
                       "hash": c["hash"]}, f)
    pairs = [(h, t) for h in jobs for t in tools]
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(pairs), usable_cpus()))) as pool:
            results = list(pool.map(lambda p: _run_tool(exe, p[1], jobs[p[0]], timeout_s), pairs))
    finally:
        for path in jobs.values():
            os.unlink(path)
    verdicts = {}
    for h in jobs:
        mine = [r for (hh, _), r in zip(pairs, results) if hh == h]
        found = [r for r in mine if r["verdict"] == "found"]
        unsure = [r for r in mine if r["verdict"] in ("timeout", "error")]
        verdicts[h] = {"status": "failed" if found else ("unknown" if unsure else "clean"), "tools": tools,
                       "reason": "; ".join(r["reason"] for r in (found or unsure)),
                       "seconds": round(max(r["seconds"] for r in mine), 2),
                       "per_tool": {r["tool"]: {"verdict": r["verdict"], "seconds": round(r["seconds"], 2)}
                                    for r in mine}}
    return verdicts


# ---- inside the tool: run the candidate once on the smallest checked shape --------------------------------------
def _smallest_entry(task: Any) -> Any:
    """The checked shape with the least compulsory traffic (the tools slow a kernel down 10-100x)."""
    checked = [e for e in task.entries if e.checks] or list(task.entries)
    return min(checked, key=lambda e: task.min_bytes(e.shape))


def _main(job_path: str) -> int:
    import hashlib

    import torch

    from evoengineer.compiler.steps import load_module
    from evoengineer.evaluators import outputs
    from evoengineer.evaluators.integrity import mismatch
    from evoengineer.space.spec import SearchSpace
    from evoengineer.families import get_task

    job = json.loads(Path(job_path).read_text())
    space = SearchSpace.from_text(job["space_text"], job["space_path"], check_valid=False)
    task = get_task(space)
    module = load_module(job["so"], job["module"])
    entry = _smallest_entry(task)
    seed = int(hashlib.sha256(f"sanitize/{job['hash']}".encode()).hexdigest()[:12], 16)
    inputs = task.make_inputs(entry.shape, seed)
    out = task.new_output(inputs)
    task.launch(module, inputs, out)
    if task.device == "cuda":
        torch.cuda.synchronize()
    # the reference on the CPU, so that nothing but the candidate runs under the tool's instrumentation for long
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    names = [""] if task.single_output() else [t.name for t in task.signature.written]
    refs = outputs.parts(outputs.reference_value(task.reference(cpu), names))
    for k, got in outputs.parts(out).items():
        bad = mismatch(got.cpu(), refs[k], *task.tolerance_of(k))
        if bad:
            print(f"{'output ' + k + ': ' if k else ''}{bad} on shape {entry.name}", file=sys.stderr)
            return WRONG_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
