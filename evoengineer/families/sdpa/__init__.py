"""Attention prefill (scaled dot-product attention): the task (task.py), its binding (binding.cpp) and op adapter
(op.py); what it shares with decode is in ../attention/; templates under evoengineer/families/sdpa/cuda/sdpa*.cu.j2."""
