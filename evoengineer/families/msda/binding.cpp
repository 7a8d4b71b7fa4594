// Torch binding of the MSDA family, compiled ONCE per family and toolchain (it is the slow part: torch headers).
// Each candidate's shared library links against it and, from its PyInit_<name>, hands over its kernel entry point
// and the signature it was compiled for; this file turns that into a Python module with `forward(...)` that refuses,
// with a ValueError/TypeError naming the argument and both values, any input the kernel was not compiled for.

#include "candidate_module.h"
#include "cubin_module.h"

#include <memory>
#include <optional>
#include <string>

namespace {

// Entry point every MSDA template exports as extern "C" evo_msda_forward_v2 (value/output typed by the family).
// value_layout 0: value [N, S, M, D]; 1: head-major [N, M, S, D] (a kernel that reads only the first returns
// kLayoutUnsupported). Workspace protocol: called with workspace == nullptr, a kernel that needs scratch memory (a
// head-major copy of value) launches nothing, writes the bytes it needs to *workspace_bytes and returns
// kNeedWorkspace; the binding allocates them from torch's caching allocator (stream-ordered) and calls again.
using MsdaForwardFn = int (*)(const void* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                              const float* sampling_locations, const float* attention_weights, void* output,
                              int64_t N, int64_t S, int64_t M, int64_t Lq, int64_t value_layout, void* workspace,
                              int64_t* workspace_bytes, void* stream);
constexpr int kLayoutUnsupported = 7;

// What the kernel was compiled for (the space's signature), plus the index tensors last found valid: the same
// tensor objects, unmodified since (version counter), are not read back again (on a GPU that read is a sync).
struct MsdaCubin;

struct MsdaState {
  MsdaForwardFn fn = nullptr;             // a candidate with host code: its entry point
  std::shared_ptr<MsdaCubin> cubin;       // a device-only candidate: its cubin and the family's launch of it
  int64_t L, P, D;
  at::ScalarType value_dtype;
  std::string signature;
  EvoCheckedTensor shapes_ok, starts_ok;
};

#ifdef EVO_WITH_CUDA
// ---- device-only candidates (issue 52): the launch evo_msda_forward_v2 does in a template with host code, here
// once for the family, driven by the traits the cubin exports (templates/cuda/msda.cu.j2, EVO_TRAIT)
struct MsdaParams {  // layout of the template's Params (its size is a trait, checked at load)
  const void* value;
  const int64_t* shapes;
  const int64_t* starts;
  const float* loc;
  const float* attn;
  void* out;
  int M;
  unsigned S, Lq, LqM, SM, total_items, total_samples, num_tiles;
};

struct MsdaCubin {
  std::shared_ptr<const EvoCubin> module;
  EvoKernel forward, window, wpipe, head_major;
  bool has_head_major, branch_free, persistent;
  int64_t lp, row_bytes, row_pieces, threads, dyn_bytes, win_threads, win_dyn_bytes, wp_threads, wp_dyn_bytes,
      tile_items;

  MsdaCubin(const std::string& image, int device, const std::string& where)
      : module(std::make_shared<const EvoCubin>(image, device, where)) {
    const EvoCubin& m = *module;
    if (m.trait("params_bytes") != static_cast<int64_t>(sizeof(MsdaParams)))
      throw std::runtime_error(where + ": its Params is " + std::to_string(m.trait("params_bytes")) +
                               " bytes, the launcher's " + std::to_string(sizeof(MsdaParams)));
    has_head_major = m.trait("head_major") != 0;
    branch_free = m.trait("branch_free") != 0;
    persistent = m.trait("persistent") != 0;
    lp = m.trait("lp");
    row_bytes = m.trait("row_bytes");
    row_pieces = m.trait("row_pieces");
    threads = m.trait("threads");
    dyn_bytes = m.trait("dyn_bytes");
    tile_items = m.trait("tile_items");
    win_threads = m.trait("win_threads");
    win_dyn_bytes = m.trait("win_dyn_bytes");
    wp_threads = m.trait("wp_threads");
    wp_dyn_bytes = m.trait("wp_dyn_bytes");
    forward = EvoKernel(module, m.function("msda_forward_kernel"));
    if (m.trait("window")) window = EvoKernel(module, m.function("msda_window_kernel"));
    if (m.trait("wpipe")) wpipe = EvoKernel(module, m.function("msda_wpipe_kernel"));
    if (has_head_major) head_major = EvoKernel(module, m.function("head_major_kernel"));
  }

