"""The family bindings refuse inputs their kernel was not compiled for (the search's own modules; the exported ops
use the same bindings): a ValueError / TypeError naming the argument and both values, never a wrong result, an
unwritten output or a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import build_candidate
from evoengineer import space_file
from evoengineer.space import load_space
from evoengineer.families.msda.task import MSDAShape, reference


@pytest.fixture(scope="module")
def msda(build_cache_module):
    space = load_space(space_file("cpu_msda.toml"))
    return build_candidate(space, space.valid_genomes()[0], build_cache_module, jobs=1)


@pytest.fixture(scope="module")
def build_cache_module(tmp_path_factory):
    import os

    given = os.environ.get("EVOENGINEER_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("evocache")


def _inputs(task, **kw):
    base = dict(name="x", N=2, Lq=7, M=3, D=32, P=4, levels=((5, 6), (3, 3), (2, 2), (1, 1)))
    base.update(kw)
    return task.make_inputs(MSDAShape(**base), 1)


def _call(mod, inp, out=None):
    keys = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")
    if out is None:
        v, loc = inp["value"], inp["sampling_locations"]
        out = torch.full((v.shape[0], loc.shape[1], v.shape[2] * v.shape[3]), float("nan"), dtype=v.dtype)
    return mod.forward(*(inp[k] for k in keys), out), out


def test_signature_is_visible_and_right_inputs_work(msda):
    task, mod = msda
    assert mod.signature == {"L": "4", "P": "4", "D": "32", "VALUE_DTYPE": "float32"}
    inp = _inputs(task)
    rc, out = _call(mod, inp)
    assert rc == 0 and torch.allclose(out.double(), reference(inp, dtype=torch.float64), atol=1e-4)


# the misuse a new user tried on the CPU MSDA elite (compiled L=4, P=4, D=32): all refused now
MISUSE = {
    "P=8": (dict(P=8), "sampling_locations: P = 8 points (size 4), but this kernel was compiled for P = 4"),
    "P=2": (dict(P=2), "sampling_locations: P = 2 points (size 4), but this kernel was compiled for P = 4"),
    "D=64": (dict(D=64), "value: head dim D = 64 (size 3), but this kernel was compiled for D = 32"),
    "D=16": (dict(D=16), "value: head dim D = 16 (size 3), but this kernel was compiled for D = 32"),
    "M=1,D=4": (dict(M=1, D=4), "value: head dim D = 4 (size 3), but this kernel was compiled for D = 32"),
    "L=3": (dict(levels=((5, 6), (3, 3), (2, 2))), "sampling_locations: L = 3 levels (size 3), but this kernel was "
                                                    "compiled for L = 4"),
}


@pytest.mark.parametrize("case", list(MISUSE), ids=list(MISUSE))
def test_msda_inputs_outside_the_signature_are_refused(msda, case):
    task, mod = msda
    kw, msg = MISUSE[case]
    inp = _inputs(task, **kw)
    with pytest.raises(ValueError) as e:
        _call(mod, inp)
    assert msg in str(e.value)


def test_msda_tensors_must_agree(msda):
    task, mod = msda
    inp = _inputs(task)
    bad = [
        (dict(value=inp["value"].half()), TypeError, "value: dtype float16, but this kernel was compiled for float32"),
        (dict(value=inp["value"].double()), TypeError, "value: dtype float64"),
        (dict(sampling_locations=inp["sampling_locations"].double()), TypeError, "sampling_locations: dtype float64"),
        (dict(spatial_shapes=inp["spatial_shapes"].int()), TypeError, "spatial_shapes: dtype int32, expected int64"),
        (dict(value=inp["value"].transpose(1, 2)), ValueError, "value: must be contiguous"),
        (dict(attention_weights=inp["attention_weights"][:, :5].contiguous()), ValueError, "attention_weights: size 1 "
                                                                             "(Lq, from sampling_locations) is 5"),
        (dict(sampling_locations=inp["sampling_locations"][:1].contiguous()), ValueError, "sampling_locations: size 0 (N, from "
                                                                            "value) is 1, expected 2"),
        (dict(level_start_index=inp["level_start_index"][:3].contiguous()), ValueError, "level_start_index: size 0 (L) is 3"),
        (dict(value=torch.cat([inp["value"], inp["value"][:, :1]], dim=1)), ValueError,
         "value: S = 45 positions, but the levels of spatial_shapes hold 44 (the sum of H * W)"),
        (dict(value=inp["value"][:, :-1].contiguous()), ValueError,
         "value: S = 43 positions, but levels 0..3 of spatial_shapes already hold more"),
        # a wrong spatial_shapes is named as such, not as the level_start_index that no longer matches it
        (dict(spatial_shapes=torch.tensor([[5, 7], [3, 3], [2, 2], [1, 1]])), ValueError,
         "value: S = 44 positions, but levels 0..2 of spatial_shapes already hold more"),
        (dict(spatial_shapes=torch.tensor([[5, 5], [3, 3], [2, 2], [1, 1]])), ValueError,
         "value: S = 44 positions, but the levels of spatial_shapes hold 39"),
        (dict(spatial_shapes=torch.tensor([[5, 6], [3, 3], [2, 2], [0, 1]])), ValueError,
         "spatial_shapes[3] = (0, 1): H and W must be at least 1"),
        (dict(level_start_index=torch.tensor([0, 30, 39, 44])), ValueError,
         "level_start_index[3] = 44, expected 43"),
        (dict(spatial_shapes=torch.tensor([[50, 60], [3, 3], [2, 2], [1, 1]])), ValueError,
         "value: S = 44 positions, but levels 0..0 of spatial_shapes already hold more"),
    ]
    for change, kind, msg in bad:
        with pytest.raises(kind) as e:
            _call(mod, {**inp, **change})
        assert msg in str(e.value), (msg, str(e.value))
    out = torch.full((2, 7, 96), float("nan"))
    with pytest.raises(ValueError, match="output: size 2 \\(M \\* D\\) is 95, expected 96"):
        _call(mod, inp, out[..., :95].contiguous())
    with pytest.raises(TypeError, match="output: dtype float64, expected float32"):
        _call(mod, inp, out.double())


def test_level_checks_follow_in_place_changes(msda):
    """The index tensors are read back once while unchanged; an in-place change is seen."""
    task, mod = msda
    inp = _inputs(task)
    assert _call(mod, inp)[0] == 0
    assert _call(mod, inp)[0] == 0
    inp["level_start_index"][3] = 44
    with pytest.raises(ValueError, match="level_start_index\\[3\\] = 44"):
        _call(mod, inp)


def test_level_checks_with_alternating_index_tensors(msda):
    """Callers alternate index tensors (the timing loop's input sets, a model's layers): several are remembered as
    checked (no read-back, a device sync on a GPU, on every call), and an in-place change to any of them is still
    seen, also once more tensors went through than are remembered."""
    task, mod = msda
    inp = _inputs(task)
    sets = [{**inp, "spatial_shapes": inp["spatial_shapes"].clone(),
             "level_start_index": inp["level_start_index"].clone()} for _ in range(20)]
    for _ in range(2):
        for s in sets:
            assert _call(mod, s)[0] == 0
    sets[0]["level_start_index"][3] = 44  # remembered long ago (20 tensors since): checked again
    sets[19]["level_start_index"][3] = 44  # remembered last
    for s in (sets[19], sets[0]):
        with pytest.raises(ValueError, match="level_start_index\\[3\\] = 44"):
            _call(mod, s)
    assert _call(mod, sets[5])[0] == 0


def test_head_major_value_needs_a_kernel_that_reads_it(msda):
    """forward_head_major takes value as [N, M, S, D]; its sizes are checked in that order, and a kernel that reads
    [N, S, M, D] only (the CPU family) refuses it with one clear line instead of reading the wrong rows."""
    task, mod = msda
    inp = _inputs(task)
    keys = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")
    out = torch.full((2, 7, 96), float("nan"))
    args = {**inp, "value": inp["value"].transpose(1, 2).contiguous()}
    with pytest.raises(ValueError, match=r"reads value as \[N, S, M, D\] only"):
        mod.forward_head_major(*(args[k] for k in keys), out)
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match="sampling_locations: size 2 \\(M, from value\\) is 3, expected 44"):
        mod.forward_head_major(*(inp[k] for k in keys), out)  # [N, S, M, D] given where [N, M, S, D] is expected
