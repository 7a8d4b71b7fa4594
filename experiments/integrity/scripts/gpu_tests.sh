# On the GPU host: the GPU test suites (planted GPU faults, the sanitizer step, shipped MSDA and SDPA genomes under
# the integrity checks) with the CPU integrity tests; logs under $OUT.
#   bash experiments/integrity/scripts/gpu_tests.sh [PYTEST ARGS]
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=$PWD/.evo_cache
{ command -v compute-sanitizer; compute-sanitizer --version | tail -1; nvidia-smi -L; } 2>&1 | tee "$OUT/tools.log"
timeout -k 10 ${GPU_TESTS_LIMIT:-540} python3 -m pytest -q -rs --durations=12 "${@:-tests/gpu/test_gpu_msda.py}" \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -40
