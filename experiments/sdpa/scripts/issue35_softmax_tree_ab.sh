# On the H100 host (issue 35, third round): the softmax's row max and row sum as balanced trees (template A/B: the
# tree version as the working tree, the chain version, i.e. the shipped template, as experiments/sdpa/ab_chain.cu.j2)
# on experiments/sdpa/genomes/desc_ab_{d128,d64}.json, then the Hopper GPU tests; logs under $OUT.
# RECORD: neither version won (ratios 0.96-1.07 both ways, medians ~1.00: results/issue35/round3/); the tree version
# is kept as results/issue35/round3/softmax_tree.patch (git apply it, copy the shipped template to ab_chain.cu.j2).
export AB_LIMIT=170
source experiments/scripts/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
for s in d128:sdpa_hopper_fp16_d128_large d64:sdpa_hopper_fp16_d64_large; do
  n=${s%%:*}; space=${s#*:}
  timeout $AB_LIMIT python3 experiments/sdpa/template_ab.py --space $space \
    --genomes experiments/sdpa/genomes/desc_ab_$n.json --variant chain=experiments/sdpa/ab_chain.cu.j2 --rounds 3 \
    --cache-dir /tmp/evo-cache --json $OUT/template_ab_tree_$n.json > $OUT/template_ab_tree_$n.log 2>&1
  echo "$n rc $?"; grep -v "^g[0-9]" $OUT/template_ab_tree_$n.log | tail -34
done
timeout -k 10 215 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sdpa_hopper.py tests/test_gpu_sdpa.py > $OUT/gpu_tests_hopper_tree.log 2>&1; echo "tests rc $?"; tail -3 $OUT/gpu_tests_hopper_tree.log
