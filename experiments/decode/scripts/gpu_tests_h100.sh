# On the GPU host, from the repository root: the decode GPU tests in two halves (each fits one device call), logs
# under $OUT (else results/issue34/cluster/).
#   bash experiments/decode/scripts/gpu_tests_h100.sh 1|2
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster || exit 1
case $1 in
  1) sel="sampled or keys_on_m" ;;
  2) sel="not sampled and not keys_on_m" ;;
  *) echo "usage: gpu_tests_h100.sh 1|2"; exit 2 ;;
esac
timeout -k 10 560 python3 -m pytest -q tests/test_gpu_decode.py -k "$sel" > "$dest/gpu_tests_decode_part$1.log" 2>&1
echo "tests rc $?"; tail -4 "$dest/gpu_tests_decode_part$1.log"
