# RECORD (issue 35, second round): ran at commits with the CROSS_TILE gene (since removed from the template and the
# spaces); its genome files were experiments/sdpa/genomes/cross_tile_ab_*.json, now beside this script.
# On the H100 host (issue 35, second round): the Hopper GPU tests at this template, then CROSS_TILE off / on for
# persistent genomes around the mixed spaces' winners (hopper_probe: checks, then times next to cuDNN, one process per
# head dim) at (16,16,1024) and (4,16,4096), causal and not.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout ${TESTS_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py > $OUT/gpu_tests_hopper.log 2>&1
echo "gpu tests rc $?"; tail -3 $OUT/gpu_tests_hopper.log
for d in d64 d128; do
  timeout ${PROBE_LIMIT:-130} python3 experiments/sdpa/hopper_probe.py --space sdpa_hopper_fp16_${d}_mixed_large \
    --genomes experiments/sdpa/genomes/cross_tile_ab_$d.json --shapes "16,16,1024;4,16,4096" --cache-dir /tmp/evo-cache \
    --json $OUT/cross_tile_$d.json > $OUT/cross_tile_$d.log 2>&1
  echo "probe $d rc $?"; grep "x cuDNN\|WRONG\|^{" $OUT/cross_tile_$d.log | sed 's/"FAST_EXP":true,//; s/"POLY_EXP2":0,//'
done
