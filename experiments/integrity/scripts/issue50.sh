# On the GPU host, one call (issue 50): the GPU cheats test, what each GPU poisoner does when nothing is undone, and
# the shipped MSDA genomes and faults under the checks; logs under $OUT.
#   bash experiments/integrity/scripts/issue50.sh
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=$PWD/.evo_cache
nvidia-smi -L | tee "$OUT/tools.log"
python3 experiments/integrity/poison_effect.py --backend cuda --json "$OUT/poison_effect_cuda.json" 2>&1 \
  | tee "$OUT/poison_effect_cuda.log"
# SIGINT at the limit: pytest still prints its summary
timeout -s INT -k 20 ${GPU_TESTS_LIMIT:-420} python3 -m pytest -q -s -rfs --tb=short --durations=12 \
  tests/test_gpu_integrity.py tests/test_cheats.py ${MORE_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
