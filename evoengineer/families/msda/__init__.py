"""Multi-scale deformable attention (Deformable DETR): the task (task.py), its binding (binding.cpp), op adapter
(op.py) and float reference (reference.py); templates under evoengineer/families/msda/cuda/msda*.cu.j2 and evoengineer/families/msda/cpu/."""
