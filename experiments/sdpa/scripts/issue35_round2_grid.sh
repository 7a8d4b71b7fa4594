# On the H100 host (issue 35, second round): the Hopper GPU tests, then the grid with the mixed spaces' elites (rank 1
# and each shape's winner) and their bf16 renderings (the first round's grid_h100.log has the single-shape elites).
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout ${TESTS_LIMIT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py > $OUT/gpu_tests_hopper.log 2>&1
echo "gpu tests rc $?"; tail -2 $OUT/gpu_tests_hopper.log
R=experiments/sdpa/results/issue35
GRID_LIMIT=${GRID_LIMIT:-380} bash experiments/sdpa/scripts/hopper_grid.sh \
  mixed_d64=$R/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json \
  mixed_d128=$R/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json \
  bf16_d64=$R/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json@sdpa_hopper_bf16_d64 \
  bf16_d128=$R/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json@sdpa_hopper_bf16_d128
