# On the GPU host (issue 35): the searched elites after a template change, against cuDNN in one process each.
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
G=experiments/sdpa/genomes
for s in "sdpa_hopper_fp8_d128_large issue35_fp8_best 4,16,4096;16,16,1024" \
         "sdpa_hopper_fp16_d128_large issue35_fp16_d128_best 4,16,4096;16,16,1024" \
         "sdpa_hopper_fp16_d64_large issue35_fp16_d64_best 4,16,4096;16,16,1024"; do
  set -- $s
  timeout 150 python3 experiments/sdpa/hopper_probe.py --space $1 --genomes $G/$2.json --shapes "$3" \
    --cache-dir /tmp/evo-cache --json $OUT/chains_$2.json > $OUT/chains_$2.log 2>&1
  grep -E "x cuDNN|WRONG" $OUT/chains_$2.log | sed "s/^/$2 /"
done
