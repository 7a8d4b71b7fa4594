# On the GPU host, from the repository root (issue 34): what the split-KV combine costs. The fastest FP8 and fp16
# kernels with each COMBINE value, and the same genes built from a copy of the template whose launcher never launches
# the separate combine (label *_nocombine: wrong outputs, the split kernel's time alone); then how fast torch reads
# the same byte counts once (stream_bound.py). One process per table. Logs under $OUT. With SHAPES (benchmark.py's
# --shapes) and NAME: those shapes only, table NAME, no stream bound.
#   bash experiments/decode/scripts/combine_cost_h100.sh
#   SHAPES='1,32,8,131072,128;8,32,8,16384,128' NAME=same_work bash experiments/decode/scripts/combine_cost_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/combine_cost || exit 1
source experiments/decode/scripts/template_before.sh
c=$(mktemp -d)
sed -e 's|if (splits > 1 \&\& !Tr::kCombineInKernel \&\& !cluster) {|if (false) {|' templates/cuda/decode.cu.j2 \
  > "$c/decode_nocombine.cu.j2"
grep -q 'if (false) {' "$c/decode_nocombine.cu.j2" || { echo "the combine launch line changed: no copy made"; exit 1; }
template_spaces nocombine
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MMA_ROWS": "keys", "STAGES": 2,
      "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false, "BLOCK_N": 128, "NUM_WARPS": 4'
f8="$keys, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\""
h="$keys, \"MIN_BLOCKS\": 1"
args=()
for cb in separate dependent in_kernel; do
  args+=(--kernel "f8_$cb=decode_fp8kv_d128:{$f8, \"COMBINE\": \"$cb\"}" --kernel "h_$cb=decode_fp16_d128:{$h, \"COMBINE\": \"$cb\"}")
done
args+=(--kernel "f8_nocombine=$c/decode_fp8kv_d128_nocombine.toml:{$f8, \"COMBINE\": \"separate\"}"
       --kernel "h_nocombine=$c/decode_fp16_d128_nocombine.toml:{$h, \"COMBINE\": \"separate\"}")
decode_bench "${NAME:-combine_cost}" "${args[@]}" ${SHAPES:+--shapes "$SHAPES"}
[ -n "$SHAPES" ] && exit 0
python3 experiments/decode/stream_bound.py > "$dest/stream_bound_h100.md" 2>&1
echo "stream rc $?"; cat "$dest/stream_bound_h100.md"