  // The status codes of evo_msda_forward_v2 (0 ok, 1-4 refused sizes / pointers / alignment, 6 workspace needed,
  // 7 layout unsupported; else a CUDA error).
  int launch(const void* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
             const float* sampling_locations, const float* attention_weights, void* output, int64_t N, int64_t S,
             int64_t M, int64_t Lq, int64_t value_layout, void* workspace, int64_t* workspace_bytes, void* stream) {
    if (value_layout != 0 && (value_layout != 1 || !has_head_major)) return 7;
    if (N < 0 || S < 0 || M < 0 || Lq < 0) return 1;
    if (N == 0 || M == 0 || Lq == 0) return 0;
    if (S == 0) return 1;
    if (!value || !spatial_shapes || !level_start_index || !sampling_locations || !attention_weights || !output)
      return 2;
    const int64_t total_items = N * Lq * M;
    const int64_t kLim = 0x7fffffffLL;
    if (Lq > kLim / M || N > kLim / (Lq * M) || total_items > kLim / (2 * lp) || S > kLim / M || N > kLim / (S * M))
      return 3;
    if (branch_free && S * M >= (1LL << 29)) return 3;
    const auto misaligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) != 0; };
    if (misaligned(value) || misaligned(output) || misaligned(sampling_locations) || misaligned(attention_weights))
      return 4;
    if (has_head_major && value_layout == 0) {
      const int64_t need = N * S * M * row_bytes;
      if (!workspace_bytes) return 2;
      if (!workspace || *workspace_bytes < need || misaligned(workspace)) {
        *workspace_bytes = need;
        return 6;
      }
      unsigned long long pieces = static_cast<unsigned long long>(N * S * M) * static_cast<unsigned long long>(row_pieces);
      int sms = 0;
      const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, module->device());
      if (e != cudaSuccess) return static_cast<int>(e);
      const unsigned long long want = (pieces + 255) / 256, cap = static_cast<unsigned long long>(sms) * 8;
      const void* src = value;
      void* dst = workspace;
      unsigned long long s_ull = static_cast<unsigned long long>(S), m_ull = static_cast<unsigned long long>(M);
      void* args[] = {&src, &dst, &s_ull, &m_ull, &pieces};
      const int rc = head_major.launch(static_cast<unsigned>(want < cap ? want : cap), 256, 0, stream, args);
      if (rc != 0) return rc;
      value = workspace;
    }
    MsdaParams p;
    p.value = value;
    p.shapes = spatial_shapes;
    p.starts = level_start_index;
    p.loc = sampling_locations;
    p.attn = attention_weights;
    p.out = output;
    p.M = static_cast<int>(M);
    p.S = static_cast<unsigned>(S);
    p.Lq = static_cast<unsigned>(Lq);
    p.LqM = static_cast<unsigned>(Lq * M);
    p.SM = static_cast<unsigned>(S * M);
    p.total_items = static_cast<unsigned>(total_items);
    p.total_samples = static_cast<unsigned>(total_items * lp);
    p.num_tiles = static_cast<unsigned>((total_items + tile_items - 1) / tile_items);
    void* args[] = {&p};
    // every value position a query (the encoder's self-attention): a query-window path where the kernel has one
    // (window metadata codes need S * M < 2^28)
    EvoKernel* win = window ? &window : (wpipe ? &wpipe : nullptr);
    if (win != nullptr && Lq == S && S * M < (1LL << 28)) {
      const int t = static_cast<int>(window ? win_threads : wp_threads);
      const int dyn = static_cast<int>(window ? win_dyn_bytes : wp_dyn_bytes);
      int blocks = 0;
      const int rc = win->resident_grid(t, dyn, blocks);
      if (rc != 0) return rc;
      return win->launch(static_cast<unsigned>(blocks), static_cast<unsigned>(t), dyn, stream, args);
    }
    unsigned grid = p.num_tiles;
    if (persistent) {
      int cap = 0;
      const int rc = forward.resident_grid(static_cast<int>(threads), static_cast<int>(dyn_bytes), cap);
      if (rc != 0) return rc;
      if (static_cast<unsigned>(cap) < grid) grid = static_cast<unsigned>(cap);
    }
    return forward.launch(grid, static_cast<unsigned>(threads), static_cast<int>(dyn_bytes), stream, args);
  }
};
#endif  // EVO_WITH_CUDA

