"""Where a search command's first seconds go, before its evaluator exists (issue 51's first candidate): runs
`python -m evoengineer search --space SPACE` in this process under cProfile and stops it the moment the evaluator
is created; prints the seconds since this script started and the top functions by cumulative time.

    python experiments/scale/command_start.py [--space cuda_msda_fp16] [--top 30]

Needs what the search needs to get that far (a GPU for a CUDA space). Writes nothing but to stdout.
"""

from __future__ import annotations

import time

T0 = time.monotonic()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", default="cuda_msda_fp16")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    profile = cProfile.Profile()
    profile.enable()
    import evoengineer.evaluators.local as local
    from evoengineer.cli import main as cli

    def stop(self, *args, **kwargs):
        profile.disable()
        print(f"evaluator created {time.monotonic() - T0:.2f} s after this script started", flush=True)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(a.top)
        sys.stdout.flush()
        os._exit(0)

    local.LocalEvaluator.__init__ = stop
    work = Path(tempfile.mkdtemp(prefix="evo-start-"))
    cli(["search", "--space", a.space, "--budget", "10", "--db", f"sqlite:///{work / 's.db'}",
         "--out", str(work / "elite.json"), "--cache-dir", str(work / "cache")])
    raise SystemExit("the search ended before it made an evaluator")


if __name__ == "__main__":
    main()
