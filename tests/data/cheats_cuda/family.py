"""Planted cheats on a CUDA device (tests/gpu/test_gpu_integrity.py, experiments/integrity): an elementwise map whose
CHEAT gene picks what the entry point does besides computing the right answer, or instead of it."""

import torch

from evoengineer.family import Family, Signature, Tensor


class CheatingMap(Family):
    """out = x * 1.5 + sqrt(|x|), float32, memory-bound (one read, one write per element)."""

    name = "cheats_cuda"
    version = "1"
    entry = "evo_cheat_map"
    templates = ("cheats.cu.j2",)

    @classmethod
    def call_signature(cls, constants):
        return Signature(args=(Tensor("x", "float32", ("n",)), Tensor("out", "float32", ("n",), output=True)))

    def make_inputs(self, shape, seed):
        g = torch.Generator().manual_seed(int(seed))
        return {"x": torch.randn(shape.n, generator=g).to(self.device)}

    def reference(self, inputs):
        x = inputs["x"].to(torch.float64)
        return x * 1.5 + x.abs().sqrt()

    def flops(self, shape):
        return 4 * shape.n

    def min_bytes(self, shape):
        return 8 * shape.n


class CheatingMapNoGraphs(CheatingMap):
    """The same map in a family that allows no CUDA graphs: work left on another stream is looked for by a burst of
    back-to-back calls instead of a graph's capture."""

    cuda_graphs = False
