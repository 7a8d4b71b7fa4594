# On the GPU host, from the repository root (issue 34, paged KV): the decode GPU tests (sampled genomes of every
# decode space, paged ones included; paged vs contiguous bits; bf16; CUDA graphs), then the benchmark of the recorded
# elites and their paged twins at page sizes 16 and 64 on every shape, logs under $OUT (or experiments/decode/results).
#   bash experiments/decode/scripts/paged.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu.txt"
set -o pipefail
timeout -k 10 ${TEST_TIMEOUT:-330} python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_decode.py \
  2>&1 | tee "$dest/gpu_tests_paged.log" | tail -15
echo "tests rc $?"
r=experiments/decode/results
timeout -k 10 ${BENCH_TIMEOUT:-230} python3 experiments/decode/benchmark.py --kernel fp16=$r/elite_decode_fp16_d128.json \
  --kernel fp8=$r/elite_decode_fp8kv_d128.json --paged 16,64 --cache-dir "$EVOENGINEER_CACHE" \
  --json "$dest/benchmark_paged.json" --md "$dest/benchmark_paged.md" > "$dest/benchmark_paged.log" 2>&1
echo "bench rc $?"; tail -12 "$dest/benchmark_paged.log"
