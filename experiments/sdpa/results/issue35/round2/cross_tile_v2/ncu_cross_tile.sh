# RECORD (issue 35, second round): run with the template and d64 mixed space of commit 8170d9c (CROSS_TILE v2) checked
# out in the working tree; ncu of the same genome with CROSS_TILE off and on at (16, 16, 1024, 64) non-causal.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
for ct in false true; do
  g='{"BLOCK_M":192,"BLOCK_N":128,"STAGES":3,"NUM_CONSUMER_WARPGROUPS":3,"PRODUCER_REGS":24,"PINGPONG":false,"INTRA_WG_OVERLAP":true,"PERSISTENT":true,"Q_PREFETCH":false,"FAST_EXP":true,"CLUSTER_SIZE":2,"RESCALE":"lazy","POLY_EXP2":0,"DESC_OFFSETS":false,"CROSS_TILE":'$ct'}'
  timeout 200 ncu -k regex:sdpa_hopper -c 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 experiments/sdpa/ncu_pair.py --space sdpa_hopper_fp16_d64_mixed_large --genome "$g" --shape 16,16,1024 \
    --cache-dir /tmp/evo-cache > $OUT/ncu_cross_tile_$ct.txt 2>&1
  echo "ct=$ct rc $?"
  grep -E "Duration|Issue Slots Busy|No Eligible|smsp__inst_executed.sum|stalled_(barrier|long_scoreboard|wait|short_scoreboard|gmma|membar|sleeping|branch_resolving|dispatch|math|mio|no_instruction|lg|drain|tex|imc|misc)" $OUT/ncu_cross_tile_$ct.txt | awk '{print $1, $NF}'
done
