"""Fused residual add + RMSNorm on the GPU, the residual updated in place (example of the public contract).

What LLM serving engines run between transformer layers (vLLM's and FlashInfer's ``fused_add_rmsnorm``), for
``x, residual [rows, HIDDEN]`` and ``weight [HIDDEN]`` of one dtype, fp32 arithmetic::

    residual[r, :] = residual[r, :] + x[r, :]                        (rounded to DTYPE, in place)
    rstd[r]        = 1 / sqrt(mean(residual[r, :]^2) + eps)          (float32, from the rounded residual)
    out[r, :]      = residual[r, :] * rstd[r] * weight               (DTYPE)

Signature constants ([signature] of a space): DTYPE ("float16" or "bfloat16") and HIDDEN (the row length, fixed at
compile time). Shapes give ``rows``. The entry point every template defines::

    extern "C" int evo_add_rmsnorm(const void* x, void* residual, const void* weight, void* out, void* rstd,
                                   int64_t rows, float eps, void* stream)
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family, Scalar, Signature, Tensor

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
EPS = 1e-6


class AddRmsNorm(Family):
    """residual += x in place, then RMSNorm of the updated residual with a [HIDDEN] weight; rstd kept."""

    name = "add_rmsnorm_cuda"
    templates = ("add_rmsnorm.cu.j2",)
    version = "1"
    entry = "evo_add_rmsnorm"

    def setup(self) -> None:
        dtype, hidden = self.constants.get("DTYPE"), self.constants.get("HIDDEN")
        if dtype not in DTYPES:
            raise UserError(f"{self.where()}: DTYPE must be one of {sorted(DTYPES)}, got {dtype!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0 or hidden % 8:
            raise UserError(f"{self.where()}: HIDDEN must be a positive multiple of 8, got {hidden!r}")
        self.dtype = DTYPES[dtype]
        self.hidden = hidden

    @classmethod
    def call_signature(cls, constants: Mapping[str, Any]) -> Signature:
        dtype, hidden = constants["DTYPE"], int(constants["HIDDEN"])
        # 16-byte aligned rows: the widest gene (VEC = 8 halves) moves 128 bits at a time
        return Signature(args=(Tensor("x", dtype, ("rows", "hidden"), align=16),
                               Tensor("residual", dtype, ("rows", "hidden"), inout=True, align=16),
                               Tensor("weight", dtype, ("hidden",), align=16),
                               Scalar("eps", "float32"),
                               Tensor("out", dtype, ("rows", "hidden"), output=True, align=16),
                               Tensor("rstd", "float32", ("rows",), output=True)),
                         fixed={"hidden": hidden})

    def make_inputs(self, shape: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(int(seed))
        x = torch.randn(shape["rows"], self.hidden, generator=g)
        x[::7] *= 100.0  # rows whose sum of squares overflows fp16
        residual = 3.0 * torch.randn(shape["rows"], self.hidden, generator=g)
        weight = 1.0 + 0.1 * torch.randn(self.hidden, generator=g)
        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(self.dtype).to(self.device)

        return {"x": dev(x), "residual": dev(residual), "weight": dev(weight), "eps": EPS}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        x, residual, eps = inputs["x"], inputs["residual"], float(inputs["eps"])
        # the residual written back is rounded to the tensor's dtype, and the normalization uses that rounded value
        # (as vLLM's and FlashInfer's fused_add_rmsnorm do)
        r = (residual.to(torch.float64) + x.to(torch.float64)).to(residual.dtype).to(torch.float64)
        rstd = torch.rsqrt(r.pow(2).mean(-1) + eps)
        out = r * rstd[:, None] * inputs["weight"].to(torch.float64)
        # every written tensor by name: the outputs and the inout's updated value
        return {"residual": r, "out": out, "rstd": rstd}

    def baselines(self) -> dict[str, Any]:
        hidden = self.hidden

        def torch_eager(inputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
            r = inputs["residual"] + inputs["x"]
            rstd = torch.rsqrt(r.float().pow(2).mean(-1) + float(inputs["eps"]))
            out = torch.nn.functional.rms_norm(r, (hidden,), inputs["weight"], float(inputs["eps"]))
            return out, rstd

        return {"torch_eager": torch_eager}

    def flops(self, shape: Any) -> int:
        return 5 * shape["rows"] * self.hidden  # add, square-add, scale, weight

    def min_bytes(self, shape: Any) -> int:
        item = torch.empty((), dtype=self.dtype).element_size()
        # x and residual read, residual and out written, weight read once, rstd written
        return (4 * shape["rows"] + 1) * self.hidden * item + 4 * shape["rows"]
