"""From search to model (CPU): `export` writes a package of an elite, `evoengineer.load` returns the same callable;
both compute the searched kernel as a torch.library op (torch.compile fullgraph), refuse inputs outside the compiled
signature with a clear error (or fall back to the reference), and differentiate through the reference's backward."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from evoengineer import space_file
from evoengineer.cli import main
from evoengineer.families.msda.task import INPUT_KEYS, MSDAShape, make_inputs, reference

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"

SMALL_SHAPES = '''
[[shapes]]
name = "odd"
N = 2
Lq = 37
M = 3
D = 32
P = 4
levels = [[7, 9], [4, 5], [2, 3], [1, 1]]
checks = 1
fresh = true

[[shapes]]
name = "timed"
N = 1
Lq = 64
M = 8
D = 32
P = 4
levels = [[12, 14], [6, 7], [3, 4], [2, 2]]
time = true
'''


def _small_msda_space(folder: Path) -> Path:
    text = (space_file("cpu_msda.toml")).read_text()
    text = text[: text.index("[[shapes]]")].replace("repeats = 20", "repeats = 3") + SMALL_SHAPES
    p = folder / "small_msda.toml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def msda_elite(tmp_path_factory, build_cache_session) -> Path:
    d = tmp_path_factory.mktemp("msda_search")
    rc = main(["search", "--space", str(_small_msda_space(d)), "--budget", "4", "--population", "4", "--db",
               f"sqlite:///{d / 's.db'}", "--out", str(d / "elite.json"), "--cache-dir", str(build_cache_session),
               "--quiet"])
    assert rc == 0
    return d / "elite.json"


def _cpu_family_elite(d: Path, family: str, build_cache: Path, population: int, faults: tuple = ()) -> Path:
    """A grid search over a test-only CPU attention family (tests/data/<family>, with the shared dtype helpers):
    its elite.json, whose best is the fault-free kernel. `faults`: the FAULT values searched (default: the space's)."""
    import re
    import shutil

    shutil.copytree(DATA / family, d / family)
    shutil.copy(DATA / "cpu_attention_dtypes.inc.j2", d / family)
    if faults:
        space = d / family / f"{family}_space.toml"
        text, n = re.subn(r"(?m)^FAULT = \{ values = \[[^\]]*\]", "FAULT = { values = " + json.dumps(list(faults)),
                          space.read_text())
        assert n == 1
        space.write_text(text)
    rc = main(["search", "--space", str(d / family / f"{family}_space.toml"), "--strategy", "grid", "--db",
               f"sqlite:///{d / 's.db'}", "--out", str(d / "elite.json"), "--population", str(population),
               "--elite", "1", "--cache-dir", str(build_cache), "--quiet"])
    assert rc == 0
    assert json.loads((d / "elite.json").read_text())["elites"][0]["params"]["FAULT"] == "none"
    return d / "elite.json"


@pytest.fixture(scope="module")
def sdpa_elite(tmp_path_factory, build_cache_session) -> Path:
    return _cpu_family_elite(tmp_path_factory.mktemp("sdpa_search"), "sdpa_cpu", build_cache_session, 3)


@pytest.fixture(scope="module")
def build_cache_session(tmp_path_factory) -> Path:
    import os

    given = os.environ.get("EVOENGINEER_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("evocache")


@pytest.fixture(autouse=True)
def _ops_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("EVOENGINEER_EXPORT_CACHE", str(tmp_path_factory.getbasetemp() / "ops-cache"))


def _args(inputs):
    return [inputs[k] for k in INPUT_KEYS]


HELD_OUT = [MSDAShape("held_a", N=3, Lq=11, M=2, D=32, P=4, levels=((9, 5), (5, 3), (3, 2), (2, 1))),
            MSDAShape("held_b", N=1, Lq=130, M=8, D=32, P=4, levels=((16, 10), (8, 5), (4, 3), (2, 2)))]


@pytest.fixture(scope="module")
def msda_package(msda_elite, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "pkg"
    assert main(["export", str(msda_elite), "--out", str(out)]) == 0
    (pkg,) = [p for p in out.iterdir() if p.is_dir()]
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(pkg.name), out
    finally:
        sys.path.remove(str(out))


@pytest.mark.slow
def test_exported_msda_matches_the_reference_on_held_out_shapes(msda_package):
    mod, out = msda_package
    assert {p.name for p in out.iterdir()} == {"pyproject.toml", "README.md", mod.__name__}
    kernel = json.loads((out / mod.__name__ / "kernel.json").read_text())
    assert kernel["build"]["signature"] == {"L": 4, "P": 4, "D": 32, "VALUE_DTYPE": "float32"}
    for shape in HELD_OUT:
        inputs = make_inputs(shape, 7)
        got = mod.ms_deform_attn(*_args(inputs), im2col_step=64)
        assert got.shape == (shape.N, shape.Lq, shape.M * shape.D) and got.dtype == torch.float32
        assert (got.double() - reference(inputs, dtype=torch.float64)).abs().max() < 1e-4


def test_an_installed_package_and_load_share_one_build(msda_package, tmp_path):
    """The same kernel from another folder (a package installed elsewhere, or evoengineer.load's copy) finds the
    build the first one made: nothing is compiled again (issue 32: each rebuilt the other's binding, 27 s)."""
    import os
    import shutil

    mod, out = msda_package
    other = tmp_path / "site" / mod.__name__
    shutil.copytree(out / mod.__name__, other)
    kernel = json.loads((other / "kernel.json").read_text())
    build = Path(mod.kernel.module.__file__).resolve().parent  # where the package built (at import)
    cache = build.parent

    def objects():  # this build's objects, and every build folder of the module (none may be added)
        return ({str(p): p.stat().st_mtime_ns for p in build.glob("*.o")},
                sorted(d.name for d in cache.glob(f"{kernel['module']}-*")))

    before = objects()
    assert before[0]  # the package's own build, made by the fixture
    code = ("import json, pathlib; from evoengineer.ops.runtime import build_module; "
            f"f = pathlib.Path({str(other)!r}); build_module(f, json.loads((f / 'kernel.json').read_text()))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "EVOENGINEER_EXPORT_CACHE": str(cache)}
    # a build killed mid-way leaves torch's `lock` file in the folder (torch would wait for it forever): removed
    # (the folder of this build: the shared cache may hold older builds of the module, from other sources)
    stale = Path(mod.kernel.module.__file__).resolve().parent / "lock"
    stale.touch()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert objects() == before and not stale.exists()


def test_exported_msda_under_torch_compile_fullgraph(msda_package):
    mod, _ = msda_package
    inputs = make_inputs(HELD_OUT[0], 3)
    eager = mod.ms_deform_attn(*_args(inputs))
    compiled = torch.compile(mod.ms_deform_attn, fullgraph=True)
    assert torch.equal(compiled(*_args(inputs)), eager)
    # the op itself, as a graph sees it: a fake implementation with the right shape
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = mod.kernel.op(*_args(inputs))
    assert fake.shape == eager.shape


# the misuse that was not refused before, plus more; through the exported function
MISUSE = {
    "P=8": dict(P=8), "P=2": dict(P=2), "D=64": dict(D=64), "D=16": dict(D=16), "M=1,D=4": dict(M=1, D=4),
    "L=3": dict(levels=((5, 6), (3, 3), (2, 2))),
}


@pytest.mark.parametrize("case", list(MISUSE), ids=list(MISUSE))
def test_exported_msda_refuses_inputs_outside_its_signature(msda_package, case):
    mod, _ = msda_package
    base = dict(name="x", N=2, Lq=7, M=3, D=32, P=4, levels=((5, 6), (3, 3), (2, 2), (1, 1)))
    inputs = make_inputs(MSDAShape(**{**base, **MISUSE[case]}), 1)
    with pytest.raises(ValueError, match="but this kernel was compiled for"):
        mod.ms_deform_attn(*_args(inputs))


def test_exported_msda_refuses_mismatched_tensors(msda_package):
    mod, _ = msda_package
    inputs = make_inputs(HELD_OUT[0], 1)
    a = _args(inputs)
    with pytest.raises(TypeError, match="value: dtype float16, but this kernel was compiled for float32"):
        mod.ms_deform_attn(a[0].half(), *a[1:])
    with pytest.raises(ValueError, match=r"attention_weights: shape \(3, 10, 2, 4, 4\), expected \(3, 11, 2, 4, 4\)"):
        mod.ms_deform_attn(*a[:4], a[4][:, :10])
    with pytest.raises(TypeError, match="value_spatial_shapes: dtype int32, expected int64"):
        mod.ms_deform_attn(a[0], a[1].int(), *a[2:])
    with pytest.raises(ValueError, match="level_start_index\\[1\\] = 44, expected 45"):  # values: the binding's check
        mod.ms_deform_attn(a[0], a[1], torch.tensor([0, 44, 60, 66]), *a[3:])
    with pytest.raises(ValueError, match="sampling_locations: expected 6 dimensions"):
        mod.ms_deform_attn(a[0], a[1], a[2], a[3][..., 0], a[4])


def test_exported_msda_names_the_argument_at_fault_and_copies_strided_inputs(msda_package):
    """What the README promises of the op's inputs (issue 32): rows of value that spatial_shapes does not describe
    name both; a wrong spatial_shapes is not blamed on level_start_index; non-contiguous tensors are computed on
    contiguous copies, with the same result."""
    mod, _ = msda_package
    a = _args(make_inputs(HELD_OUT[0], 1))
    with pytest.raises(ValueError, match=r"^value: S = 67 positions, but levels 0\.\.3 of spatial_shapes already"):
        mod.ms_deform_attn(a[0][:, :-1].contiguous(), *a[1:])
    with pytest.raises(ValueError, match=r"^value: S = 69 positions, but the levels of spatial_shapes hold 68"):
        mod.ms_deform_attn(torch.cat([a[0], a[0][:, :1]], 1), *a[1:])
    wrong = a[1].clone()
    wrong[0, 0] -= 1  # one row fewer in level 0: the levels hold 63
    with pytest.raises(ValueError, match=r"^value: S = 68 positions, but the levels of spatial_shapes hold 63"):
        mod.ms_deform_attn(a[0], wrong, *a[2:])
    want = mod.ms_deform_attn(*a)
    strided = [t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() > 1 else t for t in a]
    assert not any(t.is_contiguous() for t in strided[:1] + strided[3:])
    assert torch.equal(mod.ms_deform_attn(*strided), want)


def test_fallback_to_the_reference_warns_once(msda_package):
    mod, _ = msda_package
    fn = mod.with_fallback()
    inputs = make_inputs(MSDAShape("x", N=1, Lq=5, M=2, D=16, P=2, levels=((4, 4), (2, 2), (1, 1), (1, 1))), 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = fn(*_args(inputs))
        b = fn(*_args(inputs))
    assert len(w) == 1 and "fallback='reference'" in str(w[0].message) and "D = 16" in str(w[0].message)
    assert torch.allclose(a, reference(inputs)) and torch.equal(a, b)


def test_gradients_through_the_reference_backward(msda_package):
    mod, _ = msda_package
    shape = MSDAShape("g", N=1, Lq=4, M=2, D=32, P=4, levels=((3, 4), (2, 2), (1, 2), (1, 1)))
    inputs = make_inputs(shape, 4)
    a = _args(inputs)
    # the kernel's backward (float32) against autograd through the float64 reference
    v, loc, attn = (t.clone().requires_grad_() for t in (a[0], a[3], a[4]))
    mod.ms_deform_attn(v, a[1], a[2], loc, attn).pow(2).sum().backward()
    v64, loc64, attn64 = (t.double().requires_grad_() for t in (a[0], a[3], a[4]))
    out64 = reference({"value": v64, "spatial_shapes": a[1], "level_start_index": a[2], "sampling_locations": loc64,
                       "attention_weights": attn64}, dtype=torch.float64)
    out64.pow(2).sum().backward()
    for g32, g64 in ((v.grad, v64.grad), (loc.grad, loc64.grad), (attn.grad, attn64.grad)):
        assert torch.allclose(g32.double(), g64, atol=1e-3, rtol=1e-3)
    # the backward formula itself in float64 passes gradcheck (through the fallback path, which uses the op's
    # registered autograd only for inputs the kernel takes: float64 goes to the reference; so check the op's
    # backward against gradcheck's numerical Jacobian directly)
    from evoengineer.families.msda.reference import msda_reference, msda_reference_backward

    def f(v, loc, attn):
        return msda_reference(v, a[1], a[2], loc, attn, dtype=torch.float64)

    x = tuple(t.double().requires_grad_() for t in (a[0], a[3], a[4]))
    assert torch.autograd.gradcheck(f, x, eps=1e-6, atol=1e-5)
    grad = torch.randn_like(f(*x))
    explicit = msda_reference_backward(grad, *[t.detach() for t in (x[0],)], a[1], a[2], x[1].detach(),
                                       x[2].detach(), dtype=torch.float64)
    auto = torch.autograd.grad(f(*x), x, grad)
    for e, g in zip(explicit, auto):
        assert torch.allclose(e, g, atol=1e-10)
    fb = mod.with_fallback()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.autograd.gradcheck(lambda v, loc, attn: fb(v, a[1], a[2], loc, attn), x, eps=1e-6, atol=1e-5)


def test_load_returns_the_same_callable(msda_elite, msda_package):
    import evoengineer

    mod, _ = msda_package
    fn = evoengineer.load(msda_elite, rank=1)
    inputs = make_inputs(HELD_OUT[1], 9)
    assert torch.equal(fn(*_args(inputs)), mod.ms_deform_attn(*_args(inputs)))
    assert fn.kernel.signature == {"L": 4, "P": 4, "D": 32, "VALUE_DTYPE": "float32"}
    with pytest.raises(ValueError, match="P = 8 points"):
        fn(*_args(make_inputs(MSDAShape("x", N=1, Lq=3, M=2, D=32, P=8, levels=((4, 4), (2, 2), (1, 1), (1, 1))),
                              1)))


def test_load_refuses_build_flags_a_shell_would_run(msda_elite, tmp_path):
    """An elite.json is a file from somewhere too: its build flags pass the space files' whitelist before ninja (and
    so /bin/sh) sees them; the exported package carries the same check."""
    import evoengineer

    doc = json.loads(msda_elite.read_text())
    marker = tmp_path / "ran"
    doc["elites"][0]["build"]["flags"].append(f"-DX=1;touch {marker};true")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"build\.flags\[\d+\]: flag .* refused"):
        evoengineer.load(bad, rank=1)
    assert not marker.exists()
    from evoengineer.export import OPS_DIR

    assert (OPS_DIR.parent / "space" / "flags.py").exists()


def test_export_refuses_what_it_cannot_build_faithfully(msda_elite, tmp_path, capsys):
    doc = json.loads(msda_elite.read_text())
    edited = json.loads(json.dumps(doc))
    edited["elites"][0]["source"] += "\n// edited after the search\n"
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    assert main(["export", str(tmp_path / "edited.json"), "--out", str(tmp_path / "a")]) == 2
    assert "does not match its source_sha256" in capsys.readouterr().err and not (tmp_path / "a").exists()
    old = json.loads(json.dumps(doc))
    for e in old["elites"]:
        del e["build"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main(["export", str(tmp_path / "old.json"), "--out", str(tmp_path / "b")]) == 2
    assert "no build record" in capsys.readouterr().err
    # a kernel of the older MSDA entry point (no layout / workspace arguments): today's binding would call it wrongly
    from evoengineer.candidate import sha256_text

    abi = json.loads(json.dumps(doc))
    for e in abi["elites"]:
        e["source"] = e["source"].replace("evo_msda_forward_v2", "evo_msda_forward")
        e["source_sha256"] = sha256_text(e["source"])
    (tmp_path / "abi.json").write_text(json.dumps(abi))
    assert main(["export", str(tmp_path / "abi.json"), "--out", str(tmp_path / "b")]) == 2
    assert "does not define evo_msda_forward_v2()" in capsys.readouterr().err
    assert main(["export", str(msda_elite), "--rank", "9", "--out", str(tmp_path / "c")]) == 2
    assert "no elite of rank 9" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    assert main(["export", str(msda_elite), "--out", str(tmp_path / "d")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err and (tmp_path / "d" / "keep.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-written folder left


# ---- SDPA ---------------------------------------------------------------------------------------------------------------
def _qkv(B=2, H=3, Sq=9, Sk=13, D=64, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, s, D, generator=g).to(dtype) for s in (Sq, Sk, Sk)]


def _export_and_import(elite: Path, out: Path):
    """`evoengineer export` of rank 1 into `out`, then the package imported."""
    assert main(["export", str(elite), "--out", str(out)]) == 0
    (pkg,) = [p for p in out.iterdir() if p.is_dir()]
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module(pkg.name)
    finally:
        sys.path.remove(str(out))


@pytest.mark.slow
def test_exported_sdpa(sdpa_elite, tmp_path):
    mod = _export_and_import(sdpa_elite, tmp_path / "pkg")
    sdpa = mod.scaled_dot_product_attention
    for causal in (False, True):
        q, k, v = _qkv()
        got = sdpa(q, k, v, is_causal=causal)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert (got.double() - want).abs().max() < 4e-3
    compiled = torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True), fullgraph=True)
    assert torch.equal(compiled(q, k, v), sdpa(q, k, v, is_causal=True))
    # what an fp16 head-dim-64 kernel used to accept
    with pytest.raises(ValueError, match="query: head dim 128 \\(size 3\\), but this kernel was compiled for head dim 64"):
        sdpa(*_qkv(D=128))
    with pytest.raises(TypeError, match="query: dtype bfloat16, but this kernel was compiled for float16"):
        sdpa(*_qkv(dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="attn_mask: this kernel takes no mask"):
        sdpa(q, k, v, attn_mask=torch.ones(9, 13, dtype=torch.bool))
    # gradients through the reference backward
    q, k, v = (t.float().requires_grad_() for t in _qkv(B=1, H=2, Sq=5, Sk=6))
    qh, kh, vh = (t.detach().half().requires_grad_() for t in (q, k, v))
    sdpa(qh, kh, vh, is_causal=True).float().pow(2).sum().backward()
    F.scaled_dot_product_attention(q, k, v, is_causal=True).pow(2).sum().backward()
    for a, b in ((qh.grad, q.grad), (kh.grad, k.grad), (vh.grad, v.grad)):
        assert torch.allclose(a.float(), b, atol=2e-2, rtol=2e-2)


@pytest.fixture(scope="module")
def decode_elite(tmp_path_factory, build_cache_session) -> Path:
    # without ignore_block_table: it misreads paged caches only, so in this contiguous space it is the fault-free
    # kernel under another name and the elite between the two would be decided by timing noise
    return _cpu_family_elite(tmp_path_factory.mktemp("decode_search"), "decode_cpu", build_cache_session, 4,
                             faults=("none", "read_past_length"))


def _decode_want(q, k, v, lens):
    """float64 attention, sequence b over its first lens[b] keys, K/V heads shared by groups of query heads."""
    G = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, n in enumerate(lens.tolist()):
        kb = k[b, :, :n].double().repeat_interleave(G, dim=0)
        vb = v[b, :, :n].double().repeat_interleave(G, dim=0)
        out[b] = F.scaled_dot_product_attention(q[b].double(), kb, vb)
    return out


@pytest.mark.slow
def test_exported_decode(decode_elite, tmp_path):
    from evoengineer.families.decode.task import DecodeShape, make_inputs

    mod = _export_and_import(decode_elite, tmp_path / "pkg")
    decode = mod.decode_attention
    x = make_inputs(DecodeShape("x", B=3, Hq=8, Hkv=2, Sq=3, Sk=150, seq_lens=(150, 1, 77)), 5, head_dim=64)
    q, k, v, lens = x["q"], x["k"], x["v"], x["seq_lens"]  # NaN in the cache past each length
    got = decode(q, k, v, lens)
    assert torch.isfinite(got).all() and (got.double() - _decode_want(q, k, v, lens)).abs().max() < 4e-3
    assert torch.equal(decode(q, k, v, lens.long()), got)  # int64 lengths are taken as well
    compiled = torch.compile(lambda q, k, v, lens: decode(q, k, v, lens), fullgraph=True)
    assert torch.equal(compiled(q, k, v, lens), got)
    with pytest.raises(ValueError, match="query: head dim 32 \\(size 3\\), but this kernel was compiled for head dim 64"):
        decode(q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous(), lens)
    with pytest.raises(TypeError, match="key_cache: dtype bfloat16, but this kernel was compiled for float16"):
        decode(q, k.bfloat16(), v.bfloat16(), lens)
    with pytest.raises(ValueError, match="key_cache: shape \\(3, 3, 150, 64\\), expected \\[3, Hkv, Sk >= 1, 64\\]"):
        decode(q, k[:, :1].repeat(1, 3, 1, 1), v[:, :1].repeat(1, 3, 1, 1), lens)
    with pytest.raises(ValueError, match="seq_lens: shape \\(2,\\), expected \\[B\\] = \\[3\\]"):
        decode(q, k, v, lens[:2])
    with pytest.raises(TypeError, match="seq_lens: dtype float32"):
        decode(q, k, v, lens.float())
    with pytest.raises(ValueError, match="query: 17 query rows"):
        decode(q.repeat(1, 1, 6, 1)[:, :, :17].contiguous(), k, v, lens)
    with pytest.raises(ValueError, match="k_scale/v_scale: only for a kernel compiled for float8"):
        decode(q, k, v, lens, k_scale=torch.ones(2))
    # the reference takes what the kernel refuses (warned once)
    with pytest.warns(UserWarning, match="computing with the PyTorch reference"):
        ref = mod.with_fallback()(q.float(), k.float(), v.float(), lens)
    assert (ref.double() - _decode_want(q, k, v, lens)).abs().max() < 1e-4
    # gradients through the reference backward (keys past each length get none)
    kc, vc = k.nan_to_num(0.0), v.nan_to_num(0.0)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, kc, vc))
    qh, kh, vh = (t.detach().half().requires_grad_() for t in (qf, kf, vf))
    decode(qh, kh, vh, lens).float().pow(2).sum().backward()
    want = torch.stack([F.scaled_dot_product_attention(
        qf[b:b + 1], kf[b:b + 1, :, :n].repeat_interleave(4, dim=1), vf[b:b + 1, :, :n].repeat_interleave(4, dim=1))[0]
        for b, n in enumerate(lens.tolist())])
    want.pow(2).sum().backward()
    for a, b_ in ((qh.grad, qf.grad), (kh.grad, kf.grad), (vh.grad, vf.grad)):
        assert torch.allclose(a.float(), b_, atol=2e-2, rtol=2e-2)
    assert (kh.grad[1, :, 1:] == 0).all() and (vh.grad[2, :, 77:] == 0).all()


# ---- packaging --------------------------------------------------------------------------------------------------------
def test_elite_json_follows_the_umask(msda_elite):
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(msda_elite.stat().st_mode) == 0o666 & ~mask


def test_cli_runs_in_a_folder_holding_elite_store(tmp_path):
    (tmp_path / "elite_store").mkdir()
    (tmp_path / "elite_store" / "README.md").write_text("data only")
    r = subprocess.run([sys.executable, "-m", "evoengineer", "spaces"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "cpu_msda" in r.stdout, r.stderr


@pytest.mark.slow
def test_non_editable_install_in_a_fresh_venv(tmp_path, build_cache_session):
    """`pip install .` (not -e) into a fresh virtual environment: spaces, a budget-4 search from an empty folder
    with ./elite_store/ present, export and load all work from the installed copy."""
    venv = tmp_path / "venv"
    # the venv sees this interpreter's packages (torch and the other dependencies: nothing is downloaded) and gets
    # no pip or setuptools of its own; this pip installs into it, building with the venv's interpreter
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # run from a virtualenv, "system" site-packages are the base interpreter's, not this environment's (where torch,
    # setuptools and the other dependencies are): this environment's come right after the venv's own
    inner = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(inner) / "_evo_test_outer.pth").write_text("".join(f"{p}\n" for p in ours))
    r = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
                        "--no-build-isolation", str(ROOT)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    work = tmp_path / "empty"
    (work / "elite_store").mkdir(parents=True)
    env = {**__import__("os").environ, "EVOENGINEER_CACHE": str(build_cache_session),
           "EVOENGINEER_EXPORT_CACHE": str(tmp_path / "ops")}
    env.pop("PYTHONPATH", None)

    def run(*args):
        p = subprocess.run([py, *args], capture_output=True, text=True, cwd=work, env=env)
        assert p.returncode == 0, (args, p.stdout[-1500:], p.stderr[-3000:])
        return p.stdout

    where = run("-c", "import evoengineer; print(evoengineer.__file__, evoengineer.TEMPLATES_DIR)")
    assert str(venv) in where and "data/templates" in where
    assert "sdpa_fp16_d64" in run("-m", "evoengineer", "spaces")
    run("-m", "evoengineer", "search", "--budget", "4", "--population", "4", "--quiet")
    assert (work / "elite_store" / "evoengineer.db").is_file() and (work / "elite.json").is_file()
    run("-m", "evoengineer", "export", "elite.json", "--out", "op_pkg")
    probe = ("import evoengineer, torch; from evoengineer.families.msda.task import MSDAShape, make_inputs, reference, "
             "INPUT_KEYS; f = evoengineer.load('elite.json'); "
             "i = make_inputs(MSDAShape('x', N=1, Lq=9, M=2, D=32, P=4, levels=((5, 4), (3, 2), (2, 1), (1, 1))), 0); "
             "print(float((f(*[i[k] for k in INPUT_KEYS]).double() - reference(i, dtype=torch.float64)).abs().max()))")
    assert float(run("-c", probe).strip().splitlines()[-1]) < 1e-4


# ---- per-shape elites and dispatch ----------------------------------------------------------------------------------
TWO_TIMED_SHAPES = SMALL_SHAPES[: SMALL_SHAPES.index('[[shapes]]\nname = "timed"')] + '''
[[shapes]]
name = "small"
N = 1
Lq = 8
M = 2
D = 32
P = 4
levels = [[4, 4], [2, 2], [1, 1], [1, 1]]
time = true

[[shapes]]
name = "encoder"
N = 2
Lq = "S"
M = 8
D = 32
P = 4
levels = [[16, 20], [8, 10], [4, 5], [2, 3]]
ref = "pixels"
time = true
'''
ENCODER_S = 16 * 20 + 8 * 10 + 4 * 5 + 2 * 3


@pytest.fixture(scope="module")
def two_shape_search(tmp_path_factory, build_cache_session) -> Path:
    """A budget-5 search of the small CPU space timed on a tiny decoder-like shape and an encoder shape (Lq = S):
    its folder (s.db, elite.json)."""
    d = tmp_path_factory.mktemp("two_shapes")
    text = (space_file("cpu_msda.toml")).read_text()
    (d / "two.toml").write_text(text[: text.index("[[shapes]]")].replace("repeats = 20", "repeats = 3")
                                + TWO_TIMED_SHAPES)
    rc = main(["search", "--space", str(d / "two.toml"), "--budget", "5", "--population", "5", "--db",
               f"sqlite:///{d / 's.db'}", "--out", str(d / "elite.json"), "--cache-dir", str(build_cache_session),
               "--quiet"])
    assert rc == 0
    return d


def test_elite_json_holds_the_best_of_each_timed_shape(two_shape_search, msda_elite):
    from evoengineer.candidate import sha256_text
    from evoengineer.store import Store

    doc = json.loads((two_shape_search / "elite.json").read_text())
    store = Store(f"sqlite:///{two_shape_search / 's.db'}", create=False)
    recs = [r for r in store.candidates(doc["run_id"]) if r.status == "ok"]
    assert len(recs) >= 2
    entries = doc["shape_elites"]
    assert [e["shape"] for e in entries] == ["small", "encoder"]
    elite_rank = {e["hash"]: e["rank"] for e in doc["elites"]}
    for e in entries:
        name = e["shape"]
        best = min(recs, key=lambda r: (r.metrics["shapes"][name]["p50_us"], r.hash))
        assert (e["hash"], e["p50_us"], e["objective_us"]) == \
            (best.hash, best.metrics["shapes"][name]["p50_us"], best.metrics["time_us"])
        assert e["p50_us"] < e["objective_us"] and e["status"] == "ok" and e["params"] == best.params
        assert e["rank"] == elite_rank.get(e["hash"])
        assert e["source"] == store.find_candidate(doc["run_id"], e["hash"]).source != ""
        assert e["source_sha256"] == sha256_text(e["source"]) and e["build"] == doc["elites"][0]["build"]
    assert entries[1]["shape_spec"] == {"N": 2, "Lq": ENCODER_S, "M": 8, "D": 32, "P": 4, "ref": "pixels",
                                        "levels": [[16, 20], [8, 10], [4, 5], [2, 3]]}
    assert entries[0]["shape_spec"]["Lq"] == 8 and entries[0]["shape_spec"]["ref"] == "random"
    # one timed shape: no key, as before
    assert "shape_elites" not in json.loads(msda_elite.read_text())


def test_elites_and_inspect_print_the_shape_section(two_shape_search, capsys, monkeypatch):
    doc = json.loads((two_shape_search / "elite.json").read_text())
    monkeypatch.chdir(two_shape_search)
    for argv in (["elites", "--db", "sqlite:///s.db"], ["inspect", "elite.json"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        section = out[out.index("per shape"):].splitlines()
        assert len(section) == 2 + len(doc["shape_elites"]) and section[1].split()[0] == "shape"
        for e, line in zip(doc["shape_elites"], section[2:]):
            assert line.split()[:3] == [e["shape"], f"{e['p50_us']:.3f}", e["hash"][:12]]
            assert line.endswith(f"rank {e['rank']}" if e["rank"] else "-")
    assert main(["elites", "--db", "sqlite:///s.db", "--json"]) == 0
    assert "per shape" not in capsys.readouterr().out


def _distinct_kernels(doc: dict) -> dict:
    """The document with distinct kernels on its two shapes: when one kernel won both, the encoder entry takes the
    kernel of another elite (a real, built candidate; dispatch goes by shape_spec only)."""
    doc = json.loads(json.dumps(doc))
    small, enc = doc["shape_elites"]
    if enc["hash"] == small["hash"]:
        other = next(e for e in doc["elites"] if e["hash"] != small["hash"])
        enc.update({k: other[k] for k in ("hash", "params", "source", "source_sha256", "rank")})
    return doc


def _near(shape_name: str, seed: int):
    """Inputs near one of the timed shapes (not equal to it)."""
    if shape_name == "small":
        shape = MSDAShape("near_small", N=1, Lq=10, M=2, D=32, P=4, levels=((5, 4), (2, 3), (1, 1), (1, 1)))
    else:
        shape = MSDAShape("near_enc", N=2, Lq=12 * 16 + 6 * 8 + 3 * 4 + 2 * 2, M=8, D=32, P=4,
                          levels=((12, 16), (6, 8), (3, 4), (2, 2)), ref="pixels")
    return make_inputs(shape, seed)


def test_export_per_shape_routes_each_call_to_its_kernel(two_shape_search, tmp_path, capsys):
    doc = _distinct_kernels(json.loads((two_shape_search / "elite.json").read_text()))
    src = tmp_path / "elite.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "pkg"
    assert main(["export", str(src), "--out", str(out), "--per-shape"]) == 0
    assert "from evo_" in capsys.readouterr().out
    (pkg,) = [p for p in out.iterdir() if p.is_dir()]
    sys.path.insert(0, str(out))
    try:
        mod = importlib.import_module(pkg.name)
    finally:
        sys.path.remove(str(out))
    want = {e["shape"]: e["hash"] for e in doc["shape_elites"]}
    table = json.loads((pkg / "dispatch.json").read_text())
    assert table["task"] == "msda" and [(r["shape"], r["hash"]) for r in table["kernels"]] == list(want.items())
    assert sorted(p.name for p in pkg.glob("kernel-*")) == sorted(f"kernel-{h[:16]}" for h in want.values())
    for r in table["kernels"]:
        kernel = json.loads((pkg / r["folder"] / "kernel.json").read_text())
        assert kernel["hash"] == r["hash"] and (pkg / r["folder"] / kernel["source_file"]).read_text() == \
            next(e["source"] for e in doc["shape_elites"] if e["hash"] == r["hash"])
    dispatch = mod.kernel
    assert [r["shape"] for r in dispatch.table] == ["small", "encoder"] and dispatch.ops == {}
    for i, name in enumerate(["small", "encoder"]):
        inputs = _near(name, i)
        assert dispatch.choose(*_args(inputs))["hash"] == want[name]
        got = mod.ms_deform_attn(*_args(inputs))
        assert (got.double() - reference(inputs, dtype=torch.float64)).abs().max() < 1e-4
        assert dispatch.calls == {h: int(h in list(want.values())[: i + 1]) for h in want.values()}
        assert set(dispatch.ops) == set(list(want.values())[: i + 1])  # built when first needed, not before
    # under torch.compile(fullgraph=True), both shapes (a recompile with dynamic sizes): the same kernels
    compiled = torch.compile(mod.ms_deform_attn, fullgraph=True)
    for i, name in enumerate(["small", "encoder"]):
        inputs = _near(name, 20 + i)
        before = dict(dispatch.calls)
        assert torch.equal(compiled(*_args(inputs)), mod.ms_deform_attn(*_args(inputs)))
        assert dispatch.calls[want[name]] == before[want[name]] + 2
    # a decoder-like call as large as the encoder shape: Lq != S, so the (only) shape of that kind
    big = make_inputs(MSDAShape("dec", N=2, Lq=300, M=8, D=32, P=4, levels=((16, 20), (8, 10), (4, 5), (2, 3))), 5)
    assert dispatch.choose(*_args(big))["shape"] == "small"
    # misfits: still each kernel's own checks (raise), or the reference with the fallback
    with pytest.raises(ValueError, match="P = 8 points"):
        mod.ms_deform_attn(*_args(make_inputs(MSDAShape("x", N=1, Lq=3, M=2, D=32, P=8,
                                                        levels=((4, 4), (2, 2), (1, 1), (1, 1))), 1)))
    odd = make_inputs(MSDAShape("x", N=1, Lq=5, M=2, D=16, P=2, levels=((4, 4), (2, 2), (1, 1), (1, 1))), 2)
    with pytest.warns(UserWarning, match="fallback='reference'"):
        assert torch.allclose(mod.with_fallback()(*_args(odd)), reference(odd))


def test_load_per_shape(two_shape_search):
    import evoengineer

    doc = json.loads((two_shape_search / "elite.json").read_text())
    fn = evoengineer.load(two_shape_search / "elite.json", per_shape=True)
    assert fn.__name__ == "ms_deform_attn"
    assert [(r["shape"], r["hash"], r["p50_us"]) for r in fn.kernel.table] == \
        [(e["shape"], e["hash"], e["p50_us"]) for e in doc["shape_elites"]]
    for i, e in enumerate(doc["shape_elites"]):
        inputs = _near(e["shape"], 10 + i)
        assert fn.kernel.choose(*_args(inputs))["shape"] == e["shape"]
        got = fn(*_args(inputs))
        assert (got.double() - reference(inputs, dtype=torch.float64)).abs().max() < 1e-4
    assert sum(fn.kernel.calls.values()) == 2 and set(fn.kernel.ops) == {e["hash"] for e in doc["shape_elites"]}


def test_export_per_shape_refused_without_shape_elites(msda_elite, tmp_path, capsys):
    import evoengineer
    from evoengineer.errors import UserError

    assert main(["export", str(msda_elite), "--out", str(tmp_path / "p"), "--per-shape"]) == 2
    err = capsys.readouterr().err
    assert "no per-shape elites (shape_elites)" in err and "fewer than 2 shapes" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p").exists() and not list(tmp_path.iterdir())
    with pytest.raises(UserError, match="no per-shape elites"):
        evoengineer.load(msda_elite, per_shape=True)
    assert main(["export", str(msda_elite), "--out", str(tmp_path / "p"), "--per-shape", "--rank", "2"]) == 2
    assert "one or the other" in capsys.readouterr().err
