"""The elite store API: runs, candidates, elites, checkpoints; WAL; bad URLs."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from evoengineer.store import CandidateRecord, RunInfo, Store, StoreError
from evoengineer.store.models import CandidateRow

RUN = dict(space_name="toy", space_path="toy_space.toml", space_text="name = 'toy'\n", template="toy.cpp.j2",
           template_sha256="ab" * 32, config={"population": 8, "evaluator": {"kind": "replay"}}, seed=7,
           fingerprint={"cpu": "x", "gpu": None})


def rec(i: int, t: float | None = None, status: str = "ok", gen: int = 0) -> CandidateRecord:
    metrics = {} if t is None else {"time_us": t, "time_p90_us": t * 1.1}
    return CandidateRecord(hash=f"{i:064x}", params={"A": i, "F": i % 2 == 0, "S": "x"}, status=status,
                           reason="" if status == "ok" else "planted", metrics=metrics, generation=gen,
                           source=f"// kernel {i}\n")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 's.db'}")
    yield s
    s.close()


def raw(db: Path, sql: str) -> list:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# ---- runs ---------------------------------------------------------------------------------------------------------
def test_run_round_trip(store: Store):
    rid = store.create_run(**RUN)
    r = store.get_run(rid)
    assert isinstance(r, RunInfo)
    for k, v in RUN.items():
        assert getattr(r, k) == v, k
    assert r.status == "running" and r.stop_reason == "" and r.finished_at is None and r.created_at is not None
    assert [x.id for x in store.runs()] == [rid]
    store.set_run_status(rid, "finished", "budget")
    r = store.get_run(rid)
    assert (r.status, r.stop_reason) == ("finished", "budget") and r.finished_at is not None
    store.set_run_status(rid, "interrupted", "killed")
    assert store.get_run(rid).finished_at is None


def test_unknown_run(store: Store):
    with pytest.raises(StoreError, match="run 42 not found"):
        store.get_run(42)
    with pytest.raises(StoreError, match="run 42 not found"):
        store.set_run_status(42, "finished")


def test_latest_unfinished_and_latest_run(store: Store):
    assert store.latest_unfinished_run() is None and store.latest_run() is None
    a = store.create_run(**RUN)
    b = store.create_run(**RUN)
    c = store.create_run(**RUN)
    assert store.latest_run().id == c
    assert store.latest_unfinished_run().id == c
    store.set_run_status(c, "finished", "generations")
    assert store.latest_unfinished_run().id == b
    store.set_run_status(b, "finished", "budget")
    store.set_run_status(a, "interrupted", "interrupted by user")
    assert store.latest_unfinished_run().id == a
    store.set_run_status(a, "finished", "budget")
    assert store.latest_unfinished_run() is None
    assert store.latest_run().id == c


# ---- candidates ---------------------------------------------------------------------------------------------------
def test_candidates_round_trip_in_commit_order(store: Store):
    rid = store.create_run(**RUN)
    records = [rec(3, 12.5), rec(1, None, "timeout"), rec(2, 9.25, gen=1), rec(4, None, "wrong", gen=1)]
    for r in records:
        store.record_candidate(rid, r)
    got = store.candidates(rid)
    assert [c.hash for c in got] == [r.hash for r in records]
    assert [c.seq for c in got] == [0, 1, 2, 3]
    for g, r in zip(got, records):
        assert (g.params, g.status, g.reason, g.metrics, g.generation) == (r.params, r.status, r.reason, r.metrics,
                                                                           r.generation)
        assert g.source == "" and g.finished_at is not None
    with_src = store.candidates(rid, with_source=True)
    assert [c.source for c in with_src] == [r.source for r in records]
    assert store.find_candidate(rid, records[2].hash).source == records[2].source
    assert store.find_candidate(rid, "f" * 64) is None
    assert store.count_candidates(rid) == 4
    assert store.status_counts(rid) == {"ok": 2, "timeout": 1, "wrong": 1}
    assert got[0].time_us == 12.5 and got[1].time_us == math.inf


def test_non_finite_metrics_stored_as_null(store: Store):
    rid = store.create_run(**RUN)
    store.record_candidate(rid, CandidateRecord(hash="e" * 64, params={}, status="ok",
                                                metrics={"time_us": 5.0, "max_abs_err": math.nan,
                                                         "speedup": math.inf}))
    c = store.find_candidate(rid, "e" * 64)
    assert c.metrics == {"time_us": 5.0, "max_abs_err": None, "speedup": None}


def test_each_candidate_is_committed_at_once(store: Store, tmp_path: Path):
    rid = store.create_run(**RUN)
    for i in range(3):
        store.record_candidate(rid, rec(i, 1.0 + i))
        # another connection (another process, after a SIGKILL) sees it immediately
        assert raw(tmp_path / "s.db", "select count(*) from candidates")[0][0] == i + 1


def test_candidates_unique_per_run_and_hash(store: Store, tmp_path: Path):
    a = store.create_run(**RUN)
    b = store.create_run(**RUN)
    store.record_candidate(a, rec(1, 5.0))
    store.record_candidate(a, rec(1, 99.0, gen=4))  # a repeat is ignored: the first measurement stands
    store.record_candidate(b, rec(1, 7.0))  # same hash, another run: its own row
    assert store.count_candidates(a) == 1 and store.count_candidates(b) == 1
    assert store.find_candidate(a, rec(1).hash).metrics["time_us"] == 5.0
    assert store.find_candidate(b, rec(1).hash).metrics["time_us"] == 7.0
    # the database itself enforces it, too
    with pytest.raises(IntegrityError):
        with store._session.begin() as s:
            s.add(CandidateRow(run_id=a, seq=9, hash=rec(1).hash, params={}, status="ok", reason="", metrics={},
                               generation=0, source=""))


def test_candidates_of_runs_are_separate(store: Store):
    a = store.create_run(**RUN)
    b = store.create_run(**RUN)
    store.record_candidate(a, rec(1, 1.0))
    store.record_candidate(b, rec(2, 2.0))
    store.record_candidate(a, rec(3, 3.0))
    assert [c.hash for c in store.candidates(a)] == [rec(1).hash, rec(3).hash]
    assert [c.seq for c in store.candidates(a)] == [0, 1]
    assert [c.seq for c in store.candidates(b)] == [0]


# ---- elites ---------------------------------------------------------------------------------------------------------
def test_elites_ranked_and_replaced(store: Store):
    rid = store.create_run(**RUN)
    for i, t in enumerate([5.0, 3.0, 4.0, 1.0]):
        store.record_candidate(rid, rec(i, t))
    assert store.elites(rid) == []
    store.set_elites(rid, [rec(3).hash, rec(1).hash, rec(2).hash])
    e = store.elites(rid)
    assert [x.hash for x in e] == [rec(3).hash, rec(1).hash, rec(2).hash]  # rank order, as given
    assert [x.metrics["time_us"] for x in e] == [1.0, 3.0, 4.0]
    assert e[0].source == "// kernel 3\n"
    store.set_elites(rid, [rec(0).hash])
    assert [x.hash for x in store.elites(rid)] == [rec(0).hash]
    store.set_elites(rid, [])
    assert store.elites(rid) == []


def test_elites_must_be_candidates_of_the_run(store: Store):
    a = store.create_run(**RUN)
    b = store.create_run(**RUN)
    store.record_candidate(a, rec(1, 1.0))
    store.record_candidate(b, rec(2, 2.0))
    store.set_elites(a, [rec(1).hash])
    with pytest.raises(StoreError, match="not a candidate of run"):
        store.set_elites(a, [rec(2).hash])
    assert [x.hash for x in store.elites(a)] == [rec(1).hash]  # the failed replacement changed nothing
    store.set_elites(b, [rec(2).hash])
    assert [x.hash for x in store.elites(a)] == [rec(1).hash]


# ---- checkpoints ----------------------------------------------------------------------------------------------------
def test_checkpoints_json_round_trip(store: Store):
    rid = store.create_run(**RUN)
    assert store.latest_checkpoint(rid) is None
    state = {"strategy": "ga", "generation": 0, "population": [[0, 1, 2], [2, 1, 0]], "hall_of_fame": [[0, 1, 2]],
             "logbook": [{"gen": 0, "evals": 2, "best": 1.5, "median": None}],
             "rng": [3, list(range(625)), None], "nested": {"a": [True, False, "x", 1.25]}}
    store.save_checkpoint(rid, 0, state)
    assert store.latest_checkpoint(rid) == (0, state)
    state1 = {**state, "generation": 1, "population": [[1, 1, 1]]}
    store.save_checkpoint(rid, 1, state1)
    assert store.latest_checkpoint(rid) == (1, state1)
    state1b = {**state1, "population": [[2, 2, 2]]}
    store.save_checkpoint(rid, 1, state1b)  # replaced, not duplicated
    assert store.latest_checkpoint(rid) == (1, state1b)
    other = store.create_run(**RUN)
    assert store.latest_checkpoint(other) is None


def test_store_reopens(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = Store(url)
    rid = s.create_run(**RUN)
    s.record_candidate(rid, rec(1, 2.0))
    s.save_checkpoint(rid, 0, {"x": [1]})
    s.close()
    s2 = Store(url, create=False)
    assert s2.get_run(rid).space_name == "toy"
    assert [c.hash for c in s2.candidates(rid)] == [rec(1).hash]
    assert s2.latest_checkpoint(rid) == (0, {"x": [1]})
    s2.close()


def test_in_memory_store():
    s = Store("sqlite://")
    rid = s.create_run(**RUN)
    s.record_candidate(rid, rec(1, 2.0))
    assert s.count_candidates(rid) == 1


# ---- SQLite settings ------------------------------------------------------------------------------------------------
def test_sqlite_wal_mode(store: Store, tmp_path: Path):
    assert raw(tmp_path / "s.db", "pragma journal_mode")[0][0] == "wal"
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("pragma journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("pragma foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("pragma busy_timeout").scalar() >= 1000


# ---- bad URLs -------------------------------------------------------------------------------------------------------
def _one_line_error(url: str, **kw) -> str:
    with pytest.raises(StoreError) as ei:
        Store(url, **kw)
    msg = str(ei.value)
    assert msg and "\n" not in msg
    assert url in msg
    return msg


def test_not_a_url(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "not a database URL" in _one_line_error("notaurl")
    assert "not a database URL" in _one_line_error("")
    assert list(tmp_path.iterdir()) == []


def test_unknown_dialect():
    assert "cannot open" in _one_line_error("nosuchdb://host/x")


def test_missing_directory(tmp_path: Path):
    msg = _one_line_error("sqlite:////nonexistent/dir/x.db")
    assert "/nonexistent/dir" in msg and "does not exist" in msg
    assert not Path("/nonexistent").exists()
    _one_line_error(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    assert list(tmp_path.iterdir()) == []


def test_postgresql_without_driver_or_server():
    # No driver installed: an ImportError inside SQLAlchemy. A driver but no server: a connection error.
    # Either way one StoreError line, not a traceback.
    msg = _one_line_error("postgresql://evo:secret@127.0.0.1:1/evo")
    assert "cannot open" in msg
    _one_line_error("postgresql+psycopg2://evo@127.0.0.1:1/evo")
    _one_line_error("mysql://evo@127.0.0.1:1/evo")


def test_postgresql_unreachable_message_is_one_line():
    """Server errors from real drivers span lines ("...failed\\n\\tIs the server running..."): still one line."""
    e = StoreError("--db 'postgresql://x': cannot open: connection to server at \"127.0.0.1\", port 1 failed: "
                   "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?\n")
    assert "\n" not in str(e) and "\t" not in str(e) and str(e).endswith("connections?")


def test_create_false_on_missing_file_creates_nothing(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    msg = _one_line_error(url, create=False)
    assert "does not exist" in msg
    assert list(tmp_path.iterdir()) == []


def test_not_a_database_file(tmp_path: Path):
    p = tmp_path / "x.db"
    p.write_text("this is not sqlite " * 100)
    before = p.read_bytes()
    for create in (False, True):
        _one_line_error(f"sqlite:///{p}", create=create)
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["x.db"]


def test_other_sqlite_database_is_not_a_store(tmp_path: Path):
    p = tmp_path / "other.db"
    con = sqlite3.connect(p)
    con.execute("create table t (x)")
    con.commit()
    con.close()
    for create in (False, True):
        assert "not an EvoEngineer store" in _one_line_error(f"sqlite:///{p}", create=create)
    assert raw(p, "select name from sqlite_master") == [("t",)]  # untouched: no tables added
    assert raw(p, "pragma journal_mode")[0][0] == "delete"  # journal mode left as it was


def test_schema_version_mismatch(tmp_path: Path):
    p = tmp_path / "s.db"
    Store(f"sqlite:///{p}").close()
    con = sqlite3.connect(p)
    con.execute("update schema_info set value = '99' where key = 'version'")
    con.commit()
    con.close()
    assert "schema 99" in _one_line_error(f"sqlite:///{p}", create=False)


def test_concurrent_duplicate_insert_keeps_the_first(store: Store, monkeypatch):
    """A second writer racing on the same hash: the unique constraint trips, and the first record stands."""
    import evoengineer.store.store as st

    rid = store.create_run(**RUN)
    store.record_candidate(rid, rec(1, 5.0))
    monkeypatch.setattr(st, "_Q_CANDIDATE_ID", st.select(st.CandidateRow.id).where(st.CandidateRow.id < 0))
    store.record_candidate(rid, rec(1, 9.0))  # the existence check now misses it; the insert conflicts
    assert store.count_candidates(rid) == 1
    assert store.find_candidate(rid, rec(1).hash).metrics["time_us"] == 5.0
