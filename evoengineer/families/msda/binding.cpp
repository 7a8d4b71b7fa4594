// Torch binding of the MSDA family, compiled ONCE per family and toolchain (it is the slow part: torch headers).
// Each candidate's shared library links against it and, from its PyInit_<name>, hands over its kernel entry point
// and the signature it was compiled for; this file turns that into a Python module with `forward(...)` that refuses,
// with a ValueError/TypeError naming the argument and both values, any input the kernel was not compiled for.

#include "candidate_module.h"

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
struct MsdaState {
  MsdaForwardFn fn;
  int64_t L, P, D;
  at::ScalarType value_dtype;
  std::string signature;
  EvoCheckedTensor shapes_ok, starts_ok;
};

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

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {
  return evo_make_candidate_module(name, "EvoEngineer MSDA candidate", signature, [&](PyObject* m) {
    auto st = std::make_shared<MsdaState>();
    st->fn = reinterpret_cast<MsdaForwardFn>(entry);
    st->signature = signature;
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
  });
}
