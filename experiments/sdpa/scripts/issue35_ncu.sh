# On the GPU host (issue 35): stall reasons and pipe use of the searched FP8 elite at (4, 16, 4096, 128), non-causal
# (ncu; the first timed launch after the probe's four check shapes).
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout 300 ncu -k regex:sdpa_hopper --launch-skip 4 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_uniform.sum,smsp__inst_executed.sum,sm__inst_executed_pipe_lsu.sum" \
  python3 experiments/sdpa/hopper_probe.py --space sdpa_hopper_fp8_d128_large \
  --genomes experiments/sdpa/genomes/issue35_fp8_best.json --shapes "4,16,4096" --cache-dir /tmp/evo-cache \
  > $OUT/ncu_fp8_best.txt 2>&1
grep -E "stalled|inst_executed|Issue Slots|Eligible|No Eligible|Duration|Active Warps" $OUT/ncu_fp8_best.txt | awk '$NF+0 > 0.05 || /inst/' | head -60
