"""The SDPA family's op adapter (torch only: `export` copies it into the package):
``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
enable_gqa=False, *, q_scale=None, k_scale=None, v_scale=None)`` as torch's (k_scale/v_scale: FP8 K/V; q_scale too
for FP8 attention, whose output is the kernel's OUT_DTYPE), differentiated through the reference."""

import math
from typing import Any

import torch
import torch.nn.functional as F

try:  # in an exported package, beside the runtime
    from .runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
except ImportError:
    from evoengineer.ops.runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
try:
    from .attention_reference import sdpa_reference_backward
except ImportError:
    from evoengineer.families.attention.attention_reference import sdpa_reference_backward



class SdpaOp(OpAdapter):
    """Attention forward on the kernel (signature HEAD_DIM, Q_DTYPE, KV_DTYPE)."""

    function_name = "scaled_dot_product_attention"

    # ---- sdpa -------------------------------------------------------------------------------------------------------
    def register(self, name: str) -> tuple[Any, Any]:
        module = self.kop.module

        out_dtype = self.out_dtype()

        # k_scale is the scores' per-head factor: FP8 attention hands over q_scale * k_scale (the backward's
        # gradients with respect to the stored q and k are the same either way)
        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               is_causal: bool, scale: float) -> torch.Tensor:
            out = torch.empty_like(q, dtype=out_dtype)
            rc = module.forward(q, k, v, k_scale, v_scale, out, is_causal, scale)
            if rc != 0:
                raise RuntimeError(f"SDPA kernel returned status {rc}")
            return out

        @op.register_fake
        def _(q, k, v, k_scale, v_scale, is_causal, scale):
            return torch.empty_like(q, dtype=out_dtype)

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, is_causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            gq, gk, gv = sdpa_reference_backward(grad, q, k, v, k_scale, v_scale, is_causal, scale)
            return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)

        @backward_op.register_fake
        def _(grad, q, k, v, k_scale, v_scale, is_causal, scale):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def setup_context(ctx, inputs, output):
            q, k, v, k_scale, v_scale, is_causal, scale = inputs
            ctx.save_for_backward(q, k, v, k_scale, v_scale)
            ctx.is_causal, ctx.scale = is_causal, scale

        def backward(ctx, grad):
            q, k, v, k_scale, v_scale = ctx.saved_tensors
            gq, gk, gv = backward_op(grad.contiguous(), q, k, v, k_scale, v_scale, ctx.is_causal, ctx.scale)
            return gq, gk, gv, None, None, None, None

        op.register_autograd(backward, setup_context=setup_context)
        return op, backward_op

    def out_dtype(self) -> torch.dtype:
        """The dtype the kernel writes: OUT_DTYPE (FP8 attention), else Q_DTYPE."""
        sig = self.kop.signature
        q = sig.get("Q_DTYPE", "float16")
        return _DTYPES[sig.get("OUT_DTYPE", "float16" if q == "float8_e4m3" else q)]

    def sdpa_misfit(self, query, key, value, attn_mask, dropout_p, enable_gqa, k_scale,
                    v_scale, q_scale=None) -> tuple[str, type[Exception]] | None:
        sig = self.kop.signature
        head_dim = int(sig["HEAD_DIM"])
        q_dt = _DTYPES[sig.get("Q_DTYPE", "float16")]
        kv_dt = _DTYPES[sig.get("KV_DTYPE", sig.get("Q_DTYPE", "float16"))]
        named = {"query": query, "key": key, "value": value}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
            bad = self.kop.check_device(n, t, query.device)
            if bad:
                return bad, ValueError
            if t.dim() != 4:
                return f"{n}: expected 4 dimensions [B, H, S, D], got {t.dim()} (shape {tuple(t.shape)})", ValueError
        if attn_mask is not None:
            return "attn_mask: this kernel takes no mask (is_causal only)", ValueError
        if dropout_p:
            return f"dropout_p: {dropout_p}, this kernel has no dropout", ValueError
        if query.dtype != q_dt:
            return (f"query: dtype {_dtype_name(query.dtype)}, but this kernel was compiled for "
                    f"{_dtype_name(q_dt)}"), TypeError
        for n in ("key", "value"):
            if named[n].dtype != kv_dt:
                return (f"{n}: dtype {_dtype_name(named[n].dtype)}, but this kernel was compiled for "
                        f"{_dtype_name(kv_dt)}"), TypeError
        if query.shape[3] != head_dim:
            return (f"query: head dim {query.shape[3]} (size 3), but this kernel was compiled for head dim "
                    f"{head_dim}"), ValueError
        B, H, _, D = query.shape
        if tuple(key.shape[:2]) != (B, H) or key.shape[3] != D:
            what = " (grouped-query attention is not in this kernel)" if enable_gqa or key.shape[1] != H else ""
            return f"key: shape {tuple(key.shape)}, expected [{B}, {H}, Sk, {D}] (from query){what}", ValueError
        if value.shape != key.shape:
            return f"value: shape {tuple(value.shape)}, expected the shape of key {tuple(key.shape)}", ValueError
        for n, s in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (not isinstance(s, torch.Tensor) or tuple(s.shape) != (H,)
                                  or s.dtype != torch.float32):
                return f"{n}: expected a float32 tensor [H] = [{H}]", ValueError
            if s is not None and s.device != query.device:
                return f"{n}: on {s.device}, but query is on {query.device}", ValueError
        if kv_dt != torch.float8_e4m3fn and (k_scale is not None or v_scale is not None):
            return "k_scale/v_scale: only for a kernel compiled for float8 K/V", ValueError
        if q_dt != torch.float8_e4m3fn and q_scale is not None:
            return "q_scale: only for a kernel compiled for float8 Q (FP8 attention)", ValueError
        return None

    def scaled_dot_product_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                     *, q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """torch.nn.functional.scaled_dot_product_attention on this kernel (no mask, no dropout; causal is
        top-left aligned). FP8 K/V kernels take per-head float32 `k_scale`/`v_scale` (real = stored x scale), FP8
        attention kernels (float8 Q, K, V) `q_scale` too and return their OUT_DTYPE (float16 or bfloat16)."""
        if (attn_mask is None and not dropout_p and q_scale is None and k_scale is None and v_scale is None
                and self.kop.eager(query, key, value)):
            def prepare():
                ones = self.unit_scales(query.shape[1], query.device)
                out = torch.empty_like(query, dtype=self.out_dtype())
                return out, [query, key, value, ones, ones, out, bool(is_causal),
                             1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)]

            out = self.direct(prepare)  # refused: the checks below say why
            if out is not None:
                return out
        misfit = self.sdpa_misfit(query, key, value, attn_mask, dropout_p, enable_gqa, k_scale, v_scale, q_scale)
        if misfit is not None:
            self.kop.outside(*misfit)  # raises unless the op falls back on the reference
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        if misfit is not None:
            dt = query.dtype if query.dtype in (torch.float16, torch.bfloat16, torch.float32) else self.out_dtype()

            def real(t, s):  # the real values (stored x per-head scale) in dt
                return t.to(dt) if s is None else (t.float() * s.view(1, -1, 1, 1)).to(dt)

            gqa = {"enable_gqa": True} if enable_gqa else {}
            return F.scaled_dot_product_attention(real(query, q_scale), real(key, k_scale), real(value, v_scale),
                                                  attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                                  scale=scale, **gqa)
        ones = torch.ones(query.shape[1], dtype=torch.float32, device=query.device)  # traced by torch.compile: no cache
        ks = ones if k_scale is None else k_scale.contiguous()
        if q_scale is not None:  # the kernel takes the scores' per-head factor q_scale * k_scale
            ks = ks * q_scale
        vs = ones if v_scale is None else v_scale.contiguous()
        return self.kop.op(query.contiguous(), key.contiguous(), value.contiguous(), ks, vs, bool(is_causal), scale)

    function = scaled_dot_product_attention

    def call_features(self, args, kwargs):
        q, k = call_arg(args, kwargs, 0, "query"), call_arg(args, kwargs, 1, "key")
        causal = bool(call_arg(args, kwargs, 5, "is_causal"))
        return {"B": int(q.shape[0]), "H": int(q.shape[1]), "Sq": int(q.shape[2]), "Sk": int(k.shape[2])}, (causal,)

    def spec_features(self, spec):
        return {k: spec[k] for k in ("B", "H", "Sq", "Sk")}, (bool(spec.get("causal", False)),)

