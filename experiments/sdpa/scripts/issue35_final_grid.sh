# On the H100 host (issue 35, closing table): the grid at the final template with the best recorded kernel of every
# search, one head dim (or FP8) per device call so that each fits the 10-minute limit; FP8 also gets the ncu pair
# (our kernel next to cuDNN's fp16 kernel on the same draws) at its two target shapes. Logs under $OUT.
#   bash experiments/sdpa/scripts/issue35_final_grid.sh d64|d128|fp8
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
R=experiments/sdpa/results
part=${1:?which part: d64, d128 or fp8}
case "$part" in
  d64) kernels=(
    mission_d64=$R/hopper/elite_sdpa_hopper_fp16_d64_seed3.json
    mixed_d64_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json
    mixed_d64_s3=$R/issue35/round4/elite_sdpa_hopper_fp16_d64_mixed_large_seed3.json
    bf16_mission_d64=$R/hopper/elite_sdpa_hopper_fp16_d64_seed3.json@sdpa_hopper_bf16_d64
    bf16_d64_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json@sdpa_hopper_bf16_d64
    bf16_d64_s3=$R/issue35/round4/elite_sdpa_hopper_fp16_d64_mixed_large_seed3.json@sdpa_hopper_bf16_d64) ;;
  d128) kernels=(
    mission_d128=$R/hopper/elite_sdpa_hopper_fp16_d128_seed1.json
    large_d128=$R/issue35/elite_sdpa_hopper_fp16_d128_large_seed1.json
    mixed_d128_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json
    bf16_mission_d128=$R/hopper/elite_sdpa_hopper_fp16_d128_seed1.json@sdpa_hopper_bf16_d128
    bf16_d128_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json@sdpa_hopper_bf16_d128) ;;
  fp8) kernels=(
    fp8_large=$R/issue35/elite_sdpa_hopper_fp8_d128_large_seed2.json
    fp8_mixed=$R/issue35/round6/elite_sdpa_hopper_fp8_d128_mixed_large_seed1.json) ;;
  *) echo "unknown part '$part' (d64, d128 or fp8)"; exit 2 ;;
esac
GRID_NAME=grid_final_$part GRID_LIMIT=${GRID_LIMIT:-400} bash experiments/sdpa/scripts/hopper_grid.sh "${kernels[@]}"
[ "$part" = fp8 ] || exit 0
# ncu: the FP8 large elite at (4,16,4096) and the mixed run's (16,16,1024) winner, each beside cuDNN's fp16 kernel
NCU_LIMIT=150 bash experiments/sdpa/scripts/ncu_pair.sh "$OUT/ncu_pair_fp8_b4_s4096.txt" \
  --elite $R/issue35/elite_sdpa_hopper_fp8_d128_large_seed2.json --shape 4,16,4096 --cache-dir "$EVOENGINEER_CACHE"
NCU_LIMIT=150 bash experiments/sdpa/scripts/ncu_pair.sh "$OUT/ncu_pair_fp8_b16_s1024.txt" \
  --elite $R/issue35/round6/elite_sdpa_hopper_fp8_d128_mixed_large_seed1.json:b16_s1024 --shape 16,16,1024 \
  --cache-dir "$EVOENGINEER_CACHE"
