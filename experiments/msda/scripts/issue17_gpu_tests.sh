#!/bin/bash
# Issue 17, on the GPU host from the repository root: the CUDA MSDA GPU tests (head-major value, fused softmax,
# sampled genomes of both spaces incl. every new gene, the deadlocking genome) and the layout sweep. Logs to $OUT.
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L > "$OUT/gpu.txt"
timeout ${TEST_S:-420} python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_msda.py -k "${TESTS:-head_major or sampled or deadlock}" \
  > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc $?" >> "$OUT/gpu_tests.log"
timeout ${SWEEP_S:-150} python experiments/msda/gene_sweep.py --space cuda_msda_fp16 --cache-dir "$EVOENGINEER_CACHE" \
  --configs experiments/msda/sweeps/layout_genes.json --out "$OUT/layout_genes.json" > "$OUT/layout_genes.log" 2>&1
echo done
