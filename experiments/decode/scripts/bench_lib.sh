# Sourced by the issue-34 device scripts, from the repository root: `source .../bench_lib.sh DEFAULT_DEST` sets up
# the GPU host's environment and $dest ($OUT, else DEFAULT_DEST under experiments/decode/), and gives
#   decode_bench NAME ARGS...        benchmark.py on ARGS (its --kernel / --paged options), one process: the GPU's
#                                    clocks in gpu_NAME.txt, the table in benchmark_NAME_h100.{json,md,log}
#   decode_ncu NAME SHAPE ARGS...    ncu's occupancy, warp-state, scheduler, memory and instruction sections of the
#                                    kernels of ARGS (profile.py's --kernel options) at SHAPE: NAME_ncu_SHAPE.txt
source experiments/scripts/device_env.sh || return 1
dest=${OUT:-experiments/decode/$1}
mkdir -p "$dest"
decode_bench() {
  local name=$1
  shift
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$dest/gpu_$name.txt"
  timeout -k 10 "${BENCH_TIMEOUT:-420}" python3 experiments/decode/benchmark.py "$@" --cache-dir "$EVOENGINEER_CACHE" \
    --json "$dest/benchmark_${name}_h100.json" --md "$dest/benchmark_${name}_h100.md" \
    > "$dest/benchmark_${name}_h100.log" 2>&1
  echo "bench rc $?"
  tail -9 "$dest/benchmark_${name}_h100.log"
}
decode_ncu() {
  local name=$1 shape=$2
  shift 2
  timeout -k 5 120 ncu --profile-from-start off --nvtx --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section InstructionStats --print-summary none \
    python3 experiments/decode/profile.py "$@" --shape "$shape" --cache-dir "$EVOENGINEER_CACHE" \
    > "$dest/${name}_ncu_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
}
