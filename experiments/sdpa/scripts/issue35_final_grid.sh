# On the H100 host (issue 35, closing table): the grid at the final template with the best recorded kernel of every
# search, one head dim (or FP8) per device call so that each fits the 10-minute limit; FP8 also gets the ncu pair
# (our kernel next to cuDNN's fp16 kernel on the same draws) at its two target shapes. Logs under $OUT.
#   bash experiments/sdpa/scripts/issue35_final_grid.sh d64|d128|fp8
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
R=experiments/sdpa/results
part=${1:?which part: d64, d128 or fp8}
case "$part" in
  d64) kernels=(
    mission_d64=$R/hopper/elite_sdpa_hopper_fp16_d64_seed3.json
    mixed_d64_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json
    mixed_d64_s3=$R/issue35/round4/elite_sdpa_hopper_fp16_d64_mixed_large_seed3.json
    bf16_mission_d64=$R/hopper/elite_sdpa_hopper_fp16_d64_seed3.json@sdpa_hopper_bf16_d64
    bf16_d64_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d64_mixed_large_seed1.json@sdpa_hopper_bf16_d64
    bf16_d64_s3=$R/issue35/round4/elite_sdpa_hopper_fp16_d64_mixed_large_seed3.json@sdpa_hopper_bf16_d64) ;;
  d128) kernels=(
    mission_d128=$R/hopper/elite_sdpa_hopper_fp16_d128_seed1.json
    large_d128=$R/issue35/elite_sdpa_hopper_fp16_d128_large_seed1.json
    mixed_d128_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json
    bf16_mission_d128=$R/hopper/elite_sdpa_hopper_fp16_d128_seed1.json@sdpa_hopper_bf16_d128
    bf16_d128_s1=$R/issue35/round2/elite_sdpa_hopper_fp16_d128_mixed_large_seed1.json@sdpa_hopper_bf16_d128) ;;
  fp8) kernels=(
    fp8_large=$R/issue35/elite_sdpa_hopper_fp8_d128_large_seed2.json
    fp8_mixed=$R/issue35/round6/elite_sdpa_hopper_fp8_d128_mixed_large_seed1.json) ;;
  *) echo "unknown part '$part' (d64, d128 or fp8)"; exit 2 ;;
esac
GRID_LIMIT=${GRID_LIMIT:-400} bash experiments/sdpa/scripts/hopper_grid.sh "${kernels[@]}"
mv "$OUT/grid.json" "$OUT/grid_final_$part.json"; mv "$OUT/grid.log" "$OUT/grid_final_$part.log"
[ "$part" = fp8 ] || exit 0
# ncu: the FP8 large elite at (4,16,4096) and the mixed run's (16,16,1024) winner, each beside cuDNN's fp16 kernel
E=$R/issue35/round6/elite_sdpa_hopper_fp8_d128_mixed_large_seed1.json
g_small=$(python3 -c "import json; d=json.load(open('$E')); print(json.dumps(next(e['params'] for e in d['shape_elites'] if e['shape']=='b16_s1024')))")
g_large=$(python3 -c "import json; print(json.dumps(json.load(open('$R/issue35/elite_sdpa_hopper_fp8_d128_large_seed2.json'))['elites'][0]['params']))")
for pick in "b4_s4096|4,16,4096|$g_large" "b16_s1024|16,16,1024|$g_small"; do
  IFS='|' read -r name shape g <<< "$pick"
  timeout 150 ncu -k regex:sdpa -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section Occupancy \
    --metrics "smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_uniform.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 experiments/sdpa/ncu_pair.py --space sdpa_hopper_fp8_d128_large --genome "$g" --shape "$shape" \
    --cache-dir "$EVOENGINEER_CACHE" > "$OUT/ncu_pair_fp8_$name.txt" 2>&1
  echo "ncu $name rc $?"
  grep -E "^  [a-z_]+sdpa|Duration|gmma_cycles|Issue Slots Busy|Eligible Warps|smsp__inst_executed.sum|Registers Per" \
    "$OUT/ncu_pair_fp8_$name.txt" | cut -c1-150
done
