# On the GPU host, from the repository root (issue 34, paged tma): the decode GPU tests (paged tma kernels give the
# contiguous kernel's bits at page sizes 1-128; sampled genomes of the paged spaces now include tma), then the
# benchmark of the tma kernels of the H100 table (results/issue34/benchmark_h100_run2.md) with their paged twins at
# page sizes 16 and 64, one process; logs under $OUT.
#   bash experiments/decode/scripts/paged_tma.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
r=experiments/decode/results
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_paged_tma.txt"
if [ -z "$SKIP_TESTS" ]; then
  timeout -k 10 ${TEST_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py \
    2>&1 | tee "$dest/gpu_tests_paged_tma.log" | tail -15
  echo "tests rc $?"
fi
timeout -k 10 ${BENCH_TIMEOUT:-250} python3 experiments/decode/benchmark.py \
  --kernel "fp16_ga=decode_fp16_d128:{\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16}" \
  --kernel "fp16_tma=decode_fp16_d128:{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16}" \
  --kernel fp8_ga=$r/issue34/elite_tma_decode_fp8kv_d128.json \
  --kernel "fp8_tma=decode_fp8kv_d128:{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16}" \
  --paged 16,64 --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_paged_tma.json" \
  --md "$dest/benchmark_paged_tma.md" > "$dest/benchmark_paged_tma.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_paged_tma.log"
