# On the GPU host, from the repository root (issue 34): the four FP8 dequantizations with keys on M (DEQUANT =
# shared, shared_single, k_registers, registers) on the genes of the keys GA elite and its neighbours (register caps
# for 4 and 6 CTAs of 4 warps, separate combine, 128-key tiles, 3 stages), every shape, one process; then ncu of
# k_registers beside shared_single at the decode shape. Logs under $OUT.
#   bash experiments/decode/scripts/dequant_keys_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/dequant_keys || exit 1
ga='"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1,
    "FAST_EXP": true, "MMA_ROWS": "keys", "Q_IN_REGISTERS": false'
k() { args+=(--kernel "$1=decode_fp8kv_d128:{$2}"); }
args=()
k shared "$ga, \"COMBINE\": \"in_kernel\", \"MIN_BLOCKS\": 1, \"DEQUANT\": \"shared\""
k single_mb6_sep "$ga, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
k kreg_mb1 "$ga, \"COMBINE\": \"in_kernel\", \"MIN_BLOCKS\": 1, \"DEQUANT\": \"k_registers\""
k kreg_mb6 "$ga, \"COMBINE\": \"in_kernel\", \"MIN_BLOCKS\": 6, \"DEQUANT\": \"k_registers\""
k kreg_mb6_sep "$ga, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 6, \"DEQUANT\": \"k_registers\""
k kreg_bn128_mb2_sep "${ga/\"BLOCK_N\": 64/\"BLOCK_N\": 128}, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\""
k kreg_st3_mb4_sep "${ga/\"STAGES\": 2/\"STAGES\": 3}, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 4, \"DEQUANT\": \"k_registers\""
k reg_bn128_mb2_sep "${ga/\"BLOCK_N\": 64/\"BLOCK_N\": 128}, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\""
k single_bn128_mb2_sep "${ga/\"BLOCK_N\": 64/\"BLOCK_N\": 128}, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 2, \"DEQUANT\": \"shared_single\""
decode_bench dequant_keys "${args[@]}"
[ -n "$NO_NCU" ] && exit 0
prof=(--kernel "kreg_mb6=decode_fp8kv_d128:{$ga, \"COMBINE\": \"in_kernel\", \"MIN_BLOCKS\": 6, \"DEQUANT\": \"k_registers\"}"
      --kernel "single_mb6=decode_fp8kv_d128:{$ga, \"COMBINE\": \"in_kernel\", \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\"}")
decode_ncu dequant_keys 8,32,8,1,8192,128 "${prof[@]}"
