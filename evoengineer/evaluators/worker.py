"""Measurement worker: a subprocess that checks and times built candidates, one at a time.

It lives across candidates: inputs and reference outputs are made once per input set (fresh shapes are redrawn per
candidate), and baselines are timed once. The parent talks JSON lines on stdin / a private copy of stdout; the
kernel's own prints go to stderr. A hang or crash here costs only this process: the parent replaces it.

    python -m evoengineer.evaluators.worker
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import traceback
from typing import Any

CUDA_FATAL = ("CUDA error", "illegal memory access", "unspecified launch failure", "device-side assert",
              "misaligned address", "an illegal instruction", "CUBLAS_STATUS")


class Session:
    """State of one worker: the task, cached input sets with references, baseline timings."""

    def __init__(self, init: dict[str, Any]):
        import torch

        from evoengineer.space.spec import SearchSpace
        from evoengineer.tasks.base import get_task

        self.torch = torch
        self.space = SearchSpace.from_text(init["space_text"], init["space_path"])
        self.task = get_task(self.space)
        self.seed = int(init["seed"])
        torch.manual_seed(self.seed)
        self.sets: list[dict[str, Any]] = []  # cached (not fresh) check sets with their reference
        for i, e in enumerate(self.task.entries):
            if e.fresh:
                continue
            for k in range(e.checks):
                s = self._seed(e.name, k)
                inputs = self.task.make_inputs(e.shape, s)
                self.sets.append({"entry": e, "seed": s, "inputs": inputs, "ref": self.task.reference(inputs)})
        self.timed = {e.name: self.task.make_inputs(e.shape, self._seed(e.name, 10_000))
                      for e in self.task.entries if e.time}
        self.baselines: dict[str, dict[str, Any]] | None = None
        from evoengineer.build.compile import load_module

        self.kernels = {b["name"]: load_module(b["so"], b["module"]) for b in init.get("baselines", [])}
        for name, module in self.kernels.items():  # a baseline must be right before anything is compared to it
            ok, reason, *_ = self.check(module, f"baseline:{name}")
            if not ok:
                raise RuntimeError(f"baseline kernel {name} is wrong: {reason}")

    def _seed(self, name: str, k: int, salt: str = "") -> int:
        digest = hashlib.sha256(f"{self.seed}/{name}/{k}/{salt}".encode()).hexdigest()
        return int(digest[:12], 16)

    def _sync(self) -> None:
        if self.task.device == "cuda":
            self.torch.cuda.synchronize()

    def _time(self, fn) -> dict[str, Any]:
        from evoengineer.evaluators.timing import time_callable

        st = self.task.settings
        return time_callable(fn, device=self.task.device, warmup=int(st["warmup"]), repeats=int(st["repeats"]),
                             flush_l2=bool(st["l2_flush"]))

    def _baselines(self) -> dict[str, dict[str, Any]]:
        if self.baselines is None:
            self.baselines = {}
            for bname, fn in self.task.baselines().items():
                per_shape = {name: self._time(lambda inp=inp: fn(inp)) for name, inp in self.timed.items()}
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
            for bname, module in self.kernels.items():
                per_shape = {}
                for name, inp in self.timed.items():
                    out = self.task.new_output(inp)
                    per_shape[name] = self._time(lambda inp=inp, out=out, module=module:
                                                 self.task.launch(module, inp, out))
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
        return self.baselines

    def check(self, module: Any, candidate_hash: str) -> tuple[bool, str, float, float, dict[str, float]]:
        """Run every check set (the tolerance check, then the task's extra check); False with the worst error and
        shape on the first failure. The last item holds the extra checks' metrics, worst over the sets."""
        torch = self.torch
        atol, rtol = self.task.tolerance()
        sets = list(self.sets)
        for e in self.task.entries:
            if e.fresh:
                for k in range(e.checks):
                    s = self._seed(e.name, k, candidate_hash)
                    inputs = self.task.make_inputs(e.shape, s)
                    sets.append({"entry": e, "seed": s, "inputs": inputs, "ref": self.task.reference(inputs)})
        worst_abs = worst_rel = 0.0
        extra: dict[str, float] = {}
        for cs in sets:
            out = self.task.new_output(cs["inputs"])
            self.task.launch(module, cs["inputs"], out)
            self._sync()
            got = out.to(torch.float64)
            ref = cs["ref"].to(got.device)
            where = f"shape {cs['entry'].name} (seed {cs['seed']})"
            bad_values = ~torch.isfinite(got)
            if bad_values.any():
                n = int(bad_values.sum())
                return False, f"{n} of {got.numel()} outputs NaN/Inf (unwritten or invalid) on {where}", math.inf, \
                    math.inf, extra
            err = (got - ref).abs()
            max_abs = float(err.max()) if err.numel() else 0.0
            rel = err / ref.abs().clamp_min(atol)
            max_rel = float(rel.max()) if rel.numel() else 0.0
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            over = err > atol + rtol * ref.abs()
            if over.any():
                idx = int(torch.argmax(err.flatten()))
                return False, (f"max abs err {max_abs:.3e} (rel {max_rel:.3e}) > tol (atol {atol:g}, rtol {rtol:g}) "
                               f"on {where}, {int(over.sum())} elements off, worst at flat index {idx}"), \
                    max_abs, max_rel, extra
            ok, reason, more = self.task.extra_check(cs["entry"].shape, cs["inputs"], out, ref)
            for k, v in more.items():
                extra[k] = max(extra.get(k, v), v)
            if not ok:
                return False, f"{reason} on {where}", worst_abs, worst_rel, extra
        return True, "", worst_abs, worst_rel, extra

    def evaluate(self, msg: dict[str, Any]) -> dict[str, Any]:
        from evoengineer.build.compile import load_module

        try:
            module = load_module(msg["so"], msg["module"])
        except ImportError as exc:
            return {"status": "link_error", "reason": f"does not load: {exc}"[:400], "metrics": {}}
        ok, reason, max_abs, max_rel, extra = self.check(module, msg["hash"])
        metrics: dict[str, Any] = {"max_abs_err": max_abs, "max_rel_err": max_rel, **extra}
        if not ok:
            return {"status": "wrong", "reason": reason, "metrics": metrics}
        per_shape = {}
        for name, inputs in self.timed.items():
            out = self.task.new_output(inputs)
            per_shape[name] = self._time(lambda: self.task.launch(module, inputs, out))
        p = {q: sum(t[q] for t in per_shape.values()) for q in ("p50", "p90", "p99")}
        metrics.update(time_us=p["p50"], time_p90_us=p["p90"], time_p99_us=p["p99"],
                       timing=next(iter(per_shape.values()))["cache"], repeats=int(self.task.settings["repeats"]),
                       shapes={n: {"p50_us": t["p50"], "p90_us": t["p90"], "p99_us": t["p99"]}
                               for n, t in per_shape.items()})
        base = self._baselines()
        if base:
            first = next(iter(base))
            metrics["baseline"] = first
            metrics["baseline_us"] = base[first]["p50"]
            metrics["speedup"] = base[first]["p50"] / p["p50"]
            metrics["baselines_us"] = {b: v["p50"] for b, v in base.items()}
            metrics["speedup_vs"] = {b: v["p50"] / p["p50"] for b, v in base.items()}
            for name in per_shape:
                shape = next(e.shape for e in self.task.entries if e.name == name)
                fl, by = self.task.flops(shape), self.task.min_bytes(shape)
                secs = per_shape[name]["p50"] * 1e-6
                metrics["shapes"][name].update(gflops=fl / secs / 1e9 if fl else None,
                                               gbytes_per_s=by / secs / 1e9 if by else None)
        return {"status": "ok", "reason": "", "metrics": metrics}


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # kernel printf and Python prints go to stderr
    session: Session | None = None

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["cmd"] == "init":
                session = Session(msg)
                reply({"ok": True})
            elif msg["cmd"] == "eval":
                assert session is not None, "eval before init"
                reply(session.evaluate(msg))
            elif msg["cmd"] == "quit":
                break
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            fatal = any(m in text for m in CUDA_FATAL)
            reply({"status": "runtime_error", "reason": text.strip()[:600], "metrics": {}, "fatal": fatal,
                   "trace": traceback.format_exc()[-2000:]})
            if fatal:  # a sticky CUDA error poisons the context: let the parent start a fresh worker
                break


if __name__ == "__main__":
    main()
