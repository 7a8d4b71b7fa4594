# On the GPU host, from the repository root (issue 34): hand-picked fp16 tma genomes aimed at the one long sequence
# (1, 32, 8, 1, 32768): the combine in the kernel or apart, two waves of splits, 64-key tiles with a deeper ring,
# eight warps; every shape of the table, one process; logs under $OUT.
#   bash experiments/decode/scripts/sweep32k_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
base='"COPY_BYTES": 16, "M_TILES": 1, "LOAD_PATH": "tma", "FAST_EXP": true'
k() { echo "$1=decode_fp16_d128:{$base, $2}"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_sweep32k.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py \
  --kernel "$(k tma '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate", "MIN_BLOCKS": 1')" \
  --kernel "$(k tma_ik '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "in_kernel", "MIN_BLOCKS": 1')" \
  --kernel "$(k tma_w2 '"BLOCK_N": 128, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 2, "COMBINE": "separate", "MIN_BLOCKS": 1')" \
  --kernel "$(k n64_s4 '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 4, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate", "MIN_BLOCKS": 1')" \
  --kernel "$(k w8 '"BLOCK_N": 128, "NUM_WARPS": 8, "STAGES": 2, "Q_IN_REGISTERS": false, "SPLIT_WAVES": 1, "COMBINE": "separate", "MIN_BLOCKS": 1')" \
  --kernel "$(k w8_s3 '"BLOCK_N": 128, "NUM_WARPS": 8, "STAGES": 3, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "in_kernel", "MIN_BLOCKS": 1')" \
  --kernel "$(k ga '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "in_kernel", "MIN_BLOCKS": 1')" \
  --kernel "$(k ga_w2 '"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 2, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 2, "COMBINE": "separate", "MIN_BLOCKS": 1')" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_sweep32k.json" --md "$dest/benchmark_sweep32k.md" \
  > "$dest/benchmark_sweep32k.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_sweep32k.log"
