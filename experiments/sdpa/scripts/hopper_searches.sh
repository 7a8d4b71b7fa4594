# On the GPU host: a GA run of a Hopper-native space; store, elite.json, log and the run's landscape CSV under $OUT.
#   bash experiments/sdpa/scripts/hopper_searches.sh SPACE [SEED] [BUDGET] [more search flags, e.g. --population 24]
# (one call per space keeps under 10 min). ~130 s for 120 evaluations on an H100 (builds in parallel, sanitizer on
# the elites included). The search stops on SIGINT at SEARCH_LIMIT seconds (state stored, elite.json written).
source experiments/scripts/device_env.sh || exit 1
space=${1:?space name}; seed=${2:-1}; budget=${3:-120}
shift 3 2>/dev/null || shift $#
db="sqlite:///$OUT/${space}_seed${seed}.db"
timeout -k 20 -s INT ${SEARCH_LIMIT:-540} python3 -m evoengineer search --space "$space" --budget "$budget" \
  --seed "$seed" --db "$db" --out "$OUT/elite_${space}_seed${seed}.json" "$@" \
  > "$OUT/search_${space}_seed${seed}.log" 2>&1
echo "search $space seed $seed rc $?"
python3 -m evoengineer landscape --db "$db" --out "$OUT/landscape_${space}_seed${seed}.csv" 2>&1 | tail -1
grep -v "^\s*elites" "$OUT/search_${space}_seed${seed}.log" | tail -6
