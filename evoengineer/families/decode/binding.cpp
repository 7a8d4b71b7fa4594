// Torch binding of the decode-attention family (evoengineer/tasks/decode.py), compiled ONCE per family and toolchain.
// Each candidate's shared library links against it and hands over its kernel entry point and the signature it was
// compiled for; this file turns that into a Python module with `forward(...)` that refuses, with a
// ValueError/TypeError naming the argument and both values, any input the kernel was not compiled for (head dim,
// Q and K/V dtypes, contiguous or paged KV cache) or that breaks the layout (GQA group, seq_lens, block_table).

#include "candidate_module.h"
#include "cubin_module.h"
#ifdef EVO_WITH_CUDA
#include <cudaTypedefs.h>

#include "tma_host.h"
#endif

#include <cstddef>
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

struct DecodeCubin;

struct DecodeSignature : EvoAttentionSignature {
  void* entry = nullptr;                // a candidate with host code: its entry point
  std::shared_ptr<DecodeCubin> cubin;   // a device-only candidate: its cubin and the family's launch of it
  bool paged = false;
};

#ifdef EVO_WITH_CUDA
// ---- device-only candidates (issue 52): the launch evo_decode_forward does in a template with host code
// (templates/cuda/decode.cu.j2), here once for the family, driven by the traits the cubin exports (EVO_TRAIT).
// The template's Params up to box_shift (the offset of box_shift is a trait, checked at load); its optional members
// (the cluster flag, the TMA maps) go at the offsets the cubin exports.
struct DecodeParamsHead {
  const void* q;
  const uint8_t* k;
  const uint8_t* v;
  const float* k_scale;
  const float* v_scale;
  const int32_t* seq_lens;
  const int32_t* block_table;
  void* out;
  float* part_o;
  float* part_lse;
  unsigned int* counters;
  int Hq, Hkv, Sq, Sk, G;
  int rows;
  int chunks;
  int splits, split_keys;
  int combine_lanes;
  float scale_log2;
  int page_shift;
  int max_pages, num_pages;
  int box_shift;
};

struct DecodeCubin {
  static constexpr int kParamsCapacity = 1024;  // bytes of a kernel's Params the launcher holds (512 with TMA maps)
  std::shared_ptr<const EvoCubin> module;
  EvoKernel main, combine;
  int64_t params_bytes, off_cluster, off_tm_k, off_tm_v, threads, smem_alloc, rows, block_n, slice, head_dim,
      row_bytes, kv_bytes, split_waves, max_splits, combine_lanes, combine_unroll, combine_smem_bytes, cluster_max;
  bool combine_in_kernel, combine_dependent, combine_cluster, tma, paged, fp8, bf16;
  int resident = -1;            // CTAs of the kernel the device holds at once
  std::vector<int> held_clusters;  // per cluster size: clusters the device holds at once (-1: not asked yet)

  DecodeCubin(const std::string& image, int device, const std::string& where)
      : module(std::make_shared<const EvoCubin>(image, device, where)) {
    const EvoCubin& m = *module;
    params_bytes = m.trait("params_bytes");
    if (m.trait("off_box_shift") != static_cast<int64_t>(offsetof(DecodeParamsHead, box_shift)) ||
        params_bytes < static_cast<int64_t>(sizeof(DecodeParamsHead)) || params_bytes > kParamsCapacity)
      throw std::runtime_error(where + ": its Params (" + std::to_string(params_bytes) + " bytes, box_shift at " +
                               std::to_string(m.trait("off_box_shift")) + ") is not the launcher's (box_shift at " +
                               std::to_string(offsetof(DecodeParamsHead, box_shift)) + ", at most " +
                               std::to_string(kParamsCapacity) + " bytes)");
    off_cluster = m.trait("off_cluster");
    off_tm_k = m.trait("off_tm_k");
    off_tm_v = m.trait("off_tm_v");
    threads = m.trait("threads");
    smem_alloc = m.trait("smem_alloc");
    rows = m.trait("rows");
    block_n = m.trait("block_n");
    slice = m.trait("slice");
    head_dim = m.trait("head_dim");
    row_bytes = m.trait("row_bytes");
    kv_bytes = m.trait("kv_bytes");
    split_waves = m.trait("split_waves");
    max_splits = m.trait("max_splits");
    combine_lanes = m.trait("combine_lanes");
    combine_unroll = m.trait("combine_unroll");
    combine_smem_bytes = m.trait("combine_smem_bytes");
    cluster_max = m.trait("cluster_max");
    combine_in_kernel = m.trait("combine_in_kernel") != 0;
    combine_dependent = m.trait("combine_dependent") != 0;
    combine_cluster = m.trait("combine_cluster") != 0;
    tma = m.trait("tma") != 0;
    paged = m.trait("paged") != 0;
    fp8 = m.trait("fp8") != 0;
    bf16 = m.trait("bf16") != 0;
    // the optional members start where the head's last member ends, which may be inside sizeof(DecodeParamsHead):
    // its trailing padding (an int after box_shift sits there)
    const int64_t head_end = static_cast<int64_t>(offsetof(DecodeParamsHead, box_shift) + sizeof(int));
    const auto inside = [&](int64_t off, size_t bytes) {
      return off >= head_end &&
             off + static_cast<int64_t>(bytes) <= params_bytes;
    };
    if ((combine_cluster && !inside(off_cluster, sizeof(int))) ||
        (tma && (!inside(off_tm_k, sizeof(CUtensorMap)) || !inside(off_tm_v, sizeof(CUtensorMap)))))
      throw std::runtime_error(where + ": its Params' optional members lie outside it");
    held_clusters.assign(static_cast<size_t>(cluster_max + 1), -1);
    main = EvoKernel(module, m.function("evo_decode_kernel"));
    combine = EvoKernel(module, m.function("evo_decode_combine_kernel"));
  }

