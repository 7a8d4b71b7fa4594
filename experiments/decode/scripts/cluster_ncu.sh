# On the GPU host, from the repository root (issue 34): ncu launch statistics (grid, cluster size, occupancy,
# duration, DRAM throughput) of the FP8 and fp16 keys kernels with COMBINE = cluster and dependent at the decode shape
# and the long sequence: how many splits the launcher gave each cluster. (Run on the first version of the launcher,
# which lowered the split count until the clusters fit: results/issue34/cluster/first/.) Logs under $OUT.
#   bash experiments/decode/scripts/cluster_ncu.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/first || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "SPLIT_WAVES": 1, "FAST_EXP": true, "STAGES": 2, "Q_IN_REGISTERS": false, "BLOCK_N": 128, "NUM_WARPS": 4'
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  for cb in cluster dependent; do
    timeout -k 5 120 ncu --profile-from-start off --nvtx --section SpeedOfLight --section LaunchStats --section Occupancy \
      --print-summary none python3 experiments/decode/profile.py --shape $shape --cache-dir "$EVOENGINEER_CACHE" \
      --kernel "f8_$cb=decode_fp8kv_d128:{$keys, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\", \"COMBINE\": \"$cb\"}" \
      --kernel "h_$cb=decode_fp16_d128:{$keys, \"MIN_BLOCKS\": 1, \"COMBINE\": \"$cb\"}" > "$dest/ncu_${cb}_${shape//,/_}.txt" 2>&1
    echo "$cb $shape rc $?"
    grep -E "decode_kernel|combine_kernel|Duration|Grid Size|Cluster Size|DRAM Throughput" "$dest/ncu_${cb}_${shape//,/_}.txt"
  done
done
