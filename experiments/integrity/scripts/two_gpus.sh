# On a GPU host with two GPUs, one call: what the integrity checks cost (the default search alone on GPU 0, cost.py
# --quick: the worker's phases and the honesty phase by check), then two GPU test lists side by side, one per GPU
# (TESTS0 and TESTS1: test files; K0 / K1: optional -k expressions, spaces allowed; each pytest SIGINTed at LIMIT
# seconds so it still prints its summary). Carry .whl.
#   TESTS0="tests/gpu/test_gpu_integrity.py ..." TESTS1="tests/gpu/test_gpu_decode.py" K1="paged or tma_loads" LIMIT=420 \
#     bash experiments/integrity/scripts/two_gpus.sh [BUDGET]
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=$PWD/.evo_cache
nvidia-smi -L | tee "$OUT/tools.log"
if [ -n "${1:-}" ]; then
  CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 20 ${COST_LIMIT:-150} python3 experiments/integrity/cost.py --quick \
    --budget "$1" --work /tmp/evo-cost --json "$OUT/cost_quick.json" > "$OUT/cost.log" 2>&1
  tail -3 "$OUT/cost.log"
fi
run() {  # GPU, tests, -k expression, log
  CUDA_VISIBLE_DEVICES=$1 timeout -s INT -k 20 ${LIMIT:-420} python3 -m pytest -q -s -rfs --tb=short --durations=10 \
    $2 ${3:+-k "$3"} > "$OUT/$4" 2>&1
}
run 0 "${TESTS0:-}" "${K0:-}" gpu0_tests.log &
[ -n "${TESTS1:-}" ] && run 1 "$TESTS1" "${K1:-}" gpu1_tests.log &
wait
for f in gpu0_tests.log gpu1_tests.log; do
  [ -f "$OUT/$f" ] && { echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed|no tests ran|deselected" "$OUT/$f" | tail -12; }
done
