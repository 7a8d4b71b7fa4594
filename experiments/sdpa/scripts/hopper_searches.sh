# On the GPU host: GA runs of the Hopper-native spaces, stores and elites under $OUT.
#   bash experiments/sdpa/scripts/hopper_searches.sh SPACE [SEED] [BUDGET]     (one call per space keeps under 10 min)
# A space's run takes ~130 s for 120 evaluations on an H100 (builds in parallel, sanitizer on the elites included).
source experiments/scripts/device_env.sh || exit 1
space=${1:?space name}; seed=${2:-1}; budget=${3:-120}
timeout -k 10 ${SEARCH_LIMIT:-560} python3 -m evoengineer search --space "$space" --budget "$budget" --seed "$seed" \
  --db "sqlite:///$OUT/${space}_seed${seed}.db" --out "$OUT/elite_${space}_seed${seed}.json" \
  > "$OUT/search_${space}_seed${seed}.log" 2>&1
echo "search $space seed $seed rc $?"
grep -v "^\s*elites" "$OUT/search_${space}_seed${seed}.log" | tail -6
