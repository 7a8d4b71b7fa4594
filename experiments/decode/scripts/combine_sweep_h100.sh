# On the GPU host, from the repository root (issue 34): with the parallel combine, hand-picked tma genomes that lean on
# it (separate combine, more splits, deeper rings, both FP8 dequantizations) against the table's kernels, every
# shape, one process; logs under $OUT.
#   bash experiments/decode/scripts/combine_sweep_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/combine}
base='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MIN_BLOCKS": 1'
f8() { echo "$1=decode_fp8kv_d128:{$base, $2}"; }
f16() { echo "$1=decode_fp16_d128:{$base, $2}"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_combine_sweep.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py \
  --kernel "$(f8 f8_ga '"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_ga_w2 '"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 2, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_s3 '"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 3, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_s4 '"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 4, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_tma_sep '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 3, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_n64w2 '"BLOCK_N": 64, "NUM_WARPS": 2, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "shared"')" \
  --kernel "$(f8 f8_reg '"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "registers"')" \
  --kernel "$(f8 f8_reg_w4 '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 3, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "DEQUANT": "registers"')" \
  --kernel "$(f16 h_tma '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate"')" \
  --kernel "$(f16 h_tma_w2 '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 2, "COMBINE": "separate"')" \
  --kernel "$(f16 h_ga_sep '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate"')" \
  --kernel "$(f16 h_tma_s3 '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 3, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate"')" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_combine_sweep_h100.json" \
  --md "$dest/benchmark_combine_sweep_h100.md" > "$dest/benchmark_combine_sweep_h100.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_combine_sweep_h100.log"
