# On the GPU host, from the repository root (issue 34): the separate combine launched as a programmatic dependent
# of the split kernel (griddepcontrol) against the template before it (commit 88536d3, or without git
# results/issue34/pdl/decode_before_pdl.patch), the fastest separate-combine kernels of each dtype, every shape,
# one process. Logs under $OUT.
#   bash experiments/decode/scripts/pdl_h100.sh
source experiments/scripts/device_env.sh || exit 1
source experiments/decode/scripts/template_before.sh
template_before 88536d3 experiments/decode/results/issue34/pdl/decode_before_pdl.patch before_pdl || exit 1
dest=${OUT:-experiments/decode/results/issue34/pdl}
mkdir -p "$dest"
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MMA_ROWS": "keys", "STAGES": 2,
      "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "COMBINE": "separate"'
declare -A G=(
  [f8_kreg]="fp8kv|{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\"}"
  [f8_single]="fp8kv|{$keys, \"BLOCK_N\": 64, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\"}"
  [f8_reg]="fp8kv|{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\"}"
  [h_tma_keys]="fp16|{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}"
)
args=()
for n in "${!G[@]}"; do
  sp=decode_${G[$n]%%|*}_d128; g=${G[$n]#*|}
  args+=(--kernel "$n=$sp:$g" --kernel "${n}_before=$c/${sp}_before_pdl.toml:$g")
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_pdl.txt"
timeout -k 10 ${BENCH_TIMEOUT:-420} python3 experiments/decode/benchmark.py "${args[@]}" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_pdl_h100.json" --md "$dest/benchmark_pdl_h100.md" \
  > "$dest/benchmark_pdl_h100.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_pdl_h100.log"
