# On the GPU host, one call (issue 50): the GPU cheats test, then what the checks cost on the default search
# (cost.py --quick: one cold search with this tree, its candidates through this tree's and the baseline's evaluator,
# builds cached). Carry .whl and .baseline (git archive of the commit before issue 50).
#   bash experiments/integrity/scripts/issue50_final.sh [BUDGET]
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=$PWD/.evo_cache
nvidia-smi -L | tee "$OUT/tools.log"
timeout -s INT -k 20 ${GPU_TESTS_LIMIT:-150} python3 -m pytest -q -s -rfs --tb=short tests/test_gpu_integrity.py \
  2>&1 | tee "$OUT/gpu_integrity.log" | tail -30
timeout -s INT -k 20 ${COST_LIMIT:-240} python3 experiments/integrity/cost.py --quick --baseline .baseline \
  --budget "${1:-60}" --work /tmp/evo-cost --json "$OUT/cost_quick.json" 2>&1 | tee "$OUT/cost.log" | tail -12
