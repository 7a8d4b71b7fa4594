"""Tests for the SDPA task definition (CPU): shapes, inputs, the float64 reference, FP8 quantization, the extra
FP8-vs-fp16 check, and the shipped sdpa spaces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from evoengineer import space_file, shipped_space_files
from evoengineer.errors import UserError
from evoengineer.space import load_space
from evoengineer.space.spec import SearchSpace
from evoengineer.families.sdpa import task as sdpa
from evoengineer.families import get_task

# the mma.sync family's spaces (the Hopper-native template has tests/gpu/test_gpu_sdpa_hopper.py)
SPACES = sorted(p for p in shipped_space_files("sdpa_*.toml")
                if 'template = "cuda/sdpa.cu.j2"' in p.read_text())
FP8 = torch.float8_e4m3fn


def shape(**kw) -> sdpa.SDPAShape:
    return sdpa.SDPAShape.from_dict({"name": "t", "B": 1, "H": 2, **kw})


# ---- shapes -----------------------------------------------------------------------------------------------------
def test_shape_parsing():
    s = shape(S=77, causal=True)
    assert (s.B, s.H, s.Sq, s.Sk, s.causal, s.fp16_max_abs_err) == (1, 2, 77, 77, True, None)
    s = shape(Sq=45, Sk=77, fp16_max_abs_err=0.06)
    assert (s.Sq, s.Sk, s.causal, s.fp16_max_abs_err) == (45, 77, False, 0.06)
    assert shape(Sq=9).Sk == 9


@pytest.mark.parametrize("bad, match", [
    ({"name": "t", "B": 1, "S": 4}, "missing key"),
    ({"name": "t", "B": 1, "H": 2}, "needs S"),
    ({"name": "t", "B": 1, "H": 2, "S": 4, "Sq": 4}, "not both"),
    ({"name": "t", "B": 1, "H": 2, "S": 4, "D": 64}, "unknown key"),
    ({"name": "t", "B": 0, "H": 2, "S": 4}, "'B' must be a positive integer"),
    ({"name": "t", "B": 1, "H": 2, "S": 4.0}, "'S' must be a positive integer"),
    ({"name": "t", "B": 1, "H": True, "S": 4}, "'H' must be a positive integer"),
    ({"name": "t", "B": 1, "H": 2, "Sq": 4, "Sk": -1}, "'Sk' must be a positive integer"),
    ({"name": "t", "B": 1, "H": 2, "S": 4, "causal": 1}, "'causal' must be true or false"),
    ({"name": "t", "B": 1, "H": 2, "S": 4, "fp16_max_abs_err": 0}, "positive number"),
    ({"name": "", "B": 1, "H": 2, "S": 4}, "non-empty string"),
])
def test_bad_shapes_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        sdpa.SDPAShape.from_dict(bad)


def _space_text(sig: str, shapes: str) -> str:
    text = (space_file("sdpa_fp16_d64.toml")).read_text()
    head = text[:text.index("[signature]")]
    tail = text[text.index("[parameters]"):text.index("[[shapes]]")]
    return f"{head}[signature]\n{sig}\n\n{tail}{shapes}"


MISSION = '[[shapes]]\nname = "m"\nB = 1\nH = 1\nS = 8\ntime = true\n'


@pytest.mark.parametrize("sig, shapes, match", [
    ('HEAD_DIM = 96\nQ_DTYPE = "float16"\nKV_DTYPE = "float16"', MISSION, "HEAD_DIM"),
    ('HEAD_DIM = 64\nQ_DTYPE = "float32"\nKV_DTYPE = "float32"', MISSION, "Q_DTYPE"),
    ('HEAD_DIM = 64\nQ_DTYPE = "bfloat16"\nKV_DTYPE = "float8_e4m3"', MISSION, "KV_DTYPE"),
    ('HEAD_DIM = 64\nQ_DTYPE = "float16"\nKV_DTYPE = "bfloat16"', MISSION, "KV_DTYPE"),
    ('HEAD_DIM = 64\nQ_DTYPE = "float16"\nKV_DTYPE = "float16"', MISSION + "fp16_max_abs_err = 0.06\n", "FP8 KV only"),
    ('HEAD_DIM = 64\nQ_DTYPE = "float16"\nKV_DTYPE = "float16"', MISSION + "Sk = 3\n", "not both"),
])
def test_bad_signature_or_shape_is_a_user_error(sig, shapes, match, tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(_space_text(sig, shapes))
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "sdpa.cu.j2").write_text("// stub\n")
    with pytest.raises(UserError, match=match):
        get_task(SearchSpace.from_text(path.read_text(), path))


# ---- inputs and reference ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("q_dtype, kv_dtype", [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                               (torch.float16, FP8)])
def test_inputs_deterministic_per_seed_and_fresh_across_seeds(q_dtype, kv_dtype):
    s = shape(Sq=33, Sk=21, causal=True)
    a, b, c = (sdpa.make_inputs(s, seed, head_dim=64, q_dtype=q_dtype, kv_dtype=kv_dtype) for seed in (7, 7, 8))
    assert set(a) == set(b) and set(sdpa.INPUT_KEYS) <= set(a) and bool(a["causal"])
    for key in a:
        assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key
    for key in ("q", "k", "v"):
        assert not torch.equal(a[key].view(torch.uint8), c[key].view(torch.uint8)), key
    assert a["q"].shape == (1, 2, 33, 64) and a["q"].dtype == q_dtype
    assert a["k"].shape == a["v"].shape == (1, 2, 21, 64) and a["k"].dtype == a["v"].dtype == kv_dtype
    assert all(t.is_contiguous() for t in a.values())
    assert a["k_scale"].shape == a["v_scale"].shape == (2,) and a["k_scale"].dtype == torch.float32
    if kv_dtype != FP8:
        assert torch.equal(a["k_scale"], torch.ones(2)) and torch.equal(a["v_scale"], torch.ones(2))
        assert "k_orig" not in a
    big = sdpa.make_inputs(shape(S=512), 0, head_dim=64, q_dtype=q_dtype)
    for key in ("q", "k", "v"):
        x = big[key].float()
        assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02


def test_fp8_quantization_round_trip_and_per_head_scales():
    inputs = sdpa.make_inputs(shape(B=2, H=3, S=200), 3, head_dim=64, kv_dtype=FP8)
    for name in ("k", "v"):
        orig, scale = inputs[f"{name}_orig"], inputs[f"{name}_scale"]
        assert orig.dtype == torch.float16 and inputs[name].dtype == FP8
        amax = orig.float().abs().amax(dim=(0, 2, 3))
        assert torch.allclose(scale, amax / sdpa.FP8_MAX) and len(set(scale.tolist())) == 3
        stored = inputs[name].float()
        assert torch.allclose(stored.abs().amax(dim=(0, 2, 3)), torch.full((3,), sdpa.FP8_MAX))  # amax -> 448
        back = sdpa.dequantized(inputs, name)
        err = (back - orig.double()).abs()
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values, absolute <= 2^-10 * scale below
        assert (err <= orig.double().abs() / 16 + 2.0 ** -10 * scale.double().view(1, -1, 1, 1)).all()
        assert float((back - orig.double()).pow(2).mean().sqrt()) < 0.03


@pytest.mark.parametrize("q_dtype, kv_dtype", [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                               (torch.float16, FP8)])
@pytest.mark.parametrize("sq, sk", [(77, 77), (45, 77), (77, 50)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_matches_torch_sdpa(q_dtype, kv_dtype, sq, sk, causal):
    inputs = sdpa.make_inputs(shape(B=2, Sq=sq, Sk=sk, causal=causal), 5, head_dim=64, q_dtype=q_dtype,
                              kv_dtype=kv_dtype)
    ref = sdpa.reference(inputs)
    assert ref.dtype == torch.float64 and ref.shape == (2, 2, sq, 64)
    want = F.scaled_dot_product_attention(inputs["q"].double(), sdpa.dequantized(inputs, "k"),
                                          sdpa.dequantized(inputs, "v"), is_causal=causal)
    assert float((ref - want).abs().max()) < 1e-12
    if causal:  # top-left aligned: query 0 sees key 0 only
        assert torch.allclose(ref[:, :, 0], sdpa.dequantized(inputs, "v")[:, :, 0])
    ref32 = sdpa.reference(inputs, dtype=torch.float32)
    assert ref32.dtype == torch.float32 and float((ref32.double() - ref).abs().max()) < 1e-5


def test_reference_in_chunks_matches_one_piece(monkeypatch):
    inputs = sdpa.make_inputs(shape(B=3, S=40, causal=True), 1, head_dim=64)
    whole = sdpa.reference(inputs)
    monkeypatch.setattr(sdpa, "SCORE_CHUNK", 2 * 40 * 40)  # 6 (b, h) pairs in 3 chunks
    assert torch.equal(sdpa.reference(inputs), whole)


def test_flops_and_bytes():
    assert sdpa.causal_pairs(4, 4) == 10 and sdpa.causal_pairs(2, 5) == 3 and sdpa.causal_pairs(5, 2) == 9
    full = shape(B=2, H=8, S=512)
    assert sdpa.flops(full, 64) == 4 * 2 * 8 * 512 * 512 * 64
    causal = shape(B=2, H=8, S=512, causal=True)
    assert sdpa.flops(causal, 64) == 4 * 2 * 8 * (512 * 513 // 2) * 64
    assert sdpa.min_bytes(full, 64, 2, 2) == 4 * 2 * 8 * 512 * 64 * 2
    assert sdpa.min_bytes(full, 64, 2, 1) == 2 * 8 * 512 * 64 * (2 + 1 + 1 + 2)


# ---- the task ----------------------------------------------------------------------------------------------------
def _cpu_task(space_name: str):
    task = get_task(load_space(space_file(f"{space_name}.toml")))
    task.device = "cpu"
    return task


def test_task_outputs_and_baseline_on_cpu():
    task = _cpu_task("sdpa_fp16_d64")
    assert task.entry == "evo_sdpa_forward" and task.tolerance() == (4e-3, 4e-3)
    s = next(e.shape for e in task.entries if e.name == "s77_causal")
    inputs = task.make_inputs(s, 1)
    out = task.new_output(inputs)
    assert out.dtype == torch.float16 and out.shape == inputs["q"].shape and out.isnan().all()
    base = task.baselines()["sdpa"](inputs)
    assert float((base.double() - task.reference(inputs)).abs().max()) < 4e-3

    class Module:
        def __init__(self, rc):
            self.rc, self.calls = rc, []

        def forward(self, *args):
            self.calls.append(args)
            return self.rc

    ok = Module(0)
    task.launch(ok, inputs, out)
    q, k, v, ks, vs, o, causal, scale = ok.calls[0]
    assert (q, k, v, ks, vs, o) == (inputs["q"], inputs["k"], inputs["v"], inputs["k_scale"], inputs["v_scale"], out)
    assert causal is True and scale == pytest.approx(1 / 8)
    with pytest.raises(RuntimeError, match="status 700"):
        task.launch(Module(700), inputs, out)


def test_extra_check_fp8_against_fp16_sdpa():
    task = _cpu_task("sdpa_fp8kv_d64")
    entry = next(e for e in task.entries if e.name == "mission")
    assert entry.checks >= 5 and entry.fresh and entry.shape.fp16_max_abs_err == 0.06
    small = sdpa.SDPAShape("small", B=1, H=2, Sq=256, Sk=256, fp16_max_abs_err=0.06)
    inputs = task.make_inputs(small, 0)
    ref = task.reference(inputs)
    perfect = ref.to(torch.float16)  # the exact answer on the dequantized K/V, rounded like a kernel's output
    ok, reason, m = task.extra_check(small, inputs, perfect, ref)
    assert ok, reason
    assert set(m) == {"rmse", "fp8_vs_fp16_max_abs_err", "fp8_vs_fp16_rmse", "fp8_quantization_max_abs_err"}
    assert m["rmse"] < 1e-3 and 0 < m["fp8_vs_fp16_rmse"] < m["fp8_vs_fp16_max_abs_err"] <= 0.06
    bumped = perfect.clone()
    bumped[0, 1, 100, 7] += 0.1
    ok, reason, m2 = task.extra_check(small, inputs, bumped, ref)
    assert not ok and "FP8 KV: max abs err" in reason and m2["fp8_vs_fp16_max_abs_err"] > 0.06
    # inputs whose e4m3 rounding alone exceeds the bound: the kernel passes if it adds no more than the tolerance
    tight = sdpa.SDPAShape("tight", B=1, H=2, Sq=256, Sk=256, fp16_max_abs_err=1e-4)
    ok, reason, m4 = task.extra_check(tight, inputs, perfect, ref)
    assert ok, reason
    assert m4["fp8_quantization_max_abs_err"] > 1e-4
    ok, reason, _ = task.extra_check(tight, inputs, bumped, ref)
    assert not ok and "quantization alone" in reason
    # shapes without the bound: only the RMSE against the reference
    plain = sdpa.SDPAShape("plain", B=1, H=2, Sq=256, Sk=256)
    ok, _, m3 = task.extra_check(plain, inputs, bumped, ref)
    assert ok and set(m3) == {"rmse"}
    # fp16 KV spaces never compare against fp16 SDPA
    t16 = _cpu_task("sdpa_fp16_d64")
    i16 = t16.make_inputs(plain, 0)
    ok, _, m4 = t16.extra_check(plain, i16, t16.reference(i16).to(torch.float16), t16.reference(i16))
    assert ok and set(m4) == {"rmse"}


def test_fp8_baseline_is_fp16_sdpa_on_the_original_kv():
    task = _cpu_task("sdpa_fp8kv_d64")
    inputs = task.make_inputs(sdpa.SDPAShape("x", 1, 2, 40, 40, causal=True), 2)
    got = task.baselines()["sdpa"](inputs)
    want = F.scaled_dot_product_attention(inputs["q"], inputs["k_orig"], inputs["v_orig"], is_causal=True)
    assert got.dtype == torch.float16 and torch.equal(got, want)
    assert task.min_bytes(sdpa.SDPAShape("x", 1, 2, 40, 40)) == 40 * 64 * 2 * (2 + 1 + 1 + 2)


# ---- the shipped spaces ------------------------------------------------------------------------------------------
def _smem(p: dict, sig: dict) -> int:
    d, bm, bn, st = sig["HEAD_DIM"], p["BLOCK_M"], p["BLOCK_N"], p["STAGES"]
    if sig["KV_DTYPE"] == "float8_e4m3":
        # the template converts FP8 K/V to fp16 in one slot (consumers convert) or one per stage (producers do)
        return bm * d * 2 + st * 2 * bn * d + (st if p["USE_WARP_SPECIALIZATION"] else 1) * 2 * bn * d * 2
    return bm * d * 2 + st * 2 * bn * d * 2


def test_four_sdpa_spaces_are_shipped():
    assert [p.stem for p in SPACES] == ["sdpa_bf16_d64", "sdpa_fp16_d128", "sdpa_fp16_d64", "sdpa_fp8kv_d64"]


@pytest.mark.parametrize("space_file", SPACES, ids=lambda p: p.stem)
def test_space_loads_and_every_valid_genome_fits(space_file: Path):
    space = load_space(space_file)
    task = get_task(space)
    assert space.task == "sdpa" and space.template == "cuda/sdpa.cu.j2" and space.arch == "sm_90"
    assert space.gates == {"max_registers": 120, "max_spill_bytes": 0, "max_smem_bytes": 65536}
    assert "-maxrregcount=120" in space.cuda_flags
    assert space.count_valid() > 0
    sig = space.signature
    for g in space.valid_genomes():
        p = space.genome_to_params(g)
        assert _smem(p, sig) <= 65536, p
        assert p["BLOCK_M"] % (16 * p["NUM_WARPS"]) == 0 and p["BLOCK_M"] // (16 * p["NUM_WARPS"]) <= 2
        assert p["USE_WARP_SPECIALIZATION"] or p["NUM_PRODUCER_WARPS"] == 1
        assert not p["USE_WARP_SPECIALIZATION"] or p["STAGES"] >= 2
    # ... and nothing that fits is excluded
    fits = 0
    for i in range(space.product_size):
        g, rest = [], i
        for prm in reversed(space.parameters):
            g.append(rest % len(prm.values))
            rest //= len(prm.values)
        p = space.genome_to_params(list(reversed(g)))
        fits += (_smem(p, sig) <= 65536 and p["BLOCK_M"] % (16 * p["NUM_WARPS"]) == 0
                 and p["BLOCK_M"] // (16 * p["NUM_WARPS"]) <= 2
                 and (p["USE_WARP_SPECIALIZATION"] or p["NUM_PRODUCER_WARPS"] == 1)
                 and (not p["USE_WARP_SPECIALIZATION"] or p["STAGES"] >= 2))
    assert fits == space.count_valid()
    shapes = {e.name: e for e in task.entries}
    tails = [e.shape for e in task.entries if e.checks and e.fresh and e.name != "mission"]
    assert {(s.Sq, s.B, s.causal) for s in tails} == {(77, 1, False), (77, 1, True), (500, 3, False), (500, 3, True)}
    mission = shapes["mission"]
    assert mission.time and (mission.shape.B, mission.shape.H, mission.shape.Sq, mission.shape.causal) == \
        (2, 8, 512, False)
    if sig["KV_DTYPE"] == "float8_e4m3":
        assert mission.checks >= 5 and mission.fresh and mission.shape.fp16_max_abs_err == 0.06
    settings = task.settings
    assert (settings["timeout_s"], settings["warmup"], settings["repeats"]) == (60, 20, 100)
    assert space.search["population"] == 12 and space.search["budget"] == 120  # the tuned GA default


def test_main_space_counts():
    counts = {p.stem: load_space(p).count_valid() for p in SPACES}
    assert counts["sdpa_fp16_d64"] == counts["sdpa_bf16_d64"] == 360
    assert counts["sdpa_fp16_d128"] < counts["sdpa_fp8kv_d64"] < counts["sdpa_fp16_d64"]
    assert math.prod(len(p.values) for p in load_space(SPACES[0]).parameters) == 1152


# ---- FP8 attention (e4m3 Q, K, V; the Hopper template's FP8 path) -----------------------------------------------
def _fp8_kernel_model(inputs, tile: int = 96, lazy: float | None = 8.0, swap_keys: bool = False) -> torch.Tensor:
    """What the FP8 kernel computes, on the CPU: fp32 scores of the e4m3 inputs, an online softmax over key tiles
    (a stale running maximum unless a tile's rises more than `lazy`, as RESCALE = lazy does), P rounded to e4m3, fp32
    P V and row sums, fp16 output. `swap_keys`: V's keys 14 and 15 of every whole 16 trade places (a transpose bug)."""
    q = sdpa.dequantized(inputs, "q", torch.float32)
    k = sdpa.dequantized(inputs, "k", torch.float32)
    v = sdpa.dequantized(inputs, "v", torch.float32)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if swap_keys:
        idx = torch.arange(Sk)
        for g in range(0, Sk - 15, 16):
            idx[g + 14], idx[g + 15] = g + 15, g + 14
        v = v[:, :, idx]
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D)) * 1.4426950408889634
    if bool(inputs["causal"]):
        s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool).triu(1), -math.inf)
    m = torch.full((B, H, Sq, 1), -math.inf)
    o = torch.zeros(B, H, Sq, D)
    l = torch.zeros(B, H, Sq, 1)
    for n0 in range(0, Sk, tile):
        st = s[..., n0:n0 + tile]
        mt = st.amax(-1, keepdim=True)
        keep = (mt <= m + lazy) if lazy is not None else torch.zeros_like(mt, dtype=torch.bool)
        m_new = torch.where(keep, m, torch.maximum(m, mt))
        mu = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        corr = torch.exp2(m - mu)
        p = torch.exp2(st - mu)
        l = l * corr + p.sum(-1, keepdim=True)
        o = o * corr + p.to(FP8).float() @ v[:, :, n0:n0 + tile]
        m = m_new
    return (o / l).half()


