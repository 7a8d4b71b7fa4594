// Torch binding of the SDPA (attention forward) family, compiled ONCE per family and toolchain (it is the slow part:
// torch headers). Each candidate's shared library links against it and, from its PyInit_<name>, hands over its
// kernel entry point and the signature it was compiled for; this file turns that into a Python module with
// `forward(...)` that refuses, with a ValueError/TypeError naming the argument and both values, any input the
// kernel was not compiled for (head dim, Q and K/V dtypes).

#include "candidate_module.h"
#include "cubin_module.h"
#ifdef EVO_WITH_CUDA
#include <cudaTypedefs.h>

#include "tma_host.h"
#endif

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

namespace {

// Entry point every SDPA template exports as extern "C" evo_sdpa_forward. q/out [B, H, Sq, D] in Q_DTYPE, k/v
// [B, H, Sk, D] in KV_DTYPE, k_scale/v_scale float32 [H] (dequantization scales, ignored unless KV is FP8).
using SdpaForwardFn = int (*)(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
                              void* out, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale,
                              void* stream);

struct SdpaCubin;

struct SdpaSignature : EvoAttentionSignature {
  SdpaForwardFn fn = nullptr;        // a candidate with host code: its entry point
  std::shared_ptr<SdpaCubin> cubin;  // a device-only candidate: its cubin and the family's launch of it
};

#ifdef EVO_WITH_CUDA
// ---- device-only candidates (issue 52): the launch evo_sdpa_forward does in each template with host code
// (templates/cuda/sdpa.cu.j2, the plain kernel; sdpa_hopper.cu.j2, TMA + wgmma), here once for the family, driven by
// the traits the cubin exports (EVO_TRAIT; `kind` says which template).
struct SdpaPlainParams {  // sdpa.cu.j2's Params (its size and the offset of scale_log2 are traits, checked at load)
  const void* q;
  const void* k;
  const void* v;
  const float* k_scale;
  const float* v_scale;
  void* out;
  int H, Sq, Sk, causal;
  int num_qblocks, num_items;
  float scale_log2;
};
struct SdpaHopperParamsHead {  // sdpa_hopper.cu.j2's Params up to num_tiles; sched and scale_log2 at their offsets
  void* out;
  const float* k_scale;
  const float* v_scale;
  int Sq, Sk, BH, H, causal;
  int num_mblocks, num_groups, num_tiles;
};

struct SdpaCubin {
  static constexpr int64_t kPlain = 1, kHopper = 2;
  static constexpr int kParamsCapacity = 256;
  std::shared_ptr<const EvoCubin> module;
  EvoKernel kernel;
  int64_t kind, params_bytes, off_sched = -1, off_scale_log2, threads, smem_bytes, block_m, kv_rows_per_cta = 0,
      cluster = 1, head_dim = 0, row_bytes = 0, box_cols = 0, launch_slots = 0, graph_slots = 0;
  bool persistent, dynamic = false, fp8, bf16 = false;
  CUdeviceptr counters = 0;  // plain + persistent: the work counter; hopper + dynamic: the launches' counter slots
  int resident = -1;         // plain: blocks resident at once; hopper: clusters resident at once
  std::atomic<unsigned> launches{0}, captures{0};

  SdpaCubin(const std::string& image, int device, const std::string& where)
      : module(std::make_shared<const EvoCubin>(image, device, where)) {
    const EvoCubin& m = *module;
    kind = m.trait("kind");
    params_bytes = m.trait("params_bytes");
    off_scale_log2 = m.trait("off_scale_log2");
    threads = m.trait("threads");
    smem_bytes = m.trait("smem_bytes");
    block_m = m.trait("block_m");
    persistent = m.trait("persistent") != 0;
    fp8 = m.trait("fp8") != 0;
    size_t bytes = 0;
    if (kind == kPlain) {
      if (params_bytes != static_cast<int64_t>(sizeof(SdpaPlainParams)) ||
          off_scale_log2 != static_cast<int64_t>(offsetof(SdpaPlainParams, scale_log2)))
        throw std::runtime_error(where + ": its Params is not the launcher's (" + std::to_string(params_bytes) +
                                 " bytes)");
      kernel = EvoKernel(module, m.function("evo_sdpa_kernel"));
      if (persistent) counters = m.global("evo_sdpa_next_item", bytes);
    } else if (kind == kHopper) {
      off_sched = m.trait("off_sched");
      kv_rows_per_cta = m.trait("kv_rows_per_cta");
      cluster = m.trait("cluster");
      dynamic = m.trait("dynamic") != 0;
      bf16 = m.trait("bf16") != 0;
      head_dim = m.trait("head_dim");
      row_bytes = m.trait("row_bytes");
      box_cols = m.trait("box_cols");
      launch_slots = m.trait("launch_slots");
      graph_slots = m.trait("graph_slots");
      const auto inside = [&](int64_t off, size_t n) {
        // from the end of the head's last member (sizeof may add trailing padding a later member can occupy)
        return off >= static_cast<int64_t>(offsetof(SdpaHopperParamsHead, num_tiles) + sizeof(int)) &&
               off + static_cast<int64_t>(n) <= params_bytes;
      };
      if (params_bytes > kParamsCapacity || !inside(off_scale_log2, sizeof(float)) ||
          (dynamic && !inside(off_sched, sizeof(void*))) || cluster < 1)
        throw std::runtime_error(where + ": its Params is not the launcher's (" + std::to_string(params_bytes) +
                                 " bytes)");
      kernel = EvoKernel(module, m.function("evo_sdpa_hopper_kernel"));
      if (dynamic) {
        counters = m.global("evo_sdpa_tile_counters", bytes);
        if (bytes < 2 * sizeof(unsigned) * static_cast<size_t>(launch_slots + graph_slots) || launch_slots < 1 ||
            graph_slots < 1)
          throw std::runtime_error(where + ": its tile counters do not hold its launch slots");
      }
    } else {
      throw std::runtime_error(where + ": an SDPA cubin of unknown kind " + std::to_string(kind));
    }
  }