void expect(const torch::Tensor& t, const char* name, int64_t dim, const char* layout, const torch::Device& device) {
  EVO_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions ", layout, ", got ", t.dim(), " (shape ",
                    t.sizes(), ")");
  EVO_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous (strides ", t.strides(), ")");
  EVO_CHECK_VALUE(t.device() == device, name, ": on ", t.device(), ", value is on ", device);
}

void expect_size(const torch::Tensor& t, const char* name, int64_t dim, int64_t want, const char* what) {
  EVO_CHECK_VALUE(t.size(dim) == want, name, ": size ", dim, " (", what, ") is ", t.size(dim), ", expected ", want,
                    " (shape ", t.sizes(), ")");
}

// spatial_shapes (H, W >= 1 per level) and level_start_index (the running sum of H * W) must describe `value`'s S
// positions exactly: anything else sends the kernel outside `value`.
void check_levels(MsdaState& st, const torch::Tensor& spatial_shapes, const torch::Tensor& level_start_index,
                  int64_t S) {
  const std::vector<int64_t> limits{S};
  if (st.shapes_ok.same_as(spatial_shapes, limits) && st.starts_ok.same_as(level_start_index, limits)) return;
  // inside CUDA graph capture nothing may be read back: the shapes were (or will be) checked on an eager call
  if (evo_capturing(spatial_shapes)) return;
  const auto hw = spatial_shapes.cpu();
  const auto starts = level_start_index.cpu();
  const auto* h = hw.data_ptr<int64_t>();
  const auto* s0 = starts.data_ptr<int64_t>();
  // spatial_shapes against value first, then level_start_index against spatial_shapes: a wrong spatial_shapes is
  // reported as such, not as the level_start_index that no longer matches it
  int64_t total = 0;
  for (int64_t l = 0; l < st.L; ++l) {
    EVO_CHECK_VALUE(h[2 * l] >= 1 && h[2 * l + 1] >= 1, "spatial_shapes[", l, "] = (", h[2 * l], ", ",
                      h[2 * l + 1], "): H and W must be at least 1");
    EVO_CHECK_VALUE(h[2 * l] <= S && h[2 * l + 1] <= S && h[2 * l] * h[2 * l + 1] <= S - total,
                      "value: S = ", S, " positions, but levels 0..", l, " of spatial_shapes already hold more",
                      " (the sum of H * W)");
    total += h[2 * l] * h[2 * l + 1];
  }
  EVO_CHECK_VALUE(total == S, "value: S = ", S, " positions, but the levels of spatial_shapes hold ", total,
                    " (the sum of H * W)");
  total = 0;
  for (int64_t l = 0; l < st.L; ++l) {
    EVO_CHECK_VALUE(s0[l] == total, "level_start_index[", l, "] = ", s0[l], ", expected ", total,
                      " (the sum of H * W of the levels of spatial_shapes before it)");
    total += h[2 * l] * h[2 * l + 1];
  }
  st.shapes_ok.remember(spatial_shapes, limits);
  st.starts_ok.remember(level_start_index, limits);
}

