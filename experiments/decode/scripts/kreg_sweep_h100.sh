# On the GPU host, from the repository root (issue 34): genes around the fastest FP8 kernel of
# results/issue34/dequant_keys (keys on M, DEQUANT = k_registers, 128-key tiles of 4 warps, separate combine,
# MIN_BLOCKS 2): tile width, warps, split waves, Q in registers, combine, registers / shared_single dequant;
# every shape, one process. Logs under $OUT.
#   bash experiments/decode/scripts/kreg_sweep_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/kreg_sweep || exit 1
base='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MMA_ROWS": "keys", "STAGES": 2'
k() { args+=(--kernel "$1=decode_fp8kv_d128:{$base, $2}"); }
args=()
best='"BLOCK_N": 128, "NUM_WARPS": 4, "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "COMBINE": "separate", "MIN_BLOCKS": 2'
k kreg "$best, \"DEQUANT\": \"k_registers\""
k kreg_sw2 "${best/\"SPLIT_WAVES\": 1/\"SPLIT_WAVES\": 2}, \"DEQUANT\": \"k_registers\""
k kreg_sw4 "${best/\"SPLIT_WAVES\": 1/\"SPLIT_WAVES\": 4}, \"DEQUANT\": \"k_registers\""
k kreg_qreg "${best/\"Q_IN_REGISTERS\": false/\"Q_IN_REGISTERS\": true}, \"DEQUANT\": \"k_registers\""
k kreg_ink "${best/separate/in_kernel}, \"DEQUANT\": \"k_registers\""
k kreg_mb1 "${best/\"MIN_BLOCKS\": 2/\"MIN_BLOCKS\": 1}, \"DEQUANT\": \"k_registers\""
k kreg_w8 "${best/\"BLOCK_N\": 128, \"NUM_WARPS\": 4/\"BLOCK_N\": 256, \"NUM_WARPS\": 8}, \"DEQUANT\": \"k_registers\""
k kreg_w2 "${best/\"BLOCK_N\": 128, \"NUM_WARPS\": 4/\"BLOCK_N\": 64, \"NUM_WARPS\": 2}, \"DEQUANT\": \"k_registers\""
k kreg_w2_mb4 "${best/\"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"SPLIT_WAVES\": 1, \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 2/\"BLOCK_N\": 64, \"NUM_WARPS\": 2, \"SPLIT_WAVES\": 1, \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"MIN_BLOCKS\": 4}, \"DEQUANT\": \"k_registers\""
k kreg_bn256 "${best/\"BLOCK_N\": 128/\"BLOCK_N\": 256}, \"DEQUANT\": \"k_registers\""
k reg_qreg "${best/\"Q_IN_REGISTERS\": false/\"Q_IN_REGISTERS\": true}, \"DEQUANT\": \"registers\""
k reg_w2 "${best/\"BLOCK_N\": 128, \"NUM_WARPS\": 4/\"BLOCK_N\": 64, \"NUM_WARPS\": 2}, \"DEQUANT\": \"registers\""
BENCH_TIMEOUT=${BENCH_TIMEOUT:-480} decode_bench kreg_sweep "${args[@]}"
