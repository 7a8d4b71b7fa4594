# On the GPU host, from the repository root (issue 34): a GA search of SPACE (default decode_fp8kv_d128) with the
# COMBINE = cluster value (BUDGET evaluations, default 60, seed 0; search timing flushes L2). Logs, store and elite
# under $OUT (results/issue34/cluster/search/ keeps the log and elite renamed, and the store as a landscape CSV:
# `python3 -m evoengineer landscape --db sqlite:///decode_fp8kv_d128.db --out landscape_..._cluster_seed0.csv`).
#   bash experiments/decode/scripts/cluster_search_h100.sh [SPACE] [BUDGET]
source experiments/decode/scripts/bench_lib.sh results/issue34/cluster/search || exit 1
OUT=$dest SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-540} bash experiments/decode/scripts/searches.sh "${2:-60}" "${1:-decode_fp8kv_d128}"
