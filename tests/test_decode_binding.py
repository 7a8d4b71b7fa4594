"""The decode binding and task end to end without a GPU: a test-only plain C++ kernel (tests/data/decode_cpu) built
through the family binding and checked by the real worker (GQA, Sq = 5, ragged lengths with NaN past them, FP8 and
bf16 signatures, a planted read past the lengths), the binding's workspace protocol (split partials in memory the
binding allocates), and its refusal of inputs the kernel was not compiled for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from conftest import build_candidate
from evoengineer.candidate import CandidateFactory
from evoengineer.space import load_space

DATA = Path(__file__).resolve().parent / "data" / "decode_cpu"
SIG = 'Q_DTYPE = "float16"\nKV_DTYPE = "float16"'


def _space(tmp_path: Path, sig: str = SIG):
    text = (DATA / "decode_cpu_space.toml").read_text()
    assert SIG in text
    (tmp_path / "decode.cpp.j2").write_text((DATA / "decode.cpp.j2").read_text())
    shutil.copy(DATA.parent / "cpu_attention_dtypes.inc.j2", tmp_path)
    (tmp_path / "space.toml").write_text(text.replace(SIG, sig))
    return load_space(tmp_path / "space.toml")


def _evaluate(space, params: list[dict], build_cache: Path) -> list:
    """Measurements in the order of `params` (evaluate_many yields them as they finish)."""
    from evoengineer.evaluators.local import LocalEvaluator

    factory = CandidateFactory(space)
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        got = {tuple(sorted(c.params.items())): m for c, m in ev.evaluate_many([factory.make(p) for p in params])}
    return [got[tuple(sorted(p.items()))] for p in params]


def test_split_kernel_is_right_and_a_read_past_the_lengths_is_caught(tmp_path: Path, build_cache: Path):
    split, whole, fault = _evaluate(_space(tmp_path), [{"SPLIT_KEYS": 64, "FAULT": "none"},
                                                       {"SPLIT_KEYS": 100000, "FAULT": "none"},
                                                       {"SPLIT_KEYS": 64, "FAULT": "read_past_length"}], build_cache)
    for m in (split, whole):
        assert m.status == "ok", m.reason
        assert m.metrics["max_abs_err"] < 4e-3 and m.metrics["speedup"] > 0 and m.metrics["baseline"] == "sdpa"
    assert fault.status == "wrong" and ("NaN" in fault.reason or "nan" in fault.reason), fault.reason


@pytest.mark.parametrize("sig", ['Q_DTYPE = "bfloat16"\nKV_DTYPE = "bfloat16"',
                                 'Q_DTYPE = "float16"\nKV_DTYPE = "float8_e4m3"',
                                 'Q_DTYPE = "bfloat16"\nKV_DTYPE = "float8_e4m3"'])
def test_other_signatures(tmp_path: Path, build_cache: Path, sig: str):
    (m,) = _evaluate(_space(tmp_path, sig), [{"SPLIT_KEYS": 64, "FAULT": "none"}], build_cache)
    assert m.status == "ok", m.reason


def test_binding_validates_its_arguments(tmp_path: Path, build_cache: Path):
    from evoengineer.tasks.decode import DecodeShape, reference

    task, mod = build_candidate(_space(tmp_path), {"SPLIT_KEYS": 64, "FAULT": "none"}, build_cache, jobs=1)
    assert mod.signature == {"HEAD_DIM": "64", "Q_DTYPE": "float16", "KV_DTYPE": "float16"}
    x = task.make_inputs(DecodeShape("x", B=2, Hq=8, Hkv=2, Sq=3, Sk=200, seq_lens=(200, 65)), 0)
    q, k, v, ks, vs, lens = (x[n] for n in ("q", "k", "v", "k_scale", "v_scale", "seq_lens"))
    out = task.new_output(x)
    assert mod.forward(q, k, v, ks, vs, lens, out, 0.125) == 0  # 4 splits: the workspace round trip
    ref = reference({**x, "q": q}, dtype=torch.float64)
    assert torch.isfinite(out).all() and (out.double() - ref).abs().max() < 4e-3
    cases = [
        ((q[0], k, v, ks, vs, lens, out), "q: expected 4 dimensions"),
        ((q.float(), k, v, ks, vs, lens, out), "q: dtype float32, but this kernel was compiled for float16"),
        ((q, k, v, ks, vs, lens, out.bfloat16()), "out: dtype bfloat16 must match q"),
        ((q, k.bfloat16(), v, ks, vs, lens, out), "k: dtype bfloat16, but this kernel was compiled for float16"),
        ((q, k, v.to(torch.float8_e4m3fn), ks, vs, lens, out), "v: dtype float8_e4m3fn"),
        ((q, k, v, ks.double(), vs, lens, out), "must be float32"),
        ((q, k, v, ks, vs, lens.long(), out), "seq_lens: must be int32, got int64"),
        ((q, k, v, ks, vs, lens[:1], out), "seq_lens: expected \\[B\\] = \\[2\\]"),
        ((q, k, v, ks[:1], vs, lens, out), "k_scale, v_scale: expected \\[Hkv\\] = \\[2\\]"),
        ((q, k[:, :1].repeat(1, 3, 1, 1), v[:, :1].repeat(1, 3, 1, 1), ks, vs, lens, out),
         "k: 3 KV heads \\(size 1\\) do not divide the 8 query heads"),
        ((q, k, v[:, :, :100].contiguous(), ks, vs, lens, out), "v: expected the shape of k"),
        ((q, k[:1], v[:1], ks, vs, lens, out), "k: expected \\[B, Hkv, Sk, D\\]"),
        ((q, k.transpose(2, 3), v, ks, vs, lens, out), "k: must be contiguous"),
        ((q, k, v, ks, vs, lens, out[:, :, :2]), "out: must be contiguous"),
        ((q, k, v, ks, vs, lens, out[:, :, :2].contiguous()), "out: expected the shape of q"),
        ((q.repeat(1, 1, 6, 1), k, v, ks, vs, lens, out.repeat(1, 1, 6, 1)), "q: 18 query rows \\(size 2\\); this family "
                                                                             "decodes 1 to 16"),
        ((q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous(), ks, vs, lens,
          out[..., :32].contiguous()), "q: head dim 32 \\(size 3\\), but this kernel was compiled for head dim 64"),
        ((q, k[:, :, :0].contiguous(), v[:, :, :0].contiguous(), ks, vs, lens, out), "empty cache"),
    ]
    for args, msg in cases:
        out.fill_(float("nan"))
        with pytest.raises((ValueError, TypeError), match=msg):
            mod.forward(*args, 0.125)
