# Sourced by combine_h100.sh and combine_profile.sh: $c, a folder holding the decode template as it was before the
# parallel combine (commit 2f33940; results/issue34/combine/decode_before_combine.patch without git) and its two
# d128 spaces (`*_before_combine.toml`); the table's genomes both scripts time ($fp16_ga, $fp16_tma, $fp8_ga,
# $fp8_tma).
source experiments/decode/scripts/template_before.sh
template_before 2f33940 experiments/decode/results/issue34/combine/decode_before_combine.patch before_combine || return 1
f16='"NUM_WARPS": 4, "COPY_BYTES": 16, "M_TILES": 1, "SPLIT_WAVES": 1, "MIN_BLOCKS": 1'
fp16_ga="{\"BLOCK_N\": 64, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, $f16}"
fp16_tma="{\"BLOCK_N\": 128, \"STAGES\": 2, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": false, \"COMBINE\": \"separate\", \"FAST_EXP\": true, $f16}"
fp8_ga='{"BLOCK_N": 32, "NUM_WARPS": 2, "STAGES": 2, "LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "Q_IN_REGISTERS": true, "SPLIT_WAVES": 1, "COMBINE": "separate", "FAST_EXP": true, "MIN_BLOCKS": 1, "DEQUANT": "shared"}'
fp8_tma="{\"BLOCK_N\": 64, \"STAGES\": 3, \"LOAD_PATH\": \"tma\", \"Q_IN_REGISTERS\": true, \"COMBINE\": \"in_kernel\", \"FAST_EXP\": true, \"DEQUANT\": \"shared\", $f16}"
