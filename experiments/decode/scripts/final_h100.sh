# On the GPU host, from the repository root (issue 34): the best kernel of each kind so far against cuDNN on every
# shape, one process (FP8 keys on M with K from raw bytes at 128-key tiles of 4 warps or 64-key tiles of 2 warps
# (the GA elite of results/issue34/paged_keys), its neighbours with 3 stages; FP8 registers for Sq = 4; fp16 tma
# keys), then ncu of the FP8 leader at the decode shape and the long sequence. Logs under $OUT.
#   bash experiments/decode/scripts/final_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/final || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "SPLIT_WAVES": 1, "COMBINE": "dependent"'
kreg="{$keys, \"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\"}"
w2="{$keys, \"FAST_EXP\": false, \"Q_IN_REGISTERS\": true, \"BLOCK_N\": 64, \"NUM_WARPS\": 2, \"DEQUANT\": \"k_registers\""
args=(--kernel "f8_kreg=decode_fp8kv_d128:$kreg"
      --kernel "f8_ga=experiments/decode/results/issue34/paged_keys/elite_ga_dequant_decode_fp8kv_d128.json"
      --kernel "f8_w2_st3=decode_fp8kv_d128:$w2, \"STAGES\": 3, \"MIN_BLOCKS\": 8}"
      --kernel "f8_w2_fast=decode_fp8kv_d128:${w2/\"FAST_EXP\": false/\"FAST_EXP\": true}, \"STAGES\": 2, \"MIN_BLOCKS\": 8}"
      --kernel "f8_kreg_st3=decode_fp8kv_d128:${kreg/\"STAGES\": 2/\"STAGES\": 3}"
      --kernel "f8_reg=decode_fp8kv_d128:${kreg/k_registers/registers}"
      --kernel "h_tma_keys=decode_fp16_d128:{$keys, \"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}")
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300} decode_bench final "${args[@]}"
[ -n "$NO_NCU" ] && exit 0
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  decode_ncu final $shape --kernel "f8_kreg=decode_fp8kv_d128:$kreg"
done
