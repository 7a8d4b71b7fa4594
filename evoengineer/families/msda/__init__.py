"""Multi-scale deformable attention (Deformable DETR): the task (task.py), its binding (binding.cpp), op adapter
(op.py) and float reference (reference.py); templates under templates/cuda/msda*.cu.j2 and templates/cpu/."""
