#!/bin/bash
# Issue 17, on the GPU host from the repository root: the GA on the fp16 space (budget 400, population 24, seed 0),
# resumable: the store lives in $GA_DB (default .device_state/: carry it between calls, copied to $OUT after each),
# then the landscape CSV.
# GA_TAG names the outputs (v2: the space before PAIR_LOADS / WINDOW_STAGES; v3: with path 5).
source experiments/scripts/device_env.sh || exit 1
tag=${GA_TAG:-v2}
db=${GA_DB:-.device_state/ga_fp16_$tag.db}
mkdir -p "$(dirname "$db")"
cmd=search; [ -f "$db" ] && cmd=resume
if [ $cmd = search ]; then
  timeout ${GA_S:-520} python3 -m evoengineer search --space cuda_msda_fp16 --budget 400 --population 24 --seed 0 \
    --db "sqlite:///$db" --out "$OUT/elite_ga_fp16_$tag.json" > "$OUT/ga_fp16_$tag.log" 2>&1
else
  timeout ${GA_S:-520} python3 -m evoengineer resume --db "sqlite:///$db" > "$OUT/ga_fp16_${tag}_resume.log" 2>&1
fi
echo "ga exit $?"
cp "$db" "$OUT/ga_fp16_$tag.db"
python3 -m evoengineer landscape --db "sqlite:///$db" --out "$OUT/ga_evals_cuda_msda_fp16_$tag.csv" 2>&1 | tail -1
