# On the GPU host, from the repository root (issue 34): where the FP8 decode kernels' warps stall (ncu warp-state
# and source counters) for the two dequantizations (registers / shared, else the table's fp8_tma genes) and the GA
# elite, at the decode shape and the long single sequence; text reports under $OUT.
#   bash experiments/decode/scripts/fp8_stalls.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/fp8_stalls}
r=experiments/decode/results
g='"BLOCK_N": 64, "NUM_WARPS": 4, "STAGES": 3, "LOAD_PATH": "tma", "Q_IN_REGISTERS": true, "COMBINE": "in_kernel",
   "FAST_EXP": true, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
kernels=(--kernel "fp8_reg=decode_fp8kv_d128:{$g, \"DEQUANT\": \"registers\"}"
         --kernel "fp8_sh=decode_fp8kv_d128:{$g, \"DEQUANT\": \"shared\"}"
         --kernel fp8_ga=$r/issue34/elite_tma_decode_fp8kv_d128.json "$@")
sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis"
timeout -k 5 200 python3 experiments/decode/profile.py "${kernels[@]}" --cudnn --shape 8,32,8,1,8192,128 \
  --cache-dir "$EVOENGINEER_CACHE" > "$dest/fp8_stalls_plain.log" 2>&1; echo "plain rc $?"; tail -5 "$dest/fp8_stalls_plain.log"
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  timeout -k 5 150 ncu --profile-from-start off --nvtx $sections --print-summary none \
    python3 experiments/decode/profile.py "${kernels[@]}" --shape $shape \
    --cache-dir "$EVOENGINEER_CACHE" > "$dest/fp8_stalls_ncu_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
done
