"""A/B of template versions (or of one gene's values) in one process on a GPU host: the same genomes rendered from
the working tree's template and from other versions of it, checked, then timed in interleaved rounds next to cuDNN
(kernel-only, CUDA graph replay, L2 warm), so clock and thermal drift fall on every variant alike.

    python experiments/sdpa/template_ab.py --space sdpa_hopper_fp16_d64_large --genomes G.json \
        --variant before=old_template.cu.j2 [--variant ...] [--shapes "4,16,4096;16,16,1024"] [--rounds 3] [--json F]
    python experiments/sdpa/template_ab.py ... --genes dynamic='{"SCHEDULER": "dynamic"}'
    python experiments/sdpa/template_ab.py ... --variant no_t=COPY.cu.j2 --unchecked no_t   # a what-if timing

A --variant is a copy of the space (same genes, constraints, signature) whose template is the given file, in a
scratch folder beside a copy of the working tree's templates/cuda/common includes. A --genes variant is the tree's
template with those genes set on every genome (genomes they make invalid are refused). Times are medians over the
rounds; ratios are variant / tree. An --unchecked variant is timed only: a what-if copy whose answers are wrong by
design (a step removed to see what it costs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "sdpa"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmark import build, graph_us, with_later_genes  # noqa: E402
from hopper_probe import check_modules  # noqa: E402
from evoengineer import TEMPLATES_DIR, space_file  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.families.sdpa.task import SDPAShape  # noqa: E402

def variant_space(space_file: Path, base, template: Path, name: str, scratch: Path):
    """The space with `template` in place of its own, in scratch/name/ (with the common includes beside it)."""
    d = scratch / name
    (d / "cuda").mkdir(parents=True)
    shutil.copy(template, d / "cuda" / "sdpa_hopper.cu.j2")
    shutil.copytree(TEMPLATES_DIR / "cuda" / "common", d / "cuda" / "common")
    text = space_file.read_text().replace(f'name = "{base.name}"', f'name = "{base.name}__{name}"', 1)
    (d / "space.toml").write_text(text)
    return load_space(d / "space.toml")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", required=True)
    ap.add_argument("--genomes", required=True, help="JSON list of parameter dicts")
    ap.add_argument("--variant", action="append", default=[], help="NAME=TEMPLATE_FILE (repeatable)")
    ap.add_argument("--genes", action="append", default=[], help="NAME=JSON object of genes to set (repeatable)")
    ap.add_argument("--shapes", default="4,16,4096;16,16,1024", help="B,H,S;... (D from the space), causal and not")
    ap.add_argument("--unchecked", action="append", default=[],
                    help="a variant timed but not checked (a what-if copy, wrong by design; repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    ap.add_argument("--json")
    a = ap.parse_args()
    path = space_file(f"{a.space}.toml")
    genomes = json.loads(Path(a.genomes).read_text())
    tree = load_space(path)
    scratch = Path(tempfile.mkdtemp(prefix="template_ab_"))
    spaces = {"tree": tree}
    for spec in a.variant:
        name, _, template = spec.partition("=")
        spaces[name] = variant_space(path, tree, Path(template), name, scratch)
    overrides = {name: {} for name in spaces}
    for spec in a.genes:
        name, _, text = spec.partition("=")
        spaces[name], overrides[name] = tree, json.loads(text)
        bad = [g for g in genomes if tree.violated(with_later_genes(tree, {**g, **overrides[name]}))]
        if bad:
            raise SystemExit(f"--genes {name}: makes genomes invalid: {bad[:2]}")
    mods, task = {}, None
    for name, space in spaces.items():
        task, mods[name] = build(space, [{**g, **overrides[name]} for g in genomes], Path(a.cache_dir))
    D = tree.signature["HEAD_DIM"]
    # every variant of every genome on ragged / causal / Sq != Sk shapes
    unknown = set(a.unchecked) - set(spaces)
    if unknown:
        raise SystemExit(f"--unchecked: no variant named {sorted(unknown)[0]!r}")
    for name in a.unchecked:
        print(f"{name}: timed only, not checked (a what-if copy: its answers are wrong by design)")
    check_modules(task, {f"{name} g{gi}": mod for name in spaces if name not in a.unchecked
                         for gi, mod in enumerate(mods[name])})
    rows = []
    for spec in a.shapes.split(";"):
        B, H, S = map(int, spec.split(","))
        for causal in (False, True):
            inputs = task.make_inputs(SDPAShape("t", B=B, H=H, Sq=S, Sk=S, causal=causal), 7)
            out = task.new_output(inputs)
            q, k, v = (inputs.get(f"{n}_orig", inputs[n]) for n in ("q", "k", "v"))
            t = {(name, gi): [] for name in spaces for gi in range(len(genomes))}
            cu = []
            for _ in range(a.rounds):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cu.append(graph_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 20, 30))
                for gi in range(len(genomes)):
                    for name in spaces:
                        mod = mods[name][gi]
                        t[(name, gi)].append(graph_us(lambda: task.launch(mod, inputs, out), 20, 30))
            cud = statistics.median(cu)
            for gi, g in enumerate(genomes):
                base = statistics.median(t[("tree", gi)])
                row = {"shape": [B, H, S, D], "causal": causal, "genome": gi, "params": g, "cudnn_us": cud,
                       "us": {name: statistics.median(t[(name, gi)]) for name in spaces}}
                rows.append(row)
                print(f"{B},{H},{S},{D} {'causal' if causal else 'full  '} g{gi}: tree {base:8.1f} us (x cuDNN "
                      f"{cud / base:4.2f})" + "".join(f"  {n} {row['us'][n]:8.1f} ({row['us'][n] / base:5.3f})"
                                                      for n in spaces if n != "tree"), flush=True)
            del inputs, out
            torch.cuda.empty_cache()
    for gi, g in enumerate(genomes):
        print(f"g{gi}: {json.dumps(g, separators=(',', ':'))}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
