// Torch binding of the MSDA family, compiled ONCE per family and toolchain (it is the slow part: torch headers).
// Each candidate's shared library links against it and, from its PyInit_<name>, hands over its kernel entry point;
// this file turns that pointer into a Python module with `forward(...)`.
#include <torch/extension.h>

#include "candidate_module.h"
#ifdef EVO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cstring>
#include <string>

namespace {

// Entry point every MSDA template exports as extern "C" evo_msda_forward (value/output typed by the family).
using MsdaForwardFn = int (*)(const void* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                              const float* sampling_locations, const float* attention_weights, void* output,
                              int64_t N, int64_t S, int64_t M, int64_t Lq, void* stream);

void expect(const torch::Tensor& t, const char* name, int64_t dim, const torch::Device& device) {
  TORCH_CHECK(t.dim() == dim, name, ": expected ", dim, " dimensions, got ", t.dim());
  TORCH_CHECK(t.is_contiguous(), name, ": must be contiguous");
  TORCH_CHECK(t.device() == device, name, ": on ", t.device(), ", expected ", device);
}

int forward(MsdaForwardFn fn, const torch::Tensor& value, const torch::Tensor& spatial_shapes,
            const torch::Tensor& level_start_index, const torch::Tensor& loc, const torch::Tensor& attn,
            torch::Tensor& out) {
  const auto device = value.device();
  expect(value, "value", 4, device);
  expect(loc, "sampling_locations", 6, device);
  expect(attn, "attention_weights", 5, device);
  expect(out, "output", 3, device);
  expect(spatial_shapes, "spatial_shapes", 2, device);
  expect(level_start_index, "level_start_index", 1, device);
  TORCH_CHECK(spatial_shapes.scalar_type() == torch::kLong && level_start_index.scalar_type() == torch::kLong,
              "spatial_shapes and level_start_index must be int64");
  TORCH_CHECK(loc.scalar_type() == torch::kFloat && attn.scalar_type() == torch::kFloat,
              "sampling_locations and attention_weights must be float32");
  TORCH_CHECK(out.scalar_type() == value.scalar_type(), "output dtype must match value dtype");
  const int64_t N = value.size(0), S = value.size(1), M = value.size(2), D = value.size(3);
  const int64_t Lq = loc.size(1), L = loc.size(3), P = loc.size(4);
  TORCH_CHECK(loc.size(0) == N && loc.size(2) == M && loc.size(5) == 2, "sampling_locations: expected [N, Lq, M, L, P, 2]");
  TORCH_CHECK(attn.size(0) == N && attn.size(1) == Lq && attn.size(2) == M && attn.size(3) == L && attn.size(4) == P,
              "attention_weights: expected [N, Lq, M, L, P]");
  TORCH_CHECK(spatial_shapes.size(0) == L && spatial_shapes.size(1) == 2 && level_start_index.size(0) == L,
              "spatial_shapes [L, 2] and level_start_index [L] must match L of sampling_locations");
  TORCH_CHECK(out.size(0) == N && out.size(1) == Lq && out.size(2) == M * D, "output: expected [N, Lq, M*D]");
  void* stream = nullptr;
#ifdef EVO_WITH_CUDA
  if (device.is_cuda()) stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  int rc;
  {
    pybind11::gil_scoped_release nogil;
    rc = fn(value.data_ptr(), spatial_shapes.data_ptr<int64_t>(), level_start_index.data_ptr<int64_t>(),
            loc.data_ptr<float>(), attn.data_ptr<float>(), out.data_ptr(), N, S, M, Lq, stream);
  }
  return rc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry) {
  auto fn = reinterpret_cast<MsdaForwardFn>(entry);
  return evo_make_candidate_module(name, "EvoEngineer MSDA candidate", [fn](pybind11::module_& m) {
    m.def("forward",
          [fn](const torch::Tensor& value, const torch::Tensor& spatial_shapes, const torch::Tensor& level_start_index,
               const torch::Tensor& loc, const torch::Tensor& attn, torch::Tensor out) {
            return forward(fn, value, spatial_shapes, level_start_index, loc, attn, out);
          },
          "Run the candidate kernel; returns its status code (0 = ok).");
  });
}
