# On the GPU host, from the repository root (issue 34): what a call costs besides streaming. The fastest FP8 and fp16
# kernels (COMBINE = cluster) and cuDNN at one sequence (B = 1) and at the decode batch (B = 8), Sk from 4k to 128k
# keys, one process; overhead_fit.py fits time = overhead + bytes / rate per kernel. Logs under $OUT.
#   bash experiments/decode/scripts/overhead_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/overhead || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "cluster", "FAST_EXP": true, "Q_IN_REGISTERS": false, "STAGES": 2, "SPLIT_WAVES": 1'
f8="decode_fp8kv_d128:{$keys, \"DEQUANT\": \"k_registers\""
shapes="1,32,8,4096,128;1,32,8,8192,128;1,32,8,16384,128;1,32,8,32768,128;1,32,8,65536,128;1,32,8,131072,128"
shapes="$shapes;8,32,8,2048,128;8,32,8,4096,128;8,32,8,8192,128;8,32,8,16384,128"
BENCH_TIMEOUT=400 decode_bench overhead --shapes "$shapes" --kernel "f8_kreg=$f8, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
  --kernel "f8_w8=$f8, \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1}" \
  --kernel "h128x4=decode_fp16_d128:{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}"
python3 experiments/decode/overhead_fit.py "$dest/benchmark_overhead_h100.json" | tee "$dest/overhead_fit_h100.md"
