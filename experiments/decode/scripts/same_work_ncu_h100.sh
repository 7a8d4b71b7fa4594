# On the GPU host, from the repository root (issue 34): the FP8 kernel streams ~2500 GB/s at one sequence and ~3000
# at the decode batch (overhead_h100.sh). (1, 32, 8, 1, 131072) and (8, 32, 8, 1, 16384) give its CTAs the same work
# (256 CTAs of 32 tiles, 512 KB chunks of K and of V at the same offsets): ncu of both, and of the fp16 kernel at both.
# Logs under $OUT.
#   bash experiments/decode/scripts/same_work_ncu_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/same_work || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "cluster", "FAST_EXP": true, "Q_IN_REGISTERS": false, "STAGES": 2, "SPLIT_WAVES": 1'
for shape in 1,32,8,1,131072,128 8,32,8,1,16384,128; do
  decode_ncu same_work $shape --kernel "f8_kreg=decode_fp8kv_d128:{$keys, \"DEQUANT\": \"k_registers\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
    --kernel "h128x4=decode_fp16_d128:{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}"
  grep -E "^  [a-z_]+_kernel|Duration|DRAM Throughput|Grid Size|L2 Hit Rate|Mem Busy|Max Bandwidth|Issue Slots Busy|No Eligible|Stall Long" "$dest/same_work_ncu_${shape//,/_}.txt"
done
