# On the GPU host, from the repository root (issue 34): FP8 keys-on-M kernels that build their MMA fragments from
# the raw e4m3 bytes (DEQUANT = registers: no fp16 round trip through shared memory, whose data path ncu showed
# 80% busy in results/issue34/single) against the shared-memory dequantizations, at register caps for 4 to 6
# CTAs of 4 warps; every shape, one process; then ncu of the best of each. Logs under $OUT.
#   bash experiments/decode/scripts/regs_keys_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/regs_keys || exit 1
ga='"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1,
    "FAST_EXP": true, "MMA_ROWS": "keys"'
k() { args+=(--kernel "$1=decode_fp8kv_d128:{$2}"); }
args=()
k single_mb6_sep "$ga, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
k shared_ga "$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"shared\""
k reg_mb1 "$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"registers\""
k reg_mb4 "$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 4, \"DEQUANT\": \"registers\""
k reg_mb6 "$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"registers\""
k reg_mb6_sep "$ga, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"registers\""
k reg_qreg_mb4 "$ga, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": true, \"MIN_BLOCKS\": 4, \"DEQUANT\": \"registers\""
k reg_st3_mb4 "${ga/\"STAGES\": 2/\"STAGES\": 3}, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 4, \"DEQUANT\": \"registers\""
k reg_bn128_mb2 "${ga/\"BLOCK_N\": 64/\"BLOCK_N\": 128}, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\""
k reg_w2_mb12 "${ga/\"NUM_WARPS\": 4/\"NUM_WARPS\": 2}, \"COMBINE\": \"separate\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 12, \"DEQUANT\": \"registers\""
decode_bench regs_keys "${args[@]}"
[ -n "$NO_NCU" ] && exit 0
prof=(--kernel "reg_mb6=decode_fp8kv_d128:{$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"registers\"}"
      --kernel "single_mb6=decode_fp8kv_d128:{$ga, \"COMBINE\": \"in_kernel\", \"Q_IN_REGISTERS\": false, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\"}")
decode_ncu regs_keys 8,32,8,1,8192,128 "${prof[@]}"
