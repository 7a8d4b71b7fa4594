"""The decode family's op adapter (torch only: `export` copies it, with the attention reference, into the package):
``decode_attention(query, key_cache, value_cache, seq_lens, *, scale=None, k_scale=None, v_scale=None)``: query
``[B, Hq, Sq <= 16, D]`` against a KV cache ``[B, Hkv, Sk, D]`` (Hq a multiple of Hkv: grouped-query attention),
sequence b seeing its first ``seq_lens[b]`` keys; differentiated through the reference."""

import math
from typing import Any

import torch

try:  # in an exported package, beside the runtime
    from .runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
    from .attention_reference import _attention_backward
except ImportError:
    from evoengineer.ops.runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
    from evoengineer.families.sdpa.attention_reference import _attention_backward



def _decode_operands(q, k, v, k_scale, v_scale, seq_lens):
    """float32 dequantized K/V expanded to the query heads, and the mask of the keys past each sequence's length
    (clamped to [1, Sk], as the kernels do)."""
    G = q.shape[1] // k.shape[1]
    kd = (k.float() * k_scale.float().view(1, -1, 1, 1)).repeat_interleave(G, dim=1)
    vd = (v.float() * v_scale.float().view(1, -1, 1, 1)).repeat_interleave(G, dim=1)
    lens = seq_lens.long().clamp(1, k.shape[2])
    masked = torch.arange(k.shape[2], device=q.device)[None, :] >= lens[:, None]
    return kd, vd, masked[:, None, None, :]


def decode_reference(q, k, v, k_scale, v_scale, seq_lens, scale: float) -> torch.Tensor:
    """Decode attention in float32 (keys past a sequence's length left out; masked values zeroed, so that whatever
    a cache holds there never reaches the output), in q's dtype."""
    kd, vd, masked = _decode_operands(q, k, v, k_scale, v_scale, seq_lens)
    s = torch.matmul(q.float(), kd.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1)
    return torch.matmul(p, vd.masked_fill(masked.transpose(-1, -2), 0.0)).to(q.dtype)


