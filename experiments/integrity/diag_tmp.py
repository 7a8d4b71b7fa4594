import json, sys, time
from pathlib import Path
from evoengineer.candidate import CandidateFactory
from evoengineer.evaluators.local import LocalEvaluator
from evoengineer.space import load_space
from evoengineer import SPACES_DIR
if __name__ == "__main__":
    for path, params in [("tests/data/cheats_cuda/cheats_space.toml", [{"CHEAT": "none", "THREADS": 256}, {"CHEAT": "persist_l2", "THREADS": 256}, {"CHEAT": "none", "THREADS": 256}]),
                         (str(SPACES_DIR / "cuda_msda_fp16.toml"), None)]:
        space = load_space(Path(path))
        f = CandidateFactory(space)
        cands = [f.make(p) for p in params] if params else [f.from_genome(g) for g in space.valid_genomes()[:3]]
        with LocalEvaluator(space) as ev:
            for c in cands:
                t0 = time.time()
                m = ev.evaluate(c)
                print(path.split("/")[-1], m.status, m.reason[:600], round(time.time() - t0, 2), flush=True)
                print("   ", json.dumps({k: m.metrics.get(k) for k in ("worker_s", "shapes", "state_changes", "sentinel_us", "remeasured", "sentinel_drifts", "time_us")})[:1500], flush=True)
            print("replaced", ev.replaced, "measured_with", json.dumps(ev.measured_with)[:1500], flush=True)
