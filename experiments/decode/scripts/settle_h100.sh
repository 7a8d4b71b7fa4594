# On the GPU host, from the repository root (issue 34): benchmark.py timing at once after each kernel's float64
# reference (--settle-s 0, as the tables before issue 34's eighth part) and after 0.2 s of replays (the default now),
# the same kernels and rows, one process each. Logs under $OUT.
#   [SHAPES="B,Hq,Hkv,Sq,Sk,D;..."] bash experiments/decode/scripts/settle_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/after_reference || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "FAST_EXP": true, "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false'
f8="decode_fp8kv_d128:{$keys, \"STAGES\": 2, \"DEQUANT\": \"k_registers\""
h="decode_fp16_d128:{$keys, \"NUM_WARPS\": 4, \"COMBINE\": \"cluster\", \"BLOCK_N\": 128, \"STAGES\": 3, \"MIN_BLOCKS\": 1}"
shapes=${SHAPES:-'8,32,8,1,8192,128;1,32,8,1,32768,128;32,32,8,1,2048,128;8,32,8,4,8192,128;8,32,8,1,16384,128;1,32,8,1,131072,128'}
for settle in 0 0.2; do
  BENCH_TIMEOUT=270 decode_bench "settle_$settle" --shapes "$shapes" --settle-s $settle \
    --kernel "f8_kreg=$f8, \"COMBINE\": \"dependent\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
    --kernel "f8_w8=$f8, \"COMBINE\": \"cluster\", \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1}" \
    --kernel "h128x4_s3=$h"
done
