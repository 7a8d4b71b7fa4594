# On the GPU host, from the repository root (issue 34): does the float64 reference benchmark.py computes before it
# times a kernel slow that timing? probes/after_reference.py on two FP8 kernels, then benchmark.py as it was
# (reference freed but reserved while the kernel is timed) and as it is (empty_cache() first) on the one-sequence
# rows and the same-work batch row; the GPU's clocks and power every 100 ms. Logs under $OUT.
#   bash experiments/decode/scripts/after_reference_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/after_reference || exit 1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 100 > "$dest/smi_after_reference.csv" 2>&1 &
smi=$!
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "FAST_EXP": true, "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "STAGES": 2, "DEQUANT": "k_registers"'
kreg="decode_fp8kv_d128:{$keys, \"COMBINE\": \"dependent\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}"
w8="decode_fp8kv_d128:{$keys, \"COMBINE\": \"cluster\", \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1}"
timeout -k 10 240 python3 experiments/decode/probes/after_reference.py --cache-dir "$EVOENGINEER_CACHE" \
  --kernel "$kreg" --kernel "$w8" 2>&1 | tee "$dest/after_reference_h100.md"
shapes='1,32,8,32768,128;8,32,8,16384,128;1,32,8,131072,128'
# benchmark_before.py: benchmark.py of feac8f4 (git show feac8f4:experiments/decode/benchmark.py), put beside it
for which in before after; do
  script=experiments/decode/benchmark.py
  [ $which = before ] && script=experiments/decode/benchmark_before.py
  [ -f "$script" ] || { echo "no $script"; continue; }
  timeout -k 10 200 python3 "$script" --shapes "$shapes" --cache-dir "$EVOENGINEER_CACHE" \
    --kernel "f8_kreg=$kreg" --kernel "f8_w8=$w8" --md "$dest/benchmark_${which}_h100.md" \
    --json "$dest/benchmark_${which}_h100.json" > "$dest/benchmark_${which}_h100.log" 2>&1
  echo "bench $which rc $?"
  cat "$dest/benchmark_${which}_h100.md"
done
kill $smi
