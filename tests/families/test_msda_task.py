"""Tests for the MSDA task definition and (as a stand-in for the build pipeline) the CPU template."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
import pytest
import torch

from evoengineer.families.msda import task as msda

TEMPLATE = Path(__file__).resolve().parents[2] / "evoengineer" / "families" / "msda" / "cpu" / "msda.cpp.j2"

# Non power-of-two D with D % D_VEC != 0 exercises the scalar channel tail.
ODD_SHAPE_D20 = msda.MSDAShape("odd_d20", N=1, Lq=13, M=2, D=20, P=4, levels=((5, 3), (2, 2), (1, 1), (3, 1)))

# Covers every value of every gene at least once (not the full product); D is a signature constant.
GENE_SETS = [
    dict(D_VEC=1, QUERIES_PER_CHUNK=1, LOOP_ORDER="head_outer", OMP_SCHEDULE="static", OMP_THREADS=0, PRECOMPUTE_META=False),
    dict(D_VEC=4, QUERIES_PER_CHUNK=4, LOOP_ORDER="point_outer", OMP_SCHEDULE="dynamic", OMP_THREADS=1, PRECOMPUTE_META=True),
    dict(D_VEC=8, QUERIES_PER_CHUNK=16, LOOP_ORDER="head_outer", OMP_SCHEDULE="guided", OMP_THREADS=3, PRECOMPUTE_META=True),
    dict(D_VEC=16, QUERIES_PER_CHUNK=64, LOOP_ORDER="point_outer", OMP_SCHEDULE="static", OMP_THREADS=2, PRECOMPUTE_META=False),
]
# (context, shapes to check)
BUILDS = [({"L": 4, "P": 4, "D": 32, **g}, msda.ODD_SHAPES) for g in GENE_SETS] + [
    ({"L": 4, "P": 4, "D": 16, **GENE_SETS[2], "LOOP_ORDER": "point_outer"}, (msda.ODD_SHAPE_D16,)),
    ({"L": 4, "P": 4, "D": 20, **GENE_SETS[3], "D_VEC": 8, "PRECOMPUTE_META": True}, (ODD_SHAPE_D20,)),
]
SMALL_SHAPES = (msda.ODD_SHAPES[0], msda.ODD_SHAPES[1], msda.ODD_SHAPES[3])


# ---------------------------------------------------------------- task definition


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: s.name)
def test_reference_matches_loop(shape):
    inputs = msda.make_inputs(shape, seed=1)
    expected = msda.reference_loop_f64(inputs)
    out64 = msda.reference(inputs, dtype=torch.float64)
    out32 = msda.reference(inputs)
    assert out64.shape == out32.shape == (shape.N, shape.Lq, shape.M * shape.D)
    assert out64.dtype == torch.float64 and out32.dtype == torch.float32
    assert (out64 - expected).abs().max().item() < 1e-10
    assert (out32.double() - expected).abs().max().item() < 1e-5


def test_make_inputs_seeding_and_statistics():
    shape = msda.ODD_SHAPES[2]
    a, b, c = (msda.make_inputs(shape, seed=s) for s in (7, 7, 8))
    assert set(a) == set(msda.INPUT_KEYS)
    for k in a:
        assert torch.equal(a[k], b[k])
    for k in ("value", "sampling_locations", "attention_weights"):
        assert not torch.equal(a[k], c[k])
    assert a["sampling_locations"].shape == (shape.N, shape.Lq, shape.M, shape.L, shape.P, 2)
    assert a["sampling_locations"].dtype == a["attention_weights"].dtype == torch.float32
    assert a["spatial_shapes"].tolist() == [list(hw) for hw in shape.levels]
    assert a["level_start_index"].tolist() == [0, 60, 75, 81]
    loc = a["sampling_locations"]
    outside = ((loc < 0) | (loc > 1)).any(-1).float().mean().item()
    assert 0.02 < outside < 0.98
    sums = a["attention_weights"].sum(dim=(-2, -1))
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    assert msda.make_inputs(shape, seed=7, dtype=torch.float64)["value"].dtype == torch.float64


def test_decoder_like_inputs_have_some_points_outside():
    shape = msda.MSDAShape("mini_decoder", N=2, Lq=300, M=8, D=4, P=4, levels=((100, 167), (50, 84), (25, 42), (13, 21)))
    loc = msda.make_inputs(shape, seed=0)["sampling_locations"]
    outside = ((loc < 0) | (loc > 1)).any(-1).float().mean().item()
    assert 0.05 < outside < 0.3


def test_shape_constants_and_from_dict():
    assert msda.ENCODER.S == msda.ENCODER.Lq == 22223 and msda.ENCODER.L == 4
    assert msda.DECODER.N == 8 and msda.DECODER.Lq == 900
    enc = msda.MSDAShape.from_dict(
        {"name": "enc", "N": 1, "Lq": "S", "M": 8, "D": 32, "P": 4, "levels": [[100, 167], [50, 84], [25, 42], [13, 21]],
         "ref": "pixels"}
    )
    assert enc == dataclasses.replace(msda.ENCODER, name="enc")
    good = {"name": "x", "N": 1, "Lq": 3, "M": 1, "D": 4, "P": 1, "levels": [[1, 1]]}
    assert msda.MSDAShape.from_dict(good).levels == ((1, 1),)
    for bad in ({"Lq": "Q"}, {"N": 0}, {"D": 2.0}, {"levels": []}, {"levels": [[1, 2, 3]]}, {"extra": 1}):
        with pytest.raises(ValueError):
            msda.MSDAShape.from_dict({**good, **bad})
    with pytest.raises(ValueError, match="missing"):
        msda.MSDAShape.from_dict({k: v for k, v in good.items() if k != "P"})


def test_flops_and_bytes():
    s = msda.DECODER
    samples = 8 * 900 * 8 * 4 * 4
    assert msda.flops(s) == samples * (8 * 32 + msda.META_FLOPS_PER_SAMPLE)
    assert msda.min_bytes(s, 4) == 8 * 22223 * 8 * 32 * 4 + samples * 12 + 8 * 900 * 256 * 4
    assert msda.min_bytes(s, 2) < msda.min_bytes(s, 4)


# ---------------------------------------------------------------- CPU template (stand-in build)


def _render(ctx: dict) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(TEMPLATE.read_text()).render(**ctx)


def _compile(src: str, out_dir: Path, tag: str) -> Path:
    cpp, lib = out_dir / f"msda_{tag}.cpp", out_dir / f"msda_{tag}.so"
    cpp.write_text(src)
    cmd = ["g++", "-O3", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", str(cpp), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"compile failed for {tag}:\n{res.stderr}"
    return lib


def _run(lib: ctypes.CDLL, inputs: dict[str, torch.Tensor]) -> tuple[int, torch.Tensor]:
    v, loc = inputs["value"], inputs["sampling_locations"]
    N, S, M, D = v.shape
    out = torch.full((N, loc.shape[1], M * D), float("nan"), dtype=torch.float32)
    ptrs = [inputs[k].contiguous().data_ptr() for k in msda.INPUT_KEYS] + [out.data_ptr()]
    rc = lib.evo_msda_forward_v2(*ptrs, N, S, M, loc.shape[1], 0, None, None, None)
    return rc, out


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.evo_msda_forward_v2.restype = ctypes.c_int
    lib.evo_msda_forward_v2.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 3
    return lib


def test_template_renders_strict_and_rejects_missing_vars():
    src = _render(BUILDS[0][0])
    assert "struct MsdaTraits" in src and 'extern "C" int evo_msda_forward_v2(' in src
    with pytest.raises(jinja2.UndefinedError):
        _render({k: v for k, v in BUILDS[0][0].items() if k != "D_VEC"})


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpu_template_matches_reference(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        libs = list(pool.map(lambda ib: _compile(_render(ib[1][0]), tmp_path, str(ib[0])), enumerate(BUILDS)))
    for lib_path, (ctx, shapes) in zip(libs, BUILDS):
        lib = _load(lib_path)
        for seed, shape in enumerate(shapes):
            inputs = msda.make_inputs(shape, seed=100 + seed)
            rc, out = _run(lib, inputs)
            assert rc == 0
            assert not torch.isnan(out).any(), f"unwritten output for {ctx} on {shape.name}"
            err = (out.double() - msda.reference(inputs, dtype=torch.float64)).abs().max().item()
            assert err < 1e-4, f"max abs error {err} for {ctx} on {shape.name}"


def test_pixel_reference_points_follow_the_query_position():
    """ref = "pixels": query q samples around the centre of its own pixel (encoder); other shapes refuse it."""
    levels = ((6, 10), (3, 5), (2, 3), (1, 1))
    S = sum(h * w for h, w in levels)
    shape = msda.MSDAShape("enc_px", N=2, Lq=S, M=8, D=8, P=8, levels=levels, ref="pixels")
    loc = msda.make_inputs(shape, seed=3)["sampling_locations"]  # [N, Lq, M, L, P, 2]
    # query 13 is pixel (y=1, x=3) of level 0: the median of its 128 samples on level 0 lies within 1.5 pixels of
    # (3.5/10, 1.5/6) (offsets have a 2-pixel std-dev; a uniform reference point would miss by 0.3 on average)
    med = loc[:, 13, :, 0].reshape(-1, 2).median(dim=0).values
    assert abs(float(med[0]) - 3.5 / 10) < 1.5 / 10 and abs(float(med[1]) - 1.5 / 6) < 1.5 / 6
    # the last query is the 1x1 level's only pixel: centre (0.5, 0.5)
    med = loc[:, S - 1, :, 0].reshape(-1, 2).median(dim=0).values
    assert abs(float(med[0]) - 0.5) < 0.1 and abs(float(med[1]) - 0.5) < 0.2
    with pytest.raises(ValueError, match="needs Lq == S"):
        msda.MSDAShape("bad", N=1, Lq=S + 1, M=3, D=8, P=4, levels=levels, ref="pixels")
    with pytest.raises(ValueError, match="'ref' must be one of"):
        msda.MSDAShape.from_dict({"name": "x", "N": 1, "Lq": "S", "M": 1, "D": 8, "P": 4, "levels": [[1, 1]],
                                  "ref": "grid"})
    assert msda.ENCODER.ref == "pixels" and msda.DECODER.ref == "random"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpu_template_softmaxes_logits(tmp_path):
    """Signature ATTENTION = "logits": the kernel softmaxes each (n, q, m)'s L * P logits itself, stably (rows shifted
    by up to +-150 would overflow exp without the row maximum subtracted); value_layout 1 (head-major) is refused."""
    ctxs = [{"L": 4, "P": 4, "D": 32, "ATTENTION": "logits", **g} for g in GENE_SETS[:2]]
    libs = [_load(_compile(_render(c), tmp_path, f"logits{i}")) for i, c in enumerate(ctxs)]
    for lib in libs:
        for seed, shape in enumerate(SMALL_SHAPES):
            inputs = msda.make_inputs(shape, seed=7 + seed, logits=True)
            rc, out = _run(lib, inputs)
            assert rc == 0 and torch.isfinite(out).all()
            want = msda.reference(inputs, dtype=torch.float64, logits=True)
            assert (out.double() - want).abs().max().item() < 1e-4
            # the raw logits as weights give something else entirely
            assert (out.double() - msda.reference(inputs, dtype=torch.float64)).abs().max().item() > 1e-1
        v = msda.make_inputs(SMALL_SHAPES[0], seed=1)
        ptrs = [v[k].data_ptr() for k in msda.INPUT_KEYS] + [torch.empty(1).data_ptr()]
        assert lib.evo_msda_forward_v2(*ptrs, 1, 1, 1, 1, 1, None, None, None) == 7


def test_logit_inputs_and_reference():
    shape = msda.ODD_SHAPES[1]
    w = msda.make_inputs(shape, seed=4)
    lg = msda.make_inputs(shape, seed=4, logits=True)
    assert torch.equal(w["sampling_locations"], lg["sampling_locations"]) and torch.equal(w["value"], lg["value"])
    assert lg["attention_weights"].abs().max() > 88  # exp overflows in fp32 without the max subtracted
    soft = torch.softmax(lg["attention_weights"].double().flatten(-2), -1).view(lg["attention_weights"].shape)
    want = msda.reference({**lg, "attention_weights": soft}, dtype=torch.float64)
    assert torch.allclose(msda.reference(lg, dtype=torch.float64, logits=True), want)


@pytest.mark.parametrize("attention", [None, "weights", "logits"])
def test_the_cpu_templates_header_says_what_attention_weights_holds(attention):
    """The header names the attention mode the kernel was rendered for (it said "logits" for every kernel)."""
    from evoengineer import space_file
    from evoengineer.candidate import CandidateFactory
    from evoengineer.space.spec import SearchSpace

    path = space_file("cpu_msda.toml")
    text = path.read_text()
    if attention is not None:
        text = text.replace('VALUE_DTYPE = "float32"\n', f'VALUE_DTYPE = "float32"\nATTENTION = "{attention}"\n')
    space = SearchSpace.from_text(text, str(path))
    src = CandidateFactory(space).from_genome(space.valid_genomes()[0]).source
    header = src[:src.index("#include")]
    logits = attention == "logits"
    assert ('ATTENTION = "logits"' in header) == logits
    assert ('ATTENTION = "weights"' in header) == (not logits)
    assert f"LOGITS = {'true' if logits else 'false'};" in src
