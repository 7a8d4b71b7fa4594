# On the GPU host (issue 31): build cost per candidate vs nvcc -cubin, then the default search from empty caches.
#   bash experiments/scale/scripts/keep_busy.sh "0 1 2"     (the seeds; logs and results under $OUT)
source experiments/scripts/device_env.sh || exit 1
SEEDS=${1:-"0 1 2"}
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
if [ -z "$SKIP_COMPILE" ]; then
  timeout 200 python3 experiments/scale/keep_busy.py compile --random 20 > "$OUT/compile.log" 2>&1; echo "compile rc=$?"
  tail -8 "$OUT/compile.log"
fi
timeout ${SEARCH_LIMIT:-330} python3 experiments/scale/keep_busy.py search --seeds $SEEDS > "$OUT/search.log" 2>&1
echo "search rc=$?"; tail -12 "$OUT/search.log"
cp experiments/scale/results/keep_busy_* "$OUT/" 2>/dev/null; ls "$OUT"