  // The status codes of evo_sdpa_forward (0 ok; 1 bad sizes; 2 null pointer; 3 too large; 4 misaligned; plain: 5
  // does not fit on an SM; hopper: 6 tensor map refused, 7 no tensor-map encoder, 8 no cluster fits; else a CUDA
  // error).
  int launch(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale, void* out,
             int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale, void* stream) {
    if (B < 0 || H < 0 || Sq < 0 || Sk < 0) return 1;
    if (B == 0 || H == 0 || Sq == 0) return 0;
    if (Sk == 0) return 1;
    if (!q || !k || !v || !out || (fp8 && (!k_scale || !v_scale))) return 2;
    const auto misaligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
    if (misaligned(q) || misaligned(k) || misaligned(v) || misaligned(out)) return 4;
    return kind == kPlain ? launch_plain(q, k, v, k_scale, v_scale, out, B, H, Sq, Sk, causal, softmax_scale, stream)
                          : launch_hopper(q, k, v, k_scale, v_scale, out, B, H, Sq, Sk, causal, softmax_scale, stream);
  }

 private:
  int launch_plain(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
                   void* out, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale,
                   void* stream) {
    const int64_t num_qblocks = (Sq + block_m - 1) / block_m;
    const int64_t kLim = 0x7fffffffLL;
    if (B * H > kLim / num_qblocks || Sq > kLim || Sk > kLim) return 3;
    if (resident < 0) {
      int sms = 0, per_sm = 0;
      const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, module->device());
      if (e != cudaSuccess) return static_cast<int>(e);
      const int rc = kernel.blocks_per_sm(static_cast<int>(threads), static_cast<int>(smem_bytes), per_sm);
      if (rc != 0) return rc;
      if (per_sm < 1) return 5;
      resident = sms * per_sm;
    }
    SdpaPlainParams p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.out = out;
    p.H = static_cast<int>(H);
    p.Sq = static_cast<int>(Sq);
    p.Sk = static_cast<int>(Sk);
    p.causal = causal ? 1 : 0;
    p.num_qblocks = static_cast<int>(num_qblocks);
    p.num_items = static_cast<int>(num_qblocks * B * H);
    p.scale_log2 = softmax_scale * 1.4426950408889634f;
    int64_t grid = p.num_items;
    if (persistent) {
      if (grid > resident) grid = resident;
      const cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(counters), 0, sizeof(unsigned int),
                                            static_cast<cudaStream_t>(stream));
      if (e != cudaSuccess) return static_cast<int>(e);
    }
    void* args[] = {&p};
    return kernel.launch(static_cast<unsigned>(grid), static_cast<unsigned>(threads), static_cast<int>(smem_bytes),
                         stream, args);
  }

  int launch_hopper(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
                    void* out, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int causal, float softmax_scale,
                    void* stream) {
    const int64_t num_mblocks = (Sq + block_m - 1) / block_m;
    const int64_t num_groups = (num_mblocks + cluster - 1) / cluster;
    const int64_t kLim = 0x7fffffffLL;
    if (B * H > kLim / (num_groups * cluster) || Sq > kLim || Sk > kLim) return 3;
    if (resident < 0) {  // clusters resident at once: one per SM, or what the GPCs hold of larger clusters
      int sms = 0;
      const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, module->device());
      if (e != cudaSuccess) return static_cast<int>(e);
      int held = sms;
      if (cluster > 1) {
        const CUlaunchConfig c = EvoKernel::config(static_cast<unsigned>(cluster * sms), 1, 1,
                                                   static_cast<unsigned>(threads), static_cast<int>(smem_bytes),
                                                   nullptr, nullptr, 0);
        const int rc = kernel.max_active_clusters(c, held);
        if (rc != 0) return rc;
        if (held < 1) return 8;
      } else {
        int per_sm = 0;  // raises the kernel's dynamic shared memory limit (the answer itself is not used)
        const int rc = kernel.blocks_per_sm(static_cast<int>(threads), static_cast<int>(smem_bytes), per_sm);
        if (rc != 0) return rc;
      }
      if (!tensor_map_encoder()) return 7;
      resident = held;
    }
    CUtensorMap maps[3];
    const void* bases[3] = {q, k, v};
    const int64_t lens[3] = {Sq, Sk, Sk};
    const int64_t rows[3] = {block_m, kv_rows_per_cta, kv_rows_per_cta};
    for (int i = 0; i < 3; ++i)
      if (!encode_head_rows_map(&maps[i], tma_row_type(fp8, bf16), bases[i], head_dim, row_bytes, lens[i], B * H,
                                static_cast<int>(box_cols), static_cast<int>(rows[i])))
        return 6;
    alignas(16) unsigned char params[kParamsCapacity];
    std::memset(params, 0, sizeof(params));
    SdpaHopperParamsHead& p = *reinterpret_cast<SdpaHopperParamsHead*>(params);
    p.out = out;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.H = static_cast<int>(H);
    p.Sq = static_cast<int>(Sq);
    p.Sk = static_cast<int>(Sk);
    p.BH = static_cast<int>(B * H);
    p.causal = causal ? 1 : 0;
    p.num_mblocks = static_cast<int>(num_mblocks);
    p.num_groups = static_cast<int>(num_groups);
    p.num_tiles = static_cast<int>(num_groups * B * H);
    const float scale_log2 = softmax_scale * 1.4426950408889634f;
    std::memcpy(params + off_scale_log2, &scale_log2, sizeof(float));
    if (dynamic) {  // this launch's counter slot (the template's rotation: eager launches, then captured ones)
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
      if (e != cudaSuccess) return static_cast<int>(e);
      const uint64_t slot = capture == cudaStreamCaptureStatusActive
                                ? static_cast<uint64_t>(launch_slots) + captures.fetch_add(1u) % graph_slots
                                : launches.fetch_add(1u) % launch_slots;
      unsigned int* sched = reinterpret_cast<unsigned int*>(counters) + 2 * slot;
      std::memcpy(params + off_sched, &sched, sizeof(sched));
    }
    int64_t clusters = p.num_tiles;
    if (persistent && clusters > resident) clusters = resident;
    void* args[] = {&maps[0], &maps[1], &maps[2], params};
    return kernel.launch(static_cast<unsigned>(clusters * cluster), static_cast<unsigned>(threads),
                         static_cast<int>(smem_bytes), stream, args);
  }
};
#endif  // EVO_WITH_CUDA

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
#ifdef EVO_WITH_CUDA
  EVO_CHECK_VALUE(!sig.cubin || device.index() == sig.cubin->module->device(), "q: on ", device,
                  ", but this kernel was loaded on cuda:", sig.cubin->module->device());
