"""The store API: runs, candidates, elites and checkpoints behind plain dataclasses.

Callers never see SQL or ORM objects, so SQLite and PostgreSQL (any SQLAlchemy URL) are one code path.
Every write is its own committed transaction: a SIGKILL loses at most the evaluation in flight.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from sqlalchemy import bindparam, create_engine, delete, event, func, insert, inspect, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from evoengineer.liveness import STALE_AFTER_S, holder_alive
from evoengineer.status import Status
from evoengineer.store.models import (Base, CandidateRow, Checkpoint, Elite, Lease, Proposal, Run, SchemaInfo,
                                      utcnow)

SCHEMA_VERSION = "1"
DEFAULT_URL = "sqlite:///elite_store/evoengineer.db"
UNFINISHED = ("running", "interrupted")
LEASE_STALE_S = STALE_AFTER_S


class StoreError(Exception):
    """A database URL that cannot be opened, an unknown run id, or a schema mismatch. Always one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclass
class RunInfo:
    id: int
    space_name: str
    space_path: str
    space_text: str
    template: str
    template_sha256: str
    config: dict[str, Any]
    seed: int
    status: str
    stop_reason: str
    fingerprint: dict[str, Any]
    created_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class CandidateRecord:
    hash: str
    params: dict[str, Any]
    status: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    source: str = ""
    seq: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def time_us(self) -> float:
        t = self.metrics.get("time_us")
        return float(t) if self.status == Status.OK and isinstance(t, (int, float)) and math.isfinite(t) else math.inf


def _run_info(r: Run) -> RunInfo:
    return RunInfo(id=r.id, space_name=r.space_name, space_path=r.space_path, space_text=r.space_text,
                   template=r.template, template_sha256=r.template_sha256, config=dict(r.config), seed=r.seed,
                   status=r.status, stop_reason=r.stop_reason or "", fingerprint=dict(r.fingerprint),
                   created_at=r.created_at, finished_at=r.finished_at)


def _cand_record(c: CandidateRow, with_source: bool = True) -> CandidateRecord:
    return CandidateRecord(hash=c.hash, params=dict(c.params), status=c.status, reason=c.reason or "",
                           metrics=dict(c.metrics), generation=c.generation, source=c.source if with_source else "",
                           seq=c.seq, started_at=c.started_at, finished_at=c.finished_at)


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


_Q_CANDIDATE_ID = select(CandidateRow.id).where(CandidateRow.run_id == bindparam("run_id"),
                                                CandidateRow.hash == bindparam("hash"))
_Q_COUNT = select(func.count(CandidateRow.id)).where(CandidateRow.run_id == bindparam("run_id"))
_INSERT_CANDIDATE = insert(CandidateRow)


