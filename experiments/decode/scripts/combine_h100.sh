# On the GPU host, from the repository root (issue 34): the parallel combine against the template before it
# (results/issue34/combine/decode_before_combine.patch), the table's four kernels each way,
# every shape, one process; logs under $OUT.
#   bash experiments/decode/scripts/combine_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/combine}
source experiments/decode/scripts/before_combine.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_combine.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py \
  --kernel "fp16_ga=decode_fp16_d128:$fp16_ga" --kernel "fp16_ga_before=$c/decode_fp16_d128_before_combine.toml:$fp16_ga" \
  --kernel "fp16_tma=decode_fp16_d128:$fp16_tma" --kernel "fp16_tma_before=$c/decode_fp16_d128_before_combine.toml:$fp16_tma" \
  --kernel "fp8_ga=decode_fp8kv_d128:$fp8_ga" --kernel "fp8_ga_before=$c/decode_fp8kv_d128_before_combine.toml:$fp8_ga" \
  --kernel "fp8_tma=decode_fp8kv_d128:$fp8_tma" --kernel "fp8_tma_before=$c/decode_fp8kv_d128_before_combine.toml:$fp8_tma" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_combine_h100.json" --md "$dest/benchmark_combine_h100.md" \
  > "$dest/benchmark_combine_h100.log" 2>&1
echo "bench rc $?"; tail -12 "$dest/benchmark_combine_h100.log"