#endif
  return evo_call_on_stream(device, [&](void* stream) {
#ifdef EVO_WITH_CUDA
    if (sig.cubin)
      return sig.cubin->launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(),
                               v_scale.data_ptr<float>(), out.data_ptr(), B, H, Sq, Sk, causal ? 1 : 0,
                               static_cast<float>(softmax_scale), stream);
#endif
    return sig.fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
                  out.data_ptr(), B, H, Sq, Sk, causal ? 1 : 0, static_cast<float>(softmax_scale), stream);
  });
}

}  // namespace

namespace {

// The module's functions over `sig` (an entry point's or a cubin's), from the signature text it holds.
void define_functions(PyObject* m, const std::shared_ptr<SdpaSignature>& sig) {
  evo_read_attention_signature(*sig);
  evo_add_function<SdpaSignature>(m, sig, {"forward",
      {"q", "k", "v", "k_scale", "v_scale", "out", "causal", "softmax_scale"},
      "Run the candidate kernel (q, k, v, k_scale, v_scale, out, causal, softmax_scale); returns its status code "
      "(0 = ok). Inputs it was not compiled for raise ValueError / TypeError.",
      [](SdpaSignature& s, const EvoArgs& a) {
        return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                      a.tensor(5), a.boolean(6), a.real(7)));
      }});
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer SDPA candidate", signature, [&](PyObject* m) {
    auto sig = std::make_shared<SdpaSignature>();
    sig->fn = reinterpret_cast<SdpaForwardFn>(entry);
    sig->text = signature;
    define_functions(m, sig);
  });
}

#ifdef EVO_WITH_CUDA
// A device-only candidate (its cubin at `path`, built for `signature`) loaded on CUDA device `device`, as a module
// with the same functions; ImportError naming the file when it does not load (called through ctypes.PyDLL).
extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_load_cubin(const char* name, const char* path,
                                                                                   int device, const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer SDPA candidate (device-only build)", signature,
                                   [&](PyObject* m) {
    auto sig = std::make_shared<SdpaSignature>();
    sig->text = signature;
    sig->cubin = std::make_shared<SdpaCubin>(evo_read_file(path), device, path);
    define_functions(m, sig);
  });
}
#endif
