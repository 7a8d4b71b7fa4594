"""Gene sweeps of the CUDA MSDA family on a GPU host, through the product's own evaluator (build, ptxas gate,
correctness on every shape of the space with fresh inputs, timing of its timed shapes with the classic kernel in
the same worker process, L2 flushed before every call).

    python experiments/msda/gene_sweep.py --space cuda_msda_fp16 --base base.json \
        --vary BRANCH_FREE=false,true --vary HALF2=false,true --out sweep.json
    python experiments/msda/gene_sweep.py --space cuda_msda_fp16 --configs configs.json --out sweep.json

--vary crosses the listed values of each gene over the base configuration (a full factorial of the --vary genes;
invalid combinations are skipped and listed); --configs takes a JSON list of full configurations (or of partial
ones, merged over --base). Prints one row per configuration: status, p50 per timed shape, x classic, max error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def parse_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text.strip()


def configs_from_args(a, base: dict) -> list[dict]:
    if a.configs:
        return [{**base, **c} for c in json.loads(Path(a.configs).read_text())]
    genes, values = [], []
    for v in a.vary:
        name, _, vals = v.partition("=")
        genes.append(name)
        values.append([parse_value(x) for x in vals.split(",")])
    return [{**base, **dict(zip(genes, combo))} for combo in itertools.product(*values)] or [base]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="cuda_msda_fp16", help="a shipped space's name, or a space file")
    ap.add_argument("--base", help="JSON file: a configuration, or an elite.json (its best elite's params)")
    ap.add_argument("--vary", action="append", default=[], metavar="GENE=v1,v2,...")
    ap.add_argument("--configs", help="JSON list of configurations (merged over --base)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()

    from evoengineer import space_file
    from evoengineer.candidate import CandidateFactory
    from evoengineer.evaluators.local import LocalEvaluator
    from evoengineer.space import load_space

    given = Path(a.space)
    space = load_space(given if given.suffix == ".toml" and given.is_file() else space_file(f"{a.space}.toml"))
    base = {}
    if a.base:
        doc = json.loads(Path(a.base).read_text())
        base = doc["elites"][0]["params"] if "elites" in doc else doc
    configs = configs_from_args(a, base)
    factory = CandidateFactory(space)
    cands, skipped = [], []
    for c in configs:
        bad = space.violated(c)
        if bad:
            skipped.append({"params": c, "violated": bad})
        else:
            cands.append(factory.make(c))
    rows = []
    with LocalEvaluator(space, cache_dir=Path(a.cache_dir)) as ev:
        for cand, m in ev.evaluate_many(cands):
            met = m.metrics or {}
            shapes = {k: v["p50_us"] for k, v in (met.get("shapes") or {}).items()}
            rows.append({"params": cand.params, "status": m.status, "reason": m.reason, "time_us": met.get("time_us"),
                         "shapes_us": shapes, "baselines_us": met.get("baselines_us"),
                         "speedup_vs": met.get("speedup_vs"), "max_abs_err": met.get("max_abs_err")})
    varied = sorted({k for c in configs for k in c if len({json.dumps(x.get(k)) for x in configs}) > 1})
    timed = sorted({k for r in rows for k in r["shapes_us"]})
    print(" | ".join(varied + ["status"] + [f"{s} us" for s in timed] + ["x classic", "max err"]))
    for r in rows:
        cells = [str(r["params"].get(k)) for k in varied] + [r["status"]]
        cells += [f"{r['shapes_us'].get(s, float('nan')):.1f}" for s in timed]
        sp = (r["speedup_vs"] or {}).get("classic")
        cells += [f"{sp:.2f}" if sp else "-", f"{r['max_abs_err']:.1e}" if r["max_abs_err"] is not None else "-"]
        if r["status"] != "ok":
            cells.append(str(r["reason"])[:200])
        print(" | ".join(cells))
    for s in skipped:
        print("skipped (constraints):", s["violated"], {k: s["params"].get(k) for k in varied})
    if rows and rows[0].get("baselines_us"):
        print("classic (sum of the timed shapes):", rows[0]["baselines_us"])
    if a.out:
        Path(a.out).write_text(json.dumps({"space": a.space, "rows": rows, "skipped": skipped}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