def decode_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of decode attention; K/V gradients summed over each group's query heads, with respect to the
    stored values (zero past each sequence's length)."""
    kd, vd, masked = _decode_operands(q, k, v, k_scale, v_scale, seq_lens)
    vd = vd.masked_fill(masked.transpose(-1, -2), 0.0)
    kd = kd.masked_fill(masked.transpose(-1, -2), 0.0)
    dq, dk, dv = _attention_backward(q.float(), kd, vd, grad.float(), masked, scale)
    B, Hkv, Sk, D = k.shape
    dk = dk.view(B, Hkv, -1, Sk, D).sum(2) * k_scale.float().view(1, -1, 1, 1)
    dv = dv.view(B, Hkv, -1, Sk, D).sum(2) * v_scale.float().view(1, -1, 1, 1)
    return dq, dk, dv



class DecodeOp(OpAdapter):
    """Decode attention on the kernel (signature HEAD_DIM, Q_DTYPE, KV_DTYPE)."""

    function_name = "decode_attention"

    # ---- decode -----------------------------------------------------------------------------------------------------
    def register(self, name: str) -> tuple[Any, Any]:
        module = self.kop.module

        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
            out = torch.empty_like(q)
            rc = module.forward(q, k, v, k_scale, v_scale, seq_lens, out, scale)
            if rc != 0:
                raise RuntimeError(f"decode kernel returned status {rc}")
            return out

        @op.register_fake
        def _(q, k, v, k_scale, v_scale, seq_lens, scale):
            return torch.empty_like(q)

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, seq_lens: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            gq, gk, gv = decode_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens, scale)
            return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)

        @backward_op.register_fake
        def _(grad, q, k, v, k_scale, v_scale, seq_lens, scale):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def setup_context(ctx, inputs, output):
            q, k, v, k_scale, v_scale, seq_lens, scale = inputs
            ctx.save_for_backward(q, k, v, k_scale, v_scale, seq_lens)
            ctx.scale = scale

        def backward(ctx, grad):
            q, k, v, k_scale, v_scale, seq_lens = ctx.saved_tensors
            gq, gk, gv = backward_op(grad.contiguous(), q, k, v, k_scale, v_scale, seq_lens, ctx.scale)
            return gq, gk, gv, None, None, None, None

        op.register_autograd(backward, setup_context=setup_context)
        return op, backward_op

    def decode_misfit(self, query, key_cache, value_cache, seq_lens, k_scale,
                      v_scale) -> tuple[str, type[Exception]] | None:
        sig = self.kop.signature
        head_dim = int(sig["HEAD_DIM"])
        q_dt = _DTYPES[sig.get("Q_DTYPE", "float16")]
        kv_dt = _DTYPES[sig.get("KV_DTYPE", sig.get("Q_DTYPE", "float16"))]
        named = {"query": query, "key_cache": key_cache, "value_cache": value_cache, "seq_lens": seq_lens}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
            bad = self.kop.check_device(n, t, query.device)
            if bad:
                return bad, ValueError
            dims = 1 if n == "seq_lens" else 4
            if t.dim() != dims:
                return f"{n}: expected {dims} dimensions, got {t.dim()} (shape {tuple(t.shape)})", ValueError
        if query.dtype != q_dt:
            return (f"query: dtype {_dtype_name(query.dtype)}, but this kernel was compiled for "
                    f"{_dtype_name(q_dt)}"), TypeError
        for n in ("key_cache", "value_cache"):
            if named[n].dtype != kv_dt:
                return (f"{n}: dtype {_dtype_name(named[n].dtype)}, but this kernel was compiled for "
                        f"{_dtype_name(kv_dt)}"), TypeError
        if seq_lens.dtype not in (torch.int32, torch.int64):
            return f"seq_lens: dtype {_dtype_name(seq_lens.dtype)}, expected int32 (or int64)", TypeError
        B, Hq, Sq, D = query.shape
        if D != head_dim:
            return f"query: head dim {D} (size 3), but this kernel was compiled for head dim {head_dim}", ValueError
        if not 1 <= Sq <= 16:
            return f"query: {Sq} query rows (size 2); this kernel decodes 1 to 16", ValueError
        Hkv = key_cache.shape[1]
        if key_cache.shape[0] != B or key_cache.shape[3] != D or Hkv == 0 or Hq % Hkv or key_cache.shape[2] == 0:
            return (f"key_cache: shape {tuple(key_cache.shape)}, expected [{B}, Hkv, Sk >= 1, {D}] with Hkv "
                    f"dividing the {Hq} query heads"), ValueError
        if value_cache.shape != key_cache.shape:
            return (f"value_cache: shape {tuple(value_cache.shape)}, expected the shape of key_cache "
                    f"{tuple(key_cache.shape)}"), ValueError
        if tuple(seq_lens.shape) != (B,):
            return f"seq_lens: shape {tuple(seq_lens.shape)}, expected [B] = [{B}]", ValueError
        for n, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (not isinstance(s, torch.Tensor) or tuple(s.shape) != (Hkv,)
                                  or s.dtype != torch.float32 or s.device != query.device):
                return f"{n}: expected a float32 tensor [Hkv] = [{Hkv}] on {query.device}", ValueError
        if kv_dt != torch.float8_e4m3fn and (k_scale is not None or v_scale is not None):
            return "k_scale/v_scale: only for a kernel compiled for float8 K/V", ValueError
        return None

    def decode_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         seq_lens: torch.Tensor, *, scale: float | None = None, k_scale: torch.Tensor | None = None,
                         v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of query [B, Hq, Sq, D] over a KV cache [B, Hkv, Sk, D] (Hq = G x Hkv): every query row of
        sequence b sees keys 0 .. seq_lens[b] - 1 (lengths are clamped to [1, Sk] on the device, not checked: that
        would cost a device-to-host copy). FP8 caches take per-KV-head float32 `k_scale`/`v_scale`."""
        if (k_scale is None and v_scale is None and isinstance(seq_lens, torch.Tensor)
                and seq_lens.dtype == torch.int32 and self.kop.eager(query, key_cache, value_cache)):
            def prepare():
                ones = self.unit_scales(key_cache.shape[1], key_cache.device)
                out = torch.empty_like(query)
                return out, [query, key_cache, value_cache, ones, ones, seq_lens, out,
                             1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)]

            out = self.direct(prepare)  # refused: the checks below say why
            if out is not None:
                return out
        misfit = self.decode_misfit(query, key_cache, value_cache, seq_lens, k_scale, v_scale)
        if misfit is not None:
            self.kop.outside(*misfit)  # raises unless the op falls back on the reference
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        Hkv = key_cache.shape[1] if isinstance(key_cache, torch.Tensor) and key_cache.dim() == 4 else 1
        ones = torch.ones(Hkv, dtype=torch.float32, device=query.device)  # traced by torch.compile: no cache
        ks = ones if k_scale is None else k_scale.contiguous()
        vs = ones if v_scale is None else v_scale.contiguous()
        if misfit is not None:
            return decode_reference(query, key_cache, value_cache, ks, vs, seq_lens, scale)
        return self.kop.op(query.contiguous(), key_cache.contiguous(), value_cache.contiguous(), ks, vs,
                       seq_lens.to(torch.int32).contiguous(), scale)

    function = decode_attention

    def call_features(self, args, kwargs):
        q, kc = call_arg(args, kwargs, 0, "query"), call_arg(args, kwargs, 1, "key_cache")
        return {"B": int(q.shape[0]), "Hq": int(q.shape[1]), "Sq": int(q.shape[2]), "Hkv": int(kc.shape[1]),
                "Sk": int(kc.shape[2])}, ()

    def spec_features(self, spec):
        return {"B": spec["B"], "Hq": spec["Hq"], "Sq": spec.get("Sq", 1), "Hkv": spec["Hkv"], "Sk": spec["Sk"]}, ()


