"""The MSDA forward in plain PyTorch (``F.grid_sample`` per level), differentiable: the float64 reference of the
msda task, the fallback of exported MSDA ops and what their backward differentiates. Torch only (copied into
exported packages)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _levels(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, dtype):
    """Per level l, in `dtype`: ((h, w, s0), v [N*M, D, h, w], grid [N*M, Lq, P, 2] in [-1, 1],
    attention [N*M, Lq, P])."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"reference computes in float32 or float64, not {dtype}")
    value = value.to(dtype)
    N, _, M, D = value.shape
    Lq, P = sampling_locations.shape[1], sampling_locations.shape[4]
    # [N, Lq, M, L, P, 2] -> [N, M, L, Lq, P, 2]; grid_sample wants coordinates in [-1, 1].
    grids = (2.0 * sampling_locations.to(dtype) - 1.0).permute(0, 2, 3, 1, 4, 5)
    # [N, Lq, M, L, P] -> [N, M, L, Lq, P]
    attn = attention_weights.to(dtype).permute(0, 2, 3, 1, 4)
    for lvl, ((h, w), s0) in enumerate(zip(spatial_shapes.tolist(), level_start_index.tolist())):
        # [N, H*W, M, D] -> [N*M, D, H, W]
        v = value[:, s0: s0 + h * w].permute(0, 2, 3, 1).reshape(N * M, D, h, w)
        yield (h, w, s0), v, grids[:, :, lvl].reshape(N * M, Lq, P, 2), attn[:, :, lvl].reshape(N * M, Lq, P)


def msda_reference(value: torch.Tensor, spatial_shapes: torch.Tensor, level_start_index: torch.Tensor,
                   sampling_locations: torch.Tensor, attention_weights: torch.Tensor, *,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MSDA forward via ``F.grid_sample`` (one call per level over ``N * M`` batches), computed in ``dtype`` (float32
    or float64; inputs are cast first) on the inputs' device; returns ``[N, Lq, M * D]`` in ``dtype``."""
    N, _, M, D = value.shape
    Lq = sampling_locations.shape[1]
    out = None
    for _, v, grid, a in _levels(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                 dtype):
        sampled = F.grid_sample(v, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        contrib = (sampled * a.unsqueeze(1)).sum(-1)  # [N*M, D, Lq]
        out = contrib if out is None else out + contrib
    # [N*M, D, Lq] -> [N, Lq, M*D]
    return out.view(N, M, D, Lq).permute(0, 3, 1, 2).reshape(N, Lq, M * D)


def msda_reference_backward(grad: torch.Tensor, value: torch.Tensor, spatial_shapes: torch.Tensor,
                            level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                            attention_weights: torch.Tensor, *, dtype: torch.dtype = torch.float32
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `msda_reference` (sum over the output of `grad` x output) with respect to value,
    sampling_locations and attention_weights, computed in `dtype` without autograd (aten's grid-sampler backward per
    level), so it also runs inside a custom op's implementation, where autograd is off."""
    N, S, M, D = value.shape
    Lq, P = sampling_locations.shape[1], sampling_locations.shape[4]
    g = grad.to(dtype).view(N, Lq, M, D).permute(0, 2, 3, 1).reshape(N * M, D, Lq)  # [N*M, D, Lq]
    g_value = torch.zeros((N, S, M, D), dtype=dtype, device=value.device)
    g_loc = torch.empty(sampling_locations.shape, dtype=dtype, device=value.device)
    g_attn = torch.empty(attention_weights.shape, dtype=dtype, device=value.device)
    for lvl, ((h, w, s0), v, grid, a) in enumerate(_levels(value, spatial_shapes, level_start_index,
                                                           sampling_locations, attention_weights, dtype)):
        sampled = F.grid_sample(v, grid, mode="bilinear", padding_mode="zeros", align_corners=False)  # [NM,D,Lq,P]
        # out += sum_p sampled[..., p] * a[..., p]
        g_a = (g.unsqueeze(-1) * sampled).sum(1)  # [N*M, Lq, P]
        g_sampled = g.unsqueeze(-1) * a.unsqueeze(1)  # [N*M, D, Lq, P]
        g_v, g_grid = torch.ops.aten.grid_sampler_2d_backward(g_sampled, v, grid, 0, 0, False, [True, True])
        g_value[:, s0: s0 + h * w] = g_v.reshape(N, M, D, h * w).permute(0, 3, 1, 2)
        g_loc[:, :, :, lvl] = (2.0 * g_grid).reshape(N, M, Lq, P, 2).permute(0, 2, 1, 3, 4)
        g_attn[:, :, :, lvl] = g_a.reshape(N, M, Lq, P).permute(0, 2, 1, 3)
    return g_value, g_loc, g_attn
