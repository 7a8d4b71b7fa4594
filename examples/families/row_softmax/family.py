"""Row softmax on the CPU: an example kernel family written only against EvoEngineer's public contract.

``out[r, :] = softmax(x[r, :] * scale)`` for a float32 matrix ``x [rows, cols]``. The space file next to this one
names the family (``task = "family.py:RowSoftmax"``); EvoEngineer generates the binding from `call_signature`, checks
every call against it, builds each candidate of row_softmax.cpp.j2, compares it with `reference` on fresh inputs and
times it beside torch.softmax.
"""

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family, Scalar, Signature, Tensor


class RowSoftmax(Family):
    name = "row_softmax"
    templates = ("row_softmax.cpp.j2",)
    version = "1"
    entry = "evo_row_softmax"

    def setup(self):
        # signature constants of the space: DTYPE (only float32 here)
        if self.constants.get("DTYPE", "float32") != "float32":
            raise UserError(f"{self.where()}.DTYPE: the row_softmax family computes float32")

    @classmethod
    def call_signature(cls, constants):
        # the entry point: int evo_row_softmax(const float* x, float* out, int64_t rows, int64_t cols, float scale,
        #                                      void* stream)
        return Signature(args=(Tensor("x", "float32", ("rows", "cols")), Scalar("scale", "float32"),
                               Tensor("out", "float32", ("rows", "cols"), output=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(int(seed))
        x = torch.randn(shape.rows, shape.cols, generator=g) * 4.0
        # a few rows far from zero: a kernel that skips the row maximum overflows exp()
        x[:: max(1, shape.rows // 3)] += 200.0
        scale = float(0.5 + torch.rand((), generator=g))
        return {"x": x.to(self.device), "scale": scale}

    def reference(self, inputs):
        return torch.softmax(inputs["x"].to(torch.float64) * inputs["scale"], dim=-1)

    def baselines(self):
        return {"torch": lambda inputs: torch.softmax(inputs["x"] * inputs["scale"], dim=-1)}

    def flops(self, shape):
        return 4 * shape.rows * shape.cols

    def min_bytes(self, shape):
        return 2 * 4 * shape.rows * shape.cols
