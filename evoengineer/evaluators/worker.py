"""Measurement worker: a subprocess that checks and times built candidates, one at a time.

It lives across candidates: inputs and reference outputs are made once per input set (fresh shapes are redrawn per
candidate), and baselines are timed once. Inputs are read-only to a candidate (verified after it ran, restored from a
pristine copy), outputs are guarded and poisoned, and checked beyond the first call; timed calls alternate between
input sets and every one is fingerprinted; the time itself is checked (new inputs, work off the stream, a CUDA graph,
the physics gate); after every candidate the process and device state is compared with what the worker started with
and restored, and a sentinel workload is timed (see Session). The parent talks JSON lines on stdin / a private copy
of stdout; the kernel's own prints go to stderr. A hang or crash here costs only this process: the parent replaces
it, as it does when a candidate left state behind that cannot be undone.

    python -m evoengineer.evaluators.worker
"""

from __future__ import annotations

import time

#: when this process's Python reached the worker module, before its imports (CLOCK_MONOTONIC: the parent's clock
#: too); the imports follow it on purpose
STARTED_AT = time.monotonic()

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evoengineer.evaluators.base import state_changed
from evoengineer.evaluators import outputs as written
from evoengineer.evaluators.integrity import ProtectedInputs, any_true, as_bits, mismatch, verify_and_restore_all
from evoengineer.liveness import exit_with_parent

#: when the module's imports (torch among them) were done
IMPORTED_AT = time.monotonic()

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
    """A candidate failed a check: `reason` says which and where; `status` is `wrong` (an output or input is off) or
    `implausible` (its time cannot be honest)."""

    def __init__(self, reason: str, status: str = "wrong"):
        super().__init__(reason)
        self.reason = reason
        self.status = status


#: timed input sets per timed shape: calls alternate between them, in one output buffer
TIMED_SETS = 2
#: calls captured in the CUDA graph of the graph check, and replays timed
GRAPH_CALLS, GRAPH_REPLAYS = 4, 3
#: a graph replay slower than this x the eager p50 (+ GRAPH_SLACK_US) disagrees beyond launch-overhead effects
GRAPH_FACTOR, GRAPH_SLACK_US = 1.25, 2.0
#: back-to-back calls of the off-stream check; work still running this long after the candidate's stream finished
#: (at least, or this share of the calls' wall time) was left on another stream
OFFSTREAM_CALLS, OFFSTREAM_SLACK_S, OFFSTREAM_SHARE = 16, 80e-6, 0.25
#: calls on inputs a candidate never saw (sets made when the worker starts, new to every candidate: a candidate's
#: memory is its own module's), each paired with a call on a timed set right before it: slower than this x (+ slack)
#: in every pair, the candidate reused work of earlier calls
NOVEL_SETS, NOVEL_FACTOR, NOVEL_SLACK_US = 3, 1.5, {"cuda": 10.0, "cpu": 200.0}


