# On the GPU host, from the repository root: GA searches of the decode spaces (issue 16), each writing its store,
# elite.json and log under experiments/decode/results/ (or $OUT when set).
#   bash experiments/decode/scripts/searches.sh BUDGET SPACE [SPACE ...]
source experiments/scripts/device_env.sh || exit 1
budget=$1; shift
dest=${OUT:-experiments/decode/results}
mkdir -p "$dest"
for space in "$@"; do
  timeout -k 10 ${SEARCH_TIMEOUT:-400} python3 -m evoengineer search --space "$space" --budget "$budget" \
    --population ${POPULATION:-12} --generations ${GENERATIONS:-12} --seed ${SEED:-0} \
    --db "sqlite:///$dest/$space.db" --out "$dest/elite_$space.json" --cache-dir "$EVOENGINEER_CACHE" \
    > "$dest/search_$space.log" 2>&1
  echo "$space rc $?"; tail -4 "$dest/search_$space.log"
done
