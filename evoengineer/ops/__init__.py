"""A searched kernel as a PyTorch op: the runtime an exported package carries (runtime.py), with the op adapter of
its family (evoengineer/families/*/op.py, or runtime.DeclaredOp for a declared call). Nothing here imports the rest
of EvoEngineer: `evoengineer export` copies these files into the package it writes."""
