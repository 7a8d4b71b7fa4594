# On the GPU host (one H200; at most 9 minutes: each step has a time limit, T_GA16, T_GRID, T_GA8 in seconds):
# Stage 5 of the SDPA family.
#   bash experiments/sdpa/scripts/stage5.sh
# 1. GA on sdpa_fp16_d64 (budget 120, population 24, seed 0) -> elite_sdpa_fp16_d64.json, ga_evals_sdpa_fp16_d64.csv
# 2. the full grid of sdpa_fp16_d64 (--strategy grid)      -> landscape_sdpa_fp16_d64.csv, elite_grid_sdpa_fp16_d64.json
# 3. GA on sdpa_fp8kv_d64 (budget 60)                      -> elite_sdpa_fp8kv_d64.json, ga_evals_sdpa_fp8kv_d64.csv
# 4. benchmark.py of both elites                           -> bench.json, bench.log
# 5. benchmark.py --revalidate (K=3 fp16 elites, 500 runs)  -> revalidate.json, revalidate.log
# all under $OUT, with each step's log. Every search step is stopped with SIGINT (state stored, elite.json written
# after each generation) at its time limit, so the whole script ends in time even if builds run slow; a stopped
# search continues with `python3 -m evoengineer resume --db sqlite:////tmp/<db>`.
source experiments/scripts/device_env.sh || exit 1
rm -f /tmp/ga_sdpa_*.db* /tmp/grid_sdpa_*.db*  # a warm machine keeps /tmp: start every store afresh
T_GA16=${T_GA16:-140}
T_GRID=${T_GRID:-170}
T_GA8=${T_GA8:-90}

search() {  # name limit_s args...
  local name=$1 limit=$2
  shift 2
  ( time timeout -k 20 -s INT "$limit" python3 -m evoengineer search "$@" --db "sqlite:////tmp/$name.db" ) \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $?; $(grep -E '^ +done|stopped|interrupted' "$OUT/$name.log" | tail -1)"
}

search ga_sdpa_fp16_d64 "$T_GA16" --space sdpa_fp16_d64 --budget 120 --population 24 --seed 0 \
  --out "$OUT/elite_sdpa_fp16_d64.json"
python3 -m evoengineer landscape --db sqlite:////tmp/ga_sdpa_fp16_d64.db --out "$OUT/ga_evals_sdpa_fp16_d64.csv" 2>&1 \
  | tail -1

search grid_sdpa_fp16_d64 "$T_GRID" --space sdpa_fp16_d64 --strategy grid --population 64 --budget 100000 --seed 0 \
  --out "$OUT/elite_grid_sdpa_fp16_d64.json"
python3 -m evoengineer landscape --db sqlite:////tmp/grid_sdpa_fp16_d64.db --out "$OUT/landscape_sdpa_fp16_d64.csv" \
  2>&1 | tail -1

search ga_sdpa_fp8kv_d64 "$T_GA8" --space sdpa_fp8kv_d64 --budget 60 --population 24 --seed 0 \
  --out "$OUT/elite_sdpa_fp8kv_d64.json"
python3 -m evoengineer landscape --db sqlite:////tmp/ga_sdpa_fp8kv_d64.db --out "$OUT/ga_evals_sdpa_fp8kv_d64.csv" \
  2>&1 | tail -1

fp8=()
[ -f "$OUT/elite_sdpa_fp8kv_d64.json" ] && fp8=(--elite-fp8 "$OUT/elite_sdpa_fp8kv_d64.json")
timeout -k 20 100 python3 experiments/sdpa/benchmark.py --elite "$OUT/elite_sdpa_fp16_d64.json" "${fp8[@]}" \
  --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
timeout -k 20 50 python3 experiments/sdpa/benchmark.py --elite "$OUT/elite_sdpa_fp16_d64.json" --revalidate \
  --runs 500 --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/revalidate.json" 2>&1 | tee "$OUT/revalidate.log"
# the device tool brings back only a few files per call: everything also travels in one archive
tar czf /tmp/stage5.tgz -C "$OUT" . && mv /tmp/stage5.tgz "$OUT/"
