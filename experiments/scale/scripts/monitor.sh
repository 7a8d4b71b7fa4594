# Samples, every ${EVERY:-5} s until killed, what a GPU host is doing (for a run's breakdown): per-GPU utilization,
# which process holds which GPU (with its CUDA_VISIBLE_DEVICES), the load average and the busiest processes.
#   bash experiments/scale/scripts/monitor.sh > "$OUT/monitor.log" & mon=$!; ...; kill $mon
while true; do
  echo "=== $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader | while IFS=, read -r pid uuid mem; do
    cvd=$(tr '\0' '\n' < /proc/"$pid"/environ 2>/dev/null | grep '^CUDA_VISIBLE_DEVICES=' | cut -d= -f2)
    echo "app $pid cvd=${cvd:-unset} ${uuid# } ${mem# } $(tr '\0' ' ' < /proc/"$pid"/cmdline 2>/dev/null | cut -c1-80)"
  done
  top -b -n1 -o %CPU | sed -n 8,20p
  sleep "${EVERY:-5}"
done
