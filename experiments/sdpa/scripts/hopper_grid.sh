# On the GPU host: the issue-13 table. Every argument is NAME=elite.json (rank 1 is benchmarked), e.g.
#   bash experiments/sdpa/scripts/hopper_grid.sh hopper_d64=E1.json hopper_d64_large=E2.json hopper_d128=E3.json \
#        mma_d64=experiments/sdpa/results/elite_sdpa_fp16_d64.json
source experiments/scripts/device_env.sh || exit 1
args=()
for k in "$@"; do args+=(--kernel "$k"); done
name=${GRID_NAME:-grid}  # the logs: $OUT/$name.json and .log
timeout -k 10 ${GRID_LIMIT:-560} python3 experiments/sdpa/benchmark.py --grid "${args[@]}" --json "$OUT/$name.json" \
  2>&1 | tee "$OUT/$name.log" | tail -40
