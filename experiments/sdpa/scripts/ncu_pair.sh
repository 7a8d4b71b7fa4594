# On the GPU host, called by scripts/grid.sh (device_env.sh sourced): ncu of one Hopper-family kernel and cuDNN's
# SDPA kernel on the same inputs (ncu_pair.py), with the sections and metrics the README's comparisons read. The
# report goes to OUT_FILE; its summary lines go to stdout.
#   bash experiments/sdpa/scripts/ncu_pair.sh OUT_FILE --kernel FILE:TABLE/NAME --shape B,H,S[,causal] [...]
out=${1:?OUT_FILE first, then the arguments of ncu_pair.py}; shift
timeout ${NCU_LIMIT:-240} ncu -k regex:sdpa -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats --section Occupancy \
  --metrics "smsp__inst_executed.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_uniform.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 experiments/sdpa/ncu_pair.py "$@" > "$out" 2>&1
echo "ncu $(basename "$out") rc $?"
grep -E "^  [a-z_]+sdpa|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Eligible Warps|smsp__inst_executed.sum|Registers Per|Achieved Occupancy" \
  "$out" | cut -c1-150
