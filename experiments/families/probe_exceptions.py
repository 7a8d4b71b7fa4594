import subprocess
import sys
code = r'''
import sys, torch, faulthandler; faulthandler.enable(); faulthandler.dump_traceback_later(45, exit=True)
sys.path.insert(0, ".")
import evoengineer
from evoengineer.tasks.msda import MSDAShape, make_inputs
fn = evoengineer.load("experiments/msda/results/issue17/elite_ga_fp16_v3.json")
print("built", flush=True)
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
    if case == "headdim":
        v = torch.zeros(1, a[0].shape[1], 8, 64, dtype=a[0].dtype, device="cuda")
        m.forward(v, *a[1:], out)
    if case == "outsize": m.forward(*a, out[..., :255].contiguous())
except Exception as e:
    print("caught", type(e).__name__, str(e)[:100])
'''
import evoengineer  # build the module once, here
sys.path.insert(0, ".")
evoengineer.load("experiments/msda/results/issue17/elite_ga_fp16_v3.json")
print("built", flush=True)
for case in ("ok", "str", "dtype", "headdim", "outsize", "levels", "levels_cpu_first"):
    try:
        r = subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        print(case, "TIMEOUT", flush=True)
        continue
    print(case, r.returncode, r.stdout.strip()[-200:], r.stderr.strip()[-900:] if r.returncode else "", flush=True)
