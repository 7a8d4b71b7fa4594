# On the GPU host, from the repository root: one table of experiments/decode/tables.toml through benchmark.py in one
# process; the GPU's clocks and the table (JSON, Markdown, log) under $OUT. The `overhead` table is then fitted by
# overhead_fit.py. NCU="SHAPE [SHAPE ...]" (B,Hq,Hkv,Sq,Sk,D) adds Nsight Compute's sections of the table's kernels and
# cuDNN at those shapes (profile.py). Further arguments go to benchmark.py (e.g. --settle-s 0, --paged "").
#   bash experiments/decode/scripts/table.sh elites|final|slice16|overhead [benchmark.py options]
source experiments/scripts/device_env.sh || exit 1
table=${1:?a table of experiments/decode/tables.toml}; shift
config=experiments/decode/tables.toml
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu_$table.txt"
timeout -k 10 "${BENCH_TIMEOUT:-540}" python3 experiments/decode/benchmark.py --config $config --table "$table" "$@" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/benchmark_$table.json" --md "$OUT/benchmark_$table.md" \
  > "$OUT/benchmark_$table.log" 2>&1
echo "bench rc $?"
tail -9 "$OUT/benchmark_$table.log"
if [ "$table" = overhead ]; then
  python3 experiments/decode/overhead_fit.py "$OUT/benchmark_overhead.json" | tee "$OUT/overhead_fit.md"
fi
for shape in ${NCU:-}; do
  timeout -k 5 "${NCU_TIMEOUT:-120}" ncu --profile-from-start off --nvtx --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section InstructionStats --print-summary none \
    python3 experiments/decode/profile.py --config $config --table "$table" --cudnn --shape "$shape" \
    --cache-dir "$EVOENGINEER_CACHE" > "$OUT/ncu_${table}_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
done