// head_major: value is [N, M, S, D] (forward_head_major) instead of [N, S, M, D].
int forward(MsdaState& st, const torch::Tensor& value, const torch::Tensor& spatial_shapes,
            const torch::Tensor& level_start_index, const torch::Tensor& loc, const torch::Tensor& attn,
            const torch::Tensor& out, bool head_major) {
  const auto device = value.device();
  evo_expect_build_device(value, "value");
#ifdef EVO_WITH_CUDA
  EVO_CHECK_VALUE(!st.cubin || device.index() == st.cubin->module->device(), "value: on ", device,
                  ", but this kernel was loaded on cuda:", st.cubin->module->device());
#endif
  expect(value, "value", 4, head_major ? "[N, M, S, D]" : "[N, S, M, D]", device);
  expect(loc, "sampling_locations", 6, "[N, Lq, M, L, P, 2]", device);
  expect(attn, "attention_weights", 5, "[N, Lq, M, L, P]", device);
  expect(out, "output", 3, "[N, Lq, M * D]", device);
  expect(spatial_shapes, "spatial_shapes", 2, "[L, 2]", device);
  expect(level_start_index, "level_start_index", 1, "[L]", device);
  EVO_CHECK_TYPE(value.scalar_type() == st.value_dtype, "value: dtype ", evo_dtype_name(value.scalar_type()),
                   ", but this kernel was compiled for ", evo_dtype_name(st.value_dtype), " (", st.signature, ")");
  EVO_CHECK_TYPE(out.scalar_type() == st.value_dtype, "output: dtype ", evo_dtype_name(out.scalar_type()),
                   ", expected ", evo_dtype_name(st.value_dtype), " (the dtype of value)");
  EVO_CHECK_TYPE(spatial_shapes.scalar_type() == torch::kLong, "spatial_shapes: dtype ",
                   evo_dtype_name(spatial_shapes.scalar_type()), ", expected int64");
  EVO_CHECK_TYPE(level_start_index.scalar_type() == torch::kLong, "level_start_index: dtype ",
                   evo_dtype_name(level_start_index.scalar_type()), ", expected int64");
  EVO_CHECK_TYPE(loc.scalar_type() == torch::kFloat, "sampling_locations: dtype ",
                   evo_dtype_name(loc.scalar_type()),
                   ", expected float32");
  EVO_CHECK_TYPE(attn.scalar_type() == torch::kFloat, "attention_weights: dtype ",
                   evo_dtype_name(attn.scalar_type()),
                   ", expected float32");
  const int64_t N = value.size(0), S = value.size(head_major ? 2 : 1), M = value.size(head_major ? 1 : 2),
                Lq = loc.size(1);
  EVO_CHECK_VALUE(value.size(3) == st.D, "value: head dim D = ", value.size(3),
                    " (size 3), but this kernel was compiled for D = ", st.D, " (", st.signature, ")");
  EVO_CHECK_VALUE(loc.size(3) == st.L, "sampling_locations: L = ", loc.size(3),
                    " levels (size 3), but this kernel was compiled for L = ", st.L, " (", st.signature, ")");
  EVO_CHECK_VALUE(loc.size(4) == st.P, "sampling_locations: P = ", loc.size(4),
                    " points (size 4), but this kernel was compiled for P = ", st.P, " (", st.signature, ")");
  expect_size(loc, "sampling_locations", 0, N, "N, from value");
  expect_size(loc, "sampling_locations", 2, M, "M, from value");
  expect_size(loc, "sampling_locations", 5, 2, "(x, y)");
  const int64_t want_attn[5] = {N, Lq, M, st.L, st.P};
  const char* attn_what[5] = {"N, from value", "Lq, from sampling_locations", "M, from value", "L", "P"};
  for (int d = 0; d < 5; ++d) expect_size(attn, "attention_weights", d, want_attn[d], attn_what[d]);
  expect_size(spatial_shapes, "spatial_shapes", 0, st.L, "L");
  expect_size(spatial_shapes, "spatial_shapes", 1, 2, "(H, W)");
  expect_size(level_start_index, "level_start_index", 0, st.L, "L");
  expect_size(out, "output", 0, N, "N, from value");
  expect_size(out, "output", 1, Lq, "Lq, from sampling_locations");
  expect_size(out, "output", 2, M * st.D, "M * D");
  if (N * Lq * M == 0) return 0;
  EVO_CHECK_VALUE(S > 0, "value: S = 0 positions, but the levels are at least 1 x 1");
  check_levels(st, spatial_shapes, level_start_index, S);
  const int rc = evo_call_on_stream(device, [&](void* stream) {
    return evo_with_workspace(value, [&](void* workspace, int64_t* bytes) {
#ifdef EVO_WITH_CUDA
      if (st.cubin)
        return st.cubin->launch(value.data_ptr(), spatial_shapes.data_ptr<int64_t>(),
                                level_start_index.data_ptr<int64_t>(), loc.data_ptr<float>(), attn.data_ptr<float>(),
                                out.data_ptr(), N, S, M, Lq, head_major ? 1 : 0, workspace, bytes, stream);
#endif
      return st.fn(value.data_ptr(), spatial_shapes.data_ptr<int64_t>(), level_start_index.data_ptr<int64_t>(),
                   loc.data_ptr<float>(), attn.data_ptr<float>(), out.data_ptr(), N, S, M, Lq, head_major ? 1 : 0,
                   workspace, bytes, stream);
    });
  });
  EVO_CHECK_VALUE(rc != kLayoutUnsupported || !head_major, "value: this kernel reads value as [N, S, M, D] only "
                    "(forward_head_major needs a kernel that reads head-major value, e.g. a CUDA MSDA HEAD_MAJOR one)");
  return rc;
}

}  // namespace

