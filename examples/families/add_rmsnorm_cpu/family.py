"""Fused residual add + RMSNorm on the CPU: an example family with an in-place tensor and two outputs.

What serving engines run between transformer layers, for a float32 ``x [rows, hidden]``:

    residual += x                                  (in place: the next layer's residual stream)
    rstd[r]   = 1 / sqrt(mean(residual[r, :]^2) + eps)
    out[r, :] = residual[r, :] * rstd[r] * weight

``residual`` is declared ``inout``: the kernel updates the caller's tensor (no copy, no stacked result), and the
check compares its new value with the reference's. ``out`` and ``rstd`` are two outputs (``rstd`` is what a backward
pass would keep). The space file next to this one names the family (``task = "family.py:AddRmsNorm"``).
"""

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family, Scalar, Signature, Tensor


class AddRmsNorm(Family):
    name = "add_rmsnorm_cpu"
    templates = ("add_rmsnorm.cpp.j2",)
    version = "1"
    entry = "evo_add_rmsnorm"

    def setup(self):
        if self.constants.get("DTYPE", "float32") != "float32":
            raise UserError(f"{self.where()}.DTYPE: the add_rmsnorm_cpu family computes float32")

    @classmethod
    def call_signature(cls, constants):
        # int evo_add_rmsnorm(const float* x, float* residual, const float* weight, float* out, float* rstd,
        #                     int64_t rows, int64_t hidden, float eps, void* stream)
        return Signature(args=(Tensor("x", "float32", ("rows", "hidden")),
                               Tensor("residual", "float32", ("rows", "hidden"), inout=True),
                               Tensor("weight", "float32", ("hidden",)),
                               Scalar("eps", "float32"),
                               Tensor("out", "float32", ("rows", "hidden"), output=True),
                               Tensor("rstd", "float32", ("rows",), output=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(int(seed))
        x = torch.randn(shape.rows, shape.hidden, generator=g)
        residual = torch.randn(shape.rows, shape.hidden, generator=g) * 3.0
        weight = 1.0 + 0.1 * torch.randn(shape.hidden, generator=g)
        return {"x": x.to(self.device), "residual": residual.to(self.device), "weight": weight.to(self.device),
                "eps": 1e-6}

    def reference(self, inputs):
        residual = inputs["residual"].to(torch.float64) + inputs["x"].to(torch.float64)
        rstd = torch.rsqrt(residual.pow(2).mean(dim=-1) + inputs["eps"])
        out = residual * rstd[:, None] * inputs["weight"].to(torch.float64)
        # every written tensor by name: the outputs and the inout's updated value
        return {"residual": residual, "out": out, "rstd": rstd}

    def baselines(self):
        def eager(inputs):
            residual = inputs["residual"] + inputs["x"]
            rstd = torch.rsqrt(residual.pow(2).mean(dim=-1) + inputs["eps"])
            return residual * rstd[:, None] * inputs["weight"], rstd

        return {"torch": eager}

    def flops(self, shape):
        return 5 * shape.rows * shape.hidden

    def min_bytes(self, shape):
        # x and residual read, residual and out written, rstd written
        return 4 * (4 * shape.rows * shape.hidden + shape.rows + shape.hidden)
