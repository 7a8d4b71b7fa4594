// Branch-free gather floor of multi-scale deformable attention (MSDA) forward, CUDA (sm_90).
//
// MSDA minus the coordinate math: floor_prepare (untimed) turns every sample (n, q, m, l, p) into precomputed
// metadata, floor_gather (timed) only reads, per sample, that metadata and its 4 corner rows and sums
// weight * row into the output. Its result equals the true MSDA output, so its time is a floor for
// "read every corner row of every sample once" (all 4 rows of every sample, in-map or not).
//
// Layouts: value [N, S, M, D] (half or float), spatial_shapes int64 [L, 2] as (H, W), level_start_index int64 [L],
// sampling_locations fp32 [N, Lq, M, L, P, 2] as (x, y), attention_weights fp32 [N, Lq, M, L, P],
// out [N, Lq, M * D] (value dtype). An item is one (n, q, m), numbered flat in that order.
//
// Metadata, [N * Lq * M, L * P] entries in (item, l, p) order (the order of the attention weights):
//   codes   int32:  (row << 2) | (dy << 1) | dx, the BRANCH_FREE code of templates/cuda/msda.cu.j2. row is the
//                   top-left row of a 2 x 2 block of in-map pixels, in value rows of [N, S, M, D] relative to (n, m):
//                   row = (level_start + yc * W + xc) * M. dx = 1 when the block spans two columns (W >= 2; else
//                   its two columns coincide), dy likewise for rows (H >= 2). The 4 corner rows are
//                   row, row + dx * M, row + dy * W * M, row + dy * W * M + dx * M.
//   weights float4: the 4 corner weights (bilinear * attention) in that order, with the weights of corners outside
//                   the map moved onto the block's in-map pixels or dropped exactly as clamp_axis does; a sample
//                   entirely outside the map has code 0 (row 0, dx = dy = 0) and weights 0.
// The gather needs W_l * M per level for dy: passed by value in the kernel parameters (host array), so the timed
// kernel reads nothing but metadata and value rows.
//
// Value is assumed finite: masked corners are loaded and multiplied by a 0 weight.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace gather_floor {

constexpr int kMaxLevels = 8;

// ---- compile-time knobs ------------------------------------------------------------------------------------------
// T: half or float. kVec: elements per corner-row load of one lane (16 or 8 bytes). kItems: items per block.
// kResident: resident threads per SM that __launch_bounds__ asks for (register cap 65536 / kResident).
// kD, kL, kP: the problem signature (head dim, levels, points per level) the kernel is specialised for.
template <class T, int kVec, int kItems, int kResident = 1024, int kD = 32, int kL = 4, int kP = 4>
struct FloorTraits {
    using Elem = T;
    static constexpr int kVecElems = kVec;
    static constexpr int kItemsPerBlock = kItems;
    static constexpr int kHeadDim = kD;
    static constexpr int kLevels = kL;
    static constexpr int kPoints = kP;
    static constexpr int kLP = kL * kP;
    static constexpr int kLoadBytes = kVec * static_cast<int>(sizeof(T));
    static constexpr int kGroup = kD / kVec;  // lanes per item
    static constexpr int kThreads = kItems * kGroup;
    // 1024 resident threads = a 64-register cap: with the level and point loops unrolled the compiler hoists many
    // corner loads (unbounded it takes 64..254 registers). 1536 (40 registers; spills for fp32 16-byte loads) and
    // 2048 (32; spills for 16-byte loads) were no faster on an H100: more loads in flight per thread beat occupancy
    static constexpr int kMinBlocks = kResident / kThreads > 0 ? kResident / kThreads : 1;

    static_assert(kD % kVec == 0, "kVec must divide D");
    static_assert(kLoadBytes == 16 || kLoadBytes == 8, "a lane loads 16 or 8 bytes per corner row");
    static_assert(32 % kGroup == 0, "an item's lanes must sit in one warp");
    static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
    static_assert(kL >= 1 && kL <= kMaxLevels && kP >= 1, "1..kMaxLevels levels, P >= 1");
};

struct GatherParams {
    const void* value;            // [N, S, M, D]
    const int* codes;             // [items, L * P]
    const float4* weights;        // [items, L * P]
    void* out;                    // [N, Lq, M * D]
    unsigned items;               // N * Lq * M
    unsigned LqM;                 // Lq * M
    unsigned M;
    unsigned SM;                  // S * M: value rows per batch
    unsigned wm[kMaxLevels];      // W_l * M: value rows between vertically adjacent pixels of level l
};

// ---- vector load / convert / store of kVec elements --------------------------------------------------------------
template <int kBytes> struct VecBits;
template <> struct VecBits<16> { using type = uint4; };
template <> struct VecBits<8> { using type = uint2; };

