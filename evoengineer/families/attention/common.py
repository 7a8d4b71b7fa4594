"""What the attention families (sdpa, decode) share: the signature constants and their checks, FP8 quantization,
the chunked float64 attention the references use, and the FP8 checks (`AttentionTask`). Not a family itself: each
family folder imports this one, and no family imports another.

FP8 attention also rounds P to e4m3 (3 mantissa bits) before P V. Against the float64 reference on the dequantized
inputs that rounding alone moves an output by up to ~0.08 on short causal rows (a CPU model of the kernel's
arithmetic; a fixed atol of 0.06 turned away 2 right kernels in 115 of a search), so the check is the bound the
rounding cannot exceed, row by row (`fp8_p_rounding_bound`): an e4m3 P is off by at most 2^-4 of itself, or 2^-10
below e4m3's normal range, so |out - ref| <= sum_j max(p_j / 16, 2^-10) |v_j| / sum_j p_j (p relative to the row's
final maximum: the kernel's running maximum is never above it), plus 2^-9 |ref| + 2e-3 for the output's rounding and
the fp32 / tensor-core sums; and an RMSE bound of 0.015 (FP8_ATTENTION_MAX_RMSE; the model gives <= 0.006). A
wrong key order or a lost tile breaks both. The elementwise tolerance (FP8_ATTENTION_TOLERANCE) is only the loose
first screen every output passes through (NaN, garbage).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family

#: Largest finite float8_e4m3fn value: a head's absolute maximum is mapped onto it.
FP8_MAX = 448.0
HEAD_DIMS = (64, 128)
OUT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
Q_DTYPES = {**OUT_DTYPES, "float8_e4m3": torch.float8_e4m3fn}
KV_DTYPES = Q_DTYPES
#: FP8 attention (e4m3 Q, K, V and P) against float64 attention on the dequantized inputs: (atol, rtol), max RMSE
FP8_ATTENTION_TOLERANCE = (0.25, 0.0625)
FP8_ATTENTION_MAX_RMSE = 0.015

#: Score elements computed at once by the reference (256 MB in float64): (b, h) pairs are taken in chunks.
SCORE_CHUNK = 1 << 25


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[B, H, S, D]`` as float8_e4m3fn with per-head float32 scales ``[H]`` (amax over B, S, D / 448)."""
    xf = x.float()
    scale = (xf.abs().amax(dim=(0, 2, 3)) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    q = (xf / scale.view(1, -1, 1, 1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dtype: torch.dtype,
                       combine) -> torch.Tensor:
    """[B, H, Sq, D] in ``dtype``: ``combine(s, masked, v)`` over chunks of (b, h) pairs (to bound the score memory),
    where ``s`` are the scores q k^T / sqrt(D) with masked keys at -inf, ``masked`` the causal mask (top-left aligned:
    query i sees keys j <= i) or None, ``v`` the chunk's values."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = 1.0 / math.sqrt(D)
    qf, kf, vf = (t.reshape(B * H, -1, D) for t in (q, k, v))
    mask = None
    if causal:
        mask = torch.arange(Sk, device=q.device)[None, :] > torch.arange(Sq, device=q.device)[:, None]
    out = torch.empty(B * H, Sq, D, dtype=dtype, device=q.device)
    step = max(1, SCORE_CHUNK // max(1, Sq * Sk))
    for i in range(0, B * H, step):
        s = torch.matmul(qf[i:i + step].to(dtype), kf[i:i + step].to(dtype).transpose(1, 2)) * scale
        if mask is not None:
            s = s.masked_fill(mask, -math.inf)
        out[i:i + step] = combine(s, mask, vf[i:i + step].to(dtype))
    return out.view(B, H, Sq, D)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """Explicit softmax(q k^T / sqrt(D)) v in ``dtype``."""
    return _chunked_attention(q, k, v, causal, dtype, lambda s, _, vc: torch.matmul(torch.softmax(s, dim=-1), vc))


def fp8_p_rounding_bound(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per output element, float64: how far rounding P to e4m3 can move FP8 attention's output from the exact one
    on the dequantized inputs, sum_j max(p_j / 16, 2^-10) |v_j| / sum_j p_j (the module docstring derives it)."""
    def bound(s, masked, vc):
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
        w = torch.clamp(p / 16, min=2.0 ** -10)
        if masked is not None:
            w = w.masked_fill(masked, 0.0)
        return torch.matmul(w, vc.abs()) / p.sum(dim=-1, keepdim=True)

    q, k, v = (dequantized(inputs, n, torch.float64) for n in ("q", "k", "v"))
    return _chunked_attention(q, k, v, bool(inputs["causal"]), torch.float64, bound)


def dequantized(inputs: Mapping[str, torch.Tensor], name: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``inputs[name]`` (q, k or v) as real values in ``dtype``: stored value times its head's scale (q without a
    ``q_scale``: as stored)."""
    t, scale = inputs[name], inputs.get(f"{name}_scale")
    if scale is None:
        return t.to(dtype)
    return t.to(dtype) * scale.to(dtype).view(1, -1, 1, 1)


def fp8_against_fp16(got: torch.Tensor, ref: torch.Tensor, fp16: torch.Tensor, bound: float, atol: float,
                     metrics: dict[str, float]) -> tuple[bool, str, dict[str, float]]:
    """An FP8-KV output (`got`, float64) against fp16 attention on the unquantized K/V: within `bound` max abs error,
    unless the e4m3 rounding of these inputs alone (exact attention on the dequantized K/V, `ref`) already breaks
    it; then the kernel may add no more than the dtype tolerance to that (max abs p99 of exact e4m3 attention is
    ~0.07 at the mission shape). Adds the errors to `metrics`."""
    err = got - fp16
    max_abs = float(err.abs().max())
    floor = float((ref.to(got.device) - fp16).abs().max())
    metrics.update(fp8_vs_fp16_max_abs_err=max_abs, fp8_vs_fp16_rmse=float(err.pow(2).mean().sqrt()),
                   fp8_quantization_max_abs_err=floor)
    if not (max_abs <= bound or max_abs <= floor + atol):
        return False, (f"FP8 KV: max abs err {max_abs:.3e} against fp16 attention on the unquantized K/V > {bound:g} "
                       f"(quantization alone: {floor:.3e})"), metrics
    return True, "", metrics


class AttentionTask(Family):
    """What the attention tasks (sdpa, decode) share: signature constants HEAD_DIM (64, 128), Q_DTYPE, KV_DTYPE
    (Q_DTYPE or float8_e4m3; `fp8_needs_fp16_q`), OUT_DTYPE (FP8 Q only, `fp8_q`), the binding's signature text, a
    NaN-filled output."""

    fp8_needs_fp16_q = False
    #: FP8 attention: Q_DTYPE = KV_DTYPE = float8_e4m3 with OUT_DTYPE float16 / bfloat16
    fp8_q = False
    #: per family: the shape class, make_inputs(shape, seed, head_dim=, q_dtype=, kv_dtype=, device=) and the
    #: reference(inputs, dtype=) of its module
    shape_cls: Any = None
    inputs_fn: Any = None
    reference_fn: Any = None

    def setup(self):
        sig = self.constants
        where = self.where()
        if type(sig.get("HEAD_DIM")) is not int or sig["HEAD_DIM"] not in HEAD_DIMS:
            raise UserError(f"{where}.HEAD_DIM: the {self.name} task needs HEAD_DIM in {list(HEAD_DIMS)}")
        q_name, kv_name = sig.get("Q_DTYPE", "float16"), sig.get("KV_DTYPE", sig.get("Q_DTYPE", "float16"))
        q_names = list(Q_DTYPES) if self.fp8_q else list(OUT_DTYPES)
        if q_name not in q_names:
            raise UserError(f"{where}.Q_DTYPE: one of {', '.join(q_names)}")
        fp8_q = q_name == "float8_e4m3"
        if fp8_q and kv_name != q_name:
            raise UserError(f"{where}.KV_DTYPE: 'float8_e4m3' (FP8 attention: Q, K and V in e4m3)")
        fp8_ok = q_name == "float16" or not self.fp8_needs_fp16_q
        if not fp8_q and (kv_name not in (q_name, "float8_e4m3") or (kv_name == "float8_e4m3" and not fp8_ok)):
            with_q = " (with Q_DTYPE 'float16')" if self.fp8_needs_fp16_q else ""
            raise UserError(f"{where}.KV_DTYPE: {q_name!r} (= Q_DTYPE) or 'float8_e4m3'{with_q}")
        out_name = sig.get("OUT_DTYPE", "float16" if fp8_q else q_name)
        if (fp8_q and out_name not in OUT_DTYPES) or (not fp8_q and out_name != q_name):
            allowed = " or ".join(repr(n) for n in OUT_DTYPES) if fp8_q else f"{q_name!r} (= Q_DTYPE)"
            raise UserError(f"{where}.OUT_DTYPE: {allowed}")
        self.head_dim, self.q_dtype, self.kv_dtype = sig["HEAD_DIM"], Q_DTYPES[q_name], KV_DTYPES[kv_name]
        self.out_dtype = OUT_DTYPES[out_name]
        self.fp8 = self.kv_dtype == torch.float8_e4m3fn
        self.fp8_attention = fp8_q
        self.softmax_scale = 1.0 / math.sqrt(self.head_dim)

    @staticmethod
    def signature_text(sig) -> str:
        """What an attention binding checks, from a signature table (the space's, or one recorded in elite.json)."""
        q = sig.get("Q_DTYPE", "float16")
        text = f"HEAD_DIM={sig['HEAD_DIM']};Q_DTYPE={q};KV_DTYPE={sig.get('KV_DTYPE', q)}"
        if q == "float8_e4m3":  # FP8 attention: the output's dtype is a choice (other kernels write Q_DTYPE)
            text += f";OUT_DTYPE={sig.get('OUT_DTYPE', 'float16')}"
        return text

    def binding_signature(self):
        return self.signature_text(self.constants)

    def new_output(self, inputs):
        return torch.full_like(inputs["q"], float("nan"), dtype=self.out_dtype)

    def output_dtype(self):
        return self.out_dtype

    def tolerance(self):
        if self.fp8_attention:  # P rounded to e4m3 (the module docstring says how these were chosen)
            return FP8_ATTENTION_TOLERANCE
        return super().tolerance()

    def itemsizes(self) -> tuple[int, int]:
        """Bytes per element of q and of k/v."""
        return (torch.empty((), dtype=self.q_dtype).element_size(),
                torch.empty((), dtype=self.kv_dtype).element_size())

    def parse_shape(self, d):
        shape = self.shape_cls.from_dict(d)
        if shape.fp16_max_abs_err is not None and not self.fp8:
            raise ValueError(f"shape {shape.name!r}: fp16_max_abs_err is for FP8 KV only (KV_DTYPE is "
                             f"{self.space.signature.get('KV_DTYPE')!r})")
        return shape

    def make_inputs(self, shape, seed):
        return self.inputs_fn(shape, seed, head_dim=self.head_dim, q_dtype=self.q_dtype, kv_dtype=self.kv_dtype,
                              device=self.device)

    def reference(self, inputs):
        return self.reference_fn(inputs, dtype=torch.float64)

    def fp16_attention(self, inputs) -> torch.Tensor:
        """FP8 KV: the attention the kernel replaces, fp16 on the unquantized K/V."""
        raise NotImplementedError

    def baseline_reference(self, name, inputs):
        """FP8: the baselines run on the unquantized Q/K/V (``*_orig``, what an FP8 kernel replaces), so they are held
        to exact attention on those, not on the dequantized tensors (a length-1 sequence's output is its value row:
        e4m3 rounding alone would put the baseline ~0.1 off)."""
        if not any(f"{n}_orig" in inputs for n in ("q", "k", "v")):
            return None
        flat = {n: t for n, t in inputs.items() if n != "block_table"}  # the *_orig caches are contiguous
        for n in ("q", "k", "v"):
            if f"{n}_orig" in inputs:
                flat[n] = inputs[f"{n}_orig"]
                if f"{n}_scale" in flat:
                    flat[f"{n}_scale"] = torch.ones_like(flat[f"{n}_scale"])
        return self.reference_fn(flat, dtype=torch.float64)

    def _p_rounding_bound(self, inputs) -> torch.Tensor:
        """fp8_p_rounding_bound of these inputs, once per input set: the worker keeps a timed shape's inputs (and
        their reference) from candidate to candidate, so the bound is kept with them, by their q tensor."""
        cache = self.__dict__.setdefault("_p_bounds", {})  # id(q) -> (weak reference to q, bound): by identity
        q = inputs["q"]
        kept = cache.get(id(q))
        if kept is not None and kept[0]() is q:
            return kept[1]
        for key in [k for k, (ref, _) in cache.items() if ref() is None]:  # input sets gone since
            del cache[key]
        bound = fp8_p_rounding_bound(inputs).float()  # a tolerance: float32 halves what a kept input set holds
        cache[id(q)] = (weakref.ref(q), bound)
        return bound

    def extra_check(self, shape, inputs, out, ref):
        """RMSE against the reference; FP8 KV on shapes with ``fp16_max_abs_err``: max abs error and RMSE against
        fp16 attention on the unquantized K/V (`fp16_attention`), failing above the bound (`fp8_against_fp16`)."""
        got = out.to(torch.float64)
        metrics = {"rmse": float((got - ref.to(got.device)).pow(2).mean().sqrt())}
        if self.fp8_attention:
            if not metrics["rmse"] <= FP8_ATTENTION_MAX_RMSE:
                return False, (f"FP8 attention: RMSE {metrics['rmse']:.3e} against the float64 reference on the "
                               f"dequantized inputs > {FP8_ATTENTION_MAX_RMSE:g}"), metrics
            r = ref.to(got.device)
            allowed = self._p_rounding_bound(inputs).to(got.device) + 2.0 ** -9 * r.abs() + 2e-3
            excess = (got - r).abs() - allowed
            worst = float(excess.max())
            metrics["fp8_p_bound_margin"] = -worst
            if not worst <= 0:
                at = tuple(int(i) for i in torch.nonzero(excess == excess.max())[0].tolist())
                return False, (f"FP8 attention: error {float((got - r).abs()[at]):.3e} at {at} (b, h, row, col) "
                               f"exceeds what rounding P to e4m3 allows there ({float(allowed[at]):.3e})"), metrics
        if not self.fp8 or shape.fp16_max_abs_err is None:
            return True, "", metrics
        fp16 = self.fp16_attention(inputs).to(device=got.device, dtype=torch.float64)
        return fp8_against_fp16(got, ref, fp16, shape.fp16_max_abs_err, self.tolerance()[0], metrics)
