"""The SDPA binding and task end to end without a GPU: a test-only plain C++ kernel (tests/data/sdpa_cpu) built
through the family binding, checked by the real worker (tails, causal, planted faults, the FP8-vs-fp16 check), and
the binding's argument validation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from conftest import build_candidate
from evoengineer.candidate import CandidateFactory
from evoengineer.space import load_space

DATA = Path(__file__).resolve().parents[1] / "data" / "sdpa_cpu"
SIG = 'Q_DTYPE = "float16"\nKV_DTYPE = "float16"'


def _space(tmp_path: Path, sig: str = SIG, timed_extra: str = ""):
    text = (DATA / "sdpa_cpu_space.toml").read_text()
    timed = "checks = 1\ntime = true"
    assert SIG in text and timed in text
    text = text.replace(SIG, sig).replace(timed, "time = true" + timed_extra if timed_extra else timed)
    (tmp_path / "sdpa.cpp.j2").write_text((DATA / "sdpa.cpp.j2").read_text())
    shutil.copy(DATA.parent / "cpu_attention_dtypes.inc.j2", tmp_path)
    (tmp_path / "space.toml").write_text(text)
    return load_space(tmp_path / "space.toml")


def _evaluate(space, faults, build_cache: Path) -> dict:
    from evoengineer.evaluators.local import LocalEvaluator

    factory = CandidateFactory(space)
    with LocalEvaluator(space, cache_dir=build_cache, build_jobs=2) as ev:
        return {c.params["FAULT"]: m for c, m in ev.evaluate_many([factory.make({"FAULT": f}) for f in faults])}


def test_fp16_kernel_and_planted_faults(tmp_path: Path, build_cache: Path):
    got = _evaluate(_space(tmp_path), ["none", "ignore_causal", "drop_tail_key"], build_cache)
    ok = got["none"]
    assert ok.status == "ok", ok.reason
    assert ok.metrics["max_abs_err"] < 4e-3 and 0 < ok.metrics["rmse"] < 1e-3
    assert ok.metrics["baseline"] == "sdpa" and ok.metrics["speedup"] > 0
    assert ok.metrics["shapes"]["timed"]["gflops"] > 0 and "fp8_vs_fp16_max_abs_err" not in ok.metrics
    assert got["ignore_causal"].status == "wrong" and "causal" in got["ignore_causal"].reason
    assert got["drop_tail_key"].status == "wrong" and "max abs err" in got["drop_tail_key"].reason


def test_bf16_kernel(tmp_path: Path, build_cache: Path):
    got = _evaluate(_space(tmp_path, 'Q_DTYPE = "bfloat16"\nKV_DTYPE = "bfloat16"'), ["none"], build_cache)
    assert got["none"].status == "ok", got["none"].reason
    assert got["none"].metrics["max_abs_err"] < 3e-2


@pytest.mark.parametrize("bound", [0.1, 0.002])
def test_fp8_kv_kernel_is_checked_twice(tmp_path: Path, build_cache: Path, bound: float):
    """Tight against the dequantized reference; on the timed shape also against fp16 SDPA on the unquantized K/V,
    with the metrics recorded. A bound below what e4m3 rounding of the inputs costs by itself does not fail a right
    kernel (it may add no more than the dtype tolerance to that); a wrong output is caught in test_sdpa_task."""
    space = _space(tmp_path, 'Q_DTYPE = "float16"\nKV_DTYPE = "float8_e4m3"',
                   f"\nchecks = 2\nfresh = true\nfp16_max_abs_err = {bound}")
    m = _evaluate(space, ["none"], build_cache)["none"]
    assert m.status == "ok", m.reason
    assert m.metrics["max_abs_err"] < 4e-3
    assert 0 < m.metrics["fp8_vs_fp16_rmse"] < m.metrics["fp8_vs_fp16_max_abs_err"]
    err, floor = m.metrics["fp8_vs_fp16_max_abs_err"], m.metrics["fp8_quantization_max_abs_err"]
    assert err <= bound or (floor > bound and err <= floor + 4e-3)


def test_binding_validates_its_arguments(tmp_path: Path, build_cache: Path):
    from evoengineer.families.sdpa.task import SDPAShape

    task, mod = build_candidate(_space(tmp_path), {"FAULT": "none"}, build_cache, jobs=1)
    inputs = task.make_inputs(SDPAShape("x", B=2, H=3, Sq=5, Sk=7), 0)
    q, k, v, ks, vs = (inputs[n] for n in ("q", "k", "v", "k_scale", "v_scale"))
    out = task.new_output(inputs)
    assert mod.forward(q, k, v, ks, vs, out, False, 0.125) == 0 and not out.isnan().any()
    cases = [
        ((q[0], k, v, ks, vs, out), "q: expected 4 dimensions"),
        ((q.float(), k, v, ks, vs, out), "q: dtype float32, but this kernel was compiled for float16"),
        ((q, k, v, ks, vs, out.bfloat16()), "out: dtype"),
        ((q, k.bfloat16(), v.bfloat16(), ks, vs, out), "k: dtype bfloat16, but this kernel was compiled for float16"),
        ((q.bfloat16(), k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), ks, vs, out.bfloat16()),
         "q: dtype bfloat16, but this kernel was compiled for float16"),
        ((q, k, v.float(), ks, vs, out), "v: dtype"),
        ((q, k, v, ks.double(), vs, out), "must be float32"),
        ((q, k, v, ks[:2], vs, out), "k_scale, v_scale: expected [H]"),
        ((q, k, v[:, :, :6].contiguous(), ks, vs, out), "v: expected the shape of k"),
        ((q, k[:1], v[:1], ks, vs, out), "k: expected [B, H, Sk, D]"),
        ((q, k, v, ks, vs, out[:, :, :4]), "out: must be contiguous"),
        ((q, k, v, ks, vs, out[:, :, :4].contiguous()), "out: expected the shape of q"),
        ((q.transpose(2, 3), k, v, ks, vs, out), "q: must be contiguous"),
        ((q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous(), ks, vs,
          out[..., :32].contiguous()), "q: head dim 32 \\(size 3\\), but this kernel was compiled for head dim 64"),
    ]
    for args, msg in cases:
        with pytest.raises((ValueError, TypeError), match=msg.replace("[", r"\[")):
            mod.forward(*args, False, 0.125)
    empty = torch.empty(2, 3, 0, 64, dtype=torch.float16)
    assert mod.forward(empty, k, v, ks, vs, empty.clone(), True, 0.125) == 0
