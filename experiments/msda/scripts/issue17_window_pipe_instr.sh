source experiments/scripts/device_env.sh || exit 1
merge='{"WINDOW_TILE": 4, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 8, "WINDOW_STAGES": 4, "MIN_BLOCKS_PER_SM": 1}'
timeout 200 ncu --kernel-name regex:msda_wpipe --launch-skip 1 --launch-count 1 --section WarpStateStats --section InstructionStats \
  --print-details all --metrics sass__inst_executed_per_opcode --print-metric-instances details \
  python3 experiments/msda/profile_one.py --params experiments/msda/sweeps/elite_v2.json --merge "$merge" \
  --calls 2 --cache-dir "$EVOENGINEER_CACHE" > "$OUT/ncu_instr.txt" 2>&1
so=$(ls -t $(find $EVOENGINEER_CACHE -name "*.so") | head -1)
cuobjdump -sass -fun msda_wpipe_kernel "$so" > "$OUT/wpipe.sass" 2>&1 || cuobjdump -sass "$so" > "$OUT/wpipe.sass" 2>&1
echo "$so" >> "$OUT/wpipe.sass"
