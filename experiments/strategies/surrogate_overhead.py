"""What one surrogate proposal costs on the default space (cuda_msda_fp16: 975,286 valid configurations).

The strategy is given a synthetic history (random valid configurations with a made-up time and 10% failures: only
the cost is measured here, not the quality) and proposes a batch of 12 at 50, 100, 200 and 400 evaluations. The
one-time cost (the valid set as an array with one integer code per configuration) is reported apart.

    python experiments/strategies/surrogate_overhead.py
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from evoengineer.search.surrogate import SurrogateSearch  # noqa: E402
from evoengineer.paths import space_file  # noqa: E402
from evoengineer.space import load_space  # noqa: E402
from evoengineer.store import CandidateRecord  # noqa: E402


def main() -> int:
    space = load_space(space_file("cuda_msda_fp16.toml"))
    rng = random.Random(0)
    valid = space.valid_genomes()
    records: dict[str, CandidateRecord] = {}
    runner = SimpleNamespace(space=space, settings=SimpleNamespace(seed=0, population=12))
    strat = SurrogateSearch(runner)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    strat.valid()
    print(f"{len(valid)} valid configurations; one-time setup {time.perf_counter() - t0:.2f} s")
    gen = 1
    for n in (50, 100, 200, 400):
        while len(records) < n:
            g = valid[rng.randrange(len(valid))]
            params = space.genome_to_params(g)
            ok = rng.random() > 0.1
            t = 100.0 + sum(i * (k + 1) for k, i in enumerate(g)) + rng.random() * 10
            rec = CandidateRecord(hash=f"h{len(records)}", params=params, status="ok" if ok else "gate_failed",
                                  metrics={"time_us": t} if ok else {}, generation=0)
            records[rec.hash] = rec
            strat.tell(tuple(g), rec)  # what the search loop does as results arrive
        t0 = time.perf_counter()
        picks = strat.batch(gen, 12)
        ms = 1000 * (time.perf_counter() - t0)
        print(f"history {n}: a batch of {len(picks)} in {ms:.0f} ms ({ms / len(picks):.0f} ms per proposal)")
        gen += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
