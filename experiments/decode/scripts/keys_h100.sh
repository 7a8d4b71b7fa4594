# On the GPU host, from the repository root (issue 34): MMA_ROWS = keys (S^T = K Q^T, O^T = V^T P^T) against the
# same genes with queries on M, every shape, one process; logs under $OUT.
#   bash experiments/decode/scripts/keys_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/keys}
mkdir -p "$dest"
base='"LOAD_PATH": "tma", "COPY_BYTES": 16, "FAST_EXP": true, "MIN_BLOCKS": 1, "SPLIT_WAVES": 1'
h_tma='"M_TILES": 1, "BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "COMBINE": "separate"'
h_ga='"M_TILES": 1, "BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": true, "COMBINE": "in_kernel"'
f_ga='"M_TILES": 1, "BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "Q_IN_REGISTERS": true, "COMBINE": "separate", "DEQUANT": "shared"'
f_tma='"M_TILES": 1, "BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 3, "Q_IN_REGISTERS": true, "COMBINE": "separate", "DEQUANT": "shared"'
args=()
pair() {  # LABEL SPACE GENES: the genes with queries, then keys, on M
  args+=(--kernel "$1=$2:{$base, $3, \"MMA_ROWS\": \"queries\"}" --kernel "$1_keys=$2:{$base, $3, \"MMA_ROWS\": \"keys\"}")
}
pair h_tma decode_fp16_d128 "$h_tma"
pair h_ga decode_fp16_d128 "$h_ga"
pair f8_ga decode_fp8kv_d128 "$f_ga"
pair f8_tma decode_fp8kv_d128 "$f_tma"
# 16 query rows (Sq = 4) in one chunk with keys on M: two row tiles
args+=(--kernel "h_tma_keys_m2=decode_fp16_d128:{$base, ${h_tma/\"M_TILES\": 1/\"M_TILES\": 2}, \"MMA_ROWS\": \"keys\"}"
       --kernel "f8_ga_keys_m2=decode_fp8kv_d128:{$base, ${f_ga/\"M_TILES\": 1/\"M_TILES\": 2}, \"MMA_ROWS\": \"keys\"}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_keys.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py "${args[@]}" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_keys_h100.json" --md "$dest/benchmark_keys_h100.md" \
  > "$dest/benchmark_keys_h100.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_keys_h100.log"
