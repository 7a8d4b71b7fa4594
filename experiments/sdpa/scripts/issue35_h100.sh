# On the H100 host (issue 35): the FP8 GPU tests, a probe of FP8 genomes around the searched elite, then the grid
# table with the large-timed elites of this issue's searches and the earlier mission-timed elites, one process each.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
R=experiments/sdpa/results
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py -k fp8 2>&1 | tee $OUT/gpu_fp8.log | tail -3
timeout 150 python3 experiments/sdpa/hopper_probe.py --space sdpa_hopper_fp8_d128_large \
  --genomes experiments/sdpa/genomes/issue35_fp8_shapes.json --shapes "4,16,4096;16,16,1024" \
  --cache-dir /tmp/evo-cache --json $OUT/probe_fp8_h100.json > $OUT/probe_fp8_h100.log 2>&1
grep -v "^{" $OUT/probe_fp8_h100.log | grep -v "^ " | head; grep -c "x cuDNN" $OUT/probe_fp8_h100.log
GRID_LIMIT=300 bash experiments/sdpa/scripts/hopper_grid.sh \
  mission_d64=$R/hopper/elite_sdpa_hopper_fp16_d64_seed3.json \
  large_d64=$R/issue35/elite_sdpa_hopper_fp16_d64_large_seed1.json \
  mission_d128=$R/hopper/elite_sdpa_hopper_fp16_d128_seed1.json \
  large_d128=$R/issue35/elite_sdpa_hopper_fp16_d128_large_seed1.json \
  fp8_d128=$R/issue35/elite_sdpa_hopper_fp8_d128_large_seed2.json
