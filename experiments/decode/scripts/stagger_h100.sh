# On the GPU host, from the repository root (issue 34): the STAGGER experiment (each CTA walks its tiles from its own
# offset) on the tma kernels of the H100 table, stagger off and on, with the paged twins of the off kernels at page
# sizes 16 and 64 (the paged target), one process; logs under $OUT. Spaces with the STAGGER gene are written beside
# the logs (the shipped spaces plus that one gene).
#   bash experiments/decode/scripts/stagger_h100.sh
# RECORD: the STAGGER template code was removed after this run (no gain on the H100: benchmark_stagger_h100.md); it
# is kept as results/issue34/stagger/stagger_template.patch (git apply it to rerun this). The paged twins here were
# timed on inputs with shared prefix pages (25% fewer bytes at B = 8 and 32): see paged_tma/ for the fair timing.
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
r=experiments/decode/results
for s in decode_fp16_d128 decode_fp8kv_d128; do
  sed -e "s/^name = \"$s\"/name = \"${s}_stagger\"/" \
      -e 's/^FAST_EXP = { type = "bool" }/FAST_EXP = { type = "bool" }\nSTAGGER = { type = "bool" }/' \
      search_spaces/$s.toml > "$dest/${s}_stagger.toml"
done
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
ga16="\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16"
tma16="\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16"
ga8='"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "FAST_EXP": true, "MIN_BLOCKS": 1, "DEQUANT": "shared"'
tma8="\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16"
s16="$dest/decode_fp16_d128_stagger.toml"; s8="$dest/decode_fp8kv_d128_stagger.toml"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_stagger.txt"
timeout -k 10 ${BENCH_TIMEOUT:-400} python3 experiments/decode/benchmark.py \
  --kernel "fp16_ga=decode_fp16_d128:{$ga16}" --kernel "fp16_ga_st=$s16:{$ga16, \"STAGGER\": true}" \
  --kernel "fp16_tma=decode_fp16_d128:{$tma16}" --kernel "fp16_tma_st=$s16:{$tma16, \"STAGGER\": true}" \
  --kernel "fp8_ga=decode_fp8kv_d128:{$ga8}" --kernel "fp8_ga_st=$s8:{$ga8, \"STAGGER\": true}" \
  --kernel "fp8_tma=decode_fp8kv_d128:{$tma8}" --kernel "fp8_tma_st=$s8:{$tma8, \"STAGGER\": true}" \
  --paged 16,64 --cache-dir "$EVOENGINEER_CACHE" --json "$dest/benchmark_stagger.json" \
  --md "$dest/benchmark_stagger.md" > "$dest/benchmark_stagger.log" 2>&1
echo "bench rc $?"; tail -9 "$dest/benchmark_stagger.log"
