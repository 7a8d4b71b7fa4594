# Source on the GPU host (offline), from the repository root: installs the carried wheels (.whl) and exports
# PYTHONPATH. Shared by the experiments/*/scripts. Bytecode is compiled here, as a `pip install` compiles it at
# install time: a command timed afterwards (a search's first candidate) should not pay for compiling Python source.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
python3 -m compileall -q -j 0 /tmp/site evoengineer > /dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
export EVOENGINEER_CACHE=${EVOENGINEER_CACHE:-/tmp/evo-cache}
