# Sourced by combine_h100.sh and combine_profile.sh: $c, a folder holding the decode template as it was before the
# parallel combine (results/issue34/combine/decode_before_combine.patch applied to today's template; the patch is
# made against the template of the commit that last wrote it) and its two d128 spaces (`*_before_combine.toml`).
c=$(mktemp -d)
cp templates/cuda/decode.cu.j2 "$c/decode_before_combine.cu.j2"
patch -s "$c/decode_before_combine.cu.j2" experiments/decode/results/issue34/combine/decode_before_combine.patch || return 1
sed -i 's|{% include "common/|{% include "cuda/common/|' "$c/decode_before_combine.cu.j2"
for sp in decode_fp16_d128 decode_fp8kv_d128; do
  sed -e "s/^name = \"$sp\"/name = \"${sp}_before_combine\"/" \
      -e 's|^template = "cuda/decode.cu.j2"|template = "decode_before_combine.cu.j2"|' "search_spaces/$sp.toml" \
      > "$c/${sp}_before_combine.toml"
done
