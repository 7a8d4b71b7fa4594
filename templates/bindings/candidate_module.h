// Shared by the family bindings: wraps a candidate's kernel entry point in a Python extension module, and reads the
// signature the candidate was compiled for ("KEY=VALUE;KEY=VALUE", written by the build shim).
#pragma once
#include <torch/extension.h>
#ifdef EVO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

using EvoSignature = std::map<std::string, std::string>;

inline EvoSignature evo_parse_signature(const char* text) {
  EvoSignature sig;
  std::string s(text ? text : "");
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(';', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) sig[item.substr(0, eq)] = item.substr(eq + 1);
    start = end + 1;
  }
  return sig;
}

inline int64_t evo_signature_int(const EvoSignature& sig, const char* key) {
  auto it = sig.find(key);
  TORCH_CHECK(it != sig.end(), "candidate signature has no ", key);
  return std::strtoll(it->second.c_str(), nullptr, 10);
}

inline at::ScalarType evo_dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float8_e4m3") return at::ScalarType::Float8_e4m3fn;
  TORCH_CHECK(false, "candidate signature names an unknown dtype ", name);
}

// The dtype as torch spells it in Python (float16, not Half), for error messages.
inline std::string evo_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    default: return std::string(c10::toString(t));
  }
}

// A tensor argument of an attention binding: its rank, contiguity and device (the first input's), else a
// ValueError naming it and what it is.
inline void evo_expect_tensor(const torch::Tensor& t, const char* name, int64_t dim, const torch::Device& device) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions, got ", t.dim(), " (shape ", t.sizes(),
                    ")");
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous (strides ", t.strides(), ")");
  TORCH_CHECK_VALUE(t.device() == device, name, ": on ", t.device(), ", expected ", device, " (the device of q)");
}

// A tensor of the dtype the kernel was compiled for, else a TypeError naming it, both dtypes and the signature.
inline void evo_expect_dtype(const torch::Tensor& t, const char* name, at::ScalarType want, const std::string& sig) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, name, ": dtype ", evo_dtype_name(t.scalar_type()),
                   ", but this kernel was compiled for ", evo_dtype_name(want), " (", sig, ")");
}

// The first tensor argument is on the kind of device this build runs on (CUDA build: a CUDA device; else the CPU).
inline void evo_expect_build_device(const torch::Tensor& t, const char* name) {
#ifdef EVO_WITH_CUDA
  TORCH_CHECK_VALUE(t.device().is_cuda(), name, ": on ", t.device(), ", this CUDA kernel needs CUDA tensors");
#else
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, ": on ", t.device(), ", this CPU kernel needs CPU tensors");
#endif
}
// What every attention binding checks first: q's device is the kind this build runs on; q, k, v, out are 4-D and
// k_scale, v_scale 1-D, all contiguous on q's device; q and out have the compiled Q dtype.
inline void evo_expect_attention_tensors(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& k_scale, const torch::Tensor& v_scale,
                                         const torch::Tensor& out, at::ScalarType q_dtype, const std::string& sig) {
  const auto device = q.device();
  evo_expect_build_device(q, "q");
  evo_expect_tensor(q, "q", 4, device);
  evo_expect_tensor(k, "k", 4, device);
  evo_expect_tensor(v, "v", 4, device);
  evo_expect_tensor(out, "out", 4, device);
  evo_expect_tensor(k_scale, "k_scale", 1, device);
  evo_expect_tensor(v_scale, "v_scale", 1, device);
  evo_expect_dtype(q, "q", q_dtype, sig);
  TORCH_CHECK_TYPE(out.scalar_type() == q_dtype, "out: dtype ", evo_dtype_name(out.scalar_type()), " must match q (",
                   evo_dtype_name(q_dtype), ")");
}
inline at::ScalarType evo_signature_dtype(const EvoSignature& sig, const char* key, const char* fallback) {
  auto it = sig.find(key);
  return evo_dtype_named(it == sig.end() ? std::string(fallback) : it->second);
}

// Creates extension module `name` (with `signature` as a dict attribute) and lets `define(module)` add its
// functions. The module definition and its name must outlive the module: they are leaked on purpose (one per
// candidate).
template <typename Define>
PyObject* evo_make_candidate_module(const char* name, const char* doc, const char* signature, Define define) {
  auto* def = new pybind11::module_::module_def();
  std::memset(def, 0, sizeof(*def));
  const char* owned_name = strdup(name);
  try {
    auto m = pybind11::module_::create_extension_module(owned_name, doc, def);
    pybind11::dict sig;
    for (const auto& kv : evo_parse_signature(signature)) sig[pybind11::str(kv.first)] = pybind11::str(kv.second);
    m.attr("signature") = sig;
    define(m);
    return m.release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
}

// Runs `call(stream)` (the kernel entry point) on `device` and its current stream (nullptr on the CPU), without the
// GIL; returns the entry point's status.
template <typename Call>
int evo_call_on_stream(const torch::Device& device, Call call) {
  void* stream = nullptr;
#ifdef EVO_WITH_CUDA
  const c10::cuda::CUDAGuard guard(device);
  stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
#endif
  pybind11::gil_scoped_release nogil;
  return call(stream);
}

// The signature of an attention kernel (sdpa, decode families): HEAD_DIM, Q_DTYPE (default float16), KV_DTYPE
// (default Q_DTYPE).
struct EvoAttentionSignature {
  int64_t head_dim = 0;
  at::ScalarType q_dtype = at::kHalf, kv_dtype = at::kHalf;
  std::string text;
};
inline void evo_read_attention_signature(EvoAttentionSignature& sig) {
  const auto parsed = evo_parse_signature(sig.text.c_str());
  sig.head_dim = evo_signature_int(parsed, "HEAD_DIM");
  sig.q_dtype = evo_signature_dtype(parsed, "Q_DTYPE", "float16");
  sig.kv_dtype = evo_signature_dtype(parsed, "KV_DTYPE", parsed.count("Q_DTYPE") ? parsed.at("Q_DTYPE").c_str()
                                                                                   : "float16");
}
