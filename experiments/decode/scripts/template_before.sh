# Sourced: template_before COMMIT PATCH SUFFIX puts in $c (a new folder) the decode template as it was at COMMIT,
# as decode_SUFFIX.cu.j2, and the two d128 spaces pointing at it (decode_fp16_d128_SUFFIX.toml,
# decode_fp8kv_d128_SUFFIX.toml). With git (a clone): `git show COMMIT:...`; without (the device's copy of the
# tree): PATCH applied to today's template (PATCH turns the template of the commit that last wrote it into COMMIT's:
# remade with `diff -u templates/cuda/decode.cu.j2 <(git show COMMIT:templates/cuda/decode.cu.j2)` when the
# template changes).
# template_spaces SUFFIX: for a template variant already at $c/decode_SUFFIX.cu.j2, points its includes at the
# shipped common/ folder and writes the two d128 spaces that use it (as above).
template_spaces() {
  local suffix=$1 sp
  sed -i 's|{% include "common/|{% include "cuda/common/|' "$c/decode_$suffix.cu.j2"
  for sp in decode_fp16_d128 decode_fp8kv_d128; do
    sed -e "s/^name = \"$sp\"/name = \"${sp}_$suffix\"/" \
        -e "s|^template = \"cuda/decode.cu.j2\"|template = \"decode_$suffix.cu.j2\"|" "search_spaces/$sp.toml" \
        > "$c/${sp}_$suffix.toml"
  done
}
template_before() {
  local commit=$1 patch=$2 suffix=$3 t
  c=$(mktemp -d)
  t="$c/decode_$suffix.cu.j2"
  if git rev-parse --verify -q "$commit^{commit}" > /dev/null 2>&1; then
    git show "$commit:templates/cuda/decode.cu.j2" > "$t" || return 1
  else
    cp templates/cuda/decode.cu.j2 "$t"
    patch -s "$t" "$patch" || return 1
  fi
  template_spaces "$suffix"
}
