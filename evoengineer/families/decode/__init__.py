"""Decode attention over a KV cache (GQA, FP8 K/V): the task (task.py), its binding (binding.cpp) and op adapter
(op.py); templates under evoengineer/families/decode/cuda/decode.cu.j2."""
