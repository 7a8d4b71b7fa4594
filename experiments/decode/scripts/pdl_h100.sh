# On the GPU host, from the repository root (issue 34): COMBINE = dependent (the separate combine launched as a
# programmatic dependent of the split kernel: griddepcontrol) against COMBINE = separate with the same genes, the
# fastest separate-combine kernels of each dtype, every shape, one process. Logs under $OUT.
# (The runs in results/issue34/pdl/ and pdl/run2/ were made while the programmatic launch was what "separate" did,
# against the template before it, 88536d3, rebuilt by template_before.sh: the same two kernels each way.)
#   bash experiments/decode/scripts/pdl_h100.sh
source experiments/decode/scripts/bench_lib.sh results/issue34/pdl/gene || exit 1
keys='"LOAD_PATH": "tma", "COPY_BYTES": 16, "M_TILES": 1, "FAST_EXP": true, "MMA_ROWS": "keys", "STAGES": 2,
      "SPLIT_WAVES": 1, "Q_IN_REGISTERS": false'
declare -A G=(
  [f8_kreg]="fp8kv|\"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"k_registers\""
  [f8_single]="fp8kv|\"BLOCK_N\": 64, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 6, \"DEQUANT\": \"shared_single\""
  [f8_reg]="fp8kv|\"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 2, \"DEQUANT\": \"registers\""
  [h_tma_keys]="fp16|\"BLOCK_N\": 128, \"NUM_WARPS\": 4, \"MIN_BLOCKS\": 1"
)
args=()
for n in "${!G[@]}"; do
  sp=decode_${G[$n]%%|*}_d128; g="$keys, ${G[$n]#*|}"
  args+=(--kernel "$n=$sp:{$g, \"COMBINE\": \"dependent\"}" --kernel "${n}_separate=$sp:{$g, \"COMBINE\": \"separate\"}")
done
decode_bench pdl "${args[@]}"
