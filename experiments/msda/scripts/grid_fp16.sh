# On the GPU host: the full grid of search_spaces/cuda_msda_fp16.toml through the framework (--strategy grid), in
# slices of at most $1 seconds (default 530). The store travels between device calls gzipped in .device_state/
# (carried); the landscape CSV (replay format) is exported after every slice.
source experiments/msda/scripts/device_env.sh || exit 1
limit=${1:-530}
db=/tmp/grid_fp16.db
mkdir -p "$OUT"
if [ -f .device_state/grid_fp16.db.gz ]; then
  gunzip -c .device_state/grid_fp16.db.gz > $db
  timeout -k 30 -s INT "$limit" python3 -m evoengineer resume --db sqlite:///$db
else
  timeout -k 30 -s INT "$limit" python3 -m evoengineer search --space cuda_msda_fp16 --strategy grid \
    --population 128 --budget 100000 --db sqlite:///$db --out /tmp/elite_grid_fp16.json
fi > "$OUT/grid_fp16.log" 2>&1
echo "search exit $?"
python3 -m evoengineer landscape --db sqlite:///$db --out "$OUT/landscape_fp16.csv" 2>&1 | tail -2
gzip -c $db > "$OUT/grid_fp16.db.gz"
cp /tmp/elite_grid_fp16.json "$OUT/" 2>/dev/null
grep -E "gen |done|finished|builds:" "$OUT/grid_fp16.log" | tail -4
