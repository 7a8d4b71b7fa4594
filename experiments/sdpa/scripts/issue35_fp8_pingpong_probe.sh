# On the H100 host (issue 35, seventh round): FlashAttention-3's FP8 configuration in this template. Two consumer
# warpgroups of 64 rows in ping-pong with intra-warpgroup overlap, 160 / 192 / 128 keys (its 224 spills here: ptxas
# at the 40-register producer split). Beside the large elite, with and without DESC_OFFSETS. hopper_probe checks each
# kernel, then times it next to cuDNN fp16. Logs under $OUT.
#   bash experiments/sdpa/scripts/issue35_fp8_pingpong_probe.sh
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout -k 10 ${PROBE_LIMIT:-400} python3 experiments/sdpa/hopper_probe.py --space sdpa_hopper_fp8_d128_large \
  --genomes experiments/sdpa/genomes/fp8_fa3_like.json --shapes "4,16,4096;16,16,1024" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/fp8_pingpong_probe.json" > "$OUT/fp8_pingpong_probe.log" 2>&1
echo "probe rc $?"; grep -v "^{" "$OUT/fp8_pingpong_probe.log" | tail -30
