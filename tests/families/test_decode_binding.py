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

DATA = Path(__file__).resolve().parents[1] / "data" / "decode_cpu"
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


@pytest.mark.slow
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
    from evoengineer.families.decode.task import DecodeShape, reference

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
        ((q, k, v, ks, vs, lens, out.bfloat16()), "out: dtype bfloat16, but this kernel writes float16"),
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


# ---- the paged KV layout ------------------------------------------------------------------------------------------------
def _paged_space(tmp_path: Path, sig: str = SIG, pages: tuple[int, ...] = (16, 1, 64)):
    """The CPU space with KV_LAYOUT = "paged" and a page size per shape (cycled over `pages`)."""
    space = _space(tmp_path, sig + '\nKV_LAYOUT = "paged"')
    text = (tmp_path / "space.toml").read_text()
    parts = text.split("[[shapes]]")
    text = parts[0] + "".join(f"[[shapes]]\npage_size = {pages[i % len(pages)]}" + p
                              for i, p in enumerate(parts[1:]))
    (tmp_path / "space.toml").write_text(text)
    space = load_space(tmp_path / "space.toml")
    assert space.signature["KV_LAYOUT"] == "paged"
    return space


def test_paged_kernel_is_right_and_faults_are_caught(tmp_path: Path, build_cache: Path):
    """Pages in random order, shared prefixes, table entries past each sequence naming a page of NaN: a kernel that
    reads past the lengths (through the table) or ignores the table is caught."""
    space = _paged_space(tmp_path)
    split, whole, past, table = _evaluate(space, [{"SPLIT_KEYS": 64, "FAULT": "none"},
                                                  {"SPLIT_KEYS": 100000, "FAULT": "none"},
                                                  {"SPLIT_KEYS": 64, "FAULT": "read_past_length"},
                                                  {"SPLIT_KEYS": 64, "FAULT": "ignore_block_table"}], build_cache)
    for m in (split, whole):
        assert m.status == "ok", m.reason
        assert m.metrics["max_abs_err"] < 4e-3 and m.metrics["baseline"] == "sdpa"
    assert past.status == "wrong" and "nan" in past.reason.lower(), past.reason
    assert table.status == "wrong", table.reason


def test_paged_fp8_signature(tmp_path: Path, build_cache: Path):
    space = _paged_space(tmp_path, 'Q_DTYPE = "bfloat16"\nKV_DTYPE = "float8_e4m3"', pages=(32,))
    (m,) = _evaluate(space, [{"SPLIT_KEYS": 64, "FAULT": "none"}], build_cache)
    assert m.status == "ok", m.reason


def test_paged_binding_validates_its_arguments(tmp_path: Path, build_cache: Path):
    from evoengineer.families.decode.task import DecodeShape, reference

    task, mod = build_candidate(_paged_space(tmp_path), {"SPLIT_KEYS": 64, "FAULT": "none"}, build_cache, jobs=1)
    assert mod.signature["KV_LAYOUT"] == "paged"
    x = task.make_inputs(DecodeShape("x", B=3, Hq=8, Hkv=2, Sq=2, Sk=200, seq_lens=(200, 120, 65), page_size=16), 0)
    q, k, v, ks, vs, lens, bt = (x[n] for n in ("q", "k", "v", "k_scale", "v_scale", "seq_lens", "block_table"))
    assert k.shape[1:] == (16, 2, 64) and bt.shape == (3, 13) and bt.dtype == torch.int32
    out = task.new_output(x)
    assert mod.forward(q, k, v, ks, vs, lens, bt, out, 0.125) == 0
    ref = reference(x, dtype=torch.float64)
    assert torch.isfinite(out).all() and (out.double() - ref).abs().max() < 4e-3
    # an out-of-pool page number is clamped into the pool (a wrong answer, never a read outside it)
    wild = bt.clone()
    wild[0, 0] = 1 << 30
    wild[1, 0] = -5
    assert mod.forward(q, k, v, ks, vs, lens, wild, out, 0.125) == 0
    cases = [
        ((q, k, v, ks, vs, lens, bt.long(), out), TypeError, "block_table: must be int32, got int64"),
        ((q, k, v, ks, vs, lens, bt[0], out), ValueError, "block_table: expected 2 dimensions"),
        ((q, k, v, ks, vs, lens, bt[:2].contiguous(), out), ValueError, "block_table: expected \\[B, max_pages\\]"),
        ((q, k, v, ks, vs, lens, bt[:, :0].contiguous(), out), ValueError, "block_table: no page per sequence"),
        ((q, k, v, ks, vs, lens, bt.t(), out), ValueError, "block_table: must be contiguous"),
        ((q, k[:, :12].contiguous(), v[:, :12].contiguous(), ks, vs, lens, bt, out), ValueError,
         "k: page size 12 \\(size 1\\); this kernel takes powers of two"),
        ((q, k[..., :1, :].repeat(1, 1, 3, 1), v[..., :1, :].repeat(1, 1, 3, 1), ks, vs, lens, bt, out), ValueError,
         "k: 3 KV heads \\(size 2\\) do not divide the 8 query heads"),
        ((q, k, v[:-1].contiguous(), ks, vs, lens, bt, out), ValueError, "v: expected the shape of k"),
        ((q, k[:0], v[:0], ks, vs, lens, bt, out), ValueError, "k: 0 pages"),
        ((q, k, v, ks, vs, lens, out), TypeError, "softmax_scale"),  # the contiguous call: an argument short
    ]
    for args, kind, msg in cases:
        with pytest.raises(kind, match=msg):
            mod.forward(*args, 0.125)
    # a contiguous kernel refuses the paged call the same way
    (tmp_path / "flat").mkdir()
    _, flat = build_candidate(_space(tmp_path / "flat"), {"SPLIT_KEYS": 64, "FAULT": "none"}, build_cache, jobs=1)
    with pytest.raises(TypeError, match="at most 8 arguments|takes 8"):
        flat.forward(q, k, v, ks, vs, lens, bt, out, 0.125)


