# On the GPU host, from the repository root (issue 34): the best kernel of each kind so far against cuDNN on every
# shape, one process (FP8 keys on M with K from raw bytes at 128-key tiles of 4 warps or 64-key tiles of 2 warps
# (the GA elite of results/issue34/paged_keys), its neighbours with 3 stages; FP8 registers for Sq = 4; fp16 tma
# keys), then ncu of the FP8 leader at the decode shape and the long sequence. Logs under $OUT.
#   bash experiments/decode/scripts/final_h100.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/final}
mkdir -p "$dest"
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "SPLIT_WAVES": 1, "COMBINE": "separate"'
kreg="{$keys, \"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\"}"
w2="{$keys, \"FAST_EXP\": false, \"Q_IN_REGISTERS\": true, \"BLOCK_N\": 64, \"NUM_WARPS\": 2, \"DEQUANT\": \"k_registers\""
args=(--kernel "f8_kreg=decode_fp8kv_d128:$kreg"
      --kernel "f8_ga=experiments/decode/results/issue34/paged_keys/elite_ga_dequant_decode_fp8kv_d128.json"
      --kernel "f8_w2_st3=decode_fp8kv_d128:$w2, \"STAGES\": 3, \"MIN_BLOCKS\": 8}"
      --kernel "f8_w2_fast=decode_fp8kv_d128:${w2/\"FAST_EXP\": false/\"FAST_EXP\": true}, \"STAGES\": 2, \"MIN_BLOCKS\": 8}"
      --kernel "f8_kreg_st3=decode_fp8kv_d128:${kreg/\"STAGES\": 2/\"STAGES\": 3}"
      --kernel "f8_reg=decode_fp8kv_d128:${kreg/k_registers/registers}"
      --kernel "h_tma_keys=decode_fp16_d128:{$keys, \"FAST_EXP\": true, \"STAGES\": 2, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_final.txt"
timeout -k 10 ${BENCH_TIMEOUT:-300} python3 experiments/decode/benchmark.py "${args[@]}" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_final_h100.json" --md "$dest/benchmark_final_h100.md" \
  > "$dest/benchmark_final_h100.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_final_h100.log"
[ -n "$NO_NCU" ] && exit 0
sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats"
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  timeout -k 5 120 ncu --profile-from-start off --nvtx $sections --print-summary none \
    python3 experiments/decode/profile.py --kernel "f8_kreg=decode_fp8kv_d128:$kreg" --shape $shape \
    --cache-dir "$EVOENGINEER_CACHE" > "$dest/final_ncu_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
done
