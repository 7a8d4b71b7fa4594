# On the GPU host, from the repository root (issue 34): the benchmark of the recorded elites (with their paged twins at
# page sizes 16 and 64), the tma searches' elites and two hand-picked tma genomes, one process; logs under $OUT.
#   bash experiments/decode/scripts/tma_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
r=experiments/decode/results
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_h100.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py \
  --kernel fp16_old=$r/elite_decode_fp16_d128.json --kernel fp8_old=$r/elite_decode_fp8kv_d128.json \
  --kernel "fp16_ga=decode_fp16_d128:{\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16}" \
  --kernel "fp16_tma=decode_fp16_d128:{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16}" \
  --kernel fp8_ga=$r/issue34/elite_tma_decode_fp8kv_d128.json \
  --kernel "fp8_tma=decode_fp8kv_d128:{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16}" \
  --paged 16,64 --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_h100.json" --md "$dest/benchmark_h100.md" \
  > "$dest/benchmark_h100.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_h100.log"
