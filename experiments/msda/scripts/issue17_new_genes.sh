#!/bin/bash
# Issue 17, on the GPU host from the repository root: GPU tests of the fused softmax and head-major value, then
# the layout sweep (base = previous grid optimum, +HALF2, +HEAD_MAJOR, window path) through the product's evaluator,
# in the plain space and with ATTENTION = "logits". Logs to $OUT.
source experiments/scripts/device_env.sh || exit 1
nvidia-smi -L > "$OUT/gpu.txt"
timeout 300 python -m pytest -x -q -p no:cacheprovider tests/test_gpu_msda.py -k "logits or head_major" \
  > "$OUT/gpu_tests_new.log" 2>&1; echo "pytest rc $?" >> "$OUT/gpu_tests_new.log"
timeout 140 python experiments/msda/gene_sweep.py --space cuda_msda_fp16 --cache-dir "$EVOENGINEER_CACHE" \
  --configs experiments/msda/sweeps/layout_genes.json --out "$OUT/layout_genes.json" > "$OUT/layout_genes.log" 2>&1
sed 's/VALUE_DTYPE = "float16"/VALUE_DTYPE = "float16"\nATTENTION = "logits"/' search_spaces/cuda_msda_fp16.toml \
  > /tmp/cuda_msda_fp16_logits.toml
timeout 120 python experiments/msda/gene_sweep.py --space /tmp/cuda_msda_fp16_logits.toml --cache-dir "$EVOENGINEER_CACHE" \
  --configs experiments/msda/sweeps/layout_genes.json --out "$OUT/layout_genes_logits.json" > "$OUT/layout_genes_logits.log" 2>&1
echo done