  // clusters of `size` CTAs the device holds at once (0: none fit, or the query failed), asked once per size;
  // sizes above 8 are non-portable: allowed once, else they count as not fitting
  int resident_clusters(int size) {
    if (size < 1 || size > cluster_max) return 0;
    int& held = held_clusters[static_cast<size_t>(size)];
    if (held < 0) {
      held = 0;
      if (size > 8 && main.set_attribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1) != 0) return 0;
      CUlaunchAttribute attr[1];
      attr[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr[0].value.clusterDim.x = static_cast<unsigned>(size);
      attr[0].value.clusterDim.y = 1;
      attr[0].value.clusterDim.z = 1;
      const CUlaunchConfig c = EvoKernel::config(static_cast<unsigned>(size), 1, 1, static_cast<unsigned>(threads),
                                                 static_cast<int>(smem_alloc), nullptr, attr, 1);
      int n = 0;
      if (main.max_active_clusters(c, n) == 0) held = n;
    }
    return held;
  }

  // The status codes of evo_decode_forward (templates/cuda/decode.cu.j2: 0 launched; 1 bad sizes; 2 null pointer;
  // 3 too large; 4 misaligned; 5 does not fit on an SM; 6 workspace needed; 7 paged / contiguous mismatch; 8 tensor
  // maps refused; else a CUDA error).
  int launch(const void* q, const void* k, const void* v, const float* k_scale, const float* v_scale,
             const int32_t* seq_lens, const int32_t* block_table, void* out, int64_t B, int64_t Hq, int64_t Hkv,
             int64_t Sq, int64_t Sk, int64_t page_size, int64_t num_pages, float softmax_scale, void* workspace,
             int64_t* workspace_bytes, void* stream) {
    if ((block_table != nullptr) != paged) return 7;
    if (B < 0 || Hq < 0 || Hkv <= 0 || Sq < 1 || Sq > 16 || Sk < 1 || Hq % Hkv) return 1;
    int page_shift = 0;
    if (paged) {
      if (page_size < 1 || (page_size & (page_size - 1)) || Sk % page_size || num_pages < 1) return 1;
      while ((int64_t{1} << page_shift) < page_size) ++page_shift;
    }
    if (B == 0 || Hq == 0) return 0;
    if (!q || !k || !v || !out || !seq_lens || !workspace_bytes || (fp8 && (!k_scale || !v_scale))) return 2;
    const auto misaligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
    if (misaligned(q) || misaligned(k) || misaligned(v) || misaligned(out)) return 4;
    const int64_t G = Hq / Hkv, group_rows = G * Sq, chunks = (group_rows + rows - 1) / rows;
    const int64_t kLim = 0x7fffffffLL;
    if (B > 65535 || Hkv * chunks > 65535 || Sk > kLim / row_bytes) return 3;
    if (num_pages > kLim) return 3;

    if (resident < 0) {
      int sms = 0, per_sm = 0;
      const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, module->device());
      if (e != cudaSuccess) return static_cast<int>(e);
      const int rc = main.blocks_per_sm(static_cast<int>(threads), static_cast<int>(smem_alloc), per_sm);
      if (rc != 0) return rc;
      if (per_sm < 1) return 5;
      resident = sms * per_sm;
    }
    // the split policy of the template (kSplitWaves full waves of resident CTAs, every CTA a tile, at most
    // kMaxSplits partials)
    const int64_t groups = B * Hkv * chunks;
    const int64_t tiles = (Sk + block_n - 1) / block_n;
    int64_t splits = split_waves * resident / groups;
    splits = splits < 1 ? 1 : (splits > tiles ? tiles : splits);
    if (splits > max_splits) splits = max_splits;
    const int64_t split_tiles = (tiles + splits - 1) / splits;
    splits = (tiles + split_tiles - 1) / split_tiles;
    if (splits > 65535) return 3;

