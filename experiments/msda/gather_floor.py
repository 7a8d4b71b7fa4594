"""Branch-free gather floor of MSDA forward: the gather part of the kernel alone, as a benchmark row.

``GatherFloor(inputs, dtype, build_dir)`` builds experiments/msda/gather_floor.cu (torch JIT, sm_90), runs its
untimed ``floor_prepare`` kernel once (per-sample row code + 4 corner weights) and keeps the metadata; ``run(out)``
launches only ``floor_gather``, which loads all 4 corner rows of every sample without a per-corner test and writes
the true MSDA output. Its time is a floor for reading every corner row once.

Self-check on a GPU host (encoder and decoder shapes, fp16 and fp32)::

    PYTHONPATH=. python experiments/msda/gather_floor.py [--build-dir DIR] [--variants]
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["GatherFloor", "DEFAULT_VARIANT", "VARIANTS", "load_extension", "check"]

HERE = Path(__file__).resolve().parent
CU_PATH = HERE / "gather_floor.cu"
_EXT_NAME = "evo_msda_gather_floor"

#: Signature the .cu instantiates.
_D, _L, _P = 32, 4, 4

#: Default (vec, items_per_block) per value dtype. Measured on an H100 (all VARIANTS, p50, L2 flushed): fp16 8-byte
#: loads (8 lanes per item) tie 16-byte ones on the encoder and beat them by ~10% on the decoder; fp32 16-byte loads
#: with 64 items per block are within a few % of the best variant on both shapes.
DEFAULT_VARIANT = {torch.float16: (4, 64), torch.float32: (4, 64)}
#: Every (vec, items_per_block) the .cu instantiates (blocks of at most 1024 threads).
VARIANTS = {
    torch.float16: [(v, i) for v in (8, 4) for i in (32, 64, 128)],
    torch.float32: [(4, 32), (4, 64), (4, 128), (2, 32), (2, 64)],
}

_INT32_MAX = 2**31 - 1

# Thin pybind layer over the extern "C" launchers; both run on the current stream of the tensors' device.
_WRAPPER = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <vector>

extern "C" int gather_floor_prepare(const float*, const float*, const int64_t*, const int64_t*, int*, float*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
extern "C" int gather_floor_gather(const void*, const int*, const float*, void*, int, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, int64_t, int64_t, const int64_t*, int, int, cudaStream_t);

static void check_cuda(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.is_contiguous(), what, " must be a contiguous CUDA tensor");
}

// loc [N, Lq, M, L, P, 2] f32, attn [N, Lq, M, L, P] f32, shapes [L, 2] / starts [L] i64,
// codes [N*Lq*M, L*P] i32, weights [N*Lq*M, L*P, 4] f32.
int64_t prepare(torch::Tensor loc, torch::Tensor attn, torch::Tensor shapes, torch::Tensor starts,
                torch::Tensor codes, torch::Tensor weights, int64_t S) {
    for (auto* t : {&loc, &attn, &shapes, &starts, &codes, &weights}) check_cuda(*t, "every argument");
    TORCH_CHECK(loc.dim() == 6 && loc.scalar_type() == torch::kFloat32 && attn.scalar_type() == torch::kFloat32 &&
                shapes.scalar_type() == torch::kInt64 && starts.scalar_type() == torch::kInt64 &&
                codes.scalar_type() == torch::kInt32 && weights.scalar_type() == torch::kFloat32, "dtypes");
    TORCH_CHECK(codes.numel() == attn.numel() && weights.numel() == 4 * attn.numel() &&
                loc.numel() == 2 * attn.numel(), "metadata sizes");
    const c10::cuda::CUDAGuard guard(loc.device());
    return gather_floor_prepare(loc.data_ptr<float>(), attn.data_ptr<float>(), shapes.data_ptr<int64_t>(),
                                starts.data_ptr<int64_t>(), codes.data_ptr<int>(), weights.data_ptr<float>(),
                                loc.size(0), loc.size(1), loc.size(2), loc.size(3), loc.size(4), S,
                                at::cuda::getCurrentCUDAStream().stream());
}

// value [N, S, M, D] f16/f32, out [N, Lq, M*D] same dtype; level_w: W of each level.
int64_t gather(torch::Tensor value, torch::Tensor codes, torch::Tensor weights, torch::Tensor out,
               std::vector<int64_t> level_w, int64_t Lq, int64_t P, int64_t vec, int64_t items_per_block) {
    check_cuda(value, "value");
    check_cuda(out, "out");
    TORCH_CHECK(value.dim() == 4 && out.scalar_type() == value.scalar_type() &&
                (value.scalar_type() == torch::kFloat16 || value.scalar_type() == torch::kFloat32), "value / out");
    TORCH_CHECK(out.numel() == value.size(0) * Lq * value.size(2) * value.size(3), "out size");
    const c10::cuda::CUDAGuard guard(value.device());
    return gather_floor_gather(value.data_ptr(), codes.data_ptr<int>(), weights.data_ptr<float>(), out.data_ptr(),
                               static_cast<int>(value.element_size()), value.size(0), value.size(1), value.size(2),
                               Lq, value.size(3), static_cast<int64_t>(level_w.size()), P, level_w.data(),
                               static_cast<int>(vec), static_cast<int>(items_per_block),
                               at::cuda::getCurrentCUDAStream().stream());
}
"""