__device__ __forceinline__ void unpack(const uint4& v, unsigned (&w)[4]) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void unpack(const uint2& v, unsigned (&w)[2]) { w[0] = v.x; w[1] = v.y; }

// acc[i] += wgt * row[i] for the kVec elements held in bits (read-only path: ld.global.nc).
template <class Tr>
__device__ __forceinline__ void fma_row(float (&acc)[Tr::kVecElems], float wgt, const typename Tr::Elem* row) {
    using Bits = typename VecBits<Tr::kLoadBytes>::type;
    constexpr int kWords = Tr::kLoadBytes / 4;
    unsigned w[kWords];
    unpack(__ldg(reinterpret_cast<const Bits*>(row)), w);
    if constexpr (sizeof(typename Tr::Elem) == 4) {
#pragma unroll
        for (int i = 0; i < kWords; ++i) acc[i] = fmaf(wgt, __uint_as_float(w[i]), acc[i]);
    } else {
#pragma unroll
        for (int i = 0; i < kWords; ++i) {
            __half2 h;
            *reinterpret_cast<unsigned*>(&h) = w[i];
            const float2 f = __half22float2(h);
            acc[2 * i] = fmaf(wgt, f.x, acc[2 * i]);
            acc[2 * i + 1] = fmaf(wgt, f.y, acc[2 * i + 1]);
        }
    }
}

template <class Tr>
__device__ __forceinline__ void store_row(typename Tr::Elem* dst, const float (&acc)[Tr::kVecElems]) {
    using Bits = typename VecBits<Tr::kLoadBytes>::type;
    constexpr int kWords = Tr::kLoadBytes / 4;
    unsigned w[kWords];
    if constexpr (sizeof(typename Tr::Elem) == 4) {
#pragma unroll
        for (int i = 0; i < kWords; ++i) w[i] = __float_as_uint(acc[i]);
    } else {
#pragma unroll
        for (int i = 0; i < kWords; ++i) {
            const __half2 h = __floats2half2_rn(acc[2 * i], acc[2 * i + 1]);
            w[i] = *reinterpret_cast<const unsigned*>(&h);
        }
    }
    if constexpr (kWords == 4) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    }
}

// The kP codes of one level of one item (int4 loads when kP is a multiple of 4; rows are 16-byte aligned then).
template <int kP>
__device__ __forceinline__ void load_codes(const int* src, int (&c)[kP]) {
    if constexpr (kP % 4 == 0) {
#pragma unroll
        for (int i = 0; i < kP / 4; ++i) {
            const int4 v = __ldg(reinterpret_cast<const int4*>(src) + i);
            c[4 * i] = v.x; c[4 * i + 1] = v.y; c[4 * i + 2] = v.z; c[4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < kP; ++i) c[i] = __ldg(src + i);
    }
}

// ---- timed kernel --------------------------------------------------------------------------------------------------
// Group g of kGroup consecutive lanes owns item blockIdx.x * kItems + g; lane r its channels [r * kVec, (r+1) * kVec).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) floor_gather(const GatherParams p) {
    using T = typename Tr::Elem;
    constexpr int kD = Tr::kHeadDim, kV = Tr::kVecElems, kP = Tr::kPoints, kLP = Tr::kLP;
    const unsigned g = threadIdx.x / Tr::kGroup, r = threadIdx.x % Tr::kGroup;
    const unsigned item = blockIdx.x * Tr::kItemsPerBlock + g;
    if (item >= p.items) return;
    const unsigned n = item / p.LqM, m = item % p.M;
    // 32-bit element offsets: the launcher checks N * S * M * D < 2^31
    const T* vb = static_cast<const T*>(p.value) + ((n * p.SM + m) * kD + r * kV);
    const int* mc = p.codes + item * kLP;
    const float4* mw = p.weights + item * kLP;

    float acc[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) acc[i] = 0.f;

#pragma unroll
    for (int l = 0; l < Tr::kLevels; ++l) {
        const unsigned wm = p.wm[l];
        int code[kP];
        load_codes<kP>(mc + l * kP, code);
#pragma unroll
        for (int pt = 0; pt < kP; ++pt) {
            const float4 w = __ldg(mw + l * kP + pt);
            const unsigned c = static_cast<unsigned>(code[pt]);
            const unsigned b = c >> 2, dx = (c & 1u) * p.M, dy = ((c >> 1) & 1u) * wm;
            // all four corner rows, no per-corner test: masked corners carry weight 0
            fma_row<Tr>(acc, w.x, vb + b * kD);
            fma_row<Tr>(acc, w.y, vb + (b + dx) * kD);
            fma_row<Tr>(acc, w.z, vb + (b + dy) * kD);
            fma_row<Tr>(acc, w.w, vb + (b + dy + dx) * kD);
        }
    }
    store_row<Tr>(static_cast<T*>(p.out) + (item * kD + r * kV), acc);
}

