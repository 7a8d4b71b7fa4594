"""Per-shape elites without building anything: who wins each timed shape, the elite.json entries, the table the CLI
prints, older files without the key, and how ShapeDispatch picks a kernel for a call."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from evoengineer import elite_json
from evoengineer.store import CandidateRecord


def _space(timed: list[str], untimed: tuple[str, ...] = ("check",)) -> SimpleNamespace:
    shapes = [{"name": n, "N": 1} for n in untimed] + [{"name": n, "N": 1, "time": True} for n in timed]
    return SimpleNamespace(shapes=shapes, name="s", template="t.j2", task="msda", backend="cpu", arch=None,
                           signature={"L": 4}, build_flags=[], cuda_flags=[], ldflags=[], gates={})


def _rec(h: str, status: str = "ok", **p50: float) -> CandidateRecord:
    return CandidateRecord(hash=h, params={"X": h}, status=status, source=f"// {h}",
                           metrics={"time_us": sum(p50.values()),
                                    "shapes": {n: {"p50_us": t} for n, t in p50.items()}})


def test_winners_per_shape_ties_by_hash_and_only_correct_ones():
    recs = [_rec("c", small=1.0, big=50.0), _rec("b", small=2.0, big=30.0), _rec("a", small=1.0, big=40.0),
            _rec("z", "wrong", small=0.1, big=0.1), _rec("y", "ok")]
    won = elite_json.shape_winners(_space(["small", "big"]), recs)
    assert [(n, r.hash) for n, r in won] == [("small", "a"), ("big", "b")]
    assert elite_json.shape_winners(_space(["only"]), recs) is None
    assert elite_json.shape_winners(_space(["small", "big"]), [_rec("w", "wrong", small=1.0)]) == []


def test_document_entries_and_table(tmp_path: Path):
    space = _space(["small", "big"])
    recs = [_rec("a" * 64, small=1.0, big=50.0), _rec("b" * 64, small=2.0, big=30.0)]
    stripped = [CandidateRecord(hash=r.hash, params=r.params, status=r.status, metrics=r.metrics) for r in recs]
    by_hash = {r.hash: r for r in recs}
    shapes = elite_json.shape_elites(space, stripped, by_hash.get, specs={"small": {"N": 1}, "big": {"N": 2}})
    run = SimpleNamespace(id=1, space_path="s.toml", template_sha256="0" * 64, seed=0, config={}, fingerprint={})
    doc = elite_json.build_document(run=run, space=space, elites=[recs[1]], generation=0, evaluations=2,
                                    run_status="finished", shape_elites=shapes)
    small, big = doc["shape_elites"]
    assert (small["shape"], small["hash"], small["p50_us"], small["objective_us"], small["rank"]) == \
        ("small", "a" * 64, 1.0, 51.0, None)
    assert (big["shape"], big["hash"], big["p50_us"], big["rank"], big["shape_spec"]) == ("big", "b" * 64, 30.0, 1,
                                                                                          {"N": 2})
    assert small["source"] == "// " + "a" * 64 and small["source_sha256"] == elite_json.sha256_text(small["source"])
    assert small["build"] == doc["elites"][0]["build"] and not small["certified"]
    table = elite_json.format_shape_table(doc["shape_elites"])
    assert "small" in table and "a" * 12 in table and "30.000" in table and "rank 1" in table
    # written and read back; a file without the key (older, or one timed shape) reads as before
    path = tmp_path / "elite.json"
    elite_json.write_atomic(path, doc)
    assert elite_json.read(path)["shape_elites"] == doc["shape_elites"]
    del doc["shape_elites"]
    elite_json.write_atomic(path, doc)
    assert "shape_elites" not in elite_json.read(path)
    one = elite_json.build_document(run=run, space=_space(["only"]), elites=[], generation=0, evaluations=0,
                                    run_status="running",
                                    shape_elites=elite_json.shape_elites(_space(["only"]), recs, by_hash.get))
    assert "shape_elites" not in one and elite_json.format_shape_table(None) == ""
    doc["shape_elites"] = [{"shape": 3}]
    elite_json.write_atomic(path, doc)
    with pytest.raises(elite_json.UserError, match=r"shape_elites\[0\]"):
        elite_json.read(path)


def test_shape_specs_are_the_parsed_shapes():
    from evoengineer import space_file
    from evoengineer.space.spec import SearchSpace

    text = (space_file("cpu_msda.toml")).read_text().replace("checks = 1\ntime = true", "checks = 1\ntime = true\n"
                                                              "\n[[shapes]]\nname = \"enc\"\nN = 1\nLq = \"S\"\nM = 8"
                                                              "\nD = 32\nP = 4\nlevels = [[4, 5], [2, 3], [1, 2], "
                                                              "[1, 1]]\nref = \"pixels\"\ntime = true\n")
    space = SearchSpace.from_text(text, None)
    specs = elite_json.shape_specs(space)
    assert list(specs) == ["decoder_n2", "enc"]
    assert specs["enc"] == {"N": 1, "Lq": 20 + 6 + 2 + 1, "M": 8, "D": 32, "P": 4,
                            "levels": [[4, 5], [2, 3], [1, 2], [1, 1]], "ref": "pixels"}
    assert specs["decoder_n2"]["Lq"] == 900 and "time" not in specs["decoder_n2"]


def _dispatch(tmp_path: Path, task: str, specs: dict[str, dict]) -> "object":
    from evoengineer.families import op_adapter_for
    from evoengineer.ops.runtime import ShapeDispatch

    rows = []
    for i, (name, spec) in enumerate(specs.items()):
        folder = tmp_path / name
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_text(json.dumps({"build": {"task": task, "signature": {}}}))
        rows.append({"shape": name, "shape_spec": spec, "hash": f"{i:064d}", "p50_us": 1.0, "folder": folder})
    return ShapeDispatch(rows, adapter=op_adapter_for)


def test_dispatch_picks_the_nearest_shape_of_the_same_kind(tmp_path: Path):
    import torch

    lv = [[16, 20], [8, 10], [4, 5], [2, 3]]  # S = 426
    d = _dispatch(tmp_path, "msda", {
        "small": {"N": 1, "Lq": 8, "M": 2, "levels": [[4, 4], [2, 2], [1, 1], [1, 1]]},
        "decoder": {"N": 2, "Lq": 300, "M": 8, "levels": lv},
        "encoder": {"N": 2, "Lq": 426, "M": 8, "levels": lv}})

    def call(N, Lq, M, S):
        return d.choose(torch.empty(N, S, M, 32), torch.empty(4, 2, dtype=torch.long), torch.empty(4),
                        torch.empty(N, Lq, M, 4, 4, 2), torch.empty(N, Lq, M, 4, 4))["shape"]

    assert call(1, 10, 2, 30) == "small"
    assert call(2, 280, 8, 400) == "decoder"
    assert call(2, 400, 8, 400) == "encoder"  # Lq == S: only encoder shapes qualify
    assert call(1, 10, 2, 10) == "encoder"  # however far in sizes
    assert d.choose("not a tensor")["shape"] == "small"  # left to the first kernel's checks
    assert d.choose(value=torch.empty(2, 426, 8, 32), sampling_locations=torch.empty(2, 426, 8, 4, 4, 2))["shape"] \
        == "encoder"
    assert d.ops == {} and d.function.__name__ == "ms_deform_attn"  # nothing built by choosing

    s = _dispatch(tmp_path / "s", "sdpa", {"short": {"B": 8, "H": 16, "Sq": 128, "Sk": 128, "causal": False},
                                           "long": {"B": 1, "H": 16, "Sq": 4096, "Sk": 4096, "causal": False},
                                           "long_causal": {"B": 1, "H": 16, "Sq": 4096, "Sk": 4096, "causal": True}})
    q = torch.empty(2, 16, 3000, 64)
    assert s.choose(q, q, q)["shape"] == "long" and s.choose(q, q, q, is_causal=True)["shape"] == "long_causal"
    assert s.choose(q[:, :, :100], q[:, :, :100], q[:, :, :100], None, 0.0, True)["shape"] == "long_causal"
    assert s.choose(q[:, :, :100], q[:, :, :100], q[:, :, :100])["shape"] == "short"

    k = _dispatch(tmp_path / "d", "decode", {"b8": {"B": 8, "Hq": 32, "Hkv": 8, "Sk": 8192},
                                             "b64": {"B": 64, "Hq": 32, "Hkv": 8, "Sk": 1024, "Sq": 1}})
    assert k.choose(torch.empty(48, 32, 1, 128), torch.empty(48, 8, 2048, 128))["shape"] == "b64"
    assert k.choose(torch.empty(4, 32, 1, 128), torch.empty(4, 8, 16384, 128))["shape"] == "b8"
    paged = _dispatch(tmp_path / "p", "decode", {
        "b8": {"B": 8, "Hq": 32, "Hkv": 8, "Sk": 8192, "page_size": 16},
        "b64": {"B": 64, "Hq": 32, "Hkv": 8, "Sk": 1000, "page_size": 64}})  # Sk: 16 pages of 64 keys
    pool = torch.empty(100, 16, 8, 128)
    assert paged.choose(torch.empty(48, 32, 1, 128), pool, pool, None,
                        block_table=torch.empty(48, 64, dtype=torch.int32))["shape"] == "b64"
    assert paged.choose(torch.empty(4, 32, 1, 128), pool, pool, None,
                        block_table=torch.empty(4, 1024, dtype=torch.int32))["shape"] == "b8"