_EXTENSIONS: dict[str, Any] = {}


def load_extension(build_dir: str | Path, verbose: bool = False):
    """Build (or load the cached build of) gather_floor.cu under ``build_dir/gather_floor``; returns the module."""
    path = Path(build_dir).expanduser().resolve() / "gather_floor"
    key = str(path)
    if key not in _EXTENSIONS:
        from torch.utils.cpp_extension import load_inline

        path.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {}
        # skip the torch headers load_inline would prepend to the .cu (it needs none); older torch lacks the option
        if "no_implicit_headers" in inspect.signature(load_inline).parameters:
            kwargs["no_implicit_headers"] = True
        _EXTENSIONS[key] = load_inline(
            name=_EXT_NAME, cpp_sources=_WRAPPER, cuda_sources=CU_PATH.read_text(), functions=["prepare", "gather"],
            extra_cflags=["-O3"],
            # an explicit arch flag stops torch adding its own -gencode list
            extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
            build_directory=key, verbose=verbose, with_cuda=True, **kwargs)
    return _EXTENSIONS[key]


def _as_dtype(dtype: Any) -> torch.dtype:
    names = {"float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "float": torch.float32, "fp32": torch.float32}
    d = names.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if d not in (torch.float16, torch.float32):
        raise ValueError(f"dtype must be torch.float16 or torch.float32, got {dtype!r}")
    return d


class GatherFloor:
    """The gather floor on one set of MSDA inputs (a dict as from evoengineer.families.msda.task.make_inputs, on CUDA).

    ``dtype``: value dtype the gather reads and writes (float16 / float32; value is cast when it differs).
    ``vec`` / ``items_per_block``: the kernel variant (see VARIANTS; default DEFAULT_VARIANT[dtype]).
    Attributes: ``rows_read`` (4 per sample: the rows the kernel loads, masked ones included), ``in_map_rows``
    (corner rows with a nonzero weight), ``out_shape``, ``codes`` int32 [N*Lq*M, L*P] and ``weights`` float32
    [N*Lq*M, L*P, 4] (the metadata).
    """

    def __init__(self, inputs: Mapping[str, torch.Tensor], dtype: Any, build_dir: str | Path, *,
                 vec: int | None = None, items_per_block: int | None = None):
        self.dtype = _as_dtype(dtype)
        value = inputs["value"]
        if value.device.type != "cuda":
            raise ValueError("GatherFloor needs CUDA tensors")
        dev = value.device
        self.value = value.to(self.dtype).contiguous()
        loc = inputs["sampling_locations"].to(device=dev, dtype=torch.float32).contiguous()
        attn = inputs["attention_weights"].to(device=dev, dtype=torch.float32).contiguous()
        shapes = inputs["spatial_shapes"].to(device=dev, dtype=torch.int64).contiguous()
        starts = inputs["level_start_index"].to(device=dev, dtype=torch.int64).contiguous()

        if self.value.dim() != 4 or loc.dim() != 6 or loc.shape[-1] != 2:
            raise ValueError(f"value must be [N, S, M, D] and sampling_locations [N, Lq, M, L, P, 2]; got "
                             f"{tuple(self.value.shape)} and {tuple(loc.shape)}")
        N, S, M, D = self.value.shape
        _, Lq, _, L, P, _ = loc.shape
        if tuple(loc.shape[:3]) != (N, Lq, M) or tuple(attn.shape) != (N, Lq, M, L, P):
            raise ValueError(f"inconsistent shapes: value {tuple(self.value.shape)}, locations {tuple(loc.shape)}, "
                             f"weights {tuple(attn.shape)}")
        if (D, L, P) != (_D, _L, _P):
            raise ValueError(f"gather_floor.cu is built for D={_D} L={_L} P={_P}; got D={D} L={L} P={P}")
        levels = [tuple(hw) for hw in shapes.cpu().tolist()]
        start_list = starts.cpu().tolist()
        if tuple(shapes.shape) != (L, 2) or len(start_list) != L:
            raise ValueError(f"spatial_shapes must be [{L}, 2] and level_start_index [{L}]")
        expect, acc = [], 0
        for h, w in levels:
            if h <= 0 or w <= 0:
                raise ValueError(f"level sizes must be positive, got {levels}")
            expect.append(acc)
            acc += h * w
        if acc != S or start_list != expect:
            raise ValueError(f"levels {levels} / starts {start_list} do not tile S = {S}")
        # the kernels index in 32 bits; the row codes hold row << 2
        if (N * S * M * D > _INT32_MAX or N * Lq * M * D > _INT32_MAX or N * Lq * M * L * P * 2 > _INT32_MAX
                or S * M >= 2**29):
            raise ValueError(f"sizes exceed the kernels' 32-bit indexing (N={N} S={S} M={M} D={D} Lq={Lq})")

        dv, di = DEFAULT_VARIANT[self.dtype]
        self.vec, self.items_per_block = vec or dv, items_per_block or di
        if (self.vec, self.items_per_block) not in VARIANTS[self.dtype]:
            raise ValueError(f"(vec, items_per_block) = {(self.vec, self.items_per_block)} is not one of "
                             f"{VARIANTS[self.dtype]} for {self.dtype}")

        self.ext = load_extension(build_dir)
        items, lp = N * Lq * M, L * P
        self.codes = torch.empty((items, lp), dtype=torch.int32, device=dev)
        self.weights = torch.empty((items, lp, 4), dtype=torch.float32, device=dev)
        rc = self.ext.prepare(loc, attn, shapes, starts, self.codes, self.weights, S)
        if rc != 0:
            raise RuntimeError(f"floor_prepare failed: CUDA error {rc}")
        self._level_w = [int(w) for _, w in levels]
        self._Lq, self._P = int(Lq), int(P)
        self.out_shape = (N, Lq, M * D)
        self.rows_read = 4 * items * lp
        self.in_map_rows = int((self.weights != 0).sum().item())
        self._checked_out: torch.Tensor | None = None

    def new_output(self) -> torch.Tensor:
        """An output tensor for run(), NaN-filled (so that unwritten rows show)."""
        return torch.full(self.out_shape, float("nan"), dtype=self.dtype, device=self.value.device)

    def run(self, out: torch.Tensor) -> torch.Tensor:
        """Launch floor_gather only (current stream), writing the MSDA output into ``out`` [N, Lq, M*D]."""
        if out is not self._checked_out:  # full check once per output tensor, to keep the timed call lean
            if (tuple(out.shape) != self.out_shape or out.dtype != self.dtype or out.device != self.value.device
                    or not out.is_contiguous()):
                raise ValueError(f"out must be a contiguous {self.dtype} tensor of shape {self.out_shape} on "
                                 f"{self.value.device}")
            self._checked_out = out
        rc = self.ext.gather(self.value, self.codes, self.weights, out, self._level_w, self._Lq, self._P, self.vec,
                             self.items_per_block)
        if rc != 0:
            raise RuntimeError(f"floor_gather failed: CUDA error {rc}")
        return out


def check(inputs: Mapping[str, torch.Tensor], out: torch.Tensor, ref: torch.Tensor | None = None) -> float:
    """Max abs error of ``out`` against ``ref`` (default evoengineer.families.msda.task.reference in float64)."""
    if ref is None:
        from evoengineer.families.msda.task import reference

        ref = reference(inputs, dtype=torch.float64)
    return float((out.to(torch.float64) - ref.to(out.device)).abs().max().item())


def _main() -> int:
    import argparse
    import sys

    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from evoengineer.evaluators.timing import time_callable
    from evoengineer.families.msda.task import DECODER, ENCODER, make_inputs, reference

    ap = argparse.ArgumentParser(description="gather floor self-check and timing (needs a CUDA GPU)")
    ap.add_argument("--build-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--variants", action="store_true", help="time every (vec, items_per_block) variant")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2

    tol = {torch.float16: 1e-2, torch.float32: 1e-4}
    ok = True
    print(f"{'shape':8} {'dtype':8} {'vec':>3} {'items':>5} {'max_err':>9} {'p50_us':>8} {'us/Mrow':>8} "
          f"{'rows_read':>10} {'in_map':>6}")
    for shape in (ENCODER, DECODER):
        for dtype in (torch.float16, torch.float32):
            inputs = make_inputs(shape, a.seed, dtype=dtype, device="cuda")
            ref = reference(inputs, dtype=torch.float64)
            variants = VARIANTS[dtype] if a.variants else [DEFAULT_VARIANT[dtype]]
            for vec, items in variants:
                gf = GatherFloor(inputs, dtype, a.build_dir, vec=vec, items_per_block=items)
                out = gf.new_output()
                gf.run(out)
                torch.cuda.synchronize()
                err = check(inputs, out, ref)
                good = err <= tol[dtype]  # NaN fails too
                ok &= good
                t = time_callable(lambda: gf.run(out), device="cuda", warmup=10, repeats=100, flush_l2=True)["p50"]
                print(f"{shape.name:8} {str(dtype).removeprefix('torch.'):8} {vec:>3} {items:>5} {err:>9.2e} "
                      f"{t:>8.2f} {t / (gf.rows_read / 1e6):>8.3f} {gf.rows_read:>10} "
                      f"{gf.in_map_rows / gf.rows_read:>6.1%}{'' if good else '  FAIL (tol %g)' % tol[dtype]}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(_main())
