"""Plain-PyTorch attention gradients the exported attention ops differentiate through (torch only: `export` copies
this file into the package of an sdpa or decode kernel)."""

import torch


def _attention_backward(qf: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, do: torch.Tensor,
                        masked: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of softmax(q k^T scale, keys where `masked` is true left out) v, all float32, written out (no
    autograd: this runs inside a custom op, where autograd is off)."""
    s = torch.matmul(qf, kd.transpose(-1, -2)) * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, vd)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, vd.transpose(-1, -2))
    ds = p * (dp - (do * out).sum(-1, keepdim=True))
    return torch.matmul(ds, kd) * scale, torch.matmul(ds.transpose(-1, -2), qf) * scale, dv


def sdpa_reference_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            k_scale: torch.Tensor, v_scale: torch.Tensor, is_causal: bool,
                            scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of softmax(q k^T scale) v (top-left causal mask) in float32. K/V are dequantized with their
    per-head scales; their gradients are with respect to the stored values."""
    ks, vs = k_scale.float().view(1, -1, 1, 1), v_scale.float().view(1, -1, 1, 1)
    masked = None
    if is_causal:
        masked = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    dq, dk, dv = _attention_backward(q.float(), k.float() * ks, v.float() * vs, grad.float(), masked, scale)
    return dq, dk * ks, dv * vs
