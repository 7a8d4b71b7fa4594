"""The decode-attention task (evoengineer/tasks/decode.py) without a GPU: shape tables, inputs (GQA, ragged
seq_lens with NaN past each length, FP8 per KV head), the float64 reference against torch SDPA, and the baseline."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from evoengineer.tasks.decode import DecodeShape, flops, make_inputs, min_bytes, reference, sdpa_baseline


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
