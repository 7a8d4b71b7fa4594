"""The decode-attention task (evoengineer/tasks/decode.py) without a GPU: shape tables, inputs (GQA, ragged
seq_lens with NaN past each length, FP8 per KV head), the float64 reference against torch SDPA, and the baseline."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from evoengineer.families.decode.task import (DecodeShape, flops, gather_pages, make_inputs, min_bytes, reference,
                                      sdpa_baseline, shared_prefix_pages)


def test_shapes_parse_and_refuse_with_a_reason():
    s = DecodeShape.from_dict({"name": "r", "B": 4, "Hq": 8, "Hkv": 2, "Sk": 1000, "Sq": 5, "seq_lens": [1, 7]})
    assert s.group == 4 and s.lengths == (1, 7, 1, 7)
    assert DecodeShape.from_dict({"name": "f", "B": 2, "Hq": 4, "Hkv": 4, "Sk": 64}).lengths == (64, 64)
    for bad, words in [({"Hq": 6, "Hkv": 4}, "multiple"), ({"Sq": 17}, "at most 16"), ({"seq_lens": [2000]}, "> Sk"),
                       ({"seq_lens": [0]}, "positive"), ({"seq_lens": [1, 2, 3, 4, 5]}, "1..B"), ({"x": 1}, "unknown")]:
        with pytest.raises(ValueError, match=words):
            DecodeShape.from_dict({"name": "b", "B": 4, "Hq": 8, "Hkv": 2, "Sk": 1000, **bad})


def _sdpa64(inputs):
    """torch SDPA in float64 on expanded K/V with an explicit length mask: an independent reference."""
    q, k, v, lens = inputs["q"].double(), inputs["k"].double(), inputs["v"].double(), inputs["seq_lens"]
    k = k * inputs["k_scale"].double().view(1, -1, 1, 1)
    v = v * inputs["v_scale"].double().view(1, -1, 1, 1)
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1).nan_to_num(0.0), v.repeat_interleave(G, dim=1).nan_to_num(0.0)
    mask = (torch.arange(k.shape[2])[None, :] < lens[:, None].long())[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_reference_is_gqa_attention_over_each_sequence_length(kv):
    shape = DecodeShape.from_dict({"name": "t", "B": 4, "Hq": 8, "Hkv": 2, "Sk": 300, "Sq": 3,
                                   "seq_lens": [1, 7, 300, 150]})
    q_dtype = torch.bfloat16 if kv == torch.bfloat16 else torch.float16
    inputs = make_inputs(shape, 5, head_dim=64, q_dtype=q_dtype, kv_dtype=kv)
    assert inputs["seq_lens"].dtype == torch.int32 and inputs["seq_lens"].tolist() == [1, 7, 300, 150]
    k = inputs["k"].to(torch.float32)
    assert torch.isnan(k[0, :, 1:]).all() and torch.isnan(k[3, :, 150:]).all()  # the cache past each length
    assert not torch.isnan(k[0, :, :1]).any() and not torch.isnan(k[2]).any()
    assert inputs["k_scale"].shape == (2,) and (inputs["k_scale"] > 0).all()
    ref = reference(inputs)
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    assert torch.allclose(ref, _sdpa64(inputs), atol=1e-12, rtol=1e-10)
    # a one-key sequence returns that key's value row for every query of every head of the group
    v0 = inputs["v"][0, :, 0].double() * inputs["v_scale"].double()[:, None]
    assert torch.allclose(ref[0, :, 1], v0.repeat_interleave(4, dim=0))
    if kv == torch.float8_e4m3fn:  # the unquantized K/V are kept for the fp16 comparison and the baseline
        assert inputs["k_orig"].dtype == torch.float16 and inputs["k"].dtype == torch.float8_e4m3fn


def test_baseline_matches_the_reference():
    shape = DecodeShape.from_dict({"name": "t", "B": 3, "Hq": 8, "Hkv": 1, "Sk": 200, "Sq": 2,
                                   "seq_lens": [200, 13, 77]})
    inputs = make_inputs(shape, 9, head_dim=64, q_dtype=torch.float32, kv_dtype=torch.float32)
    assert torch.allclose(sdpa_baseline(inputs).double(), reference(inputs), atol=1e-5)
    full = DecodeShape.from_dict({"name": "f", "B": 2, "Hq": 4, "Hkv": 2, "Sk": 50})
    inputs = make_inputs(full, 1, head_dim=64, q_dtype=torch.float32, kv_dtype=torch.float32)
    assert torch.allclose(sdpa_baseline(inputs).double(), reference(inputs), atol=1e-5)


def test_flops_and_bytes_count_the_visible_keys():
    s = DecodeShape.from_dict({"name": "t", "B": 2, "Hq": 32, "Hkv": 8, "Sk": 8192, "Sq": 4, "seq_lens": [8192, 100]})
    assert flops(s, 128) == 4 * 128 * 32 * 4 * (8192 + 100)
    assert min_bytes(s, 128, 2, 1) == 2 * 8 * 128 * (8192 + 100) * 1 + 2 * 2 * 32 * 4 * 128 * 2
    assert math.isclose(min_bytes(s, 128, 2, 2) / min_bytes(s, 128, 2, 1), 2.0, rel_tol=1e-2)


@pytest.mark.parametrize("kv", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("page", [1, 16, 64])
def test_paged_inputs(kv, page):
    """Pages in random order across the pool, pairs of sequences sharing their first pages (same keys in both),
    unused pages, entries past each sequence's last page naming a page of NaN; the reference reads through the table
    and equals attention on the contiguous caches."""
    shape = DecodeShape.from_dict({"name": "p", "B": 5, "Hq": 8, "Hkv": 2, "Sk": 300, "Sq": 2,
                                   "seq_lens": [200, 180, 1, 300, 64], "page_size": page})
    x = make_inputs(shape, 3, head_dim=64, kv_dtype=kv)
    k, bt = x["k"], x["block_table"]
    P = -(-300 // page)
    assert bt.dtype == torch.int32 and bt.shape == (5, P) and k.shape[1:] == (page, 2, 64)
    shared = shared_prefix_pages(shape)
    assert shared == {1: max(1, 180 // page // 2), 3: max(1, 1 // page // 2)} if page == 1 else shared[1] >= 1
    used = {}
    for b, L in enumerate(shape.lengths):
        n = -(-L // page)
        for j in range(n):
            used.setdefault(int(bt[b, j]), []).append((b, j))
        assert len(set(bt[b, n:].tolist())) <= 1  # one page of NaN past the sequence
    assert all(len(v) == 2 and v[0][1] == v[1][1] < shared[v[1][0]] for v in used.values() if len(v) > 1)
    assert len(used) < k.shape[0] - 1  # pages nobody uses
    assert sorted(used) != list(range(len(used)))  # not in sequence order
    nan_page = int(bt[2, -1])
    assert torch.isnan(k[nan_page].float()).all() and nan_page not in used
    logical = gather_pages(k, bt).float()
    assert torch.isnan(logical[0, :, 200:]).all() and not torch.isnan(logical[0, :, :200]).any()
    ref = reference(x)
    assert torch.isfinite(ref).all()
    flat = {**x, "k": gather_pages(x["k"], bt), "v": gather_pages(x["v"], bt)}
    del flat["block_table"]
    assert torch.allclose(reference(flat), _sdpa64(flat), atol=1e-12, rtol=1e-10)
    assert torch.equal(reference(flat), ref)
    if kv == torch.float16:  # the contiguous copy the baseline reads
        assert torch.equal(x["k_orig"][:, :, :200].float()[0], logical[0, :, :200])
    assert torch.allclose(sdpa_baseline(x).double(), ref, atol=3e-3 if kv == torch.float16 else 0.2)


def test_paged_shape_options():
    s = DecodeShape.from_dict({"name": "p", "B": 2, "Hq": 4, "Hkv": 2, "Sk": 100, "page_size": 32})
    assert s.page_size == 32 and s.max_pages == 4
    assert min_bytes(s, 64, 2, 2) == min_bytes(DecodeShape("c", B=2, Hq=4, Hkv=2, Sk=100), 64, 2, 2) + 4 * 2 * 4
    for bad in (0, 24, 1 << 17, "16"):
        with pytest.raises(ValueError, match="page_size"):
            DecodeShape.from_dict({"name": "p", "B": 2, "Hq": 4, "Hkv": 2, "Sk": 100, "page_size": bad})
    assert s.shared_prefix
    with pytest.raises(ValueError, match="shared_prefix"):
        DecodeShape.from_dict({"name": "p", "B": 2, "Hq": 4, "Hkv": 2, "Sk": 100, "page_size": 32, "shared_prefix": 0})


def test_paged_inputs_without_shared_prefixes():
    """shared_prefix = false (what the benchmark times): every page of the table is one sequence's, so a paged call
    reads the bytes a contiguous one does; the reference still equals attention on the gathered caches."""
    shape = DecodeShape.from_dict({"name": "p", "B": 4, "Hq": 8, "Hkv": 2, "Sk": 256, "page_size": 16,
                                   "shared_prefix": False})
    assert not shape.shared_prefix and shared_prefix_pages(shape) == {}
    x = make_inputs(shape, 5, head_dim=64)
    named = x["block_table"].flatten().tolist()
    assert len(named) == len(set(named)) == 4 * 16
    flat = {**x, "k": gather_pages(x["k"], x["block_table"]), "v": gather_pages(x["v"], x["block_table"])}
    del flat["block_table"]
    assert torch.equal(reference(flat), reference(x))


def test_paged_fp8_gate_reads_the_contiguous_unquantized_caches():
    from evoengineer.space import load_space
    from evoengineer import space_file
    from evoengineer.families import get_task

    task = get_task(load_space(space_file("decode_fp8kv_d128_paged.toml")))
    x = make_inputs(DecodeShape("p", B=2, Hq=4, Hkv=2, Sk=100, seq_lens=(100, 60), page_size=16), 1, head_dim=128,
                    kv_dtype=torch.float8_e4m3fn)
    fp16 = task.fp16_attention(x)
    assert fp16.shape == x["q"].shape and torch.isfinite(fp16).all()
    assert (fp16 - reference(x)).abs().max() < 0.1  # the quantization error only


@pytest.mark.parametrize("space", ["decode_fp8kv_d64", "decode_fp8kv_d128_paged"])
def test_the_fp8_baseline_is_held_to_attention_on_the_unquantized_cache(space):
    """The baseline runs on the unquantized K/V (what an FP8 kernel replaces): at a worker's start it is checked
    against exact attention on those (`baseline_reference`), within the candidates' tolerance, not against the
    reference on the dequantized cache, which a length-1 sequence (its output is its e4m3-rounded value row) misses."""
    from evoengineer import space_file
    from evoengineer.space import load_space
    from evoengineer.families import get_task

    task = get_task(load_space(space_file(f"{space}.toml")))
    paged = "paged" in space
    x = make_inputs(DecodeShape("r", B=2, Hq=8, Hkv=2, Sk=128, Sq=2, seq_lens=(1, 7),
                                page_size=16 if paged else None), 3, head_dim=task.head_dim,
                    kv_dtype=torch.float8_e4m3fn)
    got = sdpa_baseline(x).double()
    own = task.baseline_reference("sdpa", x)
    atol, rtol = task.tolerance()
    assert own.dtype == torch.float64 and own.shape == got.shape
    assert ((got - own).abs() <= atol + rtol * own.abs()).all()
    assert not ((got - reference(x)).abs() <= atol + rtol * reference(x).abs()).all()
    fp16_task = get_task(load_space(space_file("decode_fp16_d128.toml")))
    assert fp16_task.baseline_reference("sdpa", make_inputs(DecodeShape("f", B=1, Hq=2, Hkv=2, Sk=8), 0,
                                                            head_dim=128)) is None
