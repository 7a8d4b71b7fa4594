# On the H100 host (issue 35, second round): the Hopper GPU tests at this template, then ncu of the mixed spaces'
# shape winners next to cuDNN's kernel on the same inputs, at (16,16,1024,128) causal and (4,16,4096,128) non-causal.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout ${TESTS_LIMIT:-300} python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py > $OUT/gpu_tests_hopper.log 2>&1
echo "gpu tests rc $?"; tail -2 $OUT/gpu_tests_hopper.log
E=experiments/sdpa/results/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json
for pick in "b16_s1024_causal:16,16,1024,causal" "b4_s4096:4,16,4096"; do
  name=${pick%%:*}; shape=${pick#*:}
  g=$(python3 -c "import json,sys; d=json.load(open('$E')); print(json.dumps(next(e['params'] for e in d['shape_elites'] if e['shape']=='$name')))")
  timeout 240 ncu -k regex:sdpa -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section Occupancy \
    --metrics "smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_uniform.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 experiments/sdpa/ncu_pair.py --space sdpa_hopper_fp16_d128_mixed_large --genome "$g" --shape $shape \
    --cache-dir /tmp/evo-cache > $OUT/ncu_pair_$name.txt 2>&1
  echo "ncu $name rc $?"
  grep -E "^  [a-z_]+sdpa|Duration|Compute \(SM\) Throughput|gmma_cycles|Issue Slots Busy|No Eligible|Eligible Warps|smsp__inst_executed.sum|Registers Per|Achieved Occupancy" $OUT/ncu_pair_$name.txt | cut -c1-150
done
