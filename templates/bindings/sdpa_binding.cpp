// Torch binding of the SDPA (attention forward) family, compiled ONCE per family and toolchain (it is the slow part:
// torch headers). Each candidate's shared library links against it and, from its PyInit_<name>, hands over its
// kernel entry point; this file turns that pointer into a Python module with `forward(...)`.
#include <torch/extension.h>

#include "candidate_module.h"
#ifdef EVO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cstring>
#include <string>

namespace {

// Entry point every SDPA template exports as extern "C" evo_sdpa_forward. q/out [B, H, Sq, D] in Q_DTYPE, k/v
// [B, H, Sk, D] in KV_DTYPE, k_scale/v_scale float32 [H] (dequantization scales, ignored unless KV is FP8).
using SdpaForwardFn = int (*)(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
                              void* out, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale,
                              void* stream);

void expect(const torch::Tensor& t, const char* name, int64_t dim, const torch::Device& device) {
  TORCH_CHECK(t.dim() == dim, name, ": expected ", dim, " dimensions, got ", t.dim());
  TORCH_CHECK(t.is_contiguous(), name, ": must be contiguous");
  TORCH_CHECK(t.device() == device, name, ": on ", t.device(), ", expected ", device, " (the device of q)");
}

int forward(SdpaForwardFn fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& k_scale, const torch::Tensor& v_scale, torch::Tensor& out, bool causal,
            double softmax_scale) {
  const auto device = q.device();
#ifdef EVO_WITH_CUDA
  TORCH_CHECK(device.is_cuda(), "q: on ", device, ", the CUDA kernel needs CUDA tensors");
#endif
  expect(q, "q", 4, device);
  expect(k, "k", 4, device);
  expect(v, "v", 4, device);
  expect(out, "out", 4, device);
  expect(k_scale, "k_scale", 1, device);
  expect(v_scale, "v_scale", 1, device);
  const auto qt = q.scalar_type(), kvt = k.scalar_type();
  const bool fp8 = kvt == at::ScalarType::Float8_e4m3fn;
  TORCH_CHECK(qt == at::ScalarType::Half || qt == at::ScalarType::BFloat16,
              "q: dtype must be float16 or bfloat16, got ", qt);
  TORCH_CHECK(out.scalar_type() == qt, "out: dtype ", out.scalar_type(), " must match q (", qt, ")");
  TORCH_CHECK(v.scalar_type() == kvt, "v: dtype ", v.scalar_type(), " must match k (", kvt, ")");
  TORCH_CHECK(kvt == qt || (fp8 && qt == at::ScalarType::Half),
              "k, v: dtype must be q's dtype or float8_e4m3fn (FP8 KV only with a float16 q), got ", kvt,
              " with q ", qt);
  TORCH_CHECK(k_scale.scalar_type() == at::ScalarType::Float && v_scale.scalar_type() == at::ScalarType::Float,
              "k_scale, v_scale: must be float32");
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, "q: head dim ", D, " is not one of the template signature's (64, 128)");
  TORCH_CHECK(k.size(0) == B && k.size(1) == H && k.size(3) == D, "k: expected [B, H, Sk, D] = [", B, ", ", H,
              ", Sk, ", D, "], got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v: expected the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(out.sizes() == q.sizes(), "out: expected the shape of q ", q.sizes(), ", got ", out.sizes());
  TORCH_CHECK(k_scale.size(0) == H && v_scale.size(0) == H, "k_scale, v_scale: expected [H] = [", H, "], got ",
              k_scale.sizes(), " and ", v_scale.sizes());
  TORCH_CHECK(Sk > 0 || Sq == 0 || B * H == 0, "k: no keys (Sk = 0) for ", Sq, " queries: softmax over nothing");
  if (B * H * Sq == 0) return 0;
  void* stream = nullptr;
#ifdef EVO_WITH_CUDA
  const c10::cuda::CUDAGuard guard(device);
  stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  int rc;
  {
    pybind11::gil_scoped_release nogil;
    rc = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
            out.data_ptr(), B, H, Sq, Sk, causal ? 1 : 0, static_cast<float>(softmax_scale), stream);
  }
  return rc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry) {
  auto fn = reinterpret_cast<SdpaForwardFn>(entry);
  return evo_make_candidate_module(name, "EvoEngineer SDPA candidate", [fn](pybind11::module_& m) {
    m.def("forward",
          [fn](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& k_scale,
               const torch::Tensor& v_scale, torch::Tensor out, bool causal, double softmax_scale) {
            return forward(fn, q, k, v, k_scale, v_scale, out, causal, softmax_scale);
          },
          "Run the candidate kernel (q, k, v, k_scale, v_scale, out, causal, softmax_scale); returns its status code "
          "(0 = ok).",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("k_scale"),
          pybind11::arg("v_scale"), pybind11::arg("out"), pybind11::arg("causal"), pybind11::arg("softmax_scale"));
  });
}
