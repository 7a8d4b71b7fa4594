# On the GPU host, from the repository root (issue 34): probes/back_to_back.py on the fastest FP8 kernel (dependent
# combine) and the fp16 kernel at one sequence of 131072 keys and at 8 sequences of 16384. Log under $OUT.
#   bash experiments/decode/scripts/back_to_back_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/same_work || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "dependent", "FAST_EXP": true, "Q_IN_REGISTERS": false, "STAGES": 2, "SPLIT_WAVES": 1'
timeout -k 10 300 python3 experiments/decode/probes/back_to_back.py --cache-dir "$EVOENGINEER_CACHE" \
  --shapes '1,32,8,131072,128;8,32,8,16384,128;1,32,8,32768,128;8,32,8,4096,128' \
  --kernel "decode_fp8kv_d128:{$keys, \"DEQUANT\": \"k_registers\", \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" \
  --kernel "decode_fp16_d128:{$keys, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1}" ${REFS:+--references} 2>&1 | tee "$dest/back_to_back${REFS:+_references}_h100.md"
