// Torch binding of the SDPA (attention forward) family, compiled ONCE per family and toolchain (it is the slow part:
// torch headers). Each candidate's shared library links against it and, from its PyInit_<name>, hands over its
// kernel entry point and the signature it was compiled for; this file turns that into a Python module with
// `forward(...)` that refuses, with a ValueError/TypeError naming the argument and both values, any input the
// kernel was not compiled for (head dim, Q and K/V dtypes).

#include "candidate_module.h"

#include <cstring>
#include <memory>
#include <string>

namespace {

// Entry point every SDPA template exports as extern "C" evo_sdpa_forward. q/out [B, H, Sq, D] in Q_DTYPE, k/v
// [B, H, Sk, D] in KV_DTYPE, k_scale/v_scale float32 [H] (dequantization scales, ignored unless KV is FP8).
using SdpaForwardFn = int (*)(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
                              void* out, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale,
                              void* stream);

struct SdpaSignature : EvoAttentionSignature {
  SdpaForwardFn fn;
};

int forward(const SdpaSignature& sig, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& k_scale, const torch::Tensor& v_scale, const torch::Tensor& out, bool causal,
            double softmax_scale) {
  const auto device = q.device();
  evo_expect_attention_tensors(q, k, v, k_scale, v_scale, out, sig.q_dtype, sig.out_dtype, sig.text);
  evo_expect_dtype(k, "k", sig.kv_dtype, sig.text);
  evo_expect_dtype(v, "v", sig.kv_dtype, sig.text);
  EVO_CHECK_TYPE(k_scale.scalar_type() == at::ScalarType::Float && v_scale.scalar_type() == at::ScalarType::Float,
                   "k_scale, v_scale: must be float32, got ", evo_dtype_name(k_scale.scalar_type()), " and ",
                   evo_dtype_name(v_scale.scalar_type()));
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2);
  EVO_CHECK_VALUE(D == sig.head_dim, "q: head dim ", D, " (size 3), but this kernel was compiled for head dim ",
                    sig.head_dim, " (", sig.text, ")");
  EVO_CHECK_VALUE(k.size(0) == B && k.size(1) == H && k.size(3) == D, "k: expected [B, H, Sk, D] = [", B, ", ",
                    H, ", Sk, ", D, "] (from q), got ", k.sizes());
  EVO_CHECK_VALUE(v.sizes() == k.sizes(), "v: expected the shape of k ", k.sizes(), ", got ", v.sizes());
  EVO_CHECK_VALUE(out.sizes() == q.sizes(), "out: expected the shape of q ", q.sizes(), ", got ", out.sizes());
  EVO_CHECK_VALUE(k_scale.size(0) == H && v_scale.size(0) == H, "k_scale, v_scale: expected [H] = [", H,
                    "], got ", k_scale.sizes(), " and ", v_scale.sizes());
  EVO_CHECK_VALUE(Sk > 0 || Sq == 0 || B * H == 0, "k: no keys (Sk = 0) for ", Sq,
                    " queries: softmax over nothing");
  if (B * H * Sq == 0) return 0;
  return evo_call_on_stream(device, [&](void* stream) {
    return sig.fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
                  out.data_ptr(), B, H, Sq, Sk, causal ? 1 : 0, static_cast<float>(softmax_scale), stream);
  });
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer SDPA candidate", signature, [&](PyObject* m) {
    auto sig = std::make_shared<SdpaSignature>();
    sig->fn = reinterpret_cast<SdpaForwardFn>(entry);
    sig->text = signature;
    evo_read_attention_signature(*sig);
    evo_add_function<SdpaSignature>(m, sig, {"forward",
        {"q", "k", "v", "k_scale", "v_scale", "out", "causal", "softmax_scale"},
        "Run the candidate kernel (q, k, v, k_scale, v_scale, out, causal, softmax_scale); returns its status code "
        "(0 = ok). Inputs it was not compiled for raise ValueError / TypeError.",
        [](SdpaSignature& s, const EvoArgs& a) {
          return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                        a.tensor(5), a.boolean(6), a.real(7)));
        }});
  });
}
