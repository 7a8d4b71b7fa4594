# Source on the GPU host (offline), from the repository root: installs the carried wheels (.whl) and exports
# PYTHONPATH. Shared by the experiments/*/scripts.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
export EVOENGINEER_CACHE=${EVOENGINEER_CACHE:-/tmp/evo-cache}