@pytest.mark.slow
def test_paged_op_exported(tmp_path: Path, build_cache: Path):
    """The paged op from a search's elite.json (evoengineer.load): right through the block table, eager and under
    torch.compile, refusals naming the argument, the reference fallback and gradients through the gathered caches."""
    import evoengineer
    from evoengineer.cli import main
    from evoengineer.families.decode.task import DecodeShape, gather_pages, make_inputs, reference

    (tmp_path / "s").mkdir()
    _paged_space(tmp_path / "s")
    rc = main(["search", "--space", str(tmp_path / "s" / "space.toml"), "--strategy", "grid", "--db",
               f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "elite.json"), "--population", "2",
               "--budget", "2", "--elite", "1", "--cache-dir", str(build_cache), "--quiet"])
    assert rc == 0
    decode = evoengineer.load(tmp_path / "elite.json", build_root=tmp_path / "ops")
    x = make_inputs(DecodeShape("x", B=4, Hq=8, Hkv=2, Sq=3, Sk=150, seq_lens=(150, 140, 1, 77), page_size=32), 5,
                    head_dim=64)
    q, k, v, lens, bt = x["q"], x["k"], x["v"], x["seq_lens"], x["block_table"]
    got = decode(q, k, v, lens, block_table=bt)
    want = reference(x)
    assert torch.isfinite(got).all() and (got.double() - want).abs().max() < 4e-3
    compiled = torch.compile(lambda q, k, v, lens, bt: decode(q, k, v, lens, block_table=bt), fullgraph=True)
    assert torch.equal(compiled(q, k, v, lens, bt), got)
    with pytest.raises(TypeError, match="block_table: this kernel was compiled for a paged KV cache"):
        decode(q, k, v, lens)
    with pytest.raises(TypeError, match="block_table: dtype int64, expected int32"):
        decode(q, k, v, lens, block_table=bt.long())
    with pytest.raises(ValueError, match="block_table: shape \\(2, 5\\), expected \\[B, max_pages\\] = \\[4"):
        decode(q, k, v, lens, block_table=bt[:2])
    with pytest.raises(ValueError, match="key_cache: shape .* expected a page pool"):
        decode(q, k[:, :24].contiguous(), v[:, :24].contiguous(), lens, block_table=bt)
    with pytest.raises(ValueError, match="only for a kernel compiled for float8"):
        decode(q, k, v, lens, block_table=bt, k_scale=torch.ones(2))
    with pytest.warns(UserWarning, match="computing with the PyTorch reference"):
        ref = evoengineer.load(tmp_path / "elite.json", build_root=tmp_path / "ops", fallback="reference")(
            q.float(), k.float(), v.float(), lens, block_table=bt)
    assert (ref.double() - want).abs().max() < 1e-4
    # gradients: the pools' slots get what the gathered caches get (shared pages: summed over their sequences)
    kc, vc = k.nan_to_num(0.0), v.nan_to_num(0.0)
    qh, kh, vh = (t.detach().clone().requires_grad_() for t in (q, kc, vc))
    decode(qh, kh, vh, lens, block_table=bt).float().pow(2).sum().backward()
    qf, kf, vf = (t.detach().double().requires_grad_() for t in (q, kc, vc))
    G = 4
    outs = []
    for b, n in enumerate(lens.tolist()):
        kb = gather_pages(kf, bt)[b, :, :n].repeat_interleave(G, dim=0)
        vb = gather_pages(vf, bt)[b, :, :n].repeat_interleave(G, dim=0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(qf[b], kb, vb))
    torch.stack(outs).pow(2).sum().backward()
    for a, b_ in ((qh.grad, qf.grad), (kh.grad, kf.grad), (vh.grad, vf.grad)):
        assert torch.allclose(a.double(), b_, atol=3e-2, rtol=3e-2)
