# On the GPU host, from the repository root (issue 34, LOAD_PATH = tma): the recorded elites beside their genes with
# tensor-map loads (and a few neighbours) on every benchmark shape, then Nsight Compute's per-instruction counts of
# the decode shape; logs under $OUT (or experiments/decode/results/issue34).
#   bash experiments/decode/scripts/tma.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
r=experiments/decode/results
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate", "MIN_BLOCKS": 1'
f8='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "in_kernel", "FAST_EXP": true, "MIN_BLOCKS": 1'
kernels=(--kernel fp16=$r/elite_decode_fp16_d128.json --kernel fp8=$r/elite_decode_fp8kv_d128.json
  --kernel "fp16_tma=decode_fp16_d128:{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"FAST_EXP\": false, $f16}"
  --kernel "fp16_tma_fx=decode_fp16_d128:{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"FAST_EXP\": true, $f16}"
  --kernel "fp16_tma_s3=decode_fp16_d128:{\"BLOCK_N\": 128, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"FAST_EXP\": true, $f16}"
  --kernel "fp8_tma_sh=decode_fp8kv_d128:{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"DEQUANT\": \"shared\", $f8}"
  --kernel "fp8_tma_reg=decode_fp8kv_d128:{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"DEQUANT\": \"registers\", $f8}"
  --kernel "fp8_tma_sh128=decode_fp8kv_d128:{\"BLOCK_N\": 128, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"DEQUANT\": \"shared\", $f8}"
  "$@")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_tma.txt"
timeout -k 10 ${BENCH_TIMEOUT:-300} python3 experiments/decode/benchmark.py "${kernels[@]}" --cache-dir "$EVOENGINEER_CACHE" \
  --json "$dest/benchmark_tma.json" --md "$dest/benchmark_tma.md" > "$dest/benchmark_tma.log" 2>&1
echo "bench rc $?"; tail -12 "$dest/benchmark_tma.log"
timeout -k 5 ${NCU_TIMEOUT:-200} ncu --profile-from-start off --set full --import-source yes -o "$dest/tma" -f \
  python3 experiments/decode/profile.py "${kernels[@]}" --cudnn --shape 8,32,8,1,8192,128 --cache-dir "$EVOENGINEER_CACHE" \
  > "$dest/ncu_tma.log" 2>&1
echo "ncu rc $?"
ncu --import "$dest/tma.ncu-rep" --page source --csv --print-source sass > "$dest/ncu_tma_source.csv" 2>/dev/null
ncu --import "$dest/tma.ncu-rep" --print-nvtx-rename kernel --page details > "$dest/ncu_tma_details.txt" 2>/dev/null
python3 experiments/decode/sass_counts.py "$dest/ncu_tma_source.csv" "$dest/ncu_tma_details.txt" --order "$dest/ncu_tma.log" | tee "$dest/ncu_tma_counts.txt"
