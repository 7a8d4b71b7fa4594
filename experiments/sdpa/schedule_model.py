"""How evenly the Hopper prefill kernel's persistent scheduler spreads its tiles (a CPU model, no GPU).

    python experiments/sdpa/schedule_model.py [--sms 132] [--overhead 1.0]

evoengineer/families/sdpa/cuda/sdpa_hopper.cu.j2 with PERSISTENT walks tiles t = unit, unit + units, ... (a unit is a CTA, or a
cluster of CLUSTER_SIZE CTAs on neighbouring q-blocks); causal runs order the tiles heaviest q-block first. A tile's
cost here is the K/V tiles its unit loads (the heavier q-block of a cluster) plus a fixed `overhead` (Q load,
epilogue, in units of one K/V tile). The model prints, per shape and tile shape, the busiest unit's cost over the
mean (1.0 = every SM busy to the end) for that static walk and for a dynamic one (each unit takes the next tile in
the same order when it is free, as an atomic tile counter would do: the template's SCHEDULER = dynamic, which takes
its next tile a little earlier, once its producer has issued the current tile's loads). It models only the
balance, not the speed of a tile.
"""

from __future__ import annotations

import argparse
import heapq
import math


def kv_tiles(mblock: int, block_m: int, block_n: int, sk: int, causal: bool) -> int:
    """K/V tiles q-block `mblock` computes on (the template's kv_tiles_for)."""
    n_end = min(sk, (mblock + 1) * block_m) if causal else sk
    return math.ceil(n_end / block_n)


def tile_costs(bh: int, s: int, block_m: int, block_n: int, cluster: int, causal: bool, overhead: float) -> list:
    """Costs of tiles t = 0, 1, ... in the template's order (tile_at)."""
    num_m = math.ceil(s / block_m)
    groups = math.ceil(num_m / cluster)
    costs = []
    for t in range(bh * groups):
        group = groups - 1 - t // bh if causal else t % groups
        heaviest = min(group * cluster + cluster - 1, num_m - 1)
        costs.append(kv_tiles(heaviest, block_m, block_n, s, causal) + overhead)
    return costs


def imbalance(costs: list, units: int, dynamic: bool) -> float:
    """The busiest unit's total over the mean total."""
    if dynamic:
        free = [(0.0, u) for u in range(units)]
        for c in costs:
            load, u = heapq.heappop(free)
            heapq.heappush(free, (load + c, u))
        loads = [load for load, _ in free]
    else:
        loads = [0.0] * units
        for i, c in enumerate(costs):
            loads[i % units] += c
    return max(loads) / (sum(costs) / units)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=1.0, help="fixed cost per tile, in K/V tiles")
    a = ap.parse_args()
    print(f"{a.sms} SMs, overhead {a.overhead} K/V tiles per tile; busiest unit / mean: static walk, dynamic")
    for b, h, s in ((16, 16, 1024), (4, 16, 4096)):
        for causal in (False, True):
            for block_m, block_n, cluster in ((128, 128, 1), (128, 128, 2), (128, 176, 2), (192, 128, 1)):
                costs = tile_costs(b * h, s, block_m, block_n, cluster, causal, a.overhead)
                units = a.sms // cluster
                print(f"({b}, {h}, {s}) {'causal' if causal else 'full  '} BLOCK_M {block_m} BLOCK_N {block_n} "
                      f"cluster {cluster}: {len(costs)} tiles, static {imbalance(costs, units, False):.3f}, "
                      f"dynamic {imbalance(costs, units, True):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