    alignas(64) unsigned char params[kParamsCapacity];
    std::memset(params, 0, sizeof(params));
    DecodeParamsHead& p = *reinterpret_cast<DecodeParamsHead*>(params);
    p.q = q;
    p.k = static_cast<const uint8_t*>(k);
    p.v = static_cast<const uint8_t*>(v);
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.seq_lens = seq_lens;
    p.block_table = block_table;
    p.page_shift = page_shift;
    p.max_pages = paged ? static_cast<int>(Sk / page_size) : 0;
    p.num_pages = static_cast<int>(num_pages);
    p.out = out;
    p.Hq = static_cast<int>(Hq);
    p.Hkv = static_cast<int>(Hkv);
    p.Sq = static_cast<int>(Sq);
    p.Sk = static_cast<int>(Sk);
    p.G = static_cast<int>(G);
    p.rows = static_cast<int>(group_rows);
    p.chunks = static_cast<int>(chunks);
    p.splits = static_cast<int>(splits);
    p.split_keys = static_cast<int>(split_tiles * block_n);
    p.combine_lanes = 1;
    while (p.combine_lanes < combine_lanes && 2 * p.combine_lanes * combine_unroll <= splits) p.combine_lanes *= 2;
    p.scale_log2 = softmax_scale * 1.4426950408889634f;
    p.part_o = nullptr;
    p.part_lse = nullptr;
    p.counters = nullptr;
    p.box_shift = 0;
    bool cluster = false;
    if (combine_cluster) {
      cluster = splits > 1 && splits <= cluster_max &&
                groups <= split_waves * static_cast<int64_t>(resident_clusters(static_cast<int>(splits)));
      const int flag = cluster ? 1 : 0;
      std::memcpy(params + off_cluster, &flag, sizeof(flag));
    }
    if (tma) {
      CUtensorMap maps[2];
      const void* bases[2] = {k, v};
      if (paged) {
        int slice_shift = 0;
        while ((int64_t{1} << slice_shift) < slice) ++slice_shift;
        p.box_shift = page_shift < slice_shift ? page_shift : slice_shift;
        if (num_pages * page_size > kLim) return 3;
        const int64_t dims[3] = {head_dim, Hkv, num_pages * page_size};
        const int64_t strides[2] = {row_bytes, Hkv * row_bytes};
        const int box[3] = {static_cast<int>(128 / kv_bytes), 1, 1 << p.box_shift};
        for (int i = 0; i < 2; ++i)
          if (!encode_swizzled_map_3d(&maps[i], tma_row_type(fp8, bf16), bases[i], dims, strides, box)) return 8;
      } else {
        for (int i = 0; i < 2; ++i)
          if (!encode_head_rows_map(&maps[i], tma_row_type(fp8, bf16), bases[i], head_dim, row_bytes, Sk, B * Hkv,
                                    static_cast<int>(128 / kv_bytes), static_cast<int>(slice)))
            return 8;
      }
      std::memcpy(params + off_tm_k, &maps[0], sizeof(CUtensorMap));
      std::memcpy(params + off_tm_v, &maps[1], sizeof(CUtensorMap));
    }
    if (splits > 1 && !cluster) {
      const int64_t o_bytes = groups * splits * rows * head_dim * 4;
      const int64_t lse_bytes = (groups * splits * rows * 4 + 15) / 16 * 16;
      const int64_t counter_bytes = combine_in_kernel ? groups * 4 : 0;
      const int64_t need = o_bytes + lse_bytes + counter_bytes;
      if (!workspace || *workspace_bytes < need || misaligned(workspace)) {
        *workspace_bytes = need;
        return 6;
      }
      char* ws = static_cast<char*>(workspace);
      p.part_o = reinterpret_cast<float*>(ws);
      p.part_lse = reinterpret_cast<float*>(ws + o_bytes);
      if (combine_in_kernel) {
        p.counters = reinterpret_cast<unsigned int*>(ws + o_bytes + lse_bytes);
        const cudaError_t e = cudaMemsetAsync(p.counters, 0, static_cast<size_t>(counter_bytes),
                                              static_cast<cudaStream_t>(stream));
        if (e != cudaSuccess) return static_cast<int>(e);
      }
    }
    void* args[] = {params};
    const unsigned gx = static_cast<unsigned>(splits), gy = static_cast<unsigned>(Hkv * chunks),
                   gz = static_cast<unsigned>(B);
    int rc;
    if (cluster) {
      CUlaunchAttribute attr[1];
      attr[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr[0].value.clusterDim.x = gx;
      attr[0].value.clusterDim.y = 1;
      attr[0].value.clusterDim.z = 1;
      rc = main.launch_ex(EvoKernel::config(gx, gy, gz, static_cast<unsigned>(threads), static_cast<int>(smem_alloc),
                                            stream, attr, 1), args);
    } else {
      rc = main.launch3(gx, gy, gz, static_cast<unsigned>(threads), static_cast<int>(smem_alloc), stream, args);
    }
    if (rc != 0) return rc;
    if (splits > 1 && !combine_in_kernel && !cluster) {
      const unsigned row_ctas = static_cast<unsigned>(group_rows < rows ? group_rows : rows);
      const int lane_threads = static_cast<int>(head_dim / 4) * p.combine_lanes;
      const unsigned cblock = static_cast<unsigned>(lane_threads < 32 ? 32 : lane_threads);
      const unsigned cx = static_cast<unsigned>(Hkv * chunks), cy = static_cast<unsigned>(B);
      if (combine_dependent) {
        CUlaunchAttribute attr[1];
        attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;  // programmatic dependent launch
        attr[0].value.programmaticStreamSerializationAllowed = 1;
        rc = combine.launch_ex(EvoKernel::config(cx, cy, row_ctas, cblock, static_cast<int>(combine_smem_bytes),
                                                 stream, attr, 1), args);
      } else {
        rc = combine.launch3(cx, cy, row_ctas, cblock, static_cast<int>(combine_smem_bytes), stream, args);
      }
    }
    return rc;
  }
};
#endif  // EVO_WITH_CUDA

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
#ifdef EVO_WITH_CUDA
  EVO_CHECK_VALUE(!sig.cubin || device.index() == sig.cubin->module->device(), "q: on ", device,
                  ", but this kernel was loaded on cuda:", sig.cubin->module->device());
