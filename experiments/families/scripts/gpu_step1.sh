# On the GPU host: exported shipped ops (overhead beside torch, misuse) and a search of the CUDA example family.
#   bash experiments/families/scripts/gpu_step1.sh   (logs under $OUT)
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L | tee "$OUT/gpu.log"
export EVOENGINEER_EXPORT_CACHE=/tmp/evo-ops
rm -rf /tmp/rms && cp -r examples/families/rmsnorm_cuda /tmp/rms
( cd /tmp/rms && timeout 420 python3 -m evoengineer search --space rmsnorm_h100.toml --db sqlite:///run.db \
    --out elite.json --budget ${RMS_BUDGET:-24} --seed 0 > "$OUT/rmsnorm_search.log" 2>&1; echo "rc=$?" >> "$OUT/rmsnorm_search.log" ) &
timeout 300 python3 -X faulthandler experiments/families/op_overhead.py "$OUT/ops" > "$OUT/op_overhead.log" 2>&1; echo "rc=$?" >> "$OUT/op_overhead.log"
wait
cp /tmp/rms/elite.json "$OUT/rmsnorm_elite.json" 2>/dev/null
if [ -f /tmp/rms/elite.json ]; then
  timeout 120 python3 -X faulthandler experiments/families/op_overhead.py "$OUT/ops_rms" /tmp/rms/elite.json /tmp/rms/family.py:RMSNorm \
    > "$OUT/op_overhead_rms.log" 2>&1; echo "rc=$?" >> "$OUT/op_overhead_rms.log"
fi
tail -30 "$OUT/op_overhead.log"; tail -12 "$OUT/rmsnorm_search.log"; tail -25 "$OUT/op_overhead_rms.log"
