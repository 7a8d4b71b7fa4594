"""Multi-scale deformable attention (MSDA) forward pass, as in Deformable DETR.

Tensor layouts (all contiguous):

* ``value``               ``[N, S, M, D]``  with ``S = sum_l H_l * W_l``; levels are
  stacked along ``S`` in row-major (y, x) order, level ``l`` starting at
  ``level_start_index[l]``.
* ``spatial_shapes``      int64 ``[L, 2]`` as ``(H_l, W_l)``.
* ``level_start_index``   int64 ``[L]``.
* ``sampling_locations``  float32 ``[N, Lq, M, L, P, 2]`` as normalised ``(x, y)``
  (nominally in ``[0, 1]``, but points may lie outside).
* ``attention_weights``   float32 ``[N, Lq, M, L, P]`` (softmaxed over ``L * P``; with the signature option
  ``ATTENTION = "logits"`` raw logits, which the kernel softmaxes over ``L * P`` itself).
* output                  ``[N, Lq, M * D]``.

For every ``(n, q, m)``::

    out[n, q, m, :] = sum_{l, p} a[n, q, m, l, p] * bilinear(value_l[n, :, :, m, :], x * W_l - 0.5, y * H_l - 0.5)

where ``bilinear`` interpolates between the four integer pixel corners around the
(pixel-centre based) coordinate. Corners outside the ``H_l x W_l`` map contribute zero and
the remaining corner weights are *not* renormalised (``grid_sample`` with
``padding_mode="zeros", align_corners=False``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from evoengineer.errors import UserError
from evoengineer.families.msda.reference import msda_reference
from evoengineer.family import Family, check_shape_keys

__all__ = [
    "INPUT_KEYS",
    "MSDAShape",
    "ENCODER",
    "DECODER",
    "ODD_SHAPES",
    "ODD_SHAPE_D16",
    "SHAPES",
    "make_inputs",
    "reference",
    "reference_loop_f64",
    "flops",
    "min_bytes",
]

#: Signature option ATTENTION: what attention_weights holds (softmaxed weights, or logits the kernel softmaxes).
ATTENTION_MODES = ("weights", "logits")

#: Keys of the dict returned by make_inputs, in the order of the kernel entry point arguments.
INPUT_KEYS = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")

_SHAPE_KEYS = ("name", "N", "Lq", "M", "D", "P", "levels")
_OPTIONAL_KEYS = ("ref",)
#: Where a query's reference point lies: "random" (uniform in [0, 1]^2; decoder object queries) or "pixels" (the
#: centre of the query's own position in the stacked pyramid, as in the Deformable-DETR encoder; needs Lq == S).
REF_MODES = ("random", "pixels")


@dataclass(frozen=True)
class MSDAShape:
    """Problem size of one MSDA forward call. ``levels`` holds ``(H, W)`` per level; ``ref`` is one of REF_MODES."""

    name: str
    N: int
    Lq: int
    M: int
    D: int
    P: int
    levels: tuple[tuple[int, int], ...]
    ref: str = "random"

    def __post_init__(self):
        if self.ref not in REF_MODES:
            raise ValueError(f"MSDA shape {self.name!r}: 'ref' must be one of {list(REF_MODES)}, got {self.ref!r}")
        if self.ref == "pixels" and self.Lq != self.S:
            raise ValueError(f"MSDA shape {self.name!r}: ref = \"pixels\" needs Lq == S (every position a query)")

    @property
    def L(self) -> int:
        """Number of feature levels."""
        return len(self.levels)

    @property
    def S(self) -> int:
        """Total number of value positions, ``sum_l H_l * W_l``."""
        return sum(h * w for h, w in self.levels)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MSDAShape":
        """Build a shape from a mapping (e.g. a TOML table).

        Required keys: ``name, N, Lq, M, D, P, levels`` (``levels`` a list of ``[H, W]``).
        ``Lq`` may be the string ``"S"``, meaning ``Lq = S`` (encoder self-attention).
        Raises ``ValueError`` on missing, unknown or invalid entries.
        """
        check_shape_keys(d, _SHAPE_KEYS, _OPTIONAL_KEYS, "MSDA")

        name = d["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"MSDA shape 'name' must be a non-empty string, got {name!r}")

        raw_levels = d["levels"]
        if isinstance(raw_levels, (str, bytes)) or not isinstance(raw_levels, (list, tuple)) or not raw_levels:
            raise ValueError(f"MSDA shape {name!r}: 'levels' must be a non-empty list of [H, W], got {raw_levels!r}")
        levels = []
        for i, lv in enumerate(raw_levels):
            if isinstance(lv, (str, bytes)) or not isinstance(lv, (list, tuple)) or len(lv) != 2:
                raise ValueError(f"MSDA shape {name!r}: levels[{i}] must be a pair [H, W], got {lv!r}")
            h, w = (_positive_int(v, f"{name!r}: levels[{i}]") for v in lv)
            levels.append((h, w))
        levels_t = tuple(levels)

        ints = {k: _positive_int(d[k], f"{name!r}: '{k}'") for k in ("N", "M", "D", "P")}
        lq = d["Lq"]
        if isinstance(lq, str):
            if lq != "S":
                raise ValueError(f"MSDA shape {name!r}: 'Lq' must be a positive int or the string \"S\", got {lq!r}")
            lq_val = sum(h * w for h, w in levels_t)
        else:
            lq_val = _positive_int(lq, f"{name!r}: 'Lq'")
        return cls(name=name, Lq=lq_val, levels=levels_t, ref=d.get("ref", "random"), **ints)


def _positive_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) <= 0:
        raise ValueError(f"MSDA shape {what} must be a positive integer, got {v!r}")
    return int(v)


_DETR_LEVELS = ((100, 167), (50, 84), (25, 42), (13, 21))

#: Deformable-DETR encoder at 800x1333 input: every value position is a query (Lq = S = 22223).
ENCODER = MSDAShape("encoder", N=1, Lq=sum(h * w for h, w in _DETR_LEVELS), M=8, D=32, P=4, levels=_DETR_LEVELS,
                    ref="pixels")
#: Deformable-DETR decoder (900 object queries, batch 8) on the same feature pyramid.
DECODER = MSDAShape("decoder", N=8, Lq=900, M=8, D=32, P=4, levels=_DETR_LEVELS)

#: Small correctness shapes. All have D=32, L=4, P=4 (so a kernel specialised for the DETR
#: signature must pass them) and vary N, Lq (never a multiple of 2, 4, 8, ...), M and the level
#: sizes (including 1x1 levels and degenerate 1-wide maps).
ODD_SHAPES: tuple[MSDAShape, ...] = (
    MSDAShape("odd_lq37", N=1, Lq=37, M=8, D=32, P=4, levels=((7, 9), (4, 5), (2, 3), (1, 1))),
    MSDAShape("odd_n3_m3", N=3, Lq=51, M=3, D=32, P=4, levels=((5, 7), (3, 4), (2, 2), (1, 1))),
    # about encoder-sized (S = 60 + 15 + 6 + 1 = 82), but Lq = 83 stays odd
    MSDAShape("odd_enc_m5", N=2, Lq=83, M=5, D=32, P=4, levels=((6, 10), (3, 5), (2, 3), (1, 1))),
    MSDAShape("odd_thin_m1", N=1, Lq=1, M=1, D=32, P=4, levels=((9, 1), (1, 13), (1, 1), (3, 2))),
)

#: Correctness shape for templates whose head dimension D is a gene (D=16, M=3).
ODD_SHAPE_D16 = MSDAShape("odd_d16", N=2, Lq=29, M=3, D=16, P=4, levels=((6, 7), (3, 4), (2, 2), (1, 1)))

#: All predefined shapes by name.
SHAPES: dict[str, MSDAShape] = {s.name: s for s in (ENCODER, DECODER, *ODD_SHAPES, ODD_SHAPE_D16)}

# Parameters of the synthetic sampling-location distribution (see make_inputs).
_OFFSET_STD_PX = 2.0  # std-dev of a sampling offset around the reference point, in pixels of its level
_EDGE_SHARE = 0.10  # share of points deliberately moved to a map edge or well outside


def make_inputs(
    shape: MSDAShape, seed: int, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    logits: bool = False,
) -> dict[str, torch.Tensor]:
    """Random but realistic MSDA inputs for ``shape``, fully determined by ``seed``.

    Each query gets a reference point in ``[0, 1]^2`` (uniform for ``ref = "random"``; the centre of its own pixel
    for ``ref = "pixels"``, the encoder's case); its sampling points are that point plus
    Gaussian offsets of a few pixels (scaled per level). About ``10%`` of the points are then moved
    onto a map edge (partly outside: some corners missing) or well outside the map, so that
    zero-padding paths are exercised. ``value`` is standard normal in ``dtype``; the attention
    weights are a softmax over ``L * P`` of normal logits. Locations and weights are float32.
    Everything is drawn on the CPU from a private ``torch.Generator`` and then moved to ``device``.
    With ``logits`` the attention input holds the logits instead (the same draws), a tenth of the (n, q, m) rows
    shifted by up to +-150 so that a kernel which does not subtract the row maximum overflows.
    """
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    N, Lq, M, L, P, D = shape.N, shape.Lq, shape.M, shape.L, shape.P, shape.D
    f32 = torch.float32

    value = torch.randn(N, shape.S, M, D, generator=g, dtype=f32).to(dtype)

    # size[l] = (W_l, H_l), matching the (x, y) order of the locations.
    size = torch.tensor([[w, h] for h, w in shape.levels], dtype=f32).view(1, 1, 1, L, 1, 2)
    ref = torch.rand(N, Lq, 1, 1, 1, 2, generator=g, dtype=f32)
    if shape.ref == "pixels":
        centres = []
        for h, w in shape.levels:
            ys, xs = torch.meshgrid(torch.arange(h, dtype=f32), torch.arange(w, dtype=f32), indexing="ij")
            centres.append(torch.stack([(xs.reshape(-1) + 0.5) / w, (ys.reshape(-1) + 0.5) / h], dim=-1))
        ref = torch.cat(centres).view(1, Lq, 1, 1, 1, 2).expand(N, Lq, 1, 1, 1, 2)
    offsets_px = torch.randn(N, Lq, M, L, P, 2, generator=g, dtype=f32) * _OFFSET_STD_PX
    loc = ref + offsets_px / size

    # Move a share of points to an edge (pixel coord t in [-1.5, 0.5) from the low or high border:
    # wholly outside, partly outside or just inside) or well outside the map (up to half a map away).
    moved = torch.rand(N, Lq, M, L, P, generator=g) < _EDGE_SHARE
    axis = torch.randint(0, 2, (N, Lq, M, L, P), generator=g)
    high_side = torch.rand(N, Lq, M, L, P, generator=g) < 0.5
    far = torch.rand(N, Lq, M, L, P, generator=g) < 0.5
    t = torch.rand(N, Lq, M, L, P, generator=g) * 2.0 - 1.5
    far_dist = 0.02 + 0.48 * torch.rand(N, Lq, M, L, P, generator=g)
    sz = size.expand(N, Lq, M, L, P, 2).gather(-1, axis.unsqueeze(-1)).squeeze(-1)
    edge_px = torch.where(high_side, (sz - 1.0) - t, t)
    edge_loc = (edge_px + 0.5) / sz
    far_loc = torch.where(high_side, 1.0 + far_dist, -far_dist)
    new_coord = torch.where(far, far_loc, edge_loc)
    old_coord = loc.gather(-1, axis.unsqueeze(-1)).squeeze(-1)
    loc = loc.scatter(-1, axis.unsqueeze(-1), torch.where(moved, new_coord, old_coord).unsqueeze(-1))

    raw = torch.randn(N, Lq, M, L * P, generator=g, dtype=f32)
    if logits:
        shifted = torch.rand(N, Lq, M, 1, generator=g) < 0.1
        raw = raw + torch.where(shifted, (torch.rand(N, Lq, M, 1, generator=g) * 2 - 1) * 150.0, 0.0)
        weights = raw.view(N, Lq, M, L, P)
    else:
        weights = torch.softmax(raw, dim=-1).view(N, Lq, M, L, P)

    hw = torch.tensor(shape.levels, dtype=torch.int64).view(L, 2)
    areas = hw[:, 0] * hw[:, 1]
    start = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])

    out = {
        "value": value,
        "spatial_shapes": hw,
        "level_start_index": start,
        "sampling_locations": loc.contiguous(),
        "attention_weights": weights.contiguous(),
    }
    return {k: v.to(device) for k, v in out.items()}


def reference(inputs: Mapping[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
              logits: bool = False) -> torch.Tensor:
    """MSDA forward via ``F.grid_sample`` (one call per level over ``N * M`` batches; evoengineer/families/msda/reference.py,
    also what exported ops fall back on). Computes in ``dtype`` (float32 or float64; inputs are cast first) on the
    inputs' device and returns ``[N, Lq, M * D]`` in ``dtype``. ``logits``: the attention input holds logits,
    softmaxed over ``L * P`` (in ``dtype``) first."""
    args = [inputs[k] for k in INPUT_KEYS]
    if logits:
        a = args[4]
        args[4] = torch.softmax(a.to(dtype).flatten(-2), dim=-1).view(a.shape)
    return msda_reference(*args, dtype=dtype)


def reference_loop_f64(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Plain float64 loop written straight from the definition; for tests on small shapes only.

    Returns a CPU float64 tensor ``[N, Lq, M * D]``.
    """
    value = inputs["value"].detach().cpu().to(torch.float64).numpy()
    loc = inputs["sampling_locations"].detach().cpu().to(torch.float64).numpy()
    attn = inputs["attention_weights"].detach().cpu().to(torch.float64).numpy()
    levels = inputs["spatial_shapes"].tolist()
    starts = inputs["level_start_index"].tolist()
    N, _, M, D = value.shape
    Lq, L, P = loc.shape[1], loc.shape[3], loc.shape[4]

    out = np.zeros((N, Lq, M, D), dtype=np.float64)
    for n in range(N):
        for q in range(Lq):
            for m in range(M):
                for l in range(L):
                    h, w = levels[l]
                    for p in range(P):
                        x = loc[n, q, m, l, p, 0] * w - 0.5
                        y = loc[n, q, m, l, p, 1] * h - 0.5
                        x0, y0 = math.floor(x), math.floor(y)
                        fx, fy = x - x0, y - y0
                        for yy, wy in ((y0, 1.0 - fy), (y0 + 1, fy)):
                            for xx, wx in ((x0, 1.0 - fx), (x0 + 1, fx)):
                                if 0 <= yy < h and 0 <= xx < w:
                                    pixel = starts[l] + yy * w + xx
                                    out[n, q, m] += attn[n, q, m, l, p] * wy * wx * value[n, pixel, m]
    return torch.from_numpy(out.reshape(N, Lq, M * D))


#: Scalar flops per sample (n, q, m, l, p) that do not depend on D: 2 mul + 2 sub for the pixel
#: coordinates, 2 sub for the fractions, 2 sub for (1 - fraction), 4 mul for the corner weights
#: and 4 mul to fold in the attention weight.
META_FLOPS_PER_SAMPLE = 16


def flops(shape: MSDAShape) -> int:
    """Nominal floating-point operations of one forward pass.

    Counted per sample ``(n, q, m, l, p)``: ``8 * D`` for the channel work (4 corners x D channels
    x one multiply + one add each, the corner weight already including the attention weight) plus
    ``META_FLOPS_PER_SAMPLE = 16`` for the coordinate and weight arithmetic. All four corners are
    counted even when some fall outside the map; integer index arithmetic is not counted.
    """
    samples = shape.N * shape.Lq * shape.M * shape.L * shape.P
    return samples * (8 * shape.D + META_FLOPS_PER_SAMPLE)


def min_bytes(shape: MSDAShape, value_itemsize: int) -> int:
    """Compulsory DRAM traffic in bytes: ``value`` (at ``value_itemsize``), the float32 sampling
    locations and attention weights each read once, and the output (at ``value_itemsize``) written
    once. ``spatial_shapes`` / ``level_start_index`` (a few dozen bytes) are ignored.
    """
    samples = shape.N * shape.Lq * shape.M * shape.L * shape.P
    value_bytes = shape.N * shape.S * shape.M * shape.D * value_itemsize
    loc_bytes = samples * 2 * 4
    weight_bytes = samples * 4
    out_bytes = shape.N * shape.Lq * shape.M * shape.D * value_itemsize
    return value_bytes + loc_bytes + weight_bytes + out_bytes


# ---- the task, as the evaluator sees it ----------------------------------------------------------------------------
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class MSDATask(Family):
    """MSDA forward. Signature constants: L, P, D (and VALUE_DTYPE, default float32); the rest is runtime."""

    name = "msda"
    entry = "evo_msda_forward_v2"
    function = "ms_deform_attn"
    binding_file = "binding.cpp"
    device_only = True  # CUDA candidates: a cubin each, launched by the binding (msda_cubin_forward)
    #: the exported op: its adapter (torch only) and the files it needs, copied into an exported package
    op_module, op_class, op_files = "op.py", "MsdaOp", ("reference.py",)
    templates = ("cuda/msda.cu.j2", "cuda/msda_classic.cu.j2", "cpu/msda.cpp.j2")

    def setup(self):
        sig = self.constants
        where = self.where()
        for k in ("L", "P", "D"):
            if type(sig.get(k)) is not int or sig[k] <= 0:
                raise UserError(f"{where}.{k}: the msda task needs a positive integer {k}")
        dtype_name = sig.get("VALUE_DTYPE", "float32")
        if dtype_name not in _DTYPES:
            raise UserError(f"{where}.VALUE_DTYPE: one of {', '.join(_DTYPES)}")
        self.value_dtype = _DTYPES[dtype_name]
        attention = sig.get("ATTENTION", "weights")
        if attention not in ATTENTION_MODES:
            raise UserError(f"{where}.ATTENTION: one of {', '.join(repr(m) for m in ATTENTION_MODES)}")
        self.logits = attention == "logits"


    @staticmethod
    def signature_text(sig) -> str:
        """What the binding checks, from a signature table (the space's, or one recorded in elite.json)."""
        text = f"L={sig['L']};P={sig['P']};D={sig['D']};VALUE_DTYPE={sig.get('VALUE_DTYPE', 'float32')}"
        return text + (";ATTENTION=logits" if sig.get("ATTENTION", "weights") == "logits" else "")

    def binding_signature(self):
        return self.signature_text(self.constants)

    def parse_shape(self, d):
        shape = MSDAShape.from_dict(d)
        sig = self.space.signature
        if (shape.L, shape.P, shape.D) != (sig["L"], sig["P"], sig["D"]):
            raise ValueError(f"shape {shape.name!r} has L={shape.L} P={shape.P} D={shape.D}; the template "
                             f"signature is L={sig['L']} P={sig['P']} D={sig['D']}")
        return shape

    def make_inputs(self, shape, seed):
        return make_inputs(shape, seed, dtype=self.value_dtype, device=self.device, logits=self.logits)

    def reference(self, inputs):
        return reference(inputs, dtype=torch.float64, logits=self.logits)

    def new_output(self, inputs):
        v, loc = inputs["value"], inputs["sampling_locations"]
        N, Lq, M, D = v.shape[0], loc.shape[1], v.shape[2], v.shape[3]
        return torch.full((N, Lq, M * D), float("nan"), dtype=self.value_dtype, device=v.device)

    def launch(self, module, inputs, out):
        rc = module.forward(*(inputs[k] for k in INPUT_KEYS), out)
        if rc != 0:
            raise RuntimeError(f"kernel returned status {rc}")

    def output_dtype(self):
        return self.value_dtype

    def baselines(self):
        return {"reference": lambda inputs: reference(inputs, dtype=torch.float32, logits=self.logits)}

    def baseline_kernels(self):
        return {"classic": "cuda/msda_classic.cu.j2"} if self.space.target.device_compiler else {}

    def flops(self, shape):
        return flops(shape)

    def min_bytes(self, shape):
        return min_bytes(shape, torch.empty((), dtype=self.value_dtype).element_size())
