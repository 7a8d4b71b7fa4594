# On the GPU host: the grid (benchmark.py --grid) of one table of experiments/sdpa/grid.toml, one device call each;
# fp8 also runs the ncu pair (our FP8 kernel beside cuDNN's fp16 kernel on the same draws) at its two target shapes.
# Logs under $OUT.
#   bash experiments/sdpa/scripts/grid.sh d64|d128|fp8
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
table=${1:?a table of experiments/sdpa/grid.toml: d64, d128 or fp8}
config=experiments/sdpa/grid.toml
timeout -k 10 "${GRID_LIMIT:-400}" python3 experiments/sdpa/benchmark.py --grid --config $config --table "$table" \
  --json "$OUT/grid_$table.json" 2>&1 | tee "$OUT/grid_$table.log" | tail -40
[ "$table" = fp8 ] || exit 0
NCU_LIMIT=150 bash experiments/sdpa/scripts/ncu_pair.sh "$OUT/ncu_pair_fp8_b4_s4096.txt" \
  --kernel $config:fp8/fp8_large --shape 4,16,4096 --cache-dir "$EVOENGINEER_CACHE"
NCU_LIMIT=150 bash experiments/sdpa/scripts/ncu_pair.sh "$OUT/ncu_pair_fp8_b16_s1024.txt" \
  --kernel $config:fp8/fp8_mixed/b16_s1024 --shape 16,16,1024 --cache-dir "$EVOENGINEER_CACHE"