// ---- untimed metadata kernel ---------------------------------------------------------------------------------------
// One axis of a sample (as clamp_axis in templates/cuda/msda.cu.j2): the two map columns c, c + d (d = 0 on a
// 1-wide map) nearest the corners x0, x0 + 1 (x0 in [-1, n - 1]), and their weights (lo belongs to x0, hi to x0 + 1;
// a corner outside the map has none).
__device__ __forceinline__ void clamp_axis(int x0, float lo, float hi, int n, int& c, int& d, float& w0, float& w1) {
    d = n >= 2 ? 1 : 0;
    c = min(max(x0, 0), n - 1 - d);
    w0 = (c == x0 ? lo : 0.f) + (c == x0 + 1 ? hi : 0.f);
    w1 = d ? ((c + 1 == x0 ? lo : 0.f) + (c + 1 == x0 + 1 ? hi : 0.f)) : 0.f;
}

// One thread per sample s = (item * L + l) * P + p.
__global__ void __launch_bounds__(256) floor_prepare(const float2* __restrict__ loc, const float* __restrict__ attn,
                                                     const int64_t* __restrict__ shapes,
                                                     const int64_t* __restrict__ starts, int* __restrict__ codes,
                                                     float4* __restrict__ weights, unsigned samples, int L, int P,
                                                     int M) {
    const unsigned s = blockIdx.x * 256u + threadIdx.x;
    if (s >= samples) return;
    const int l = static_cast<int>((s / static_cast<unsigned>(P)) % static_cast<unsigned>(L));
    const int h = static_cast<int>(shapes[2 * l]), wd = static_cast<int>(shapes[2 * l + 1]);
    const int start = static_cast<int>(starts[l]);
    const float2 xy = loc[s];
    const float a = attn[s];
    const float x = fmaf(xy.x, static_cast<float>(wd), -0.5f);
    const float y = fmaf(xy.y, static_cast<float>(h), -0.5f);
    int code = 0;
    float4 w = make_float4(0.f, 0.f, 0.f, 0.f);
    // also rejects NaN and keeps the float -> int conversion in range
    if (x > -1.f && y > -1.f && x < static_cast<float>(wd) && y < static_cast<float>(h)) {
        const float xf = floorf(x), yf = floorf(y);
        const int x0 = static_cast<int>(xf), y0 = static_cast<int>(yf);
        const float fx = x - xf, fy = y - yf;
        int xc, dx, yc, dy;
        float ax0, ax1, ay0, ay1;
        clamp_axis(x0, 1.f - fx, fx, wd, xc, dx, ax0, ax1);
        clamp_axis(y0, a * (1.f - fy), a * fy, h, yc, dy, ay0, ay1);
        w = make_float4(ay0 * ax0, ay0 * ax1, ay1 * ax0, ay1 * ax1);
        code = (((start + yc * wd + xc) * M) << 2) | (dy << 1) | dx;
    }
    codes[s] = code;
    weights[s] = w;
}

// ---- host side -----------------------------------------------------------------------------------------------------
template <class Tr>
static cudaError_t launch_gather(const GatherParams& p, cudaStream_t stream) {
    const unsigned blocks = (p.items + Tr::kItemsPerBlock - 1) / Tr::kItemsPerBlock;
    floor_gather<Tr><<<blocks, Tr::kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

// kVec x kItems instantiated only where a block has at most 1024 threads.
template <class T, int kVec, int kItems>
static cudaError_t try_launch(const GatherParams& p, cudaStream_t stream) {
    if constexpr (kItems * (32 / kVec) <= 1024) {
        return launch_gather<FloorTraits<T, kVec, kItems>>(p, stream);
    } else {
        return cudaErrorInvalidValue;
    }
}

// Instantiations: 16- or 8-byte lane loads x 32 / 64 / 128 items per block (fp32 8-byte: 32 / 64 only).
template <class T>
static cudaError_t dispatch_gather(const GatherParams& p, int vec, int items, cudaStream_t stream) {
    constexpr int kWide = 16 / static_cast<int>(sizeof(T)), kNarrow = 8 / static_cast<int>(sizeof(T));
    if (vec == kWide) {
        if (items == 32) return try_launch<T, kWide, 32>(p, stream);
        if (items == 64) return try_launch<T, kWide, 64>(p, stream);
        if (items == 128) return try_launch<T, kWide, 128>(p, stream);
    } else if (vec == kNarrow) {
        if (items == 32) return try_launch<T, kNarrow, 32>(p, stream);
        if (items == 64) return try_launch<T, kNarrow, 64>(p, stream);
        if (items == 128) return try_launch<T, kNarrow, 128>(p, stream);
    }
    return cudaErrorInvalidValue;
}

static bool misaligned(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) != 0; }

}  // namespace gather_floor

