# On the GPU host: exported ops (shipped and the CUDA example's recorded elite) timed beside torch and misused; the
# exception probe. Logs under $OUT.   bash experiments/families/scripts/gpu_ops.sh
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_EXPORT_CACHE=/tmp/evo-ops
echo "CXX=${CXX:-unset} $(${CXX:-g++} --version | head -1)" | tee "$OUT/toolchain.log"
timeout 150 python3 experiments/families/probe_exceptions.py > "$OUT/probe.log" 2>&1; echo "rc=$?" >> "$OUT/probe.log"
timeout 360 python3 -X faulthandler experiments/families/op_overhead.py "$OUT/ops" \
  experiments/families/results/rmsnorm_elite.json examples/families/rmsnorm_cuda/family.py:RMSNorm \
  > "$OUT/op_overhead.log" 2>&1; echo "rc=$?" >> "$OUT/op_overhead.log"
grep -v "changed since" "$OUT/probe.log"; grep -v "changed since" "$OUT/op_overhead.log" | tail -45
