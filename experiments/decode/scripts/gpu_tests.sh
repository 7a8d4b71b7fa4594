# On the GPU host, from the repository root: the decode GPU tests in two halves (each fits a 10-minute device call);
# the log under $OUT.
#   bash experiments/decode/scripts/gpu_tests.sh 1|2
source experiments/scripts/device_env.sh || exit 1
case $1 in
  1) sel="sampled or keys_on_m" ;;
  2) sel="not sampled and not keys_on_m" ;;
  *) echo "usage: gpu_tests.sh 1|2"; exit 2 ;;
esac
timeout -k 10 560 python3 -m pytest -q tests/gpu/test_gpu_decode.py -k "$sel" > "$OUT/gpu_tests_decode_part$1.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/gpu_tests_decode_part$1.log"
