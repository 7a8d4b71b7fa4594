# On the GPU host, from the repository root (issue 34), after cluster_h100.sh: (1) fp16 keys-on-M genomes around the
# fastest fp16 kernel with COMBINE = cluster (tile, warps, stages, register caps, split waves) on every shape, for the
# fp16 >= 1.0x target; (2) the fastest cluster kernels of each dtype paged at page sizes 16 and 64 against their
# contiguous twins. One process per table; logs under $OUT.
#   bash experiments/decode/scripts/cluster_sweep_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/sweep || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "cluster", "FAST_EXP": true'
h() { echo "decode_fp16_d128:{$keys, \"Q_IN_REGISTERS\": ${6:-false}, \"BLOCK_N\": $1, \"NUM_WARPS\": $2, \"STAGES\": $3, \"MIN_BLOCKS\": $4, \"SPLIT_WAVES\": $5}"; }
decode_bench fp16_sweep --kernel "h128x4=$(h 128 4 2 1 1)" --kernel "h128x4_w2=$(h 128 4 2 1 2)" \
  --kernel "h128x4_s3=$(h 128 4 3 1 1)" --kernel "h128x8=$(h 128 8 2 1 1)" --kernel "h64x4=$(h 64 4 2 2 1)" \
  --kernel "h64x4_s4=$(h 64 4 4 1 1)" --kernel "h64x2_s4=$(h 64 2 4 4 1 true)" --kernel "h128x4_w4=$(h 128 4 2 1 4)" \
  --kernel "h64x4_q=$(h 64 4 3 2 1 true)"
f8="decode_fp8kv_d128:{$keys, \"Q_IN_REGISTERS\": false, \"STAGES\": 2, \"SPLIT_WAVES\": 1, \"DEQUANT\": \"k_registers\""
BENCH_TIMEOUT=360 decode_bench cluster_paged --paged 16,64 --kernel "f8_w8=$f8, \"BLOCK_N\": 256, \"NUM_WARPS\": 8, \"MIN_BLOCKS\": 1}" \
  --kernel "f8_kreg=$f8, \"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2}" --kernel "h128x4=$(h 128 4 2 1 1)"
