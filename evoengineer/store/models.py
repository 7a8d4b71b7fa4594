"""SQLAlchemy 2.0 ORM models of the elite store. Only evoengineer.store.store uses them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class SchemaInfo(Base):
    __tablename__ = "schema_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    space_name: Mapped[str] = mapped_column(String(256), index=True)
    space_path: Mapped[str] = mapped_column(Text)
    space_text: Mapped[str] = mapped_column(Text)
    template: Mapped[str] = mapped_column(Text)
    template_sha256: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32), index=True)
    stop_reason: Mapped[str] = mapped_column(Text, default="")
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    candidates: Mapped[list["CandidateRow"]] = relationship(back_populates="run", cascade="all, delete-orphan")


class CandidateRow(Base):
    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("run_id", "hash", name="uq_candidate_run_hash"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    time_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    generation: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="candidates")


class Elite(Base):
    __tablename__ = "elites"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"))


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Proposal(Base):
    """What an asynchronous search proposed, in order, and how many results it had been told by then: with the
    candidates' arrival order (CandidateRow.seq) the whole history its proposals depend on, so a resumed run
    proposes again exactly what it proposed before (search/loop.py)."""

    __tablename__ = "proposals"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64))
    told: Mapped[int] = mapped_column(Integer)  # results told to the strategy before this proposal
    known: Mapped[int] = mapped_column(Integer, default=0)  # 1: answered from the store at once (measured before)


class Lease(Base):
    """Who drives a run now: one row per run being searched or resumed (evoengineer.store.store: acquire_lease)."""

    __tablename__ = "leases"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    token: Mapped[str] = mapped_column(String(64))
    heartbeat: Mapped[float] = mapped_column(Float)  # time.time() of the holder's last sign of life
    acquired: Mapped[float] = mapped_column(Float)
