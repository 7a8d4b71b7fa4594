# On the H100 host (issue 35, second round): the Hopper genomes of experiments/sdpa/genomes/desc_ab_*.json probed
# (checks, then kernel-only times next to cuDNN / FA2 at (4,16,4096) and (16,16,1024), causal and not) with the
# template before this round (first argument: a copy of it) and with the working tree's, in two processes each.
#   bash experiments/sdpa/scripts/issue35_desc_ab.sh OLD_TEMPLATE.j2
source experiments/scripts/device_env.sh || exit 1
old=${1:?the earlier template}
T=templates/cuda/sdpa_hopper.cu.j2
cp $T /tmp/new_template.j2
for which in old new; do
  if [ $which = old ]; then cp "$old" $T; else cp /tmp/new_template.j2 $T; fi
  for s in d64:sdpa_hopper_fp16_d64_large d128:sdpa_hopper_fp16_d128_large fp8:sdpa_hopper_fp8_d128_large; do
    n=${s%%:*}; space=${s#*:}
    timeout 170 python3 experiments/sdpa/hopper_probe.py --space $space --genomes experiments/sdpa/genomes/desc_ab_$n.json \
      --shapes "4,16,4096;16,16,1024" --cache-dir /tmp/evo-cache --json $OUT/ab_${which}_$n.json > $OUT/ab_${which}_$n.log 2>&1
    echo "$which $n rc $?"
  done
done
cp /tmp/new_template.j2 $T
grep -h "x cuDNN\|WRONG\|^{" $OUT/ab_*_*.log | head -0
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
for n in ("d64", "d128", "fp8"):
    rows = {w: json.load(open(f"{out}/ab_{w}_{n}.json")) for w in ("old", "new") if os.path.exists(f"{out}/ab_{w}_{n}.json")}
    if len(rows) < 2: print(n, "missing"); continue
    for i, (o, m) in enumerate(zip(rows["old"], rows["new"])):
        print(n, i, o["status"], m["status"], json.dumps(m["params"], separators=(",", ":")))
        for k in m.get("times", {}):
            to, tn = o["times"].get(k), m["times"][k]
            if to: print(f"   {k:>22}: old {to[0]:8.1f} new {tn[0]:8.1f} us  new/old {tn[0]/to[0]:.3f}  x cuDNN old {to[1]/to[0]:.2f} new {tn[1]/tn[0]:.2f}")
PY
