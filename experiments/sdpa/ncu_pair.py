"""One launch of a Hopper-family genome and one of cuDNN's SDPA on the same inputs, for ncu to profile side by side
(nothing else named *sdpa* runs: ncu -k regex:sdpa picks exactly these two).

    ncu -k regex:sdpa --section ... python experiments/sdpa/ncu_pair.py --space SPACE --genome '{...}' --shape B,H,S[,causal]
    ncu ... python experiments/sdpa/ncu_pair.py --elite elite.json[:SHAPE] --shape B,H,S[,causal]
    ncu ... python experiments/sdpa/ncu_pair.py --kernel experiments/sdpa/grid.toml:fp8/fp8_large --shape 4,16,4096

scripts/ncu_pair.sh runs it under ncu with the sections and metrics the issue-35 comparisons read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "sdpa"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmark import build, config_kernel, elite_params, load_doc  # noqa: E402
from evoengineer import space_file  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.families.sdpa.task import SDPAShape  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", help="the space's name (default with --elite: the elite's space)")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--genome", help="JSON parameter dict (needs --space)")
    which.add_argument("--elite", help="elite.json[:SHAPE]: its rank 1, or that shape's winner")
    which.add_argument("--kernel", help="FILE:TABLE/NAME: a kernel of a config (grid.toml)")
    ap.add_argument("--shape", required=True, help="B,H,S or B,H,S,causal")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "evoengineer"))
    a = ap.parse_args()
    if a.genome and not a.space:
        ap.error("--genome needs --space")
    if a.elite:
        path, _, shape_name = a.elite.partition(":")
        doc, space = load_doc(path)
        params = elite_params(doc, shape_name)
    elif a.kernel:
        space, params = config_kernel(a.kernel)
    else:
        params = json.loads(a.genome)
    if a.space:  # (with --elite: its genes rendered in this space)
        space = load_space(space_file(f"{a.space}.toml"))
    task, (module,) = build(space, [params], Path(a.cache_dir))
    parts = a.shape.split(",")
    B, H, S = map(int, parts[:3])
    causal = len(parts) > 3 and parts[3] == "causal"
    inputs = task.make_inputs(SDPAShape("ncu", B=B, H=H, Sq=S, Sk=S, causal=causal), 5)
    out = task.new_output(inputs)
    q, k, v = (inputs.get(f"{n}_orig", inputs[n]) for n in ("q", "k", "v"))
    torch.cuda.synchronize()
    task.launch(module, inputs, out)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    print(f"max abs diff to cuDNN {float((out.float() - ref.float()).abs().max()):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
