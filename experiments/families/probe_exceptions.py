import sys, subprocess, os
code = r'''
import sys, torch, faulthandler; faulthandler.enable()
sys.path.insert(0, ".")
import evoengineer
from evoengineer.tasks.msda import MSDAShape, make_inputs
fn = evoengineer.load("experiments/msda/results/issue17/elite_ga_fp16_v3.json")
m = fn.kernel.module
shape = MSDAShape("q10", N=1, Lq=10, M=8, D=32, P=4, levels=((25, 42), (13, 21), (7, 11), (4, 6)))
x = make_inputs(shape, 0, dtype=torch.float16, device="cuda")
a = [x[k] for k in ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")]
out = torch.empty(1, 10, 256, dtype=torch.float16, device="cuda")
case = sys.argv[1]
try:
    if case == "dtype": m.forward(a[0].float(), *a[1:], out)
    if case == "str": m.forward("x", *a[1:], out)
    if case == "levels": m.forward(a[0], torch.tensor([[25, 42], [13, 21], [7, 11], [4, 7]], device="cuda"), *a[2:], out)
    if case == "levels_cpu_first":
        m.forward(a[0], a[1].cpu(), *a[2:], out)
    if case == "ok": print("rc", m.forward(*a, out))
except Exception as e:
    print("caught", type(e).__name__, str(e)[:100])
'''
for case in ("ok", "str", "dtype", "levels", "levels_cpu_first"):
    r = subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True)
    print(case, r.returncode, r.stdout.strip()[-200:], r.stderr.strip()[-600:] if r.returncode else "")
