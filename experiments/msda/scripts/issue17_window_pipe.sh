#!/bin/bash
# Issue 17, third step, on the GPU host from the repository root: path 5 (producer warp + cp.async.bulk level windows
# behind mbarriers) through the product's evaluator (correctness on every shape of the space, timing), then
# compute-sanitizer memcheck / synccheck of two path-5 genomes on a window correctness shape and the encoder.
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L > "$OUT/gpu.txt"
CONFIGS=${CONFIGS:-experiments/msda/sweeps/window_pipe_genes.json}
timeout ${SWEEP_S:-330} python experiments/msda/gene_sweep.py --space cuda_msda_fp16 --cache-dir "$EVOENGINEER_CACHE" \
  --base experiments/msda/sweeps/elite_v2.json --configs "$CONFIGS" --out "$OUT/window_pipe.json" \
  > "$OUT/window_pipe.log" 2>&1; echo "sweep rc $?" >> "$OUT/window_pipe.log"
for merge in '{"WINDOW_TILE": 4, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 8, "WINDOW_STAGES": 4, "MIN_BLOCKS_PER_SM": 1}' \
             '{"WINDOW_TILE": 4, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 4, "WINDOW_STAGES": 4, "MIN_BLOCKS_PER_SM": 2}' \
             '{"WINDOW_TILE": 8, "WINDOW_MARGIN": 2, "WINDOW_HEADS": 4, "WINDOW_STAGES": 3, "MIN_BLOCKS_PER_SM": 1, "HEAD_MAJOR": true}'; do
  for shape in ${SAN_SHAPES:-win_pixels_m5 win_random_m3 encoder}; do
    for tool in memcheck synccheck; do
      echo "== $tool $shape $merge" >> "$OUT/sanitizer.log"
      timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python experiments/msda/profile_one.py \
        --params experiments/msda/sweeps/elite_v2.json --merge "$merge" --shape $shape --calls 1 \
        --cache-dir "$EVOENGINEER_CACHE" 2>&1 | tail -4 >> "$OUT/sanitizer.log"
      echo "rc ${PIPESTATUS[0]}" >> "$OUT/sanitizer.log"
    done
  done
done
echo done
