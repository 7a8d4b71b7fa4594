# On the GPU host, one call: the planted GPU faults with the sanitizer step, then the cost measurement.
#   bash experiments/integrity/scripts/device_all.sh [BUDGET]
GPU_TESTS_LIMIT=170 bash experiments/integrity/scripts/gpu_tests.sh tests/gpu/test_gpu_msda.py -k "faults or after_each"
bash experiments/integrity/scripts/cost.sh "${1:-200}"
