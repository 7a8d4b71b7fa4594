# On the H100 host (issue 35, fourth round): GA runs of the two mixed spaces with the SCHEDULER gene (seed 3, 144
# evaluations or 250 s each, whichever comes first); results in results/issue35/round4/ (the stores not kept).
export EVOENGINEER_CACHE=/tmp/evo-cache
SEARCH_LIMIT=250 bash experiments/sdpa/scripts/hopper_searches.sh sdpa_hopper_fp16_d64_mixed_large 3 144 --generations 12
SEARCH_LIMIT=250 bash experiments/sdpa/scripts/hopper_searches.sh sdpa_hopper_fp16_d128_mixed_large 3 144 --generations 12
