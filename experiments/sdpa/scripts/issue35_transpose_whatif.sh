# On the H100 host (issue 35, sixth round): what FP8's V transpose costs. The FP8 large elite and the mixed run's rank 1
# and (16, 16, 1024) winner, from the template and from a copy whose transposing warps skip the work (they still wait
# and arrive on every barrier, so the pipeline runs; the answers are wrong by design, so that copy is timed, not
# checked). template_ab.py, interleaved rounds beside cuDNN, one process. Log under $OUT.
#   bash experiments/sdpa/scripts/issue35_transpose_whatif.sh
source experiments/scripts/device_env.sh || exit 1
export EVOENGINEER_CACHE=/tmp/evo-cache
c=$(mktemp -d)
sed -e 's|for (int u = tid; u < kUnits; u += 32 \* Tr::kTransposeWarps) {|for (int u = tid; u < 0 * kUnits; u += 32 * Tr::kTransposeWarps) {|' \
  templates/cuda/sdpa_hopper.cu.j2 > "$c/sdpa_hopper_no_transpose.cu.j2"
grep -q 'u < 0 \* kUnits' "$c/sdpa_hopper_no_transpose.cu.j2" || { echo "the transpose loop changed: no copy made"; exit 1; }
timeout -k 10 ${AB_LIMIT:-420} python3 experiments/sdpa/template_ab.py --space sdpa_hopper_fp8_d128_large \
  --genomes experiments/sdpa/genomes/transpose_whatif_fp8.json --variant no_transpose="$c/sdpa_hopper_no_transpose.cu.j2" \
  --unchecked no_transpose --cache-dir "$EVOENGINEER_CACHE" --json "$OUT/transpose_whatif_fp8.json" \
  2>&1 | tee "$OUT/transpose_whatif_fp8.log" | tail -20
