# On the GPU host, from the repository root (issue 34): the fastest keys-on-M kernels of results/issue34/kreg_sweep
# (FP8 k_registers and registers, fp16 tma) and their paged twins at page sizes 16 and 64, every shape, one
# process; then a GA search of decode_fp8kv_d128 with the new DEQUANT values and register caps (BUDGET, seed 0).
# Logs under $OUT.
#   bash experiments/decode/scripts/paged_keys_h100.sh [BUDGET]
source experiments/decode/scripts/bench_lib.sh results/issue34/paged_keys || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MMA_ROWS": "keys", "STAGES": 2,
      "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "COMBINE": "dependent", "BLOCK_N": 128, "NUM_WARPS": 4'
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240} decode_bench paged_keys --paged 16,64 \
  --kernel "f8_kreg=decode_fp8kv_d128:{$keys, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\"}" \
  --kernel "f8_reg=decode_fp8kv_d128:{$keys, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\"}" \
  --kernel "h_tma_keys=decode_fp16_d128:{$keys, \"MIN_BLOCKS\": 1}"
[ -z "$1" ] && exit 0
OUT=$dest SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-330} bash experiments/decode/scripts/searches.sh "$1" decode_fp8kv_d128
