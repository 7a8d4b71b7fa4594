# On the GPU host, from the repository root (issue 34): the two fastest FP8 kernels at the one long sequence, each
# combine (cluster falls back to dependent there) x one or two waves of splits, and a third ring stage; timed with
# benchmark.py's settled graphs, one process. Logs under $OUT.
#   bash experiments/decode/scripts/long_row_sweep_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/after_reference/long_row || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "FAST_EXP": true, "Q_IN_REGISTERS": false, "DEQUANT": "k_registers"'
w8="decode_fp8kv_d128:{$keys, \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1"
kreg="decode_fp8kv_d128:{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2"
args=()
for k in w8 kreg; do
  for c in dependent in_kernel separate; do
    for w in 1 2; do
      args+=(--kernel "${k}_${c}_w$w=${!k}, \"STAGES\": 2, \"COMBINE\": \"$c\", \"SPLIT_WAVES\": $w}")
    done
  done
done
# three stages: the 8-warp kernel's shared memory does not hold them
args+=(--kernel "kreg_dependent_s3=$kreg, \"STAGES\": 3, \"COMBINE\": \"dependent\", \"SPLIT_WAVES\": 1}")
BENCH_TIMEOUT=450 decode_bench long_row --shapes '1,32,8,1,32768,128;1,32,8,1,16384,128;8,32,8,1,8192,128' "${args[@]}"
