# On the H100 host (issue 35, sixth round): a GA run of the FP8 mixed space (seed 1, 144 evaluations or
# SEARCH_LIMIT s), then the grid with the first round's FP8 large elite and the new run's rank 1 and shape winners.
# Results under $OUT (the store not kept).
#   bash experiments/sdpa/scripts/issue35_round6_fp8_mixed.sh
export EVOENGINEER_CACHE=/tmp/evo-cache
SEARCH_LIMIT=${SEARCH_LIMIT:-280} bash experiments/sdpa/scripts/hopper_searches.sh sdpa_hopper_fp8_d128_mixed_large 1 144 \
  --generations 12
R=experiments/sdpa/results/issue35
GRID_LIMIT=${GRID_LIMIT:-250} bash experiments/sdpa/scripts/hopper_grid.sh \
  fp8_large=$R/elite_sdpa_hopper_fp8_d128_large_seed2.json \
  fp8_mixed=$OUT/elite_sdpa_hopper_fp8_d128_mixed_large_seed1.json
