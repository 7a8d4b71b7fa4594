"""RMSNorm forward as a kernel family (example of the public contract, evoengineer.family).

    out = x * rsqrt(mean(x^2, -1) + eps) * weight      x, out: [rows, HIDDEN]; weight: [HIDDEN]

Signature constants ([signature] of a space): DTYPE ("float16" or "bfloat16") and HIDDEN (the row length, fixed at
compile time). Shapes give ``rows``. The template is device code only (issue 52): it defines the kernel the
generated binding launches, a 1-D grid over the rows (``Launch(items="rows")``), and exports the launch traits
``threads``, ``smem_bytes``, ``items_per_block`` (rows per block) and ``persistent``::

    extern "C" __global__ void evo_rmsnorm_kernel(const void* x, const void* weight, void* out, int64_t rows,
                                                  float eps)

Candidates compile to a cubin alone (no host compile, no link); an exported op carries the cubin.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family, Launch, Scalar, Signature, Tensor

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
EPS = 1e-6


class RMSNorm(Family):
    """Row-wise RMSNorm of a [rows, HIDDEN] tensor with a [HIDDEN] weight, fp32 accumulation."""

    name = "rmsnorm"
    templates = ("rmsnorm.cu.j2",)
    version = "2"
    entry = "evo_rmsnorm_kernel"

    def setup(self) -> None:
        dtype, hidden = self.constants.get("DTYPE"), self.constants.get("HIDDEN")
        if dtype not in DTYPES:
            raise UserError(f"{self.where()}: DTYPE must be one of {sorted(DTYPES)}, got {dtype!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0 or hidden % 2:
            raise UserError(f"{self.where()}: HIDDEN must be a positive even integer, got {hidden!r}")
        self.dtype = DTYPES[dtype]
        self.hidden = hidden

    @classmethod
    def call_signature(cls, constants: Mapping[str, Any]) -> Signature:
        dtype, hidden = constants["DTYPE"], int(constants["HIDDEN"])
        # 16-byte aligned data: the widest gene (VEC = 8 halves) loads 128 bits at a time
        return Signature(args=(Tensor("x", dtype, ("rows", "hidden"), align=16),
                               Tensor("weight", dtype, ("hidden",), align=16),
                               Scalar("eps", "float32"),
                               Tensor("out", dtype, ("rows", "hidden"), output=True, align=16)),
                         fixed={"hidden": hidden}, launch=Launch(items="rows"))

    def make_inputs(self, shape: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape["rows"], self.hidden, generator=g)
        x[::7] *= 100.0  # rows whose sum of squares overflows fp16
        weight = 1.0 + 0.1 * torch.randn(self.hidden, generator=g)
        return {"x": x.to(self.dtype).to(self.device), "weight": weight.to(self.dtype).to(self.device), "eps": EPS}

    def reference(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        x, w, eps = inputs["x"].to(torch.float64), inputs["weight"].to(torch.float64), inputs["eps"]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(eps)) * w

    def baselines(self) -> dict[str, Any]:
        hidden = self.hidden

        def torch_eager(inputs: Mapping[str, Any]) -> torch.Tensor:
            return torch.nn.functional.rms_norm(inputs["x"], (hidden,), inputs["weight"], float(inputs["eps"]))

        return {"torch_eager": torch_eager}

    def flops(self, shape: Any) -> int:
        return 4 * shape["rows"] * self.hidden  # square-add, scale, weight

    def min_bytes(self, shape: Any) -> int:
        item = torch.empty((), dtype=self.dtype).element_size()
        return 2 * shape["rows"] * self.hidden * item + self.hidden * item
