# On the GPU host, from the repository root (issue 34): keys-on-M kernels (fp16 tma, FP8 GA genes) and their paged
# twins at page sizes 16 and 64 (pages in random order, none shared), every shape, one process; logs under $OUT.
#   bash experiments/decode/scripts/keys_paged_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/keys}
mkdir -p "$dest"
base='"LOAD_PATH": "tma", "COPY_BYTES": 16, "FAST_EXP": true, "MIN_BLOCKS": 1, "SPLIT_WAVES": 1, "M_TILES": 1, "MMA_ROWS": "keys"'
timeout -k 10 ${BENCH_TIMEOUT:-300} python3 experiments/decode/benchmark.py \
  --kernel "h_tma_keys=decode_fp16_d128:{$base, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\"}" \
  --kernel "f8_ga_keys=decode_fp8kv_d128:{$base, \"BLOCK_N\": 32, \"NUM_WARPS\": 2, \"STAGES\": 2, \"Q_IN_REGISTERS\": true, \"COMBINE\": \"separate\", \"DEQUANT\": \"shared\"}" \
  --paged 16,64 --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_keys_paged_h100.json" \
  --md "$dest/benchmark_keys_paged_h100.md" > "$dest/benchmark_keys_paged_h100.log" 2>&1
echo "bench rc $?"; tail -8 "$dest/benchmark_keys_paged_h100.log"
