# On the GPU host, from the repository root (issue 34): COMBINE = cluster (a group's splits as one thread-block
# cluster where the device holds them all, reduced through each other's shared memory) against the separate and
# dependent combines with the same genes: the fastest FP8 kernels (128-key tiles of 4 warps; 256-key tiles of 8 warps,
# one CTA an SM; the GA elite's 64-key tiles of 2 warps), FP8 registers for Sq = 4, the fp16 keys kernel; every shape,
# one process. First the GPU tests of the combines (call after call, where clusters fit and where they fall back).
# Logs under $OUT.
#   bash experiments/decode/scripts/cluster_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster || exit 1
timeout -k 10 240 python3 -m pytest -q tests/test_gpu_decode.py -k "call_after_call or cluster" > "$dest/gpu_tests_cluster.log" 2>&1
echo "tests rc $?"; tail -3 "$dest/gpu_tests_cluster.log"
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "SPLIT_WAVES": 1'
declare -A G=(
  [f8_kreg]="fp8kv|\"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\""
  [f8_w8]="fp8kv|\"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1, \"DEQUANT\": \"k_registers\""
  [f8_w2]="fp8kv|\"FAST_EXP\": false, \"STAGES\": 2, \"Q_IN_REGISTERS\": true, \"BLOCK_N\": 64, \"NUM_WARPS\": 2, \"MIN_BLOCKS\": 8, \"DEQUANT\": \"k_registers\""
  [f8_reg]="fp8kv|\"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\""
  [h_keys]="fp16|\"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1"
)
args=()
for n in "${!G[@]}"; do
  sp=decode_${G[$n]%%|*}_d128; g="$keys, ${G[$n]#*|}"
  for cb in ${COMBINES:-cluster separate dependent}; do args+=(--kernel "${n}_$cb=$sp:{$g, \"COMBINE\": \"$cb\"}"); done
done
decode_bench cluster "${args[@]}" ${BENCH_ARGS:-}
