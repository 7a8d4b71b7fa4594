# On a GPU host, one call (issue 51): the asynchronous search on one GPU and on all GPUs of the host, the default
# search and random, seeds SEEDS (default 0,1,2), budget BUDGET (default 200), every run from an empty build cache
# (experiments/scale/async_search.py). Carry .whl. Results (JSON, table, run logs) under $OUT.
#   bash experiments/scale/scripts/issue51.sh            # nvidia-h100-x1: one GPU; nvidia-h100-x2 / -x4: 1 vs all
#   GPUS=1,2,4 SEEDS=0 bash experiments/scale/scripts/issue51.sh   # on -x4: 1, 2 and 4 GPUs of one host
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L | tee "$OUT/gpus.log"
n=$(nvidia-smi -L | grep -c '^GPU ')
gpus=1; [ "$n" -gt 1 ] && gpus="1,$n"
gpus=${GPUS:-$gpus}
# MONITOR=1: what the host does every 8 s beside the runs ($OUT/monitor.log; scripts/monitor.sh)
mon=
if [ -n "${MONITOR:-}" ]; then EVERY=8 bash experiments/scale/scripts/monitor.sh > "$OUT/monitor.log" 2>&1 & mon=$!; fi
timeout -s INT -k 20 ${LIMIT:-560} python3 experiments/scale/async_search.py --budget "${BUDGET:-200}" \
  --seeds "${SEEDS:-0,1,2}" --strategies "${STRATEGIES:-ga,random}" --gpus "$gpus" --tag "gpus$n" 2>&1 \
  | tee "$OUT/async_search.log" | tail -30
[ -n "$mon" ] && kill "$mon"
cp experiments/scale/results/async_search_gpus"$n".* "$OUT"/ 2>/dev/null
mkdir -p "$OUT/logs" && cp /tmp/evo-async-*/*.log "$OUT/logs/" 2>/dev/null  # also after a cut-short run
[ -n "${COPY_DB:-}" ] && cp /tmp/evo-async-*/*.db "$OUT/logs/" 2>/dev/null  # the runs' stores (per-phase metrics)
