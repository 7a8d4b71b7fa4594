# On the GPU host, from the repository root (issue 34): does the float64 reference benchmark.py computes before it
# times a kernel slow that timing? probes/after_reference.py on two FP8 kernels, the GPU's clocks and power every
# 100 ms. Logs under $OUT. benchmark.py timed at once and after settling: scripts/settle_h100.sh.
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
kill $smi
