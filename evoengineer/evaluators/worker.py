"""Measurement worker: a subprocess that checks and times built candidates, one at a time.

It lives across candidates: inputs and reference outputs are made once per input set (fresh shapes are redrawn per
candidate), and baselines are timed once. Inputs are read-only to a candidate (verified after it ran, restored from a
pristine copy), outputs are guarded and poisoned, and checked beyond the first call (see Session). The parent talks JSON lines on stdin / a private copy of stdout; the
kernel's own prints go to stderr. A hang or crash here costs only this process: the parent replaces it.

    python -m evoengineer.evaluators.worker
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from evoengineer.evaluators.integrity import Guarded, ProtectedInputs, as_bits, checksum, mismatch
from evoengineer.liveness import exit_with_parent

CUDA_FATAL = ("CUDA error", "illegal memory access", "unspecified launch failure", "device-side assert",
              "misaligned address", "an illegal instruction", "CUBLAS_STATUS")


@dataclass
class InputSet:
    """One input set of a shape entry: the protected inputs and (made once, lazily for timed sets) the reference."""

    entry: Any
    seed: int
    inputs: ProtectedInputs
    ref: Any = None

    @property
    def where(self) -> str:
        return f"shape {self.entry.name} (seed {self.seed})"


class Rejected(Exception):
    """A candidate failed a check: `reason` says which and where; metrics gathered so far travel with it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Session:
    """State of one worker: the task, cached input sets with references, baseline timings.

    Every input set a candidate sees is protected (evaluators/integrity.py): inputs sit in guarded allocations with a
    pristine copy; after each candidate they are verified and restored, so one candidate never changes what the next
    one is checked or timed on. Outputs are guarded and NaN-poisoned before every checked call.
    """

    def __init__(self, init: dict[str, Any]):
        import torch

        from evoengineer.space.spec import SearchSpace
        from evoengineer.tasks.base import get_task

        self.torch = torch
        self.space = SearchSpace.from_text(init["space_text"], init["space_path"], check_valid=False)
        self.task = get_task(self.space)
        self.settings = self.task.settings
        self.seed = int(init["seed"])
        torch.manual_seed(self.seed)
        self.canaries = torch.Generator().manual_seed(self._seed("canaries", 0))
        self.sets: list[InputSet] = []  # cached (not fresh) check sets with their reference
        for e in self.task.entries:
            if e.fresh:
                continue
            for k in range(e.checks):
                self.sets.append(self._input_set(e, self._seed(e.name, k), with_ref=True))
        self.timed = {e.name: self._input_set(e, self._seed(e.name, 10_000), with_ref=False)
                      for e in self.task.entries if e.time}
        self.baselines: dict[str, dict[str, Any]] | None = None
        self.kernels: dict[str, Any] = {}
        self.add_baselines(init.get("baselines", []))

    def add_baselines(self, builds: list[dict[str, str]]) -> None:
        """Load the family's built baseline kernels and check each (a baseline must be right before anything is
        compared to it). A separate message from init: the parent starts the worker (torch, the device context, the
        inputs and their references) while the baselines are still building."""
        from evoengineer.compiler.steps import load_module

        for b in builds:
            module = self.kernels[b["name"]] = load_module(b["so"], b["module"])
            try:
                self.check(module, f"baseline:{b['name']}")
            except Rejected as r:
                raise RuntimeError(f"baseline kernel {b['name']} is wrong: {r.reason}") from None
            finally:
                self._restore_inputs()
        self.baselines = None  # timed again, with every baseline, at the next candidate

    def _seed(self, name: str, k: int, salt: str = "") -> int:
        digest = hashlib.sha256(f"{self.seed}/{name}/{k}/{salt}".encode()).hexdigest()
        return int(digest[:12], 16)

    def _input_set(self, entry: Any, seed: int, *, with_ref: bool) -> InputSet:
        raw = self.task.make_inputs(entry.shape, seed)
        s = InputSet(entry, seed, ProtectedInputs(raw, self.canaries))
        if with_ref:
            s.ref = self.task.reference(s.inputs.pristine)
        return s

    def _ref(self, s: InputSet) -> Any:
        if s.ref is None:
            s.ref = self.task.reference(s.inputs.pristine)
        return s.ref

    def _restore_inputs(self) -> None:
        """Cached inputs are never shared mutable state: back to their pristine bytes before the next candidate."""
        for s in (*self.sets, *self.timed.values()):
            s.inputs.verify_and_restore()

    def _sync(self) -> None:
        if self.task.device == "cuda":
            self.torch.cuda.synchronize()

    def _output(self, s: InputSet) -> Guarded:
        return Guarded.holding(self.task.new_output(s.inputs.pristine), self.canaries)

    def _poison(self, out: Any) -> None:
        if out.is_floating_point():
            out.fill_(float("nan"))

    def _time(self, fn, before=None, after=None) -> dict[str, Any]:
        from evoengineer.evaluators.timing import time_callable

        st = self.settings
        return time_callable(fn, device=self.task.device, warmup=int(st["warmup"]), repeats=int(st["repeats"]),
                             flush_l2=bool(st["l2_flush"]), before=before, after=after)

    def _baselines(self) -> dict[str, dict[str, Any]]:
        if self.baselines is None:
            self.baselines = {}
            for bname, fn in self.task.baselines().items():
                per_shape = {name: self._time(lambda inp=s.inputs: fn(inp)) for name, s in self.timed.items()}
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
            for bname, module in self.kernels.items():
                per_shape = {}
                for name, s in self.timed.items():
                    out = self.task.new_output(s.inputs)
                    per_shape[name] = self._time(lambda inp=s.inputs, out=out, module=module:
                                                 self.task.launch(module, inp, out))
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
        return self.baselines

    # ---- checks ---------------------------------------------------------------------------------------------------
    def _against_reference(self, out: Any, ref: Any, where: str) -> tuple[float, float]:
        """Raise Rejected unless every output is finite and within tolerance of the reference; else the errors."""
        atol, _ = self.task.tolerance()
        bad = mismatch(out, ref, *self.task.tolerance())
        if bad:
            raise Rejected(f"{bad} on {where}")
        got = out.to(self.torch.float64)
        err = (got - ref.to(got.device)).abs()
        if not err.numel():
            return 0.0, 0.0
        return float(err.max()), float((err / ref.to(got.device).abs().clamp_min(atol)).max())

    def _agree(self, first: Any, again: Any, ref: Any) -> str | None:
        """None if a repeated run's output matches the first (bitwise for deterministic families, else within the
        tolerance of the reference); else how many elements differ."""
        torch = self.torch
        if self.settings["deterministic"]:
            diff = as_bits(first) != as_bits(again)
            kind = "bitwise"
        else:
            atol, rtol = self.task.tolerance()
            diff = (first.to(torch.float64) - again.to(torch.float64)).abs() > atol + rtol * ref.to(first.device).abs()
            kind = "beyond tolerance"
        n = int(diff.sum())
        return f"{n} of {diff.numel()} elements differ {kind}" if n else None

    def _unwritten(self, out: Any) -> int:
        """Outputs still holding the NaN poison (or made NaN/Inf) after a call."""
        return int((~self.torch.isfinite(out)).sum()) if out.is_floating_point() else 0

    def _verify_memory(self, s: InputSet, out: Guarded, where: str) -> None:
        bad = out.damage("output") or s.inputs.verify()
        if bad:
            raise Rejected(f"{bad} on {where}")

    def check(self, module: Any, candidate_hash: str) -> tuple[float, float, dict[str, float]]:
        """Run every check set `check_runs` times (output poisoned each time); the first run must match the
        reference (then the task's extra check), later runs must write every output again and agree with the first;
        inputs and guard bands must be untouched. Returns the worst errors and the extra checks' metrics (worst over
        the sets); raises Rejected on the first failure."""
        runs = int(self.settings["check_runs"])
        sets = list(self.sets)
        for e in self.task.entries:
            if e.fresh:
                for k in range(e.checks):
                    sets.append(self._input_set(e, self._seed(e.name, k, candidate_hash), with_ref=True))
        worst_abs = worst_rel = 0.0
        extra: dict[str, float] = {}
        for s in sets:
            out = self._output(s)
            first = None
            for r in range(runs):
                self._poison(out.tensor)
                self.task.launch(module, s.inputs, out.tensor)
                self._sync()
                where = s.where if runs == 1 else f"{s.where}, run {r + 1} of {runs}"
                self._verify_memory(s, out, where)
                if first is None:
                    max_abs, max_rel = self._against_reference(out.tensor, s.ref, where)
                    worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
                    ok, reason, more = self.task.extra_check(s.entry.shape, s.inputs.pristine, out.tensor, s.ref)
                    for k, v in more.items():
                        extra[k] = max(extra.get(k, v), v)
                    if not ok:
                        raise Rejected(f"{reason} on {where}")
                    first = out.tensor.clone()
                    continue
                unwritten = self._unwritten(out.tensor)
                if unwritten:
                    raise Rejected(f"stale output: run {r + 1} of {runs} left {unwritten} of {out.tensor.numel()} "
                                   f"outputs unwritten (NaN) on {s.where}")
                diff = self._agree(first, out.tensor, s.ref)
                if diff:
                    raise Rejected(f"nondeterministic: run {r + 1} of {runs} differs from run 1 ({diff}) on "
                                   f"{s.where}")
        return worst_abs, worst_rel, extra

    def timed_runs(self, module: Any, candidate_hash: str) -> dict[str, dict[str, Any]]:
        """Time the candidate on every timed shape. Outside the timed region: the output of the last call and of
        `check_calls - 1` random others is poisoned before and kept after the call, and (deterministic families)
        every call's output is fingerprinted. Afterwards the kept outputs must match the reference, every call
        must agree, and inputs and guard bands must be untouched. Raises Rejected; returns timings per shape."""
        torch = self.torch
        st = self.settings
        warmup, repeats = int(st["warmup"]), int(st["repeats"])
        total = warmup + repeats
        rng = random.Random(f"{self.seed}/{candidate_hash}")
        per_shape: dict[str, dict[str, Any]] = {}
        for name, s in self.timed.items():
            out = self._output(s)
            sample = {total - 1, *rng.sample(range(warmup, total - 1), min(int(st["check_calls"]) - 1, repeats - 1))}
            kept: dict[int, Any] = {}
            sums = torch.zeros(total, dtype=torch.int64, device=out.tensor.device) if st["deterministic"] else None

            def before(i: int, out=out, sample=sample) -> None:
                if i in sample:
                    self._poison(out.tensor)

            def after(i: int, out=out, sample=sample, kept=kept, sums=sums) -> None:
                if sums is not None:
                    sums[i] = checksum(out.tensor)
                if i in sample:
                    kept[i] = out.tensor.clone()

            per_shape[name] = self._time(lambda s=s, out=out: self.task.launch(module, s.inputs, out.tensor),
                                         before, after)
            self._sync()
            self._verify_memory(s, out, f"shape {name} after timing")
            for i in sorted(kept):
                unwritten = self._unwritten(kept[i])
                if unwritten:
                    raise Rejected(f"stale output: timed call {i + 1} of {total} left {unwritten} of "
                                   f"{kept[i].numel()} outputs unwritten (NaN) on shape {name}")
            if sums is not None:
                values = sums.tolist()
                common = max(values.count(v) for v in set(values))
                if common != total:
                    raise Rejected(f"nondeterministic: {total - common} of {total} runs on shape {name} differ "
                                   "bitwise from the others")
            ref = self._ref(s)
            for i in sorted(kept):
                self._against_reference(kept[i], ref, f"shape {name}, timed call {i + 1} of {total}")
            per_shape[name]["checked_calls"] = len(kept)
            per_shape[name]["fingerprinted_calls"] = total if sums is not None else 0
        return per_shape

    def evaluate(self, msg: dict[str, Any]) -> dict[str, Any]:
        from evoengineer.compiler.steps import load_module

        t0 = time.perf_counter()
        try:
            module = load_module(msg["so"], msg["module"])
        except ImportError as exc:
            return {"status": "link_error", "reason": f"does not load: {exc}"[:400], "metrics": {}}
        reply = self.evaluate_module(module, msg["hash"])
        reply["metrics"].setdefault("worker_s", {})["load"] = round(time.perf_counter() - t0
                                                                    - sum(reply["metrics"]["worker_s"].values()), 4)
        return reply

    def evaluate_module(self, module: Any, candidate_hash: str) -> dict[str, Any]:
        """Check, then time, one loaded candidate; the reply the parent records."""
        # where the worker's time goes, per phase (seconds): checks, timed runs (with their own checks), baselines
        phases: dict[str, float] = {}
        metrics: dict[str, Any] = {"worker_s": phases}
        t0 = time.perf_counter()
        try:
            max_abs, max_rel, extra = self.check(module, candidate_hash)
            metrics.update(max_abs_err=max_abs, max_rel_err=max_rel, **extra)
            t1 = time.perf_counter()
            phases["check"] = round(t1 - t0, 4)
            per_shape = self.timed_runs(module, candidate_hash)
            phases["timing"] = round(time.perf_counter() - t1, 4)
        except Rejected as r:
            return {"status": "wrong", "reason": r.reason, "metrics": metrics}
        finally:
            self._restore_inputs()
        p = {q: sum(t[q] for t in per_shape.values()) for q in ("p50", "p90", "p99")}
        metrics.update(time_us=p["p50"], time_p90_us=p["p90"], time_p99_us=p["p99"],
                       timing=next(iter(per_shape.values()))["cache"], repeats=int(self.settings["repeats"]),
                       check_runs=int(self.settings["check_runs"]),
                       shapes={n: {"p50_us": t["p50"], "p90_us": t["p90"], "p99_us": t["p99"],
                                   "checked_calls": t["checked_calls"],
                                   "fingerprinted_calls": t["fingerprinted_calls"]}
                               for n, t in per_shape.items()})
        t2 = time.perf_counter()
        try:
            base = self._baselines()
        finally:
            self._restore_inputs()
        phases["baselines"] = round(time.perf_counter() - t2, 4)
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


    # ---- re-timing of the finalists ---------------------------------------------------------------------------
    def retime(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time the finalists together on fresh inputs: `rounds` rounds, each timing every candidate (and the first
        baseline) for `repeats` calls, the order rotated by one every round (round-robin interleaving, so drift of
        the machine hits every candidate alike). Each candidate's output on the fresh inputs is checked against the
        reference first. Returns per hash the samples per round (or why it was dropped), the baseline's per-round
        p50s and the order the timings ran in."""
        from evoengineer.compiler.steps import load_module

        session, rounds, repeats = str(msg["session"]), int(msg["rounds"]), int(msg["repeats"])
        warmup = max(1, int(self.settings["warmup"]) // 4)
        sets = {e.name: self._input_set(e, self._seed(e.name, 0, f"retime/{session}"), with_ref=True)
                for e in self.task.entries if e.time}
        loaded: dict[str, Any] = {}
        dropped: dict[str, dict[str, str]] = {}
        for c in msg["candidates"]:
            try:
                module = load_module(c["so"], c["module"])
            except ImportError as exc:
                dropped[c["hash"]] = {"status": "link_error", "reason": f"does not load: {exc}"[:300]}
                continue
            try:
                for s in sets.values():  # right on inputs it has never seen, before it is timed on them
                    out = self._output(s)
                    self._poison(out.tensor)
                    self.task.launch(module, s.inputs, out.tensor)
                    self._sync()
                    where = f"re-timing inputs of {s.where}"
                    self._verify_memory(s, out, where)
                    self._against_reference(out.tensor, s.ref, where)
                loaded[c["hash"]] = module
            except Rejected as r:
                dropped[c["hash"]] = {"status": "wrong", "reason": r.reason}
            finally:
                for s in sets.values():
                    s.inputs.verify_and_restore()
        base_fn = None
        bases = self.task.baselines()
        if bases:
            name, fn = next(iter(bases.items()))
            base_fn = (name, lambda: [fn(s.inputs) for s in sets.values()])
        elif self.kernels:
            name, module = next(iter(self.kernels.items()))
            base_outs = {n: self.task.new_output(s.inputs) for n, s in sets.items()}
            base_fn = (name, lambda: [self.task.launch(module, s.inputs, base_outs[n]) for n, s in sets.items()])
        outs = {h: {n: self.task.new_output(s.inputs) for n, s in sets.items()} for h in loaded}
        st = self.settings
        samples: dict[str, list[list[float]]] = {h: [] for h in loaded}
        baseline: list[float] = []
        order: list[str] = []
        from evoengineer.evaluators.retiming import median, round_robin

        for turn in round_robin(list(loaded), rounds):
            for h in turn:
                module = loaded[h]
                per_round = []
                for n, s in sets.items():  # a candidate's time is the sum over the timed shapes, as in the search
                    t = self._time_n(lambda module=module, s=s, out=outs[h][n]: self.task.launch(module, s.inputs, out),
                                     warmup, repeats)
                    per_round.append(t)
                samples[h].append([sum(x) for x in zip(*per_round)])
                order.append(h)
            if base_fn is not None:
                baseline.append(median(self._time_n(base_fn[1], warmup, repeats)))
                order.append(f"baseline:{base_fn[0]}")
        self._restore_inputs()
        for s in sets.values():
            s.inputs.verify_and_restore()
        return {"ok": True, "samples": samples, "dropped": dropped, "order": order,
                "baseline": {"name": base_fn[0] if base_fn else None, "p50_per_round": baseline},
                "cache": "L2 flushed before every call" if (self.task.device == "cuda" and st["l2_flush"])
                else ("L2 warm (same inputs every call)" if self.task.device == "cuda" else "warm (CPU)")}

    def _time_n(self, fn, warmup: int, repeats: int) -> list[float]:
        """Per-call microseconds of `repeats` calls after `warmup` (the search's timing method and cache setting)."""
        from evoengineer.evaluators.timing import time_samples

        return time_samples(fn, device=self.task.device, warmup=warmup, repeats=repeats,
                            flush_l2=bool(self.settings["l2_flush"]))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    # a parent killed with -9 (e.g. a Dask worker mid-candidate): stdin's end-of-file tells an idle worker, this
    # watch one busy in a kernel, which would otherwise hold the device for nobody
    exit_with_parent()
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
            elif msg["cmd"] == "baselines":
                assert session is not None, "baselines before init"
                session.add_baselines(msg["baselines"])
                reply({"ok": True})
            elif msg["cmd"] == "eval":
                assert session is not None, "eval before init"
                reply(session.evaluate(msg))
            elif msg["cmd"] == "retime":
                assert session is not None, "retime before init"
                reply(session.retime(msg))
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