namespace {

// The module's functions over `st` (an entry point's or a cubin's state).
void define_functions(PyObject* m, const std::shared_ptr<MsdaState>& st) {
  const auto sig = evo_parse_signature(st->signature.c_str());
  st->L = evo_signature_int(sig, "L");
  st->P = evo_signature_int(sig, "P");
  st->D = evo_signature_int(sig, "D");
  st->value_dtype = evo_signature_dtype(sig, "VALUE_DTYPE", "float32");
  const std::vector<std::string> args{"value", "spatial_shapes", "level_start_index", "sampling_locations",
                                      "attention_weights", "output"};
  evo_add_function<MsdaState>(m, st, {"forward", args,
      "Run the candidate kernel (value, spatial_shapes, level_start_index, sampling_locations, attention_weights, "
      "output); returns its status code (0 = ok). Inputs it was not compiled for raise ValueError / TypeError.",
      [](MsdaState& s, const EvoArgs& a) {
        return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                      a.tensor(5), false));
      }});
  evo_add_function<MsdaState>(m, st, {"forward_head_major", args,
      "forward() with value already head-major, [N, M, S, D] (no layout copy); ValueError if the kernel reads "
      "[N, S, M, D] only.",
      [](MsdaState& s, const EvoArgs& a) {
        return evo_return_int(forward(s, a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(4),
                                      a.tensor(5), true));
      }});
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer MSDA candidate", signature, [&](PyObject* m) {
    auto st = std::make_shared<MsdaState>();
    st->fn = reinterpret_cast<MsdaForwardFn>(entry);
    st->signature = signature;
    define_functions(m, st);
  });
}

#ifdef EVO_WITH_CUDA
// A device-only candidate (its cubin at `path`, built for `signature`) loaded on CUDA device `device`, as a module
// with the same functions; ImportError naming the file when it does not load (called through ctypes.PyDLL).
extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_load_cubin(const char* name, const char* path,
                                                                                   int device, const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer MSDA candidate (device-only build)", signature,
                                   [&](PyObject* m) {
    auto st = std::make_shared<MsdaState>();
    st->cubin = std::make_shared<MsdaCubin>(evo_read_file(path), device, path);
    st->signature = signature;
    define_functions(m, st);
  });
}
#endif
