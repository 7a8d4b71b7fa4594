# On the GPU host, from the repository root (issue 34): FP8 kernels of one CTA an SM (whose 2 splits a group fit as
# clusters at the decode shape) around the 256-key, 8-warp k_registers kernel of cluster_final_h100.sh: stages,
# 16-key slices, Q in registers, exp2, 4-warp CTAs with a 4-deep ring; COMBINE = cluster; decode shape and 32k, one
# process. Logs under $OUT.
#   bash experiments/decode/scripts/cluster_w8_sweep_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/w8_sweep || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "MMA_ROWS": "keys", "COMBINE": "cluster", "SPLIT_WAVES": 1, "MIN_BLOCKS": 1, "DEQUANT": "k_registers"'
f8() { echo "decode_fp8kv_d128:{$keys, \"BLOCK_N\": $1, \"NUM_WARPS\": $2, \"STAGES\": $3, \"Q_IN_REGISTERS\": ${4:-false}, \"FAST_EXP\": ${5:-true}}"; }
decode_bench w8_sweep --shapes "8,32,8,8192,128;1,32,8,32768,128" --kernel "w8=$(f8 256 8 2)" \
  --kernel "w8_q=$(f8 256 8 2 true)" --kernel "w8_exp=$(f8 256 8 2 false false)" --kernel "n128w8_s4=$(f8 128 8 4)" \
  --kernel "n128w8_s3=$(f8 128 8 3)" --kernel "n128w4_s4=$(f8 128 4 4)"
