"""Test-only: out = x * scale in float32 or float64 (signature constant DTYPE): a family with signature variants."""

import torch

from evoengineer.errors import UserError
from evoengineer.family import Family, Scalar, Signature, Tensor

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class Scale(Family):
    name = "scale_variants"
    version = "1"
    entry = "evo_scale"
    templates = ("scale.cpp.j2",)

    def setup(self):
        if self.constants.get("DTYPE") not in DTYPES:
            raise UserError(f"{self.where()}.DTYPE: float32 or float64")
        self.dtype = DTYPES[self.constants["DTYPE"]]

    @classmethod
    def call_signature(cls, constants):
        d = constants["DTYPE"]
        return Signature(args=(Tensor("x", d, ("n",)), Scalar("scale", "float64"), Tensor("out", d, ("n",), output=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(int(seed))
        return {"x": torch.randn(shape.n, generator=g, dtype=torch.float64).to(self.dtype).to(self.device),
                "scale": 0.75}

    def reference(self, inputs):
        return inputs["x"].to(torch.float64) * inputs["scale"]
