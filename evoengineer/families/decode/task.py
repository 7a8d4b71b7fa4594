"""Attention for decoding (and short extends: speculative decoding) over a KV cache, with grouped-query attention.

Tensor layouts (all contiguous, one device):

* ``q``, output   ``[B, Hq, Sq, D]``  in Q_DTYPE (float16 or bfloat16), Sq from 1 to 16.
* ``k``, ``v``    ``[B, Hkv, Sk, D]`` in KV_DTYPE (Q_DTYPE, or float8_e4m3), Hq = G x Hkv.
* ``k_scale``, ``v_scale``  float32 ``[Hkv]``: per-KV-head dequantization scales (ones unless KV is FP8).
* ``seq_lens``    int32 ``[B]``: sequence b holds keys ``0 .. seq_lens[b] - 1`` (1 <= seq_lens[b] <= Sk); the
  rest of its cache is ignored (it may hold anything: the inputs fill it with NaN to prove it is never read).

Paged KV cache (signature ``KV_LAYOUT = "paged"``; default ``"contiguous"``), the layout vLLM and FlashInfer keep
(FlashInfer's "NHD" pages):

* ``k``, ``v``    ``[num_pages, page_size, Hkv, D]``: a pool of pages; page_size a power of two (the shape's
  ``page_size``).
* ``block_table`` int32 ``[B, max_pages]`` with ``max_pages = ceil(Sk / page_size)``: key ``j`` of sequence ``b``
  lies in slot ``j % page_size`` of page ``block_table[b, j // page_size]``. The inputs put the pages in random order
  across the pool, let pairs of sequences share their first pages (prefix caching), leave unused pages in the pool,
  and point every table entry past a sequence's last page at a page of NaN.
* ``k_orig``, ``v_orig`` ``[B, Hkv, Sk, D]``: the same caches laid out contiguously (unquantized for FP8): the
  baseline's inputs (torch SDPA has no paged layout) and the FP8 gate's.

For every ``(b, h)``: ``out[b, h] = softmax(q[b, h] k[b, h // G, :L]^T * D ** -0.5) v[b, h // G, :L]`` with
``L = seq_lens[b]``: every one of the Sq query rows sees the sequence's L keys (the rows of a speculative extend
are scored against the same cache; no mask among them).

FP8 KV keeps the unquantized K/V (``k_orig``/``v_orig``, the baseline's inputs) and, on shapes with
``fp16_max_abs_err``, is also compared with fp16 attention on them, as the sdpa task does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from evoengineer.errors import UserError
from evoengineer.families.attention.common import FP8_MAX, AttentionTask
from evoengineer.family import check_shape_keys
# the op adapter's (torch-only, exported with the op): one reading of a block table for the op and the task
from evoengineer.families.decode.op import gather_pages

__all__ = ["DecodeShape", "make_inputs", "reference", "sdpa_baseline", "flops", "min_bytes", "gather_pages",
           "shared_prefix_pages"]

MAX_SQ = 16
_REQUIRED = ("name", "B", "Hq", "Hkv", "Sk")
_OPTIONAL = ("Sq", "seq_lens", "fp16_max_abs_err", "page_size", "shared_prefix")
KV_LAYOUTS = ("contiguous", "paged")
#: the largest page a paged kernel takes (the binding's limit)
MAX_PAGE_SIZE = 1 << 16


@dataclass(frozen=True)
class DecodeShape:
    """One decode call: ``seq_lens`` per sequence (default: every sequence holds Sk keys)."""

    name: str
    B: int
    Hq: int
    Hkv: int
    Sk: int
    Sq: int = 1
    seq_lens: tuple[int, ...] | None = None
    fp16_max_abs_err: float | None = None
    page_size: int | None = None  # paged KV layout: keys per page (a power of two)
    # paged inputs: pairs of sequences share their first pages (prefix caching); off, every page is read by one
    # sequence, so a paged call moves the bytes a contiguous one does (what a timing of the layout alone wants)
    shared_prefix: bool = True

    @property
    def group(self) -> int:
        return self.Hq // self.Hkv

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.seq_lens if self.seq_lens is not None else (self.Sk,) * self.B

    @property
    def max_pages(self) -> int:
        """Paged: block-table entries per sequence."""
        return -(-self.Sk // self.page_size) if self.page_size else 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DecodeShape":
        """From a TOML table: ``name, B, Hq, Hkv, Sk``; optional ``Sq`` (1..16, default 1), ``seq_lens`` (B values
        in 1..Sk, or fewer, repeated over the batch), ``fp16_max_abs_err`` and ``page_size`` (paged layout: a power
        of two; ``shared_prefix``, default true: pairs of sequences share their first pages). ValueError on anything
        else."""
        check_shape_keys(d, _REQUIRED, _OPTIONAL, "decode")
        name = d["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"decode shape 'name' must be a non-empty string, got {name!r}")
        ints = {k: _positive_int(d[k], f"{name!r}: '{k}'") for k in ("B", "Hq", "Hkv", "Sk")}
        sq = _positive_int(d.get("Sq", 1), f"{name!r}: 'Sq'")
        if sq > MAX_SQ:
            raise ValueError(f"decode shape {name!r}: 'Sq' is at most {MAX_SQ} (decode and short extends), got {sq}")
        if ints["Hq"] % ints["Hkv"]:
            raise ValueError(f"decode shape {name!r}: Hq ({ints['Hq']}) must be a multiple of Hkv ({ints['Hkv']})")
        lens = d.get("seq_lens")
        if lens is not None:
            if not isinstance(lens, list) or not lens or len(lens) > ints["B"]:
                raise ValueError(f"decode shape {name!r}: 'seq_lens' must be a list of 1..B lengths, got {lens!r}")
            lens = [_positive_int(x, f"{name!r}: 'seq_lens'") for x in lens]
            if max(lens) > ints["Sk"]:
                raise ValueError(f"decode shape {name!r}: seq_lens {max(lens)} > Sk ({ints['Sk']})")
            lens = tuple(lens[i % len(lens)] for i in range(ints["B"]))
        tol = d.get("fp16_max_abs_err")
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0):
            raise ValueError(f"decode shape {name!r}: 'fp16_max_abs_err' must be a positive number, got {tol!r}")
        page = d.get("page_size")
        if page is not None:
            page = _positive_int(page, f"{name!r}: 'page_size'")
            if page & (page - 1) or page > MAX_PAGE_SIZE:
                raise ValueError(f"decode shape {name!r}: 'page_size' must be a power of two up to {MAX_PAGE_SIZE}, "
                                 f"got {page}")
        shared = d.get("shared_prefix", True)
        if not isinstance(shared, bool):
            raise ValueError(f"decode shape {name!r}: 'shared_prefix' must be true or false, got {shared!r}")
        return cls(name=name, Sq=sq, seq_lens=lens, fp16_max_abs_err=None if tol is None else float(tol),
                   page_size=page, shared_prefix=shared, **ints)


def _positive_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) <= 0:
        raise ValueError(f"decode shape {what} must be a positive integer, got {v!r}")
    return int(v)


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, H, S, D]`` as float8_e4m3fn with per-head scales (amax over the valid values / 448)."""
    xf = x.float().nan_to_num(0.0)
    scale = (xf.abs().amax(dim=(0, 2, 3)) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (xf / scale.view(1, -1, 1, 1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def shared_prefix_pages(shape: DecodeShape) -> dict[int, int]:
    """Paged inputs: how many leading pages sequence b (odd) shares with sequence b - 1, as prefix caching does
    (half the full pages both hold, at least one where both hold one); none unless ``shape.shared_prefix``."""
    shared = {}
    if not shape.shared_prefix:
        return shared
    lens = shape.lengths
    for b in range(1, shape.B, 2):
        full = min(lens[b - 1], lens[b]) // shape.page_size
        if full:
            shared[b] = max(1, full // 2)
    return shared


def _to_pages(caches: list[torch.Tensor], shape: DecodeShape, g: torch.Generator,
              nan_fill: float | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Contiguous caches ``[B, Hkv, Sk, D]`` (equal over the shared prefixes) as page pools ``[num_pages,
    page_size, Hkv, D]`` and a block table: each sequence's pages (shared ones once) in random order in the pool,
    two unused pages, and a page of NaN that every entry past a sequence's last page names."""
    B, P, ps = shape.B, shape.max_pages, shape.page_size
    shared = shared_prefix_pages(shape)
    owned = [(b, j) for b, L in enumerate(shape.lengths) for j in range(-(-L // ps)) if j >= shared.get(b, 0)]
    num_pages = len(owned) + 3  # + two unused pages, + the NaN page
    order = torch.randperm(num_pages, generator=g).tolist()
    physical = dict(zip(owned, order))
    nan_page = order[len(owned)]
    table = torch.full((B, P), nan_page, dtype=torch.int32)
    for b, L in enumerate(shape.lengths):
        for j in range(-(-L // ps)):
            table[b, j] = physical[(b - 1 if j < shared.get(b, 0) else b, j)]
    def fill_nan(t: torch.Tensor) -> torch.Tensor:
        if nan_fill is None:  # float8: the e4m3 NaN byte
            t.view(torch.uint8).fill_(int(torch.tensor(float("nan")).to(t.dtype).view(torch.uint8)))
        else:
            t.fill_(nan_fill)
        return t

    pools = []
    for c in caches:
        Hkv, D = c.shape[1], c.shape[3]
        padded = c
        if P * ps > c.shape[2]:  # the last page's slots past Sk: past every length, NaN like the rest
            padded = torch.cat([c, fill_nan(c.new_empty(B, Hkv, P * ps - c.shape[2], D))], dim=2)
        pages = padded.view(B, Hkv, P, ps, D).permute(0, 2, 3, 1, 4)  # [B, P, ps, Hkv, D]
        pool = torch.randn(num_pages, ps, Hkv, D, generator=g).to(c.dtype)  # unused pages hold data
        fill_nan(pool[nan_page])
        bs, js = (torch.tensor([key[i] for key in physical], dtype=torch.long) for i in (0, 1))
        pool[torch.tensor(list(physical.values()), dtype=torch.long)] = pages[bs, js]
        pools.append(pool)
    return pools, table


def make_inputs(shape: DecodeShape, seed: int, *, head_dim: int, q_dtype: torch.dtype = torch.float16,
                kv_dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Standard-normal q, k, v drawn from ``seed`` on the CPU, then moved to ``device``. Cache rows past a
    sequence's length hold NaN (FP8: the e4m3 NaN), so a kernel that reads them gives NaN outputs. A shape with a
    ``page_size`` gets the paged layout (module docstring): k, v as page pools, ``block_table``, and the contiguous
    caches as ``k_orig``, ``v_orig``."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    B, Hq, Hkv, Sq, Sk, D = shape.B, shape.Hq, shape.Hkv, shape.Sq, shape.Sk, head_dim
    fp8 = kv_dtype == torch.float8_e4m3fn
    q = torch.randn(B, Hq, Sq, D, generator=g).to(q_dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(q_dtype if fp8 else kv_dtype)  # FP8: the cache it quantizes
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(q_dtype if fp8 else kv_dtype)
    if shape.page_size:  # prefix caching: the shared pages hold the same keys in both sequences
        for b, n in shared_prefix_pages(shape).items():
            k[b, :, :n * shape.page_size] = k[b - 1, :, :n * shape.page_size]
            v[b, :, :n * shape.page_size] = v[b - 1, :, :n * shape.page_size]
    lens = torch.tensor(shape.lengths, dtype=torch.int32)
    past = torch.arange(Sk)[None, :] >= lens[:, None].long()  # [B, Sk]: cache rows no sequence holds
    out = {"q": q}
    if fp8:
        kq, ks = _quantize(k.masked_fill(past[:, None, :, None], 0.0))
        vq, vs = _quantize(v.masked_fill(past[:, None, :, None], 0.0))
        nan8 = torch.tensor(float("nan")).to(torch.float8_e4m3fn)
        for t in (kq, vq):
            t.view(torch.uint8)[past[:, None, :, None].expand_as(t)] = nan8.view(torch.uint8)
        out.update(k=kq, v=vq, k_scale=ks, v_scale=vs, k_orig=k, v_orig=v)
    else:
        ones = torch.ones(Hkv, dtype=torch.float32)
        out.update(k=k, v=v, k_scale=ones, v_scale=ones.clone())
    for name in ("k", "v") if not fp8 else ():
        out[name] = out[name].masked_fill(past[:, None, :, None], float("nan"))
    out["seq_lens"] = lens
    if shape.page_size:
        if not fp8:
            out.update(k_orig=out["k"], v_orig=out["v"])
        (out["k"], out["v"]), out["block_table"] = _to_pages([out["k"], out["v"]], shape, g,
                                                             None if fp8 else float("nan"))
    return {name: t.contiguous().to(device) for name, t in out.items()}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in ``dtype``, per sequence over its first ``lens[b]`` keys, K/V heads shared by
    groups of G query heads."""
    B, Hq, Sq, D = q.shape
    G = Hq // k.shape[1]
    out = torch.empty(B, Hq, Sq, D, dtype=dtype, device=q.device)
    for b in range(B):
        L = int(lens[b])
        kb = k[b, :, :L].to(dtype).repeat_interleave(G, dim=0)  # [Hq, L, D]
        vb = v[b, :, :L].to(dtype).repeat_interleave(G, dim=0)
        s = torch.matmul(q[b].to(dtype), kb.transpose(1, 2)) / math.sqrt(D)
        out[b] = torch.matmul(torch.softmax(s, dim=-1), vb)
    return out


def reference(inputs: Mapping[str, torch.Tensor], *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Attention in ``dtype`` on the dequantized K/V (stored value x its KV head's scale); paged caches are read
    through the block table."""
    k, v = inputs["k"], inputs["v"]
    if "block_table" in inputs:
        k, v = gather_pages(k, inputs["block_table"]), gather_pages(v, inputs["block_table"])
    k = k.to(dtype) * inputs["k_scale"].to(dtype).view(1, -1, 1, 1)
    v = v.to(dtype) * inputs["v_scale"].to(dtype).view(1, -1, 1, 1)
    return _attend(inputs["q"], k, v, inputs["seq_lens"], dtype)


def sdpa_baseline(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """torch SDPA with enable_gqa on the unquantized K/V (fp16 attention, what an FP8 kernel replaces); ragged
    lengths as a boolean mask (full caches take the unmasked, fastest path). A paged cache's baseline runs on the
    same caches laid out contiguously (torch SDPA has no paged layout)."""
    k, v = inputs.get("k_orig", inputs["k"]), inputs.get("v_orig", inputs["v"])
    q, lens = inputs["q"], inputs["seq_lens"]
    Sk = k.shape[2]
    mask = None
    if bool((lens != Sk).any()):
        mask = (torch.arange(Sk, device=q.device)[None, :] < lens.to(q.device)[:, None].long())[:, None, None, :]
        k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)  # masked NaN would still poison 0 x NaN in the math backend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def flops(shape: DecodeShape, head_dim: int) -> int:
    """4 D per (query row, visible key) pair."""
    return 4 * head_dim * shape.Hq * shape.Sq * sum(shape.lengths)


def min_bytes(shape: DecodeShape, head_dim: int, q_itemsize: int, kv_itemsize: int) -> int:
    """K/V of the visible keys read once, q read and the output written once (paged: plus the block-table entries
    of the pages read)."""
    kv = 2 * shape.Hkv * head_dim * sum(shape.lengths) * kv_itemsize
    table = 4 * sum(-(-L // shape.page_size) for L in shape.lengths) if shape.page_size else 0
    return kv + table + 2 * shape.B * shape.Hq * shape.Sq * head_dim * q_itemsize


class DecodeTask(AttentionTask):
    """Decode attention. Signature constants: HEAD_DIM, Q_DTYPE, KV_DTYPE; B, Hq, Hkv, Sq, Sk, seq_lens runtime."""

    name = "decode"
    entry = "evo_decode_forward"
    function = "decode_attention"
    binding_file = "binding.cpp"
    device_only = True  # CUDA candidates: a cubin each, launched by the binding (DecodeCubin)
    op_module, op_class, op_files = "op.py", "DecodeOp", ("../attention/attention_reference.py",)
    templates = ("cuda/decode.cu.j2",)

    shape_cls = DecodeShape
    inputs_fn = staticmethod(make_inputs)
    reference_fn = staticmethod(reference)

    def setup(self):
        super().setup()
        layout = self.constants.get("KV_LAYOUT", "contiguous")
        if layout not in KV_LAYOUTS:
            raise UserError(f"{self.where()}.KV_LAYOUT: one of {', '.join(KV_LAYOUTS)}, got {layout!r}")
        self.paged = layout == "paged"

    @staticmethod
    def signature_text(sig) -> str:
        """The attention signature, plus ``KV_LAYOUT=paged`` for a paged kernel (contiguous kernels keep the text,
        and so the cache keys, they had before the paged layout existed)."""
        text = AttentionTask.signature_text(sig)
        return text + ";KV_LAYOUT=paged" if sig.get("KV_LAYOUT", "contiguous") == "paged" else text

    def parse_shape(self, d):
        shape = super().parse_shape(d)
        if self.paged and shape.page_size is None:
            raise ValueError(f"shape {shape.name!r}: a paged space (KV_LAYOUT = 'paged') needs 'page_size'")
        if not self.paged and shape.page_size is not None:
            raise ValueError(f"shape {shape.name!r}: 'page_size' is for a paged space (KV_LAYOUT = 'paged')")
        return shape

    def launch(self, module, inputs, out):
        if self.paged:
            rc = module.forward(inputs["q"], inputs["k"], inputs["v"], inputs["k_scale"], inputs["v_scale"],
                                inputs["seq_lens"], inputs["block_table"], out, self.softmax_scale)
        else:
            rc = module.forward(inputs["q"], inputs["k"], inputs["v"], inputs["k_scale"], inputs["v_scale"],
                                inputs["seq_lens"], out, self.softmax_scale)
        if rc != 0:
            raise RuntimeError(f"kernel returned status {rc}")

    def fp16_attention(self, inputs):
        """Attention on the unquantized K/V over each sequence's visible keys, computed exactly (float64)."""
        flat = {name: t for name, t in inputs.items() if name != "block_table"}  # k_orig is contiguous
        return reference({**flat, "k": inputs["k_orig"], "v": inputs["v_orig"],
                          "k_scale": torch.ones_like(inputs["k_scale"]), "v_scale": torch.ones_like(inputs["v_scale"])})

    def baselines(self):
        return {"sdpa": sdpa_baseline}


    def flops(self, shape):
        return flops(shape, self.head_dim)

    def min_bytes(self, shape):
        return min_bytes(shape, self.head_dim, *self.itemsizes())
