# On the GPU host, from the repository root (issue 34): GA searches of the two contiguous d128 decode spaces with the
# tma load path in them, then the benchmark of their elites beside the recorded ones (and the paged twins at page
# sizes 16 and 64 where the elite has one); logs, stores and elite.json under $OUT (or experiments/decode/results/issue34).
#   BUDGET=60 bash experiments/decode/scripts/tma_searches.sh [EXTRA --kernel ARGS...]
dest=${OUT:-experiments/decode/results/issue34}
OUT=$dest POPULATION=${POPULATION:-12} GENERATIONS=${GENERATIONS:-12} SEED=${SEED:-0} SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-220} \
  bash experiments/decode/scripts/searches.sh ${BUDGET:-60} decode_fp16_d128 decode_fp8kv_d128
source experiments/scripts/device_env.sh || exit 1
r=experiments/decode/results
timeout -k 10 ${BENCH_TIMEOUT:-200} python3 experiments/decode/benchmark.py \
  --kernel fp16_old=$r/elite_decode_fp16_d128.json --kernel fp8_old=$r/elite_decode_fp8kv_d128.json \
  --kernel fp16=$dest/elite_decode_fp16_d128.json --kernel fp8=$dest/elite_decode_fp8kv_d128.json "$@" --paged 16,64 \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_searched.json" --md "$dest/benchmark_searched.md" \
  > "$dest/benchmark_searched.log" 2>&1
echo "bench rc $?"; tail -10 "$dest/benchmark_searched.log"
