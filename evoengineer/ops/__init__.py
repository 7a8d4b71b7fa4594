"""A searched kernel as a PyTorch op: the runtime an exported package carries (runtime.py) and the torch-only
references it falls back on and differentiates (msda_reference.py). Nothing here imports the rest of EvoEngineer:
`evoengineer export` copies these files into the package it writes."""
