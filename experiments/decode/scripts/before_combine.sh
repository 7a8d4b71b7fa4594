# Sourced by combine_h100.sh and combine_profile.sh: $c, a folder holding the decode template as it was before the
# parallel combine (results/issue34/combine/decode_before_combine.patch applied to today's template; the patch is
# made against the template of the commit that last wrote it) and its two d128 spaces (`*_before_combine.toml`);
# the table's genomes both scripts time ($fp16_ga, $fp16_tma, $fp8_ga, $fp8_tma).
c=$(mktemp -d)
cp templates/cuda/decode.cu.j2 "$c/decode_before_combine.cu.j2"
patch -s "$c/decode_before_combine.cu.j2" experiments/decode/results/issue34/combine/decode_before_combine.patch || return 1
sed -i 's|{% include "common/|{% include "cuda/common/|' "$c/decode_before_combine.cu.j2"
for sp in decode_fp16_d128 decode_fp8kv_d128; do
  sed -e "s/^name = \"$sp\"/name = \"${sp}_before_combine\"/" \
      -e 's|^template = "cuda/decode.cu.j2"|template = "decode_before_combine.cu.j2"|' "search_spaces/$sp.toml" \
      > "$c/${sp}_before_combine.toml"
done
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
fp16_ga="{\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16}"
fp16_tma="{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16}"
fp8_ga='{"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "FAST_EXP": true, "MIN_BLOCKS": 1, "DEQUANT": "shared"}'
fp8_tma="{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16}"
