# On the GPU host: the family GPU tests, then the exported ops' eager overhead (shipped + the CUDA example's elite)
# beside torch. Logs under $OUT.   bash experiments/families/scripts/gpu_recheck.sh
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_EXPORT_CACHE=/tmp/evo-ops
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.log"
timeout 300 python3 -m pytest -q -x tests/gpu/test_gpu_rmsnorm_family.py tests/gpu/test_gpu_export.py > "$OUT/gpu_tests.log" 2>&1
echo "rc=$?" >> "$OUT/gpu_tests.log"; tail -5 "$OUT/gpu_tests.log"
timeout 270 python3 -X faulthandler experiments/families/op_overhead.py "$OUT/ops" \
  experiments/data/families/rmsnorm_elite.json examples/families/rmsnorm_cuda/family.py:RMSNorm \
  > "$OUT/op_overhead.log" 2>&1; echo "rc=$?" >> "$OUT/op_overhead.log"
grep -v "changed since" "$OUT/op_overhead.log" | tail -45