def test_fp8_attention_check_takes_the_rounding_of_p_and_nothing_more():
    """The FP8 attention check (fp8_p_rounding_bound + RMSE): a model of the kernel's arithmetic (online softmax,
    lazy maximum, e4m3 P) passes on the FP8 spaces' correctness shapes over several seeds; V's keys in a wrong order
    (a transpose bug), keys lost (a missing load), or one output bumped by 0.1 fail."""
    task = _cpu_task("sdpa_hopper_fp8_d128")
    assert task.fp8_attention and task.output_dtype() == torch.float16
    assert task.binding_signature().endswith(";OUT_DTYPE=float16")
    shapes = [e.shape for e in task.entries if not e.time and e.shape.Sq * e.shape.Sk <= 500 * 500]
    assert {s.name for s in shapes} >= {"s77", "s77_causal", "sq300_sk77", "s500_b3_causal"}
    margins = []
    for seed in range(3):
        for s in shapes:
            inputs = task.make_inputs(s, seed)
            assert inputs["q"].dtype == FP8 and torch.equal(inputs["qk_scale"], inputs["q_scale"] * inputs["k_scale"])
            for lazy in (8.0, None):
                ok, reason, m = task.extra_check(s, inputs, _fp8_kernel_model(inputs, lazy=lazy),
                                                 task.reference(inputs))
                assert ok, (s.name, seed, lazy, reason)
                margins.append(m["fp8_p_bound_margin"])
    assert min(margins) > 0
    s77 = next(x for x in shapes if x.name == "s77_causal")
    inputs = task.make_inputs(s77, 0)
    ref = task.reference(inputs)
    lost = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
    lost["k"][:, :, 64:] = torch.zeros((), dtype=FP8)  # keys 64.. read as zeros (a missing load)
    lost["v"][:, :, 64:] = torch.zeros((), dtype=FP8)
    bumped = _fp8_kernel_model(inputs)
    bumped[0, 1, 40, 7] += 0.1
    for name, out in (("key order", _fp8_kernel_model(inputs, swap_keys=True)), ("lost keys", _fp8_kernel_model(lost)),
                      ("bumped", bumped)):
        ok, reason, _ = task.extra_check(s77, inputs, out, ref)
        assert not ok, name
