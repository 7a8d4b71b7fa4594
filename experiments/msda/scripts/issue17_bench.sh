#!/bin/bash
# Issue 17, on the GPU host from the repository root: the benchmark (fp16 + fp32) and ncu of the best encoder kernel
# and of the gather floor. Logs to $OUT.
source experiments/scripts/device_env.sh || exit 1
cd experiments/msda
timeout ${BENCH_S:-330} python3 benchmark.py --elite sweeps/bench_fp16_issue17.json --elite-fp32 sweeps/bench_fp32_issue17.json \
  --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/bench_issue17.json" > "$OUT/bench_issue17.log" 2>&1
echo "bench exit $?"
cd ../..
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
metrics="--metrics l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct"
python3 -c "import json; print(json.dumps(json.load(open('experiments/msda/sweeps/bench_fp16_issue17.json'))['elites'][0]['params']))" > /tmp/enc.json
timeout 150 ncu --kernel-name regex:msda_forward --launch-skip 2 --launch-count 1 $sections $metrics \
  python3 experiments/msda/profile_one.py --params /tmp/enc.json --cache-dir "$EVOENGINEER_CACHE" > "$OUT/ncu_encoder_best.txt" 2>&1
echo "ncu elite exit $?"
timeout 120 ncu --kernel-name regex:floor_gather --launch-count 1 $sections $metrics \
  python3 experiments/msda/gather_floor.py --build-dir "$EVOENGINEER_CACHE" > "$OUT/ncu_floor.txt" 2>&1
echo "ncu floor exit $?"