class Store:
    """Opens (and, with create=True, initialises) the database at `url`."""

    def __init__(self, url: str = DEFAULT_URL, *, create: bool = True):
        self.url = url
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StoreError(f"--db {url!r}: not a database URL (e.g. sqlite:///path/to.db)") from None
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        created_file: Path | None = None  # the SQLite file this call creates: removed again if opening fails
        if self.is_sqlite:
            db = parsed.database
            if db and db != ":memory:":
                path = Path(db)
                if not create and not path.exists():
                    raise StoreError(f"--db {url!r}: database file {db} does not exist")
                if create and not path.parent.exists():
                    if url == DEFAULT_URL:
                        path.parent.mkdir(parents=True, exist_ok=True)
                    else:
                        raise StoreError(f"--db {url!r}: directory {path.parent} does not exist")
                if create and not path.exists():
                    created_file = path
        try:
            self.engine: Engine = create_engine(url, future=True)
        except (ArgumentError, NoSuchModuleError, ImportError) as exc:
            raise StoreError(f"--db {url!r}: cannot open: {exc}") from None
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        try:
            if create:
                self._create_schema(url)
            else:
                tables = set(inspect(self.engine).get_table_names())
                if SchemaInfo.__tablename__ not in tables:
                    self.engine.dispose()
                    raise StoreError(f"--db {url!r}: not an EvoEngineer store (no schema_info table)")
            with self._session() as s:
                row = s.get(SchemaInfo, "version")
        except (SQLAlchemyError, StoreError) as exc:
            self.engine.dispose()
            if created_file is not None:  # no 0-byte (or half-made) database left behind
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{created_file}{suffix}").unlink(missing_ok=True)
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"--db {url!r}: cannot open: {str(exc.orig if hasattr(exc, 'orig') else exc)}") from None
        if row is None or row.value != SCHEMA_VERSION:
            self.engine.dispose()
        if row is None:
            raise StoreError(f"--db {url!r}: not an EvoEngineer store (no schema_info)")
        if row.value != SCHEMA_VERSION:
            raise StoreError(f"--db {url!r}: store schema {row.value}, this version reads {SCHEMA_VERSION}")
        if Proposal.__tablename__ not in set(inspect(self.engine).get_table_names()):
            # a store made before asynchronous searches: the one table it lacks, added (nothing else changes)
            Base.metadata.create_all(self.engine, tables=[Proposal.__table__])

    def _create_schema(self, url: str) -> None:
        """Create the tables (and the version row) unless there; two processes creating one store at once both
        succeed: SQLite takes an exclusive lock for the whole check-and-create, other databases retry once."""
        def create(conn) -> None:
            tables = set(inspect(conn).get_table_names())
            if SchemaInfo.__tablename__ not in tables and tables:
                raise StoreError(f"--db {url!r}: not an EvoEngineer store (no schema_info table)")
            Base.metadata.create_all(conn)
            if conn.scalar(select(SchemaInfo.value).where(SchemaInfo.key == "version")) is None:
                conn.execute(insert(SchemaInfo), [{"key": "version", "value": SCHEMA_VERSION}])

        if self.is_sqlite:
            with self.engine.connect() as conn:
                fresh = not inspect(conn).get_table_names()
            if fresh:
                # WAL is a property of the file, set once when the store is created (never on a database that is
                # not known to be a store: opening one must leave it as it is). Idempotent, so a race is harmless,
                # but SQLite answers "database is locked" at once, without waiting out busy_timeout, when the switch
                # would deadlock with a concurrent creator's exclusive transaction: retried until busy_timeout.
                deadline = time.monotonic() + 30.0
                while True:
                    try:
                        with self.engine.connect() as conn:
                            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                        break
                    except OperationalError as exc:
                        if "locked" not in str(exc) or time.monotonic() > deadline:
                            raise
                        time.sleep(0.02)
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("BEGIN EXCLUSIVE")  # waits (busy_timeout) for a concurrent creator
                try:
                    create(conn)
                except BaseException:
                    conn.exec_driver_sql("ROLLBACK")
                    raise
                conn.exec_driver_sql("COMMIT")
            return
        for attempt in (0, 1):
            try:
                with self.engine.begin() as conn:
                    create(conn)
                return
            except IntegrityError:  # another process created the same rows between our check and insert
                if attempt:
                    raise

    def close(self) -> None:
        self.engine.dispose()

    # ---- leases: one process drives a run ---------------------------------------------------------------------------
    def acquire_lease(self, run_id: int, *, stale_after_s: float | None = None) -> str:
        """Take the run's lease for this process; returns its token. Refuses (StoreError, one line naming the
        holder) while another live process holds it; takes over a lease whose holder is gone (its pid is dead on
        this host) or silent (no heartbeat for `stale_after_s`)."""
        stale_after_s = LEASE_STALE_S if stale_after_s is None else stale_after_s
        Lease.__table__.create(self.engine, checkfirst=True)  # stores made before leases existed
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(10):
            now = time.time()
            token = uuid.uuid4().hex
            with self.engine.connect() as conn:
                row = conn.execute(select(Lease.host, Lease.pid, Lease.token, Lease.heartbeat)
                                   .where(Lease.run_id == run_id)).first()
            if row is None:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(insert(Lease), [{"run_id": run_id, **me, "token": token, "heartbeat": now,
                                                      "acquired": now}])
                    return token
                except IntegrityError:  # someone took it between our look and our insert: look again
                    continue
            if holder_alive(row.host, row.pid, row.heartbeat, stale_after_s):
                ago = max(0.0, now - row.heartbeat)
                raise StoreError(f"run {run_id} is being driven by pid {row.pid} on {row.host} (last heartbeat "
                                 f"{ago:.0f} s ago): wait for it to end or stop it first")
            with self.engine.begin() as conn:  # take over, unless someone else did first
                taken = conn.execute(update(Lease).where(Lease.run_id == run_id, Lease.token == row.token)
                                     .values(**me, token=token, heartbeat=now, acquired=now)).rowcount
            if taken == 1:
                return token
        raise StoreError(f"run {run_id}: could not take the run's lease (other processes keep taking it)")

    def heartbeat(self, run_id: int, token: str) -> bool:
        """Renew this process's lease; False if it is no longer ours (taken over)."""
        with self.engine.begin() as conn:
            return conn.execute(update(Lease).where(Lease.run_id == run_id, Lease.token == token)
                                .values(heartbeat=time.time())).rowcount == 1

    def release_lease(self, run_id: int, token: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(Lease).where(Lease.run_id == run_id, Lease.token == token))

    def lease_holder(self, run_id: int) -> dict[str, Any] | None:
        """{"host", "pid", "heartbeat"} of the run's lease, or None."""
        if Lease.__tablename__ not in inspect(self.engine).get_table_names():
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(Lease.host, Lease.pid, Lease.heartbeat).where(Lease.run_id == run_id)).first()
        return dict(row._mapping) if row else None

    # ---- runs ---------------------------------------------------------------------------------------------------
    def create_run(self, *, space_name: str, space_path: str, space_text: str, template: str, template_sha256: str,
                   config: dict[str, Any], seed: int, fingerprint: dict[str, Any]) -> int:
        with self._session.begin() as s:
            run = Run(space_name=space_name, space_path=space_path, space_text=space_text, template=template,
                      template_sha256=template_sha256, config=config, seed=seed, status="running",
                      stop_reason="", fingerprint=fingerprint)
            s.add(run)
            s.flush()
            return run.id

    def get_run(self, run_id: int) -> RunInfo:
        with self._session() as s:
            r = s.get(Run, run_id)
            if r is None:
                raise StoreError(f"run {run_id} not found in {self.url}")
            return _run_info(r)

    def runs(self) -> list[RunInfo]:
        with self._session() as s:
            return [_run_info(r) for r in s.scalars(select(Run).order_by(Run.id))]

    def latest_unfinished_run(self) -> RunInfo | None:
        with self._session() as s:
            r = s.scalars(select(Run).where(Run.status.in_(UNFINISHED)).order_by(Run.id.desc()).limit(1)).first()
            return _run_info(r) if r else None

    def latest_run(self) -> RunInfo | None:
        with self._session() as s:
            r = s.scalars(select(Run).order_by(Run.id.desc()).limit(1)).first()
            return _run_info(r) if r else None

    def set_run_status(self, run_id: int, status: str, stop_reason: str = "") -> None:
        with self._session.begin() as s:
            r = s.get(Run, run_id)
            if r is None:
                raise StoreError(f"run {run_id} not found in {self.url}")
            r.status = status
            r.stop_reason = stop_reason
            r.finished_at = utcnow() if status == "finished" else None

    # ---- candidates -----------------------------------------------------------------------------------------------
    def record_candidate(self, run_id: int, rec: CandidateRecord) -> None:
        """Commit one evaluation now. A hash already recorded in this run is left as it is."""
        metrics = {k: _finite_or_none(v) for k, v in rec.metrics.items()}
        t = rec.time_us
        # Prebuilt Core statements, not the ORM unit of work: this runs once per evaluation and should cost little.
        try:
            with self.engine.begin() as conn:
                if conn.scalar(_Q_CANDIDATE_ID, {"run_id": run_id, "hash": rec.hash}) is not None:
                    return
                seq = conn.scalar(_Q_COUNT, {"run_id": run_id}) or 0
                conn.execute(_INSERT_CANDIDATE, {
                    "run_id": run_id, "seq": seq, "hash": rec.hash, "params": rec.params, "status": rec.status,
                    "reason": rec.reason, "metrics": metrics, "time_us": t if math.isfinite(t) else None,
                    "generation": rec.generation, "source": rec.source, "started_at": rec.started_at,
                    "finished_at": utcnow()})
        except IntegrityError:
            # another writer recorded this hash between the check and the insert: the first one stands
            if self.find_candidate(run_id, rec.hash) is None:
                raise

    def update_verdict(self, run_id: int, hash_: str, *, status: str, reason: str, metrics: dict[str, Any]) -> None:
        """Change a recorded candidate's status, reason and metrics (a later check, e.g. the sanitizer before it is
        published, overturned or confirmed the measurement)."""
        clean = {k: _finite_or_none(v) for k, v in metrics.items()}
        t = metrics.get("time_us")
        keep_time = status == Status.OK and isinstance(t, (int, float)) and math.isfinite(t)
        with self._session.begin() as s:
            c = s.scalars(select(CandidateRow).where(CandidateRow.run_id == run_id,
                                                     CandidateRow.hash == hash_)).first()
            if c is None:
                raise StoreError(f"candidate {hash_[:12]} is not in run {run_id}")
            c.status, c.reason, c.metrics = status, reason, clean
            c.time_us = float(t) if keep_time else None

    def find_candidate(self, run_id: int, hash_: str) -> CandidateRecord | None:
        with self._session() as s:
            c = s.scalars(select(CandidateRow).where(CandidateRow.run_id == run_id,
                                                     CandidateRow.hash == hash_)).first()
            return _cand_record(c) if c else None

    def candidates(self, run_id: int, *, with_source: bool = False) -> list[CandidateRecord]:
        """All evaluations of a run, in the order they were committed."""
        with self._session() as s:
            rows = s.scalars(select(CandidateRow).where(CandidateRow.run_id == run_id).order_by(CandidateRow.seq))
            return [_cand_record(c, with_source) for c in rows]

    def count_candidates(self, run_id: int) -> int:
        with self._session() as s:
            return s.scalar(select(func.count(CandidateRow.id)).where(CandidateRow.run_id == run_id)) or 0

    def status_counts(self, run_id: int) -> dict[str, int]:
        with self._session() as s:
            rows = s.execute(select(CandidateRow.status, func.count(CandidateRow.id))
                             .where(CandidateRow.run_id == run_id).group_by(CandidateRow.status))
            return {status: n for status, n in rows}

    # ---- elites ---------------------------------------------------------------------------------------------------
    def set_elites(self, run_id: int, hashes: Iterable[str]) -> None:
        """Replace the run's elites with `hashes`, best first (rank 1)."""
        hashes = list(hashes)
        with self.engine.begin() as conn:  # one transaction: a failure leaves the old elites in place
            conn.execute(delete(Elite).where(Elite.run_id == run_id))
            rows = []
            for rank, h in enumerate(hashes, start=1):
                cid = conn.scalar(_Q_CANDIDATE_ID, {"run_id": run_id, "hash": h})
                if cid is None:
                    raise StoreError(f"elite {h[:12]} is not a candidate of run {run_id}")
                rows.append({"run_id": run_id, "rank": rank, "candidate_id": cid})
            if rows:
                conn.execute(insert(Elite), rows)

    def elites(self, run_id: int) -> list[CandidateRecord]:
        with self._session() as s:
            rows = s.execute(select(CandidateRow).join(Elite, Elite.candidate_id == CandidateRow.id)
                             .where(Elite.run_id == run_id).order_by(Elite.rank)).scalars()
            return [_cand_record(c) for c in rows]

    # ---- the proposal log of an asynchronous search ------------------------------------------------------------------
    def record_proposal(self, run_id: int, seq: int, hash_: str, *, told: int, known: bool) -> None:
        """Commit one proposal (before its candidate is submitted)."""
        with self.engine.begin() as conn:
            conn.execute(insert(Proposal), [{"run_id": run_id, "seq": seq, "hash": hash_, "told": told,
                                              "known": int(known)}])

    def proposals(self, run_id: int) -> list[tuple[str, int, bool]]:
        """The run's proposals in order: (hash, results told before it, answered from the store at once)."""
        with self._session() as s:
            rows = s.execute(select(Proposal.hash, Proposal.told, Proposal.known).where(Proposal.run_id == run_id)
                             .order_by(Proposal.seq))
            return [(h, int(t), bool(k)) for h, t, k in rows]

    def clear_proposals(self, run_id: int) -> None:
        """Forget the run's proposals (a resume from scratch proposes anew; what was measured stays)."""
        with self.engine.begin() as conn:
            conn.execute(delete(Proposal).where(Proposal.run_id == run_id))

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    def save_checkpoint(self, run_id: int, generation: int, state: dict[str, Any]) -> None:
        """Store a JSON state for `generation` (replacing one already there)."""
        with self._session.begin() as s:
            old = s.get(Checkpoint, (run_id, generation))
            if old is not None:
                old.state = state
                old.created_at = utcnow()
            else:
                s.add(Checkpoint(run_id=run_id, generation=generation, state=state))

    def latest_checkpoint(self, run_id: int) -> tuple[int, dict[str, Any]] | None:
        with self._session() as s:
            c = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id)
                          .order_by(Checkpoint.generation.desc()).limit(1)).first()
            return (c.generation, dict(c.state)) if c else None


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
