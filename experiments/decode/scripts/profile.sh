# On the GPU host, from the repository root (issue 34): Nsight Compute profiles of the recorded decode elites, their
# paged twins at page sizes 16 and 64 and cuDNN's kernel at the decode shape and at the long single sequence; text
# reports under $OUT (or experiments/decode/results/issue34).
#   bash experiments/decode/scripts/profile.sh [EXTRA --kernel ARGS...]
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34}
r=experiments/decode/results
kernels=(--kernel fp16=$r/elite_decode_fp16_d128.json --kernel fp8=$r/elite_decode_fp8kv_d128.json "$@")
sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
# build once outside ncu (the builder's process pool under the profiler is slow)
timeout -k 5 240 python3 experiments/decode/profile.py "${kernels[@]}" --paged 16,64 --cudnn --shape 8,32,8,1,8192,128 \
  --cache-dir "$EVOENGINEER_CACHE" > "$dest/profile_plain.log" 2>&1; echo "plain rc $?"; tail -12 "$dest/profile_plain.log"
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  timeout -k 5 200 ncu --profile-from-start off --nvtx $sections --print-summary none \
    python3 experiments/decode/profile.py "${kernels[@]}" --paged 16,64 --cudnn --shape $shape \
    --cache-dir "$EVOENGINEER_CACHE" > "$dest/ncu_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
done
