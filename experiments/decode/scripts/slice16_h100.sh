# On the GPU host, from the repository root (issue 34): FP8 kernels whose warps take 16-key slices (one page of 16
# holds a slice: one box per slice), beside the two fastest (32-key slices: two boxes per slice at page size 16),
# contiguous and paged at page sizes 16 and 64, every row, one process. Logs under $OUT.
#   bash experiments/decode/scripts/slice16_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/after_reference/slice16 || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "FAST_EXP": true, "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "DEQUANT": "k_registers"'
f8="decode_fp8kv_d128:{$keys"
BENCH_TIMEOUT=540 decode_bench slice16 --paged 16,64 \
  --kernel "w8=$f8, \"COMBINE\": \"cluster\", \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1, \"STAGES\": 2}" \
  --kernel "kreg=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"STAGES\": 2}" \
  --kernel "ga32x2=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 32, \"NUM_WARPS\": 2, \"MIN_BLOCKS\": 4, \"STAGES\": 2}" \
  --kernel "k64x4=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 64, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"STAGES\": 2}" \
  --kernel "k64x4s4=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 64, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"STAGES\": 4}" \
  --kernel "k128x8=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 128, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1, \"STAGES\": 2}" \
  --kernel "k128x8s3=$f8, \"COMBINE\": \"cluster\", \"BLOCK_N\": 128, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1, \"STAGES\": 3}" \
  --kernel "k128x8mb2=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 128, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 2, \"STAGES\": 2}"
