# On a GPU host, one call: the GPU tests of the family bindings' argument paths (tensors, workspaces, index checks),
# then where a fresh search's start goes (command_start.py; async_search.py's start timeline with the measuring
# worker's own steps), an exported op's first call (cold and warm), and a profile of the measuring worker's time per
# candidate (experiments/integrity/cost.py --quick under EVOENGINEER_WORKER_PROFILE). Carry .whl. Logs under $OUT.
#   TESTS="tests/gpu/test_gpu_msda.py" K="head_major" bash experiments/scale/scripts/start_and_checks.sh
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L | tee "$OUT/gpus.log"
if [ -n "${TESTS:-}" ]; then
  timeout -s INT -k 10 ${TEST_LIMIT:-150} python3 -m pytest -q -rfs --tb=short --durations=8 $TESTS ${K:+-k "$K"} \
    > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -8
fi
timeout -k 5 60 python3 experiments/scale/command_start.py > "$OUT/command_start.log" 2>&1; head -40 "$OUT/command_start.log"
timeout -s INT -k 10 ${ASYNC_LIMIT:-90} python3 experiments/scale/async_search.py --budget ${BUDGET:-60} --seeds 0 \
  --strategies ga --gpus 1 --tag start > "$OUT/async.log" 2>&1
grep -E '"start_s"|first_candidate' "$OUT/async.log" | tail -2
timeout -k 10 ${FIRST_CALL_LIMIT:-80} python3 experiments/scale/export_first_call.py --spaces cuda_msda_fp16 --budget 2 \
  --out /tmp/first_call > "$OUT/first_call.log" 2>&1; grep '"space"' "$OUT/first_call.log"
EVOENGINEER_WORKER_PROFILE=/tmp/prof timeout -s INT -k 10 ${COST_LIMIT:-80} python3 experiments/integrity/cost.py --quick \
  --budget ${COST_BUDGET:-24} --work /tmp/evo-cost --json "$OUT/cost.json" > "$OUT/cost.log" 2>&1
tail -1 "$OUT/cost.log"; cp /tmp/prof/*.txt "$OUT/" 2>/dev/null; ls "$OUT"
