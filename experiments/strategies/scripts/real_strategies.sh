#!/usr/bin/env bash
# The strategies with the real evaluator: on the GPU host SPACE=sdpa_fp16_d64 (nvcc builds, correctness vs SDPA,
# CUDA-event timing), on a CPU machine SPACE=cpu_msda (C++/OpenMP builds, float64 reference, wall-clock timing).
# Budget 24 each, one store for all runs; the Optuna run is SIGKILLed after 8 stored evaluations and resumed.
# Everything under $OUT: the store (strategies.db), elite files, logs. The HTML report is made from the store:
#   python -m evoengineer report --db sqlite:///$OUT/strategies.db --out report
#   OUT=/tmp/out SPACE=cpu_msda bash experiments/strategies/scripts/real_strategies.sh
set -u
if command -v nvidia-smi >/dev/null 2>&1 && [ -d .whl ]; then source experiments/scripts/device_env.sh || exit 1; fi
SPACE=${SPACE:-sdpa_fp16_d64}
mkdir -p "$OUT"
db=/tmp/strategies_$SPACE.db
rm -f $db $db-wal $db-shm
common=(--space "$SPACE" --budget 24 --seed 0 --db "sqlite:///$db")

for s in ga random grid; do
  ( time timeout -k 20 -s INT 150 python3 -m evoengineer search "${common[@]}" --strategy "$s" \
      --out "$OUT/elite_$s.json" ) > "$OUT/$s.log" 2>&1
  echo "$s: exit $? | $(grep -E '^ +done' "$OUT/$s.log" | tail -1)"
done

count() { python3 -c "import sqlite3,sys; c=sqlite3.connect('file:$db?mode=ro',uri=True,timeout=5); print(c.execute('select count(*) from candidates where run_id=4').fetchone()[0])" 2>/dev/null || echo 0; }
python3 -m evoengineer search "${common[@]}" --strategy optuna --sampler tpe --out "$OUT/elite_optuna.json" \
  > "$OUT/optuna_killed.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ "$(count)" -ge 8 ] && break; sleep 0.5; done
kill -9 $pid; wait $pid 2>/dev/null
echo "optuna: SIGKILL after $(count) stored evaluations"
( time timeout -k 20 -s INT 150 python3 -m evoengineer resume --db "sqlite:///$db" --run 4 ) > "$OUT/optuna_resumed.log" 2>&1
echo "optuna resumed: exit $? | $(grep -E 'resuming|^ +done' "$OUT/optuna_resumed.log" | tr '\n' ' ')"
python3 - "$db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for rid, strat, status, reason in c.execute("select id, json_extract(config, '$.strategy'), status, stop_reason from runs"):
    n, distinct = c.execute("select count(*), count(distinct hash) from candidates where run_id=?", (rid,)).fetchone()
    best = c.execute("select min(time_us) from candidates where run_id=? and status='ok'", (rid,)).fetchone()[0]
    by = dict(c.execute("select status, count(*) from candidates where run_id=? group by status", (rid,)).fetchall())
    print(f"run {rid} {strat}: {status} ({reason}), {n} evaluations ({distinct} distinct), best {best:.2f} us, {by}")
PY
python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$db" "$OUT/strategies.db"