class Session:
    """State of one worker: the task, cached input sets with references, baseline timings, and what keeps one
    candidate from changing how the next is measured.

    Every input set a candidate sees is protected (evaluators/integrity.py): inputs sit in guarded allocations with a
    pristine copy; after each candidate they are verified and restored. Outputs are guarded and NaN-poisoned before
    every checked call. Process and device state is recorded once (evaluators/process_state.py), restored after
    every candidate and compared; a sentinel workload (evaluators/sentinel.py) is timed after every candidate. A
    CUDA candidate runs on a stream of its own, made for it and dropped after it.
    """

    def __init__(self, init: dict[str, Any]):
        # where the start goes (time.monotonic() at the end of each step; the parent's start timeline shows them)
        self.start_marks: dict[str, float] = {"python": STARTED_AT, "torch imported": IMPORTED_AT}
        import torch

        from evoengineer.evaluators.physics import PhysicsGate
        from evoengineer.space.spec import SearchSpace
        from evoengineer.families import get_task

        self.torch = torch
        self.space = SearchSpace.from_text(init["space_text"], init["space_path"], check_valid=False)
        self.task = get_task(self.space)
        if self.task.device == "cuda":
            torch.cuda.init()  # the device context, timed on its own
            torch.empty(1, device="cuda")
            self.start_marks["device context"] = time.monotonic()
        self.start_marks["family loaded"] = time.monotonic()
        self.settings = self.task.settings
        self.single = self.task.single_output()
        self.inout = self.task.inout_names()
        self.written = [""] if self.single else [t.name for t in self.task.signature.written]
        self.seed = int(init["seed"])
        self.cache_dir = init.get("cache_dir")
        torch.manual_seed(self.seed)
        self.canaries = torch.Generator().manual_seed(self._seed("canaries", 0))
        self.sets: list[InputSet] = []  # cached (not fresh) check sets with their reference
        for e in self.task.entries:
            if e.fresh:
                continue
            for k in range(e.checks):
                self.sets.append(self._input_set(e, self._seed(e.name, k), with_ref=True))
        self.start_marks["check inputs and references"] = time.monotonic()
        self.timed = {e.name: [self._input_set(e, self._seed(e.name, 10_000 + k), with_ref=False)
                               for k in range(TIMED_SETS)]
                      for e in self.task.entries if e.time}
        self.novel = {e.name: [self._input_set(e, self._seed(e.name, 20_000 + k), with_ref=False)
                               for k in range(NOVEL_SETS)]
                      for e in self.task.entries if e.time}
        self.start_marks["timed inputs"] = time.monotonic()
        self._weightings: dict[str, tuple[Any, list[tuple[float, float]]]] = {}
        self._novel_rounds = 0  # second-round new-input sets made so far (each round's seeds are its own)
        self.baselines: dict[str, dict[str, Any]] | None = None
        self.kernels: dict[str, Any] = {}
        self.gate = PhysicsGate(self.task.device, l2_flush=bool(self.settings["l2_flush"]))
        self.guard: Any = None  # StateGuard, made once the worker has done everything it does before candidates
        self.sentinel: Any = None
        self.started: dict[str, Any] = {}
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
        self.baselines = None  # timed again, with every baseline, before the next candidate

    def _seed(self, name: str, k: int, salt: str = "") -> int:
        digest = hashlib.sha256(f"{self.seed}/{name}/{k}/{salt}".encode()).hexdigest()
        return int(digest[:12], 16)

    def _input_set(self, entry: Any, seed: int, *, with_ref: bool) -> InputSet:
        raw = self.task.make_inputs(entry.shape, seed)
        s = InputSet(entry, seed, ProtectedInputs(raw, self.canaries))
        if with_ref:
            s.ref = self._reference(s)
        return s

    def _ref(self, s: InputSet) -> Any:
        if s.ref is None:
            s.ref = self._reference(s)
        return s.ref

    def _reference(self, s: InputSet) -> Any:
        try:
            return written.reference_value(self.task.reference(s.inputs.pristine), self.written)
        except ValueError as exc:
            raise RuntimeError(f"family {self.task.name}: {exc}") from None

    def _restore_inputs(self) -> None:
        """Cached inputs are never shared mutable state: back to their pristine bytes before the next candidate."""
        verify_and_restore_all([s.inputs for s in (*self.sets, *(t for sets in self.timed.values() for t in sets))])

    def _sync(self) -> None:
        if self.task.device == "cuda":
            self.torch.cuda.synchronize()

    def _output(self, s: InputSet) -> written.GuardedOutputs:
        return written.GuardedOutputs(self.task.new_output(s.inputs.pristine), self.canaries)

    def _poison(self, out: Any, s: InputSet | None = None) -> None:
        """Before a checked call: floating outputs NaN, and (given the call's input set) every inout back to that
        set's value."""
        for k, t in written.parts(out).items():
            if k in self.inout:
                if s is not None:
                    t.copy_(s.inputs.pristine[k])
            elif t.is_floating_point():
                t.fill_(float("nan"))

    def _reset_inout(self, out: Any, s: InputSet) -> None:
        """Before any call: every inout back to the call's input set's value (an in-place kernel then does the same
        work on the same data every call, as it would in a model)."""
        for k in self.inout:
            out[k].copy_(s.inputs.pristine[k])

    def _time(self, fn, before=None, after=None) -> dict[str, Any]:
        from evoengineer.evaluators.timing import time_callable

        st = self.settings
        return time_callable(fn, device=self.task.device, warmup=int(st["warmup"]), repeats=int(st["repeats"]),
                             flush_l2=bool(st["l2_flush"]), before=before, after=after, numbered=True)

    def _baselines(self) -> dict[str, dict[str, Any]]:
        """The baselines' times per timed shape (made once per worker, calls alternating over the timed sets as the
        candidates' do)."""
        if self.baselines is None:
            self.baselines = {}
            for bname, fn in self.task.baselines().items():
                per_shape = {name: self._time(_alternate(lambda s, fn=fn: fn(s.inputs), sets))
                             for name, sets in self.timed.items()}
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
            for bname, module in self.kernels.items():
                per_shape = {}
                for name, sets in self.timed.items():
                    out = self.task.new_output(sets[0].inputs)
                    per_shape[name] = self._time(_alternate(
                        lambda s, out=out, module=module: self.task.launch(module, s.inputs, out), sets),
                        before=self._resetter(out, sets))
                self.baselines[bname] = {"p50": sum(t["p50"] for t in per_shape.values()), "shapes": per_shape}
        return self.baselines

    # ---- the state candidates are measured with -------------------------------------------------------------------
    def _start_guards(self, *, baselines: bool = True) -> None:
        """Once, before the first candidate: baselines timed (not for a re-timing, which times its baseline in every
        round), then the sentinel's and the process state's record (so whatever the worker itself starts, threads or
        handles, is part of the state measured with)."""
        if self.guard is not None:
            return
        from evoengineer.evaluators.process_state import StateGuard
        from evoengineer.evaluators.sentinel import CpuProbe, Sentinel

        if baselines:
            try:
                self._baselines()
            finally:
                self._restore_inputs()
        for sets in self.timed.values():
            self.gate.prepare(int(self.task.min_bytes(sets[0].entry.shape) or 0))
        probe = None
        if self.task.device == "cpu":
            from evoengineer.compiler.builder import default_cache_dir

            probe = CpuProbe.build(Path(self.cache_dir) if self.cache_dir else default_cache_dir())
        self.sentinel = Sentinel(self.task.device, probe)
        self.started["sentinel"] = self.sentinel.start()
        self.guard = StateGuard(self.task.device, probe)
        self.started["state"] = self.guard.snapshot()
        self.started["peaks"] = self.gate.describe()

    def _resetter(self, out: Any, sets: list[InputSet]) -> Any:
        """A timing hook resetting the inouts before call i (None without inouts)."""
        if not self.inout:
            return None
        return lambda i: self._reset_inout(out, sets[i % len(sets)])

    def _stream(self):
        """A fresh stream for one candidate (CUDA): attributes it sets on it (an access-policy window) go with it."""
        if self.task.device != "cuda":
            return contextlib.nullcontext(), None
        s = self.torch.cuda.Stream()
        return self.torch.cuda.stream(s), s

    # ---- checks ---------------------------------------------------------------------------------------------------
    def _named(self, k: str, text: str) -> str:
        return f"output {k}: {text}" if k else text

    def _against_reference(self, out: Any, ref: Any, where: str) -> tuple[float, float]:
        """Raise Rejected unless every written tensor is finite and within tolerance of the reference; else the
        worst errors."""
        worst_abs = worst_rel = 0.0
        refs = written.parts(ref)
        for k, got in written.parts(out).items():
            atol, rtol = self.task.tolerance_of(k)
            bad = mismatch(got, refs[k], atol, rtol)
            if bad:
                raise Rejected(f"{self._named(k, bad)} on {where}")
            got = got.to(self.torch.float64)
            r = refs[k].to(got.device)
            err = (got - r).abs()
            if err.numel():
                worst_abs = max(worst_abs, float(err.max()))
                worst_rel = max(worst_rel, float((err / r.abs().clamp_min(atol)).max()))
        return worst_abs, worst_rel

    def _agree(self, first: Any, again: Any, ref: Any) -> str | None:
        """None if a repeated run's outputs match the first (bitwise for deterministic families, else within the
        tolerance of the reference); else how many elements differ."""
        torch = self.torch
        refs, seconds = written.parts(ref), written.parts(again)
        for k, a in written.parts(first).items():
            b = seconds[k]
            if self.settings["deterministic"]:
                diff = as_bits(a) != as_bits(b)
                kind = "bitwise"
            else:
                atol, rtol = self.task.tolerance_of(k)
                diff = (a.to(torch.float64) - b.to(torch.float64)).abs() > atol + rtol * refs[k].to(a.device).abs()
                kind = "beyond tolerance"
            n = int(diff.sum())
            if n:
                return self._named(k, f"{n} of {diff.numel()} elements differ {kind}")
        return None

    def _unwritten(self, out: Any) -> int:
        """Outputs still holding the NaN poison (or made NaN/Inf) after a call."""
        return written.unwritten(out)

    def _verify_memory(self, s: InputSet, out: written.GuardedOutputs, where: str) -> None:
        """The output's guard bands and the input set (bytes and guard bands) as they were: one read-back when so."""
        if not any_true([*out.flags(), *s.inputs.flags()]):
            return
        bad = out.damage() or s.inputs.verify()
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
                self._poison(out.tensor, s)
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
                    first = written.clone(out.tensor)
                    continue
                unwritten = self._unwritten(out.tensor)
                if unwritten:
                    raise Rejected(f"stale output: run {r + 1} of {runs} left {unwritten} of "
                                   f"{written.numel(out.tensor)} "
                                   f"outputs unwritten (NaN) on {s.where}")
                diff = self._agree(first, out.tensor, s.ref)
                if diff:
                    raise Rejected(f"nondeterministic: run {r + 1} of {runs} differs from run 1 ({diff}) on "
                                   f"{s.where}")
        return worst_abs, worst_rel, extra

    def timed_runs(self, module: Any, candidate_hash: str) -> dict[str, dict[str, Any]]:
        """Time the candidate on every timed shape, its calls alternating between the shape's timed input sets in
        one output buffer (an output kept from an earlier call is the other set's: wrong). Outside the timed region
        every call's output is fingerprinted (deterministic families: its bits; others: a random weighting of it,
        compared with the reference's within the tolerance), and the output of the last call of each set and of
        `check_calls - 2` random others is poisoned before and kept after the call. Afterwards the kept outputs
        must match the reference, every call's fingerprint must be its set's, and inputs and guard bands must be
        untouched; then one more checked call per set (after the timing loop). Raises Rejected; returns timings per
        shape."""
        torch = self.torch
        st = self.settings
        warmup, repeats = int(st["warmup"]), int(st["repeats"])
        total = warmup + repeats
        rng = random.Random(f"{self.seed}/{candidate_hash}")
        per_shape: dict[str, dict[str, Any]] = {}
        for name, sets in self.timed.items():
            n = len(sets)
            out = self._output(sets[0])
            last = {total - 1 - k for k in range(min(n, total))}  # the last call of every set
            others = range(warmup, total - len(last))
            sample = last | set(rng.sample(others, min(max(int(st["check_calls"]) - len(last), 0), len(others))))
            kept: dict[int, Any] = {}
            deterministic = bool(st["deterministic"])
            device = next(iter(written.parts(out.tensor).values())).device
            sums = torch.zeros(total, dtype=torch.int64 if deterministic else torch.float64, device=device)
            weights = None if deterministic else self._weighting(name, sets)[0]

            def before(i: int, out=out, sample=sample, sets=sets) -> None:
                if self.inout:
                    self._reset_inout(out.tensor, sets[i % len(sets)])
                if i in sample:
                    self._poison(out.tensor)

            def after(i: int, out=out, sample=sample, kept=kept, sums=sums, weights=weights) -> None:
                sums[i] = (written.fingerprint(out.tensor) if weights is None else
                           written.weighted_sum(out.tensor, weights))
                if i in sample:
                    kept[i] = written.clone(out.tensor)

            per_shape[name] = self._time(_alternate(lambda s, out=out: self.task.launch(module, s.inputs, out.tensor),
                                                    sets), before, after)
            self._sync()
            for s in sets:
                self._verify_memory(s, out, f"shape {name} after timing")
            for i in sorted(kept):
                unwritten = self._unwritten(kept[i])
                if unwritten:
                    raise Rejected(f"stale output: timed call {i + 1} of {total} left {unwritten} of "
                                   f"{written.numel(kept[i])} outputs unwritten (NaN) when it returned, on shape "
                                   f"{name}")
            for i in sorted(kept):
                self._against_reference(kept[i], self._ref(sets[i % n]),
                                        f"shape {name}, timed call {i + 1} of {total} (input set {i % n + 1} of {n})")
            self._fingerprints_agree(name, sets, sums.tolist(), kept, weights)
            for k, s in enumerate(sets):  # checked again once the timing loop is over
                self._poison(out.tensor, s)
                self.task.launch(module, s.inputs, out.tensor)
                self._sync()
                where = f"shape {name} (input set {k + 1} of {n}), the call after the timing loop"
                self._verify_memory(s, out, where)
                self._against_reference(out.tensor, self._ref(s), where)
            per_shape[name]["checked_calls"] = len(kept) + n
            per_shape[name]["fingerprinted_calls"] = total
            per_shape[name]["input_sets"] = n
        return per_shape

    def _weighting(self, name: str, sets: list[InputSet]) -> tuple[Any, list[tuple[float, float]]]:
        """A nondeterministic family's fingerprint of one shape's outputs, made once per worker: random weights (a
        candidate never sees them) and, per timed set, the reference's weighted sum and how far an output within
        the tolerance can be from it."""
        if name not in self._weightings:
            torch = self.torch
            refs = [written.parts(self._ref(s)) for s in sets]
            weights = {k: torch.rand(r.shape, dtype=torch.float64, generator=self.canaries).to(r.device)
                       for k, r in refs[0].items()}

            def bound(r: dict[str, Any]) -> float:
                total = 0.0
                for k, w in weights.items():
                    atol, rtol = self.task.tolerance_of(k)
                    total += float((w * (atol + rtol * r[k].to(torch.float64).abs())).sum())
                return total * 1.01 + 1e-12

            self._weightings[name] = (weights, [
                (float(sum((r[k].to(torch.float64) * w).sum() for k, w in weights.items())), bound(r))
                for r in refs])
        return self._weightings[name]

    def _fingerprints_agree(self, name: str, sets: list[InputSet], values: list[Any], kept: dict[int, Any],
                            weights: Any) -> None:
        """Every call's fingerprint is its input set's (the fingerprint of the set's outputs checked against the
        reference); a call whose fingerprint is another set's returned an output kept from an earlier call."""
        n, total = len(sets), len(values)
        if weights is None:
            expected = {}
            for i, out in kept.items():
                expected.setdefault(i % n, int(written.fingerprint(out)))
            for i, v in enumerate(values):
                want = expected.get(i % n)
                if want is None or v == want:
                    continue
                other = [k for k, w in expected.items() if w == v and k != i % n]
                if other:
                    raise Rejected(f"timed call {i + 1} of {total} on shape {name} returned the output of input set "
                                   f"{other[0] + 1}, not of its own set {i % n + 1} (an output kept from an earlier "
                                   "call)")
                bad = sum(1 for j, u in enumerate(values) if j % n == i % n and u != want)
                raise Rejected(f"nondeterministic: {bad} of {len(values[i % n::n])} runs of input set {i % n + 1} on "
                               f"shape {name} differ bitwise from its checked output (first: timed call {i + 1})")
            return
        for k, (want, bound) in enumerate(self._weighting(name, sets)[1]):
            for i in range(k, total, n):
                if not abs(values[i] - want) <= bound:
                    raise Rejected(f"timed call {i + 1} of {total} on shape {name} (input set {k + 1}): its output's "
                                   f"weighted sum {values[i]:.6g} is off the reference's {want:.6g} by more than "
                                   f"the tolerance allows ({bound:.3g})")

    # ---- timing honesty -------------------------------------------------------------------------------------------
    def honesty_checks(self, module: Any, per_shape: dict[str, dict[str, Any]], stream: Any) -> dict[str, Any]:
        """Checks of the time itself, per timed shape: calls on inputs never seen before cost what repeated ones do
        (no work kept from earlier calls); CUDA: all the work a call starts is on the stream it was given (the
        device is idle once that stream is), and a CUDA graph of the calls (where the family allows graphs) gives
        right outputs and about the eager time; then the physics gate. Metrics per shape; raises Rejected."""
        found: dict[str, Any] = {}
        for name, sets in self.timed.items():
            eager = per_shape[name]["p50"]
            m: dict[str, Any] = found.setdefault(name, {})
            t0 = time.perf_counter()
            m.update(self._novel_inputs(module, name, sets, per_shape[name]["p90"]))
            m["novel_s"] = round(time.perf_counter() - t0, 4)  # what each check costs (experiments/integrity)
            if self.task.device == "cuda":
                # A graph check catches work left on another stream by itself (capture refuses an unjoined fork; a
                # kernel that forks only outside capture replays slower than its eager time), so the burst of
                # back-to-back calls that looks for it runs only where the family allows no graphs (issue 50: cost).
                t0 = time.perf_counter()
                if self.task.cuda_graphs:
                    m["graph_us"] = self._graph(module, name, sets, eager, stream)
                    m["graph_s"] = round(time.perf_counter() - t0, 4)
                else:
                    m["offstream_s"] = self._offstream(module, name, sets)
            shape = sets[0].entry.shape
            why = self.gate.verdict(time_us=eager, min_bytes=int(self.task.min_bytes(shape) or 0),
                                    flops=int(self.task.flops(shape) or 0))
            if why:
                raise Rejected(f"faster than the device allows on shape {name}: {eager:.4g} us is {why}",
                               "implausible")
        return found

    def _novel_inputs(self, module: Any, name: str, sets: list[InputSet], seen_p90: float) -> dict[str, Any]:
        """Paired single calls: one on a timed set (inputs the candidate has seen many times) and one on a set it has
        not seen (other buffers, other contents), each with its inputs just read by the worker (both warm in cache:
        a first read from memory is not a cheat) and in alternating order. A candidate that returns work kept from
        earlier calls is fast only on the seen sets; an honest one takes about as long on both. Three calls in a row
        can still be slowed by the machine's load, so a first verdict is checked once more on sets made only then.
        Returns the ratios new / seen (novel_ratio), and what the check's cost is made of: its passes of timed calls
        (novel_rounds: 2 when the first looked slow), the calls timed again behind a longer spin because the host
        queued them after their spin had ended (novel_retimed, each time one was) and those still late after the
        last try (novel_late)."""
        pairs, late, retimed = self._novel_pairs(module, name, sets, self.novel[name])
        rounds = 1
        if self._novel_slow(pairs, seen_p90):
            self._novel_rounds += 1
            again = [self._input_set(sets[0].entry, self._seed(name, 30_000 + 100 * self._novel_rounds + k),
                                     with_ref=False) for k in range(NOVEL_SETS)]
            pairs, late_again, retimed_again = self._novel_pairs(module, name, sets, again)
            rounds, late, retimed = 2, late + late_again, retimed + retimed_again
            if self._novel_slow(pairs, seen_p90):
                slack = NOVEL_SLACK_US[self.task.device]
                t_new, t_seen = min(pairs, key=lambda p: p[0] / max(p[1], 1e-9))
                raise Rejected(f"calls on inputs it had not seen took {t_new:.4g} us against {t_seen:.4g} us on the "
                               f"timed inputs it had seen, call after call on shape {name} (over {NOVEL_FACTOR:g}x + "
                               f"{slack:g} us in each of {len(pairs)} pairs, twice): work kept from earlier calls",
                               "implausible")
        return {"novel_ratio": [round(t_new / max(t_seen, 1e-9), 3) for t_new, t_seen in pairs],
                "novel_rounds": rounds, "novel_late": late, "novel_retimed": retimed}

    def _novel_slow(self, pairs: list[tuple[float, float]], seen_p90: float) -> bool:
        """Every call on new inputs slower than both the seen calls and the timing loop's p90 allow."""
        slack = NOVEL_SLACK_US[self.task.device]
        bar = max(max(t_seen for _, t_seen in pairs), seen_p90)
        return all(t_new > NOVEL_FACTOR * bar + slack for t_new, _ in pairs)

    def _novel_pairs(self, module: Any, name: str, sets: list[InputSet],
                     novel: list[InputSet]) -> tuple[list[tuple[float, float]], int, int]:
        """(new, seen) microseconds per pair, the calls timed in one pass (one sync); how many of them stayed late
        (`host_late`) and how many re-timings a late host caused (`retimed`). Only this check hands the new
        sets to a candidate: it verifies them, and restores them for the next candidate."""
        from evoengineer.evaluators.timing import time_callable

        outs = [self._output(s) for s in novel]
        seen_out = self.task.new_output(sets[0].inputs)
        # call i of the pass: (input set, output, pair, is new); alternating order within pairs, so nothing that
        # favours the first or second call of a pair decides
        calls = []
        for k, (s, out) in enumerate(zip(novel, outs)):
            new, seen = (s, out.tensor, k, True), (sets[k % len(sets)], seen_out, k, False)
            calls += [new, seen] if k % 2 else [seen, new]

        def before(i: int) -> None:
            s, out, _, _ = calls[i]
            for t in s.inputs.values():  # the worker reads the inputs: both sides of a pair start warm
                if isinstance(t, self.torch.Tensor) and t.numel():
                    t.detach().reshape(-1).view(self.torch.uint8).sum()  # bytes: any dtype
            if self.inout:
                self._reset_inout(out, s)

        def call(i: int) -> None:
            s, out, _, _ = calls[i]
            self.task.launch(module, s.inputs, out)

        bad, intact = None, False
        try:
            self.task.launch(module, sets[0].inputs, seen_out)  # back to steady state after the timing loop's checks
            timed = time_callable(call, device=self.task.device, warmup=0, repeats=len(calls),
                                  flush_l2=bool(self.settings["l2_flush"]), before=before, numbered=True,
                                  keep_samples=True)
            samples = timed["samples"]
            # the new outputs' guard bands and the new inputs, read back together (the details only when off)
            intact = not any_true([f for out in outs for f in out.flags()] +
                                  [f for s in novel for f in s.inputs.flags()])
            if not intact:
                bad = next((b for b in (out.damage() for out in outs) if b), None)
        finally:
            if not intact:  # also after a candidate's exception: the new sets go back to their bytes
                bad = verify_and_restore_all([s.inputs for s in novel]) or bad
        if bad:
            raise Rejected(f"{bad} on new inputs of shape {name}")
        pairs = {}
        for (_, _, k, is_new), t in zip(calls, samples):
            pairs.setdefault(k, [0.0, 0.0])[0 if is_new else 1] = t
        return ([(p[0], p[1]) for _, p in sorted(pairs.items())], int(timed.get("host_late", 0)),
                int(timed.get("retimed", 0)))

    def _offstream(self, module: Any, name: str, sets: list[InputSet]) -> float:
        """Back-to-back calls, then: how long the device stayed busy after the candidate's stream had finished."""
        torch = self.torch
        out = self.task.new_output(sets[0].inputs)
        gaps = []
        for _ in range(2):  # a first excess is measured again: the host may have been preempted
            torch.cuda.synchronize()
            ev = torch.cuda.Event()
            t0 = time.perf_counter()
            for k in range(OFFSTREAM_CALLS):
                self.task.launch(module, sets[k % len(sets)].inputs, out)
            ev.record()
            ev.synchronize()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            gap = t2 - t1
            gaps.append(gap)
            if gap <= max(OFFSTREAM_SLACK_S, OFFSTREAM_SHARE * (t1 - t0)):
                return round(gap, 6)
        raise Rejected(f"work left running on another stream: the device was busy {min(gaps) * 1e6:.0f} us after "
                       f"the candidate's stream had finished {OFFSTREAM_CALLS} calls on shape {name}", "implausible")

    def _graph(self, module: Any, name: str, sets: list[InputSet], eager_us: float, stream: Any) -> float:
        """The calls captured in a CUDA graph: replayed, the output must be right, and the time per call must not
        exceed the eager time by more than launch effects explain."""
        torch = self.torch
        n = len(sets)
        # one output for every call; with inouts one per call (each call updates its own copy once, reset before a
        # replay outside the timed region)
        outs = ([self._output(sets[k % n]) for k in range(GRAPH_CALLS)] if self.inout else
                [self._output(sets[0])] * GRAPH_CALLS)
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            g.capture_begin()
            try:
                for k in range(GRAPH_CALLS):
                    self.task.launch(module, sets[k % n].inputs, outs[k].tensor)
            finally:
                g.capture_end()
        except Exception as exc:  # noqa: BLE001 - any failure inside capture is the candidate's
            text = str(exc).splitlines()[0][:200]
            if "unjoined" in text:  # work forked to a stream of its own and not joined back
                raise Rejected(f"work left running on another stream (inside a CUDA graph capture on shape {name}: "
                               f"{text})", "implausible") from None
            raise Rejected(f"does not run inside a CUDA graph on shape {name}: {text}") from None
        checked = range(GRAPH_CALLS) if self.inout else [GRAPH_CALLS - 1]  # the calls whose output the replay leaves
        for k in checked:
            self._poison(outs[k].tensor, sets[k % n])
        g.replay()
        torch.cuda.synchronize()
        where = f"shape {name}, replay of a CUDA graph of {GRAPH_CALLS} calls"
        for k in checked:
            self._verify_memory(sets[k % n], outs[k], where)
            self._against_reference(outs[k].tensor, self._ref(sets[k % n]), where)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(GRAPH_REPLAYS)]
        for a, b in ev:
            for k in (checked if self.inout else ()):
                self._reset_inout(outs[k].tensor, sets[k % n])
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        per_call = sorted(a.elapsed_time(b) * 1e3 / GRAPH_CALLS for a, b in ev)[GRAPH_REPLAYS // 2]
        del g
        if per_call > GRAPH_FACTOR * eager_us + GRAPH_SLACK_US:
            raise Rejected(f"inside a CUDA graph {per_call:.4g} us a call against {eager_us:.4g} us eagerly on shape "
                           f"{name}: the eager time misses work", "implausible")
        return round(per_call, 3)

    # ---- one candidate --------------------------------------------------------------------------------------------
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
        """Check, then time, one loaded candidate; then what it left behind (state restored, sentinel timed). The
        reply the parent records; `replace` in it asks for a fresh worker (state that cannot be undone, or a
        sentinel that drifted)."""
        t_start = time.perf_counter()
        first = self.guard is None
        self._start_guards()
        # where the worker's time goes, per phase (seconds): checks, timed runs (with their own checks), the
        # honesty checks, the state check and the sentinel (and, for a worker's first candidate, its start)
        phases: dict[str, float] = {}
        metrics: dict[str, Any] = {"worker_s": phases}
        if first:
            phases["start"] = round(time.perf_counter() - t_start, 4)
        reply: dict[str, Any]
        ctx, stream = self._stream()
        t0 = time.perf_counter()
        try:
            with ctx:
                reply = self._measure(module, candidate_hash, metrics, phases, t0, stream)
        except Rejected as r:
            reply = {"status": r.status, "reason": r.reason, "metrics": metrics}
        except Exception as exc:  # the candidate raised (a status, a CUDA error): recorded, then its leftovers
            reply = runtime_error(exc)
            reply["metrics"] = metrics
            if reply["fatal"]:  # the CUDA context is gone with it: nothing more to check in this process
                return reply
        self._restore_inputs()
        t3 = time.perf_counter()
        changes = self.guard.check((stream.cuda_stream,) if stream is not None else ())
        phases["state"] = round(time.perf_counter() - t3, 4)
        if changes:
            reply["status"], reply["reason"] = state_changed(reply["status"], reply["reason"], _changed(changes))
            metrics["state_changes"] = [str(c) for c in changes]
            if any(not c.restored for c in changes):
                reply["replace"] = "state that cannot be undone: " + "; ".join(str(c) for c in changes)
        t4 = time.perf_counter()
        drift, now = self.sentinel.check()
        phases["sentinel"] = round(time.perf_counter() - t4, 4)
        metrics["sentinel_us"] = {k: round(v, 2) for k, v in now.items()}
        if drift:
            reply["sentinel_drift"] = drift
            reply.setdefault("replace", drift)
        return reply

    def _measure(self, module: Any, candidate_hash: str, metrics: dict[str, Any], phases: dict[str, float],
                 t0: float, stream: Any) -> dict[str, Any]:
        max_abs, max_rel, extra = self.check(module, candidate_hash)
        metrics.update(max_abs_err=max_abs, max_rel_err=max_rel, **extra)
        t1 = time.perf_counter()
        phases["check"] = round(t1 - t0, 4)
        per_shape = self.timed_runs(module, candidate_hash)
        t2 = time.perf_counter()
        phases["timing"] = round(t2 - t1, 4)
        honesty = self.honesty_checks(module, per_shape, stream)
        phases["honesty"] = round(time.perf_counter() - t2, 4)
        p = {q: sum(t[q] for t in per_shape.values()) for q in ("p50", "p90", "p99")}
        metrics.update(time_us=p["p50"], time_p90_us=p["p90"], time_p99_us=p["p99"],
                       timing=next(iter(per_shape.values()))["cache"], repeats=int(self.settings["repeats"]),
                       check_runs=int(self.settings["check_runs"]),
                       shapes={n: {"p50_us": t["p50"], "p90_us": t["p90"], "p99_us": t["p99"],
                                   "checked_calls": t["checked_calls"], "input_sets": t["input_sets"],
                                   "fingerprinted_calls": t["fingerprinted_calls"],
                                   # timed calls the host queued too late to hide its launch delay (CUDA)
                                   **({"host_late": t["host_late"]} if "host_late" in t else {}),
                                   **honesty.get(n, {})}
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

    def hello(self, baselines: bool = True) -> dict[str, Any]:
        """What the worker measures with (after the guards started): sentinel times, state, device peaks; and the
        family's baselines that miss the reference (`baselines_off`: one line each)."""
        off = self.check_baselines() if baselines else []
        self._start_guards(baselines=baselines)
        return {"ok": True, **self.started, "baselines_off": off}

    def check_baselines(self) -> list[str]:
        """Each of the family's baseline callables once per shape against the reference, with the tolerance the
        candidates are held to: one line per shape it misses (an input distribution that even the baseline cannot
        meet shows here, not only as candidates rejected one after another)."""
        torch = self.torch
        found: list[str] = []
        outs = [""] if self.single else [t.name for t in self.task.signature.outputs]
        for bname, fn in self.task.baselines().items():
            for e in self.task.entries:
                s = next((x for x in self.sets if x.entry is e), None) or (self.timed.get(e.name) or [None])[0]
                if s is None:
                    s = self._input_set(e, self._seed(e.name, 0, "baseline-check"), with_ref=False)
                try:
                    with torch.no_grad():
                        got = fn(s.inputs)
                    self._sync()
                    own = self.task.baseline_reference(bname, s.inputs)
                    refs = written.parts(self._ref(s) if own is None else own)
                    if isinstance(got, torch.Tensor):
                        pairs = {outs[0]: got}
                    elif isinstance(got, (tuple, list)):
                        pairs = dict(zip(self.written if len(got) == len(self.written) else outs, got))
                    elif isinstance(got, dict):
                        pairs = {k: v for k, v in got.items() if k in refs}
                    else:
                        continue  # a baseline that returns nothing to compare (e.g. it writes in place)
                    for k, v in pairs.items():
                        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(refs[k].shape):
                            continue
                        bad = mismatch(v, refs[k], *self.task.tolerance_of(k))
                        if bad:
                            found.append(f"baseline {bname} misses the reference on shape {e.name}"
                                         f"{' (' + k + ')' if k else ''}: {bad}; candidates are held to the same "
                                         "tolerance (check make_inputs and reference)")
                            break
                except Exception as exc:  # noqa: BLE001 - a baseline that fails here is reported, not fatal
                    found.append(f"baseline {bname} failed on shape {e.name}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
                finally:
                    s.inputs.verify_and_restore()
        return found

    # ---- re-timing of the finalists ---------------------------------------------------------------------------
    def retime(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time the finalists together on fresh inputs: `rounds` rounds, each timing every candidate for its
        `repeats` calls (a number, or one per hash) and, in the rounds `baseline_rounds` names (default: every
        one), the first baseline for `baseline_calls`, the order rotated by one every round (round-robin
        interleaving, so drift of the machine hits every candidate alike). With `budget_s`, no round starts once
        the time spent here and a round like the last would exceed it (two rounds at the least). Each candidate's
        output on the fresh inputs is checked against the reference first. Returns per hash the samples per round
        (or why it was dropped), the baseline's per-round p50s, the order the timings ran in and the rounds done."""
        from evoengineer.compiler.steps import load_module
        from evoengineer.evaluators.retiming import MIN_ROUNDS

        t_start = time.perf_counter()
        session, rounds = str(msg["session"]), int(msg["rounds"])
        repeats = msg["repeats"]
        calls_of = (lambda h: int(repeats[h])) if isinstance(repeats, dict) else (lambda h: int(repeats))
        base_calls = int(msg.get("baseline_calls") or max([calls_of(c["hash"]) for c in msg["candidates"]] or [1]))
        base_rounds = set(msg.get("baseline_rounds", range(rounds)))
        budget = msg.get("budget_s")
        self._start_guards(baselines=False)
        warmup = int(msg.get("warmup") or max(1, int(self.settings["warmup"]) // 4))
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
                    self._poison(out.tensor, s)
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
            # (inouts are not reset between a baseline kernel's re-timed calls: each call still does the same work)
        outs = {h: {n: self.task.new_output(s.inputs) for n, s in sets.items()} for h in loaded}
        st = self.settings
        samples: dict[str, list[list[float]]] = {h: [] for h in loaded}
        baseline: list[float] = []
        order: list[str] = []
        from evoengineer.evaluators.retiming import median, round_robin

        streams = {h: self._stream() for h in loaded}
        done, t_round = 0, 0.0
        for r, turn in enumerate(round_robin(list(loaded), rounds)):
            spent = time.perf_counter() - t_start
            if budget is not None and done >= MIN_ROUNDS and spent + t_round > float(budget):
                break  # the budget is spent: the rounds done rank the finalists
            t0 = time.perf_counter()
            for h in turn:
                if h in dropped:
                    continue
                module = loaded[h]
                per_round = []
                ctx, stream = streams[h]
                with ctx:
                    for n, s in sets.items():  # a candidate's time is the sum over the timed shapes, as in the search
                        t = self._time_n(lambda module=module, s=s, out=outs[h][n]:
                                         self.task.launch(module, s.inputs, out), warmup, calls_of(h),
                                         before=self._resetter(outs[h][n], [s]))
                        per_round.append(t)
                changes = self.guard.check((stream.cuda_stream,) if stream is not None else ())
                if changes:  # restored; the finalist cannot be an elite
                    dropped[h] = {"status": "state_changed", "reason": _changed(changes)}
                    samples.pop(h, None)
                    continue
                samples[h].append([sum(x) for x in zip(*per_round)])
                order.append(h)
            if base_fn is not None and r in base_rounds:
                baseline.append(median(self._time_n(base_fn[1], warmup, base_calls)))
                order.append(f"baseline:{base_fn[0]}")
            done, t_round = done + 1, time.perf_counter() - t0
        if base_fn is not None and base_rounds and len(baseline) < min(2, len(base_rounds)) and done:
            # stopped before the baseline's last round: a second timing of it, or there is no noise to tell
            baseline.append(median(self._time_n(base_fn[1], warmup, base_calls)))
            order.append(f"baseline:{base_fn[0]}")
        self._restore_inputs()
        for s in sets.values():
            s.inputs.verify_and_restore()
        return {"ok": True, "samples": samples, "dropped": dropped, "order": order, "rounds_done": done,
                "seconds": round(time.perf_counter() - t_start, 3),
                "baseline": {"name": base_fn[0] if base_fn else None, "p50_per_round": baseline},
                "cache": "L2 flushed before every call" if (self.task.device == "cuda" and st["l2_flush"])
                else ("L2 warm (same inputs every call)" if self.task.device == "cuda" else "warm (CPU)")}

    def _time_n(self, fn, warmup: int, repeats: int, before: Any = None) -> list[float]:
        """Per-call microseconds of `repeats` calls after `warmup` (the search's timing method and cache setting);
        `before(i)` runs ahead of call i, untimed."""
        from evoengineer.evaluators.timing import time_callable

        return time_callable(fn, device=self.task.device, warmup=warmup, repeats=repeats,
                             flush_l2=bool(self.settings["l2_flush"]), before=before, keep_samples=True)["samples"]


def _changed(changes: list[Any]) -> str:
    return "changed the measuring process's state: " + "; ".join(str(c) for c in changes)


def _alternate(call, sets: list[InputSet]):
    """A function of the call number i that runs `call(sets[i % len(sets)])` (the timing hooks number calls the
    same way, warm-up included; a call timed again keeps its number and its set)."""
    return lambda i: call(sets[i % len(sets)])


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    # a parent killed with -9 (e.g. a Dask worker mid-candidate): stdin's end-of-file tells an idle worker, this
    # watch one busy in a kernel, which would otherwise hold the device for nobody
    exit_with_parent()
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # kernel printf and Python prints go to stderr
    session: Session | None = None
    profile = _Profile.from_env()

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["cmd"] == "init":
                session = Session(msg)
                reply({"ok": True, "start_marks": session.start_marks})
            elif msg["cmd"] == "hello":
                assert session is not None, "hello before init"
                reply(session.hello(bool(msg.get("baselines", True))))
            elif msg["cmd"] == "baselines":
                assert session is not None, "baselines before init"
                session.add_baselines(msg["baselines"])
                reply({"ok": True})
            elif msg["cmd"] == "eval":
                assert session is not None, "eval before init"
                with profile:
                    out = session.evaluate(msg)
                reply(out)
            elif msg["cmd"] == "retime":
                assert session is not None, "retime before init"
                reply(session.retime(msg))
            elif msg["cmd"] == "quit":
                break
        except Exception as exc:
            r = runtime_error(exc)
            reply(r)
            if r["fatal"]:  # a sticky CUDA error poisons the context: let the parent start a fresh worker
                break
    profile.write()


class _Profile:
    """With EVOENGINEER_WORKER_PROFILE=DIR, where a worker's time on candidates goes (cProfile around each "eval";
    the top functions by cumulative time, as text, in DIR/worker-PID.txt when the worker ends). A diagnostic."""

    def __init__(self, out_dir: str | None):
        import cProfile

        self.out_dir = out_dir
        self.prof = cProfile.Profile() if out_dir else None
        self.evals = 0

    @classmethod
    def from_env(cls) -> "_Profile":
        return cls(os.environ.get("EVOENGINEER_WORKER_PROFILE") or None)

    def __enter__(self) -> None:
        if self.prof is not None:
            self.evals += 1
            self.prof.enable()

    def __exit__(self, *exc: Any) -> None:
        if self.prof is not None:
            self.prof.disable()

    def write(self) -> None:
        if self.prof is None or not self.evals:
            return
        import io
        import pstats

        buf = io.StringIO()
        buf.write(f"{self.evals} candidates\n")
        pstats.Stats(self.prof, stream=buf).sort_stats("cumulative").print_stats(70)
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.out_dir) / f"worker-{os.getpid()}.txt").write_text(buf.getvalue())


def runtime_error(exc: BaseException) -> dict[str, Any]:
    """The reply for an exception out of a candidate or a command; `fatal` when the CUDA context is lost."""
    text = f"{type(exc).__name__}: {exc}"
    return {"status": "runtime_error", "reason": text.strip()[:600], "metrics": {},
            "fatal": any(m in text for m in CUDA_FATAL), "trace": traceback.format_exc()[-2000:]}


if __name__ == "__main__":
    main()
