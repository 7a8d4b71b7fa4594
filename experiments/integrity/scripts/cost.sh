# On the GPU host: what the integrity checks cost on the default GPU search (experiments/integrity/cost.py), this
# tree against the baseline tree carried in .baseline/ (git archive of the commit before the checks).
#   bash experiments/integrity/scripts/cost.sh [BUDGET]
source experiments/scripts/device_env.sh || exit 1
python3 experiments/integrity/cost.py --baseline .baseline --budget "${1:-200}" --work /tmp/evo-cost \
  --json "$OUT/cost.json" 2>&1 | tee "$OUT/cost.log"
tar -czf "$OUT/logs.tgz" /tmp/evo-cost/*/search.log 2>/dev/null