extern "C" {

// Metadata for all N * Lq * M * L * P samples into codes (int32) and weights (float4 = 4 floats each), on `stream`.
// Returns a cudaError_t code (cudaErrorInvalidValue for bad sizes or pointers).
int gather_floor_prepare(const float* sampling_locations, const float* attention_weights,
                         const int64_t* spatial_shapes, const int64_t* level_start_index, int* codes, float* weights,
                         int64_t N, int64_t Lq, int64_t M, int64_t L, int64_t P, int64_t S, cudaStream_t stream) {
    using namespace gather_floor;
    if (N <= 0 || Lq <= 0 || M <= 0 || L <= 0 || P <= 0 || S <= 0) return cudaErrorInvalidValue;
    if (!sampling_locations || !attention_weights || !spatial_shapes || !level_start_index || !codes || !weights ||
        misaligned(weights) || (reinterpret_cast<uintptr_t>(sampling_locations) & 7u) != 0)
        return cudaErrorInvalidValue;
    const int64_t kLim = 0x7fffffffLL;
    if (L > kLim / P || M > kLim / (L * P) || Lq > kLim / (M * L * P) || N > kLim / (Lq * M * L * P))
        return cudaErrorInvalidValue;
    if (S > ((1LL << 29) - 1) / M) return cudaErrorInvalidValue;  // (row << 2) must stay below 2^31
    const int64_t samples = N * Lq * M * L * P;
    const unsigned blocks = static_cast<unsigned>((samples + 255) / 256);
    floor_prepare<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float2*>(sampling_locations), attention_weights,
                                              spatial_shapes, level_start_index, codes,
                                              reinterpret_cast<float4*>(weights), static_cast<unsigned>(samples),
                                              static_cast<int>(L), static_cast<int>(P), static_cast<int>(M));
    return cudaGetLastError();
}

// The timed gather. level_w: host array of the L level widths W_l. dtype_bytes: 2 (half) or 4 (float).
// vec: elements per lane load (half: 8 or 4, float: 4 or 2); items_per_block: 32, 64 or 128.
// Only D = 32, L = 4, P = 4 are instantiated; anything else returns cudaErrorInvalidValue.
int gather_floor_gather(const void* value, const int* codes, const float* weights, void* output, int dtype_bytes,
                        int64_t N, int64_t S, int64_t M, int64_t Lq, int64_t D, int64_t L, int64_t P,
                        const int64_t* level_w, int vec, int items_per_block, cudaStream_t stream) {
    using namespace gather_floor;
    if (D != 32 || L != 4 || P != 4 || !level_w) return cudaErrorInvalidValue;
    if (N <= 0 || S <= 0 || M <= 0 || Lq <= 0) return cudaErrorInvalidValue;
    if (!value || !codes || !weights || !output || misaligned(value) || misaligned(codes) || misaligned(weights) ||
        misaligned(output))
        return cudaErrorInvalidValue;
    // 32-bit indexing in the kernel: value and output elements, metadata entries, row codes
    const int64_t kLim = 0x7fffffffLL;
    if (M > kLim / D || S > kLim / (M * D) || N > kLim / (S * M * D)) return cudaErrorInvalidValue;
    if (Lq > kLim / (M * D) || N > kLim / (Lq * M * D) || N * Lq * M > kLim / (L * P)) return cudaErrorInvalidValue;
    if (S > ((1LL << 29) - 1) / M) return cudaErrorInvalidValue;
    GatherParams p;
    p.value = value;
    p.codes = codes;
    p.weights = reinterpret_cast<const float4*>(weights);
    p.out = output;
    p.items = static_cast<unsigned>(N * Lq * M);
    p.LqM = static_cast<unsigned>(Lq * M);
    p.M = static_cast<unsigned>(M);
    p.SM = static_cast<unsigned>(S * M);
    for (int l = 0; l < kMaxLevels; ++l) {
        if (l < L && (level_w[l] <= 0 || level_w[l] > S)) return cudaErrorInvalidValue;
        p.wm[l] = l < L ? static_cast<unsigned>(level_w[l] * M) : 0u;
    }
    if (dtype_bytes == 2) return dispatch_gather<__half>(p, vec, items_per_block, stream);
    if (dtype_bytes == 4) return dispatch_gather<float>(p, vec, items_per_block, stream);
    return cudaErrorInvalidValue;
}

}  // extern "C"
