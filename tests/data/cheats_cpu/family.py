"""Planted cheats on the CPU (tests/e2e/test_cheats.py): a row softmax whose CHEAT gene picks what the entry point does
besides computing the right answer, or instead of it."""

import torch

from evoengineer.family import Family, Signature, Tensor


class CheatingSoftmax(Family):
    name = "cheats_cpu"
    version = "1"
    entry = "evo_cheat_softmax"
    templates = ("cheats.cpp.j2",)

    @classmethod
    def call_signature(cls, constants):
        return Signature(args=(Tensor("x", "float32", ("rows", "cols")),
                               Tensor("out", "float32", ("rows", "cols"), output=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(int(seed))
        return {"x": torch.randn(shape.rows, shape.cols, generator=g) * 3.0}

    def reference(self, inputs):
        return torch.softmax(inputs["x"].to(torch.float64), dim=-1)

    def flops(self, shape):
        return 5 * shape.rows * shape.cols

    def min_bytes(self, shape):
        return 8 * shape.rows * shape.cols
