# On the GPU host, one call (issue 50): the GPU cheats test (and MORE_TESTS), what each GPU poisoner does when
# nothing is undone, and with a BUDGET what the checks cost on the default search (cost.py --quick: one cold search
# with this tree, its candidates through this tree's and the baseline's evaluator, builds cached). Carry .whl, and
# for the cost .baseline (git archive of the commit before issue 50). Logs under $OUT.
#   bash experiments/integrity/scripts/issue50.sh [BUDGET]
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=$PWD/.evo_cache
nvidia-smi -L | tee "$OUT/tools.log"
python3 experiments/integrity/poison_effect.py --backend cuda --json "$OUT/poison_effect_cuda.json" 2>&1 \
  | tee "$OUT/poison_effect_cuda.log"
# SIGINT at the limit: pytest still prints its summary
timeout -s INT -k 20 ${GPU_TESTS_LIMIT:-420} python3 -m pytest -q -s -rfs --tb=short --durations=12 \
  tests/gpu/test_gpu_integrity.py ${MORE_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
if [ -n "${1:-}" ]; then
  timeout -s INT -k 20 ${COST_LIMIT:-300} python3 experiments/integrity/cost.py --quick --baseline .baseline \
    --budget "$1" --work /tmp/evo-cost --json "$OUT/cost_quick.json" 2>&1 | tee "$OUT/cost.log" | tail -12
fi
