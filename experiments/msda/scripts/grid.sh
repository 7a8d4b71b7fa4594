# On the GPU host: the full grid of a space (default cuda_msda_fp16) through the framework (--strategy grid), in
# slices of at most LIMIT seconds (default 530):  bash experiments/msda/scripts/grid.sh [SPACE] [LIMIT]
# Between device calls the store travels gzipped in .device_state/ (carried there, fetched back from $OUT/state/),
# with the kernel sources of all but the 20 fastest candidates blanked to keep it small (resume needs only the
# measurements; elite.json takes the elites' sources). The landscape CSV (replay format) is exported after every slice.
source experiments/scripts/device_env.sh || exit 1
space=${1:-cuda_msda_fp16}
limit=${2:-530}
db=/tmp/grid_$space.db
mkdir -p "$OUT/state"
if [ -f .device_state/grid_$space.db.gz ]; then
  gunzip -c .device_state/grid_$space.db.gz > "$db"
  timeout -k 30 -s INT "$limit" python3 -m evoengineer resume --db "sqlite:///$db"
else
  timeout -k 30 -s INT "$limit" python3 -m evoengineer search --space "$space" --strategy grid \
    --population 128 --budget 100000 --db "sqlite:///$db" --out "/tmp/elite_grid_$space.json"
fi >> "$OUT/grid_$space.log" 2>&1
echo "grid $space: search exit $?"
python3 -m evoengineer landscape --db "sqlite:///$db" --out "$OUT/landscape_$space.csv" 2>&1 | tail -1
python3 - "$db" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("update candidates set source = '' where id not in "
            "(select id from candidates where status = 'ok' order by time_us limit 20)")
con.commit()
con.execute("vacuum")
PY
gzip -c "$db" > "$OUT/state/grid_$space.db.gz"
cp "/tmp/elite_grid_$space.json" "$OUT/" 2>/dev/null
grep -E "gen |done|finished|builds:" "$OUT/grid_$space.log" | tail -3