#endif
  return evo_call_on_stream(device, [&](void* stream) {
    return evo_with_workspace(q, [&](void* workspace, int64_t* bytes) {
#ifdef EVO_WITH_CUDA
      if (sig.cubin)
        return sig.cubin->launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_scale.data_ptr<float>(),
                                 v_scale.data_ptr<float>(), seq_lens.data_ptr<int32_t>(),
                                 sig.paged ? block_table->data_ptr<int32_t>() : nullptr, out.data_ptr(), B, Hq, Hkv,
                                 Sq, Sk, page_size, num_pages, static_cast<float>(softmax_scale), workspace, bytes,
                                 stream);
#endif
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

// The module's functions over `sig` (an entry point's or a cubin's), from the signature text it holds.
void define_functions(PyObject* m, const std::shared_ptr<DecodeSignature>& sig) {
  evo_read_attention_signature(*sig);
  const auto parsed = evo_parse_signature(sig->text.c_str());
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
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer decode-attention candidate", signature, [&](PyObject* m) {
    auto sig = std::make_shared<DecodeSignature>();
    sig->entry = entry;
    sig->text = signature;
    define_functions(m, sig);
  });
}

#ifdef EVO_WITH_CUDA
// A device-only candidate (its cubin at `path`, built for `signature`) loaded on CUDA device `device`, as a module
// with the same functions; ImportError naming the file when it does not load (called through ctypes.PyDLL).
extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_load_cubin(const char* name, const char* path,
                                                                                   int device, const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer decode-attention candidate (device-only build)", signature,
                                   [&](PyObject* m) {
    auto sig = std::make_shared<DecodeSignature>();
    sig->text = signature;
    sig->cubin = std::make_shared<DecodeCubin>(evo_read_file(path), device, path);
    define_functions(m, sig);
    if (sig->cubin->paged != sig->paged)
      throw std::runtime_error(std::string(path) + ": a " + (sig->cubin->paged ? "paged" : "contiguous") +
                               " kernel, but the signature says " + (sig->paged ? "paged" : "contiguous") + " (" +
                               signature + ")");
  });
}
#endif
