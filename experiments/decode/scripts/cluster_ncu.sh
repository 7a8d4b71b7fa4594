source experiments/scripts/device_env.sh
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "SPLIT_WAVES": 1, "FAST_EXP": true, "STAGES": 2, "Q_IN_REGISTERS": false, "BLOCK_N": 128, "NUM_WARPS": 4'
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
for cb in cluster dependent; do
timeout -k 5 120 ncu --profile-from-start off --nvtx --section SpeedOfLight --section LaunchStats --section Occupancy --print-summary none \
  python3 experiments/decode/profile.py --kernel "f8_$cb=decode_fp8kv_d128:{$keys, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\", \"COMBINE\": \"$cb\"}" --kernel "h_$cb=decode_fp16_d128:{$keys, \"MIN_BLOCKS\": 1, \"COMBINE\": \"$cb\"}" --shape $shape --cache-dir $EVOENGINEER_CACHE > $OUT/ncu_${cb}_${shape//,/_}.txt 2>&1
echo "$cb $shape rc $?"
grep -E "decode_kernel|combine_kernel|Duration|Grid Size|Cluster Size|Waves Per SM|Block Limit|Achieved Occupancy|Memory Throughput|DRAM Throughput" $OUT/ncu_${cb}_${shape//,/_}.txt | head -40
done; done
