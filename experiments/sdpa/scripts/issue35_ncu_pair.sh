# On the H100 host (issue 35, second round): the Hopper GPU tests at this template, then ncu of the mixed spaces'
# shape winners next to cuDNN's kernel on the same inputs, at (16,16,1024,128) causal and (4,16,4096,128) non-causal.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout ${TESTS_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py > $OUT/gpu_tests_hopper.log 2>&1
echo "gpu tests rc $?"; tail -2 $OUT/gpu_tests_hopper.log
E=experiments/sdpa/results/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json
for pick in "b16_s1024_causal:16,16,1024,causal" "b4_s4096:4,16,4096"; do
  name=${pick%%:*}; shape=${pick#*:}
  bash experiments/sdpa/scripts/ncu_pair.sh "$OUT/ncu_pair_$name.txt" --elite "$E:$name" --shape "$shape" \
    --cache-dir /tmp/evo-cache
done
