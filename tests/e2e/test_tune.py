"""`evoengineer.tune`: one call tunes a kernel on the family contract (checked binding, integrity checks, store,
resume, the op)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import evoengineer
from evoengineer.errors import UserError

SCALE = r"""
#include <cstdint>
// out = x * alpha (WRONG adds a bias: must never be an elite). VEC={{ VEC }} WRONG={{ WRONG }}
extern "C" int evo_scale(const float* x, float alpha, float* out, void* stream) {
  const int64_t n = 4 * 33;
  for (int64_t i = 0; i < n; i += {{ VEC }})
    for (int64_t j = i; j < i + {{ VEC }} && j < n; ++j) out[j] = x[j] * alpha{% if WRONG %} + 1e-3f{% endif %};
  return 0;
}
"""

ACCUMULATE = r"""
#include <cstdint>
// acc += x * x, in place; sizes passed in. UNROLL={{ UNROLL }}
extern "C" int evo_accumulate(const float* x, float* acc, int64_t n, void* stream) {
  int64_t i = 0;
  for (; i + {{ UNROLL }} <= n; i += {{ UNROLL }})
    for (int u = 0; u < {{ UNROLL }}; ++u) acc[i + u] += x[i + u] * x[i + u];
  for (; i < n; ++i) acc[i] += x[i] * x[i];
  return 0;
}
"""


@pytest.mark.slow
def test_tune_a_kernel_in_one_call_then_reuse_its_run(tmp_path: Path, build_cache: Path):
    x = torch.randn(4, 33)
    kw = dict(entry="evo_scale", args={"x": x, "alpha": 0.5}, outputs={"out": x},
              reference=lambda a: a["x"].double() * a["alpha"], knobs={"VEC": [1, 4, 8], "WRONG": [False, True]},
              budget=6, strategy="grid", workdir=tmp_path / "work", repeats=3, flags=["-O2"], quiet=True)
    tuned = evoengineer.tune(SCALE, **kw)
    assert not tuned.reused and 1 <= len(tuned.elites) <= 3
    assert all(e["params"]["WRONG"] is False for e in tuned.elites)  # the biased kernels were all rejected
    assert tuned.elites[0]["time_us"] > 0
    out = tuned.function(x, 0.5)
    assert torch.allclose(out, x * 0.5)
    with pytest.raises(ValueError, match="x: size 1 .* expected 33"):
        tuned.function(torch.randn(4, 32), 0.5)
    # the same call again: the finished run is reused (new example values, same call)
    again = evoengineer.tune(SCALE, **{**kw, "args": {"x": torch.randn(4, 33), "alpha": 0.5}})
    assert again.reused and [e["hash"] for e in again.elites] == [e["hash"] for e in tuned.elites]
    # a knob changed: a new run
    changed = evoengineer.tune(SCALE, **{**kw, "knobs": {"VEC": [2], "WRONG": [False]}, "budget": 1})
    assert not changed.reused and changed.elites[0]["params"] == {"VEC": 2, "WRONG": False}


@pytest.mark.slow
def test_tune_with_named_sizes_more_shapes_and_an_inout(tmp_path: Path, build_cache: Path):
    x, acc = torch.randn(100), torch.randn(100)
    tuned = evoengineer.tune(ACCUMULATE, entry="evo_accumulate", args={"x": x, "acc": acc}, outputs={},
                             inout=["acc"], dims={"x": ("n",), "acc": ("n",)}, shapes=[{"n": 7}, {"n": 1}],
                             reference=lambda a: {"acc": a["acc"].double() + a["x"].double() ** 2},
                             knobs={"UNROLL": [1, 4]}, budget=2, strategy="grid", workdir=tmp_path / "w",
                             repeats=3, flags=["-O2"], quiet=True)
    assert len(tuned.elites) >= 1 and tuned.elites[0]["params"]["UNROLL"] in (1, 4)
    space = (tmp_path / "w" / "space.toml").read_text()
    assert space.count("[[shapes]]") == 3 and "n = 7" in space
    y, a = torch.randn(33), torch.randn(33)
    want = a + y * y
    assert tuned.function(y, a) is None and torch.allclose(a, want)  # updated in place, nothing returned


def test_tune_refuses_what_it_cannot_declare(tmp_path: Path):
    x = torch.randn(4)
    base = dict(entry="evo_scale", args={"x": x, "alpha": 0.5}, outputs={"out": x}, reference=lambda a: a["x"],
                knobs={"VEC": [1]}, workdir=tmp_path / "w")
    for change, words in [({"entry": "not an identifier"}, "entry"),
                          ({"knobs": {"VEC": []}}, "non-empty list"),
                          ({"args": {"alpha": 0.5}}, "no tensor"),
                          ({"args": {"x": x, "alpha": "a"}}, "args\\['alpha'\\]"),
                          ({"inout": ["y"]}, "inout \\['y'\\]"),
                          ({"shapes": [{"n": 3}]}, "no dims named"),
                          ({"outputs": {}}, "no tensor is written")]:
        with pytest.raises(UserError, match=words):
            evoengineer.tune(SCALE, **{**base, **change})


TWO = r"""
#include <cstdint>
// twice = 2x, square = x * x. UNROLL={{ UNROLL }}
extern "C" int evo_two(const float* x, float* twice, float* square, void* stream) {
  for (int64_t i = 0; i < 24; ++i) { twice[i] = 2.0f * x[i]; square[i] = x[i] * x[i]; }
  return 0;
}
"""


@pytest.mark.slow
def test_two_outputs_return_a_tuple_and_differentiate_through_the_reference(tmp_path: Path, build_cache: Path):
    x = torch.randn(24)
    tuned = evoengineer.tune(TWO, entry="evo_two", args={"x": x}, outputs={"twice": x, "square": x},
                             reference=lambda a: (2 * a["x"].double(), a["x"].double() ** 2), knobs={"UNROLL": [1]},
                             budget=1, workdir=tmp_path / "w", repeats=3, flags=["-O2"], quiet=True)
    twice, square = tuned.function(x)
    assert torch.allclose(twice, 2 * x) and torch.allclose(square, x * x)
    xg = x.clone().requires_grad_()
    t, s = tuned.function(xg)
    (t.sum() + 3 * s.sum()).backward()
    assert torch.allclose(xg.grad, 2 + 6 * x, atol=1e-5)
    xg.grad = None
    _, s = tuned.function(xg)  # a gradient through one output only
    s.sum().backward()
    assert torch.allclose(xg.grad, 2 * x, atol=1e-5)
    c = torch.compile(tuned.function, fullgraph=True)
    t2, s2 = c(x)
    assert torch.allclose(t2, 2 * x) and torch.allclose(s2, x * x)
