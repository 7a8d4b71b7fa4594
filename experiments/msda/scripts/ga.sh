# On the GPU host: the GA (K=3 elites) on both CUDA MSDA spaces, then the benchmark of the fp16/fp32 elites.
#   bash experiments/msda/scripts/ga.sh [FP16_BUDGET] [FP32_BUDGET]
# Writes elite_fp16.json, elite_fp32.json, ga_*.log, ga_evals_*.csv (every evaluation in order, replay format),
# bench.json and bench.log under $OUT.
source experiments/scripts/device_env.sh || exit 1
budget16=${1:-200}
budget32=${2:-120}
for dt in fp16 fp32; do
  budget=$budget16; [ $dt = fp32 ] && budget=$budget32
  ( time python3 -m evoengineer search --space cuda_msda_$dt --budget "$budget" --population 24 --seed 0 \
      --db "sqlite:////tmp/ga_$dt.db" --out "$OUT/elite_$dt.json" ) > "$OUT/ga_$dt.log" 2>&1
  echo "ga $dt: exit $?; $(grep -E '^ +done' "$OUT/ga_$dt.log")"
  python3 -m evoengineer landscape --db "sqlite:////tmp/ga_$dt.db" --out "$OUT/ga_evals_cuda_msda_$dt.csv" 2>&1 | tail -1
done
python3 experiments/msda/benchmark.py --elite "$OUT/elite_fp16.json" --elite-fp32 "$OUT/elite_fp32.json" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
