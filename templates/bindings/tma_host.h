// Host side of TMA tensor maps (templates/bindings/tma_host.h): the encoder fetched through the runtime (no -lcuda) and
// 3-D maps with 128-byte swizzled boxes. Included by templates/cuda/common/tma.cuh.j2 (a template's host code, inside
// its namespace) and by family bindings that launch device-only builds (the same maps, built once for the family).
// Needs <cuda.h>, <cudaTypedefs.h> and <cuda_runtime.h> before it.
// cuTensorMapEncodeTiled through the runtime's driver entry point (fetched once), or nullptr when the driver has none
static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        const cudaError_t e =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
        if (e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn)
            encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }
    return encode;
}
// A 3-D map (dims[0] fastest; strides in bytes of dims 1 and 2) whose boxes (`box` elements per dim, box[0] x the
// element size = 128 bytes: the swizzle's width) land in the 128-byte swizzle; elements past a dim read as zeros.
// false when the encoder is missing or refuses the map.
static inline bool encode_swizzled_map_3d(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                                          const int64_t (&dims)[3], const int64_t (&strides)[2], const int (&box)[3]) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return false;
    cuuint64_t d[3], st[2];
    cuuint32_t b[3];
    for (int i = 0; i < 3; ++i) {
        d[i] = static_cast<cuuint64_t>(dims[i]);
        b[i] = static_cast<cuuint32_t>(box[i]);
    }
    for (int i = 0; i < 2; ++i) st[i] = static_cast<cuuint64_t>(strides[i]);
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    return encode(map, type, 3, const_cast<void*>(base), d, st, b, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// Heads of `rows` rows of `row_bytes` bytes each ([heads, rows, cols], cols fastest) as a 3-D map whose boxes are
// 128 bytes of a row (`box_cols` elements: the 128-byte swizzle's width) x `box_rows` rows of one head. Rows past
// `rows` read as zeros, never as the next head's.
static inline bool encode_head_rows_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t cols,
                                        int64_t row_bytes, int64_t rows, int64_t heads, int box_cols, int box_rows) {
    const int64_t dims[3] = {cols, rows, heads};
    const int64_t strides[2] = {row_bytes, rows * row_bytes};
    const int box[3] = {box_cols, box_rows, 1};
    return encode_swizzled_map_3d(map, type, base, dims, strides, box);
}
// The map element type of attention K/V (or Q) rows: FP8 as bytes, else the 16-bit type.
static inline CUtensorMapDataType tma_row_type(bool fp8, bool bf16) {
    return fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}
