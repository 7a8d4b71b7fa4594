# On the GPU host, from the repository root (issue 34): SCHEDULE = balanced against splits on the tma kernels of the
# H100 table (same genes otherwise), with every kernel's paged twin at page sizes 16 and 64 (pages not shared between
# sequences: the same bytes as contiguous), one process; logs under $OUT.
#   bash experiments/decode/scripts/balanced_h100.sh
# RECORD: balanced was slower than splits on 15 of the 16 kernel x shape pairs (benchmark_balanced_h100.md) and was
# removed; results/issue34/balanced/*.patch hold the template, spaces and tests (git apply them to rerun this). The
# GPU-test log there is the run that found the in-kernel combine's arrival count wrong (mended in the patch).
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
ga16="\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16"
tma16="\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16"
ga8='"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "FAST_EXP": true, "MIN_BLOCKS": 1, "DEQUANT": "shared"'
tma8="\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16"
args=()
for k in "fp16_ga:decode_fp16_d128:$ga16" "fp16_tma:decode_fp16_d128:$tma16" "fp8_ga:decode_fp8kv_d128:$ga8" \
         "fp8_tma:decode_fp8kv_d128:$tma8"; do
  label=${k%%:*}; rest=${k#*:}; space=${rest%%:*}; genes=${rest#*:}
  args+=(--kernel "$label=$space:{$genes, \"SCHEDULE\": \"splits\"}")
  args+=(--kernel "${label}_bal=$space:{$genes, \"SCHEDULE\": \"balanced\"}")
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_balanced.txt"
timeout -k 10 ${BENCH_TIMEOUT:-500} python3 experiments/decode/benchmark.py "${args[@]}" --paged 16,64 \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_balanced.json" --md "$dest/benchmark_balanced.md" \
  > "$dest/benchmark_balanced.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_balanced.log"
