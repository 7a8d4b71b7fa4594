# On the H100 host (issue 35, fourth round): SCHEDULER static vs dynamic on the recorded persistent elites (the
# causal shape winners of the mixed-shape runs, the FP8 elites), same genomes, one process, interleaved rounds
# (template_ab.py --genes); logs under $OUT.
source experiments/scripts/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
for s in d128:sdpa_hopper_fp16_d128_large:190 d64:sdpa_hopper_fp16_d64_large:190 fp8:sdpa_hopper_fp8_d128_large:150; do
  IFS=: read n space limit <<< "$s"
  timeout $limit python3 experiments/sdpa/template_ab.py --space $space \
    --genomes experiments/sdpa/genomes/scheduler_ab_$n.json --genes dynamic='{"SCHEDULER": "dynamic"}' --rounds 3 \
    --shapes "16,16,1024;4,16,4096" --cache-dir /tmp/evo-cache --json $OUT/scheduler_ab_$n.json > $OUT/scheduler_ab_$n.log 2>&1
  echo "$n rc $?"; grep -v "^g[0-9]" $OUT/scheduler_ab_$n.log | tail -20
done
