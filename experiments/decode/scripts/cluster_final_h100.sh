# On the GPU host, from the repository root (issue 34): the fastest kernel of each kind with COMBINE = cluster (FP8
# k_registers at 256-key tiles of 8 warps and 128-key tiles of 4, FP8 registers for Sq = 4, fp16 keys at 128-key
# tiles of 4 warps with 3 stages and 64-key tiles of 4 with MIN_BLOCKS 2) against cuDNN on every shape, and their
# paged twins at page sizes 16 and 64 (NO_PAGED=" ": without them; NAME: the table's name); one process. Logs
# under $OUT.
#   bash experiments/decode/scripts/cluster_final_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/final || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "cluster", "FAST_EXP": true, "SPLIT_WAVES": 1'
f8="decode_fp8kv_d128:{$keys, \"Q_IN_REGISTERS\": false, \"STAGES\": 2"
h="decode_fp16_d128:{$keys, \"NUM_WARPS\": 4"
BENCH_TIMEOUT=480 decode_bench "${NAME:-cluster_final}" ${NO_PAGED:---paged 16,64} \
  --kernel "f8_w8=$f8, \"DEQUANT\": \"k_registers\", \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1}" \
  --kernel "f8_kreg=$f8, \"DEQUANT\": \"k_registers\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
  --kernel "f8_reg=$f8, \"DEQUANT\": \"registers\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
  --kernel "h128x4_s3=$h, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 128, \"STAGES\": 3, \"MIN_BLOCKS\": 1}" \
  --kernel "h64x4=$h, \"Q_IN_REGISTERS\": false, \"BLOCK_N\": 64, \"STAGES\": 2, \"MIN_BLOCKS\": 2}"
