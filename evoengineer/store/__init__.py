"""The elite store: SQLAlchemy models and the store API (runs, candidates, elites, checkpoints)."""

from evoengineer.store.store import DEFAULT_URL, CandidateRecord, RunInfo, Store, StoreError

__all__ = ["DEFAULT_URL", "CandidateRecord", "RunInfo", "Store", "StoreError"]
