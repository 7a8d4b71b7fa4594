"""The decode family's op adapter (torch only: `export` copies it, with the attention reference, into the package):
``decode_attention(query, key_cache, value_cache, seq_lens, *, block_table=None, scale=None, k_scale=None,
v_scale=None)``: query ``[B, Hq, Sq <= 16, D]`` against a KV cache ``[B, Hkv, Sk, D]`` (Hq a multiple of Hkv:
grouped-query attention), sequence b seeing its first ``seq_lens[b]`` keys; a kernel compiled for the paged layout
(signature KV_LAYOUT = "paged") takes the caches as page pools ``[num_pages, page_size, Hkv, D]`` (vLLM's and
FlashInfer's NHD layout) and ``block_table`` int32 ``[B, max_pages]``: key j of sequence b in slot j % page_size of
page block_table[b, j // page_size]. Differentiated through the reference."""

import math
from typing import Any

import torch

try:  # in an exported package, beside the runtime
    from .runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
    from .attention_reference import _attention_backward
except ImportError:
    from evoengineer.ops.runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
    from evoengineer.families.attention.attention_reference import _attention_backward



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


def gather_pages(pool: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Page pools ``[num_pages, page_size, Hkv, D]`` read through ``block_table [B, max_pages]`` (entries clamped
    into the pool, as the kernels do) as contiguous caches ``[B, Hkv, max_pages x page_size, D]``."""
    B, P = block_table.shape
    _, ps, Hkv, D = pool.shape
    pages = pool[block_table.long().clamp(0, pool.shape[0] - 1)]  # [B, P, ps, Hkv, D]
    return pages.permute(0, 3, 1, 2, 4).reshape(B, Hkv, P * ps, D)


def paged_reference(q, k, v, k_scale, v_scale, seq_lens, block_table, scale: float) -> torch.Tensor:
    """Decode attention over paged caches (the contiguous reference on the caches the block table names)."""
    return decode_reference(q, gather_pages(k, block_table), gather_pages(v, block_table), k_scale, v_scale,
                            seq_lens, scale)


def paged_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens, block_table,
                             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of paged decode attention with respect to q and the stored page pools: the contiguous gradients
    of the gathered caches added into the slots they came from (a shared page sums its sequences'; slots past the
    lengths and pages nobody reads get zero)."""
    dq, dkc, dvc = decode_reference_backward(grad, q, gather_pages(k, block_table), gather_pages(v, block_table),
                                             k_scale, v_scale, seq_lens, scale)
    pages = block_table.long().clamp(0, k.shape[0] - 1).reshape(-1)

    def scatter(dc: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
        B, Hkv, _, D = dc.shape
        per_page = dc.view(B, Hkv, -1, pool.shape[1], D).permute(0, 2, 3, 1, 4).reshape(-1, *pool.shape[1:])
        return torch.zeros(pool.shape, dtype=dc.dtype, device=dc.device).index_add_(0, pages, per_page)

    return dq, scatter(dkc, k), scatter(dvc, v)


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
    @property
    def paged(self) -> bool:
        return self.kop.signature.get("KV_LAYOUT", "contiguous") == "paged"

    def register(self, name: str) -> tuple[Any, Any]:
        if self.paged:
            return self.register_paged(name)
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

    def register_paged(self, name: str) -> tuple[Any, Any]:
        """The custom ops of a paged kernel: the block table is one more input."""
        module = self.kop.module

        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               seq_lens: torch.Tensor, block_table: torch.Tensor, scale: float) -> torch.Tensor:
            out = torch.empty_like(q)
            rc = module.forward(q, k, v, k_scale, v_scale, seq_lens, block_table, out, scale)
            if rc != 0:
                raise RuntimeError(f"decode kernel returned status {rc}")
            return out

        @op.register_fake
        def _(q, k, v, k_scale, v_scale, seq_lens, block_table, scale):
            return torch.empty_like(q)

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, seq_lens: torch.Tensor,
                        block_table: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            gq, gk, gv = paged_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens, block_table, scale)
            return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)

        @backward_op.register_fake
        def _(grad, q, k, v, k_scale, v_scale, seq_lens, block_table, scale):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def setup_context(ctx, inputs, output):
            q, k, v, k_scale, v_scale, seq_lens, block_table, scale = inputs
            ctx.save_for_backward(q, k, v, k_scale, v_scale, seq_lens, block_table)
            ctx.scale = scale

        def backward(ctx, grad):
            q, k, v, k_scale, v_scale, seq_lens, block_table = ctx.saved_tensors
            gq, gk, gv = backward_op(grad.contiguous(), q, k, v, k_scale, v_scale, seq_lens, block_table, ctx.scale)
            return gq, gk, gv, None, None, None, None, None

        op.register_autograd(backward, setup_context=setup_context)
        return op, backward_op

    def decode_misfit(self, query, key_cache, value_cache, seq_lens, k_scale, v_scale,
                      block_table=None) -> tuple[str, type[Exception]] | None:
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
        if self.paged:
            if block_table is None:
                return ("block_table: this kernel was compiled for a paged KV cache (KV_LAYOUT = 'paged'): pass "
                        "block_table=[B, max_pages] int32 and page pools [num_pages, page_size, Hkv, D]"), TypeError
            if not isinstance(block_table, torch.Tensor):
                return f"block_table: expected a tensor, got {type(block_table).__name__}", TypeError
            bad = self.kop.check_device("block_table", block_table, query.device)
            if bad:
                return bad, ValueError
            if block_table.dtype != torch.int32:
                return f"block_table: dtype {_dtype_name(block_table.dtype)}, expected int32", TypeError
            num_pages, page_size, Hkv, Dk = key_cache.shape
            if (Dk != D or num_pages == 0 or Hkv == 0 or Hq % Hkv or page_size == 0
                    or page_size & (page_size - 1) or page_size > 1 << 16):
                return (f"key_cache: shape {tuple(key_cache.shape)}, expected a page pool [num_pages >= 1, "
                        f"page_size (a power of two up to 65536), Hkv, {D}] with Hkv dividing the {Hq} query "
                        "heads"), ValueError
            if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] == 0:
                return (f"block_table: shape {tuple(block_table.shape)}, expected [B, max_pages] = [{B}, "
                        "max_pages >= 1]"), ValueError
        else:
            if block_table is not None:
                return ("block_table: this kernel was compiled for a contiguous KV cache [B, Hkv, Sk, D] "
                        "(KV_LAYOUT = 'contiguous'); it takes no block table"), TypeError
            Hkv = key_cache.shape[1]
            if (key_cache.shape[0] != B or key_cache.shape[3] != D or Hkv == 0 or Hq % Hkv
                    or key_cache.shape[2] == 0):
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
                         seq_lens: torch.Tensor, *, block_table: torch.Tensor | None = None,
                         scale: float | None = None, k_scale: torch.Tensor | None = None,
                         v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of query [B, Hq, Sq, D] over a KV cache [B, Hkv, Sk, D] (Hq = G x Hkv): every query row of
        sequence b sees keys 0 .. seq_lens[b] - 1 (lengths are clamped to [1, Sk] on the device, not checked: that
        would cost a device-to-host copy). FP8 caches take per-KV-head float32 `k_scale`/`v_scale`. A paged kernel
        takes page pools [num_pages, page_size, Hkv, D] and `block_table` int32 [B, max_pages] (Sk = max_pages x
        page_size; page numbers are device data, clamped into the pool by the kernel, not checked)."""
        paged = self.paged
        heads = 2 if paged else 1  # the KV-head dimension of the caches
        if (k_scale is None and v_scale is None and isinstance(seq_lens, torch.Tensor)
                and seq_lens.dtype == torch.int32 and (block_table is not None) == paged
                and self.kop.eager(query, key_cache, value_cache)):
            def prepare():
                ones = self.unit_scales(key_cache.shape[heads], key_cache.device)
                out = torch.empty_like(query)
                tail = [block_table, out] if paged else [out]
                return out, [query, key_cache, value_cache, ones, ones, seq_lens, *tail,
                             1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)]

            out = self.direct(prepare)  # refused: the checks below say why
            if out is not None:
                return out
        misfit = self.decode_misfit(query, key_cache, value_cache, seq_lens, k_scale, v_scale, block_table)
        if misfit is not None:
            self.kop.outside(*misfit)  # raises unless the op falls back on the reference
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        Hkv = key_cache.shape[heads] if isinstance(key_cache, torch.Tensor) and key_cache.dim() == 4 else 1
        ones = torch.ones(Hkv, dtype=torch.float32, device=query.device)  # traced by torch.compile: no cache
        ks = ones if k_scale is None else k_scale.contiguous()
        vs = ones if v_scale is None else v_scale.contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        if paged:
            if misfit is not None:
                if block_table is None:  # nothing to read the pages through: the reference cannot stand in
                    raise TypeError(misfit[0])
                return paged_reference(query, key_cache, value_cache, ks, vs, seq_lens, block_table, scale)
            return self.kop.op(query.contiguous(), key_cache.contiguous(), value_cache.contiguous(), ks, vs, lens,
                               block_table.contiguous(), scale)
        if misfit is not None:
            return decode_reference(query, key_cache, value_cache, ks, vs, seq_lens, scale)
        return self.kop.op(query.contiguous(), key_cache.contiguous(), value_cache.contiguous(), ks, vs, lens, scale)

    function = decode_attention

    def call_features(self, args, kwargs):
        q, kc = call_arg(args, kwargs, 0, "query"), call_arg(args, kwargs, 1, "key_cache")
        bt = kwargs.get("block_table")  # (a dispatch's feature adapter is bound to no kernel: the call says)
        if bt is not None:  # paged: Sk is the keys a block table can name
            Hkv, Sk = int(kc.shape[2]), int(bt.shape[1]) * int(kc.shape[1])
        else:
            Hkv, Sk = int(kc.shape[1]), int(kc.shape[2])
        return {"B": int(q.shape[0]), "Hq": int(q.shape[1]), "Sq": int(q.shape[2]), "Hkv": Hkv, "Sk": Sk}, ()

    def spec_features(self, spec):
        Sk = spec["Sk"]
        if spec.get("page_size"):  # whole pages
            Sk = -(-Sk // spec["page_size"]) * spec["page_size"]
        return {"B": spec["B"], "Hq": spec["Hq"], "Sq": spec.get("Sq", 1), "Hkv": spec["Hkv"], "Sk": Sk}, ()


