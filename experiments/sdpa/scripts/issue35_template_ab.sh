# On the H100 host (issue 35, second round): template A/B in one process per space (experiments/sdpa/template_ab.py):
# the working tree's template against the variant files given, on experiments/sdpa/genomes/desc_ab_*.json.
#   bash experiments/sdpa/scripts/issue35_template_ab.sh NAME=FILE [NAME=FILE ...]
source experiments/scripts/device_env.sh || exit 1
args=()
for v in "$@"; do args+=(--variant "$v"); done
for s in d64:sdpa_hopper_fp16_d64_large d128:sdpa_hopper_fp16_d128_large fp8:sdpa_hopper_fp8_d128_large; do
  n=${s%%:*}; space=${s#*:}
  timeout ${AB_LIMIT:-200} python3 experiments/sdpa/template_ab.py --space $space \
    --genomes experiments/sdpa/genomes/desc_ab_$n.json "${args[@]}" --rounds ${ROUNDS:-3} \
    --cache-dir /tmp/evo-cache --json $OUT/template_ab_$n.json > $OUT/template_ab_$n.log 2>&1
  echo "$n rc $?"; grep -v "^g[0-9]" $OUT/template_ab_$n.log | tail -30
done
