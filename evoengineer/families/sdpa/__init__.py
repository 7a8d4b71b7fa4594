"""Attention prefill (scaled dot-product attention): the task (task.py), its binding (binding.cpp), op adapter (op.py)
and the attention gradients shared with decode (attention_reference.py); templates under templates/cuda/sdpa*.cu.j2."""
