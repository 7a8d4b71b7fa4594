# On the GPU host, from the repository root (issue 34): Nsight Compute durations, occupancy and DRAM throughput of the
# split and combine kernels with the parallel combine and before it (frozen template), the decode shape and the long
# single sequence; text reports under $OUT.
#   bash experiments/decode/scripts/combine_profile.sh
source experiments/scripts/device_env.sh || exit 1
dest=${OUT:-experiments/decode/results/issue34/combine}
source experiments/decode/scripts/before_combine.sh || exit 1
kernels=(--kernel "fp16_ga=decode_fp16_d128:$fp16_ga" --kernel "fp16_ga_before=$c/decode_fp16_d128_before_combine.toml:$fp16_ga"
         --kernel "fp8_ga=decode_fp8kv_d128:$fp8_ga" --kernel "fp8_ga_before=$c/decode_fp8kv_d128_before_combine.toml:$fp8_ga")
timeout -k 5 200 python3 experiments/decode/profile.py "${kernels[@]}" --cudnn --shape 1,32,8,1,32768,128 \
  --cache-dir "$EVOENGINEER_CACHE" > "$dest/combine_profile_plain.log" 2>&1; echo "plain rc $?"; tail -5 "$dest/combine_profile_plain.log"
for shape in 8,32,8,1,8192,128 1,32,8,1,32768,128; do
  timeout -k 5 150 ncu --profile-from-start off --nvtx --section SpeedOfLight --section LaunchStats --section Occupancy \
    --print-summary none python3 experiments/decode/profile.py "${kernels[@]}" --cudnn --shape $shape \
    --cache-dir "$EVOENGINEER_CACHE" > "$dest/combine_ncu_${shape//,/_}.txt" 2>&1
  echo "ncu $shape rc $?"
done
