# On the H100 host (issue 35, second round): the Hopper GPU tests at this template, then GA runs of the two mixed
# spaces (timed on the four large grid rows, causal and not), each stopped at SEARCH_LIMIT seconds.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py > $OUT/gpu_tests_hopper.log 2>&1
echo "gpu tests rc $?"; tail -3 $OUT/gpu_tests_hopper.log
SEARCH_LIMIT=${LIMIT_D128:-170} bash experiments/sdpa/scripts/hopper_searches.sh sdpa_hopper_fp16_d128_mixed_large 1 144 --generations 12
SEARCH_LIMIT=${LIMIT_D64:-150} bash experiments/sdpa/scripts/hopper_searches.sh sdpa_hopper_fp16_d64_mixed_large 1 144 --generations 12
