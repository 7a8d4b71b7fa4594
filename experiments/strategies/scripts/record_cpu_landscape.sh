#!/usr/bin/env bash
# Records the CPU landscape the strategy benchmark replays: three full grid passes of the cpu_msda space through the
# real pipeline (build, check, time), then the per-configuration median of the three. ~5 minutes a pass on 2 cores;
# keep the machine otherwise idle while it runs.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
work=${WORK:-/tmp/evo-cpu-landscape}
mkdir -p "$work" experiments/strategies/results
passes=()
for i in 1 2 3; do
  rm -f "$work/grid$i.db" "$work/grid$i.db-wal" "$work/grid$i.db-shm"
  python3 -m evoengineer search --space cpu_msda --strategy grid --population 16 --budget 528 --build-jobs 1 \
    --seed "$i" --db "sqlite:///$work/grid$i.db" --out "$work/elite$i.json" --force --quiet
  python3 -m evoengineer landscape --db "sqlite:///$work/grid$i.db" --out "$work/pass$i.csv"
  passes+=("$work/pass$i.csv")
done
python3 experiments/strategies/merge_landscapes.py --space cpu_msda \
  --out experiments/data/strategies/landscape_cpu_msda.csv "${passes[@]}"
