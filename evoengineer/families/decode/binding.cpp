// Torch binding of the decode-attention family (evoengineer/tasks/decode.py), compiled ONCE per family and toolchain.
// Each candidate's shared library links against it and hands over its kernel entry point and the signature it was
// compiled for; this file turns that into a Python module with `forward(...)` that refuses, with a
// ValueError/TypeError naming the argument and both values, any input the kernel was not compiled for (head dim,
// Q and K/V dtypes, contiguous or paged KV cache) or that breaks the layout (GQA group, seq_lens, block_table).

#include "candidate_module.h"

#include <cstring>
#include <memory>
#include <string>

namespace {

// Entry point every decode template exports as extern "C" evo_decode_forward. q/out [B, Hq, Sq, D] in Q_DTYPE, k/v
// [B, Hkv, Sk, D] in KV_DTYPE, k_scale/v_scale float32 [Hkv], seq_lens int32 [B] (1 <= seq_lens[b] <= Sk). A paged
// kernel (signature KV_LAYOUT=paged) takes k/v as a pool [num_pages, page_size, Hkv, D] and block_table int32
// [B, max_pages], Sk = max_pages x page_size, and exports the prototype with block_table, page_size and num_pages
// (PagedForwardFn); a contiguous kernel keeps the prototype it had before paged caches (ContiguousForwardFn), so that
// kernels recorded then still load.
// Workspace protocol (split-KV partials): called with workspace == nullptr, a kernel that needs scratch memory
// launches nothing, writes the bytes it needs to *workspace_bytes and returns kNeedWorkspace; the binding allocates
// them from torch's caching allocator (stream-ordered, CUDA-graph safe) and calls again.
using ContiguousForwardFn = int (*)(const void* q, const void* k, const void* v, const float* k_scale,
                                    const float* v_scale, const int32_t* seq_lens, void* out, int64_t B, int64_t Hq,
                                    int64_t Hkv, int64_t Sq, int64_t Sk, float softmax_scale, void* workspace,
                                    int64_t* workspace_bytes, void* stream);
using PagedForwardFn = int (*)(const void* q, const void* k, const void* v, const float* k_scale,
                               const float* v_scale, const int32_t* seq_lens, const int32_t* block_table, void* out,
                               int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t page_size,
                               int64_t num_pages, float softmax_scale, void* workspace, int64_t* workspace_bytes,
                               void* stream);

struct DecodeSignature : EvoAttentionSignature {
  void* entry = nullptr;
  bool paged = false;
};

// Page sizes a paged kernel takes: powers of two (the kernel splits key numbers with a shift and a mask)
constexpr int64_t kMaxPageSize = 1 << 16;

int forward(const DecodeSignature& sig, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& k_scale, const torch::Tensor& v_scale, const torch::Tensor& seq_lens,
            const torch::Tensor* block_table, const torch::Tensor& out, double softmax_scale) {
  const auto device = q.device();
  evo_expect_attention_tensors(q, k, v, k_scale, v_scale, out, sig.q_dtype, sig.out_dtype, sig.text);
  evo_expect_tensor(seq_lens, "seq_lens", 1, device);
  evo_expect_dtype(k, "k", sig.kv_dtype, sig.text);
  evo_expect_dtype(v, "v", sig.kv_dtype, sig.text);
  EVO_CHECK_TYPE(k_scale.scalar_type() == at::ScalarType::Float && v_scale.scalar_type() == at::ScalarType::Float,
                   "k_scale, v_scale: must be float32, got ", evo_dtype_name(k_scale.scalar_type()), " and ",
                   evo_dtype_name(v_scale.scalar_type()));
  EVO_CHECK_TYPE(seq_lens.scalar_type() == at::ScalarType::Int, "seq_lens: must be int32, got ",
                   evo_dtype_name(seq_lens.scalar_type()));
  const int64_t B = q.size(0), Hq = q.size(1), Sq = q.size(2), D = q.size(3);
  EVO_CHECK_VALUE(D == sig.head_dim, "q: head dim ", D, " (size 3), but this kernel was compiled for head dim ",
                    sig.head_dim, " (", sig.text, ")");
  EVO_CHECK_VALUE(Sq >= 1 && Sq <= 16, "q: ", Sq, " query rows (size 2); this family decodes 1 to 16");
  int64_t Hkv, Sk, page_size = 0, num_pages = 0;
  if (sig.paged) {
    const torch::Tensor& bt = *block_table;
    evo_expect_tensor(bt, "block_table", 2, device);
    EVO_CHECK_TYPE(bt.scalar_type() == at::ScalarType::Int, "block_table: must be int32, got ",
                   evo_dtype_name(bt.scalar_type()));
    num_pages = k.size(0);
    page_size = k.size(1);
    Hkv = k.size(2);
    EVO_CHECK_VALUE(k.size(3) == D, "k: expected a page pool [num_pages, page_size, Hkv, D] with D = ", D,
                    " (from q), got ", k.sizes());
    EVO_CHECK_VALUE(num_pages > 0 && num_pages <= 0x7fffffffLL, "k: ", num_pages,
                    " pages (size 0); a pool holds 1 to 2^31 - 1");
    EVO_CHECK_VALUE(page_size > 0 && page_size <= kMaxPageSize && (page_size & (page_size - 1)) == 0, "k: page size ",
                    page_size, " (size 1); this kernel takes powers of two up to ", kMaxPageSize);
    EVO_CHECK_VALUE(bt.size(0) == B, "block_table: expected [B, max_pages] with B = ", B, " (from q), got ",
                    bt.sizes());
    EVO_CHECK_VALUE(bt.size(1) > 0, "block_table: no page per sequence (shape ", bt.sizes(), ")");
    EVO_CHECK_VALUE(bt.size(1) <= 0x7fffffffLL / page_size, "block_table: ", bt.size(1), " pages of ", page_size,
                    " keys per sequence is too long");
    Sk = bt.size(1) * page_size;
  } else {
    Hkv = k.size(1);
    Sk = k.size(2);
    EVO_CHECK_VALUE(k.size(0) == B && k.size(3) == D, "k: expected [B, Hkv, Sk, D] = [", B, ", Hkv, Sk, ", D,
                    "] (from q), got ", k.sizes());
  }
  EVO_CHECK_VALUE(Hkv > 0 && Hq % Hkv == 0, "k: ", Hkv, " KV heads (size ", sig.paged ? 2 : 1, ") do not divide the ", Hq,
                    " query heads of q (grouped-query attention needs Hq = G x Hkv)");
  EVO_CHECK_VALUE(v.sizes() == k.sizes(), "v: expected the shape of k ", k.sizes(), ", got ", v.sizes());
  EVO_CHECK_VALUE(out.sizes() == q.sizes(), "out: expected the shape of q ", q.sizes(), ", got ", out.sizes());
  EVO_CHECK_VALUE(k_scale.size(0) == Hkv && v_scale.size(0) == Hkv, "k_scale, v_scale: expected [Hkv] = [", Hkv,
                    "], got ", k_scale.sizes(), " and ", v_scale.sizes());
  EVO_CHECK_VALUE(seq_lens.size(0) == B, "seq_lens: expected [B] = [", B, "], got ", seq_lens.sizes());
  EVO_CHECK_VALUE(Sk > 0, "k: an empty cache (Sk = 0): softmax over nothing");
  if (B * Hq == 0) return 0;
  // the lengths are device data: a kernel clamps them to [1, Sk] and the task's inputs keep them there; checking
  // them here would cost a device-to-host copy per call
  return evo_call_on_stream(device, [&](void* stream) {
    return evo_with_workspace(q, [&](void* workspace, int64_t* bytes) {
      if (sig.paged)
        return reinterpret_cast<PagedForwardFn>(sig.entry)(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
            seq_lens.data_ptr<int32_t>(), block_table->data_ptr<int32_t>(), out.data_ptr(), B, Hq, Hkv, Sq, Sk,
            page_size, num_pages, static_cast<float>(softmax_scale), workspace, bytes, stream);
      return reinterpret_cast<ContiguousForwardFn>(sig.entry)(
          q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
          seq_lens.data_ptr<int32_t>(), out.data_ptr(), B, Hq, Hkv, Sq, Sk, static_cast<float>(softmax_scale),
          workspace, bytes, stream);
    });
  });
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer decode-attention candidate", signature, [&](PyObject* m) {
    auto sig = std::make_shared<DecodeSignature>();
    sig->entry = entry;
    sig->text = signature;
    evo_read_attention_signature(*sig);
    const auto parsed = evo_parse_signature(signature);
    const auto layout = parsed.find("KV_LAYOUT");
    sig->paged = layout != parsed.end() && layout->second == "paged";
    if (layout != parsed.end() && !sig->paged && layout->second != "contiguous")
      throw std::runtime_error("decode signature: KV_LAYOUT is 'contiguous' or 'paged', got '" + layout->second + "'");
    if (sig->paged) {
      evo_add_function<DecodeSignature>(m, sig, {"forward",
          {"q", "k", "v", "k_scale", "v_scale", "seq_lens", "block_table", "out", "softmax_scale"},
          "Run the candidate kernel on a paged KV cache (q, k, v [num_pages, page_size, Hkv, D], k_scale, v_scale, "
          "seq_lens, block_table [B, max_pages], out, softmax_scale); returns its status code (0 = ok). Inputs it "
          "was not compiled for raise ValueError / TypeError.",
          [](DecodeSignature& s, const EvoArgs& a) {
            const torch::Tensor& bt = a.tensor(6);
            return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                          a.tensor(5), &bt, a.tensor(7), a.real(8)));
          }});
    } else {
      evo_add_function<DecodeSignature>(m, sig, {"forward",
          {"q", "k", "v", "k_scale", "v_scale", "seq_lens", "out", "softmax_scale"},
          "Run the candidate kernel (q, k, v, k_scale, v_scale, seq_lens, out, softmax_scale); returns its status "
          "code (0 = ok). Inputs it was not compiled for raise ValueError / TypeError.",
          [](DecodeSignature& s, const EvoArgs& a) {
            return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                          a.tensor(5), nullptr, a.tensor(6), a.real(7)));
          }});
    }
  });
}
