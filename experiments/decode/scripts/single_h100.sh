# On the GPU host, from the repository root (issue 34): FP8 with one fp16 conversion buffer per warp (DEQUANT =
# shared_single: V converted over K's rows once the scores are in registers) against two (shared), keys on M, at
# register caps that let 6 CTAs of 4 warps (or 12 of 2) share an SM; every shape, one process; then ncu's
# occupancy and warp states of the two-buffer GA elite and the best one-buffer genes at the decode shape and the
# long sequence. Logs under $OUT.
#   bash experiments/decode/scripts/single_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/single || exit 1
# the keys GA elite (results/issue34/keys/elite_ga_keys_decode_fp8kv_d128.json, rank 1) and its variations
ga='"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1,
    "COMBINE": "in_kernel", "FAST_EXP": true, "MMA_ROWS": "keys"'
two='"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1,
     "COMBINE": "separate", "FAST_EXP": true, "MMA_ROWS": "keys"'
k() { args+=(--kernel "$1=decode_fp8kv_d128:{$2}"); }
args=()
k ga_shared "$ga, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"shared\""
k ga_single "$ga, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"shared_single\""
k ga_single_mb6 "$ga, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
k ga_single_mb6_qreg "$ga, \"Q_IN_REGISTERS\": true, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
k ga_single_mb6_sep "${ga/in_kernel/separate}, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
k w2_shared_mb8 "$two, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 8, \"DEQUANT\": \"shared\""
k w2_single_mb12 "$two, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 12, \"DEQUANT\": \"shared_single\""
decode_bench single "${args[@]}"
[ -n "$NO_NCU" ] && exit 0
prof=(--kernel "ga_shared=decode_fp8kv_d128:{$ga, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"shared\"}"
      --kernel "ga_single_mb6=decode_fp8kv_d128:{$ga, \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\"}")
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do decode_ncu single $shape "${prof[@]}"; done
