#!/bin/bash
# Issue 17, third step: ncu of path-5 genomes on the encoder (GPU host, repository root). Logs to $OUT.
source experiments/scripts/device_env.sh || exit 1
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters"
metrics="--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed.sum"
i=0
merges=('{"WINDOW_TILE": 4, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 8, "WINDOW_STAGES": 4, "MIN_BLOCKS_PER_SM": 1}'
        '{"WINDOW_TILE": 8, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 4, "WINDOW_STAGES": 3, "MIN_BLOCKS_PER_SM": 1}')
[ -n "$NCU_ONLY_FIRST" ] && merges=("${merges[0]}")
for merge in "${merges[@]}"; do
  i=$((i + 1))
  echo "$merge" > "$OUT/ncu_wpipe_$i.txt"
  timeout 200 ncu --kernel-name regex:msda_wpipe --launch-skip 1 --launch-count 1 $sections $metrics \
    python3 experiments/msda/profile_one.py --params experiments/msda/sweeps/elite_v2.json --merge "$merge" \
    --calls 2 --cache-dir "$EVOENGINEER_CACHE" >> "$OUT/ncu_wpipe_$i.txt" 2>&1
  echo "ncu $i exit $?"
done
