"""Leases (rule 1): claim, targeted takeover, renew, release.

Invariants (enforced by the fencecheck.* functions these call):
- a lease is granted only when free or expired by database time, and every
  grant is epoch + 1;
- renew succeeds only while owner AND epoch match AND the lease is unexpired;
- release keeps the epoch;
- a zero-row answer is reported with its cause (missing, held, not_due,
  paused, terminal, lost, expired) and is never a task failure.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from reference_impl import db, metrics
from reference_impl.db import Conn
from reference_impl.queries import Queries

# lease_acquire_total outcome label for each database outcome.
_ACQUIRE_LABEL = {
    "acquired": "success",
    "held": "busy",
    "not_due": "busy",
    "none": "busy",
    "missing": "missing",
    "terminal": "terminal",
    "paused": "paused",
}


@dataclass(frozen=True)
class Lease:
    """Proof of ownership to present with every protected write."""

    run_id: uuid.UUID
    owner: str
    epoch: int


@dataclass(frozen=True)
class Grant:
    """Answer of claim / takeover; ``lease`` only when ``outcome == 'acquired'``."""

    outcome: str
    run_id: uuid.UUID | None
    owner: str | None
    epoch: int | None
    revision: int | None
    status: str | None
    lease_expires_at: datetime | None
    previous_owner: str | None
    expired_for_ms: float | None
    lock_wait_ms: float | None

    @property
    def acquired(self) -> bool:
        return self.outcome == "acquired"

    @property
    def lease(self) -> Lease:
        if not self.acquired or self.run_id is None or self.owner is None or self.epoch is None:
            raise ValueError(f"no lease was granted (outcome {self.outcome})")
        return Lease(self.run_id, self.owner, self.epoch)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Grant:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Renewal:
    outcome: str  # renewed | lost | expired | missing | terminal
    lease_expires_at: datetime | None

    @property
    def ok(self) -> bool:
        return self.outcome == "renewed"


class Leases:
    """The lease statements, by name (a mutant may swap one)."""

    def __init__(self, queries: Queries) -> None:
        self.q = queries

    def claim(self, conn: Conn, owner: str, ttl_ms: int) -> Grant:
        """Claim any runnable run (SKIP LOCKED); outcome ``none`` when nothing is claimable."""
        try:
            row = db.execute(
                conn, self.q.sql("claim"), {"owner": owner, "ttl_ms": ttl_ms}, dict_row
            ).fetchone()
        except psycopg.Error:
            metrics.lease_acquire_total.labels("db_error").inc()
            raise
        grant = (
            Grant.from_row(row)
            if row
            else Grant("none", None, owner, None, None, None, None, None, None, None)
        )
        self._observe(grant)
        return grant

    def takeover(self, conn: Conn, run_id: uuid.UUID, owner: str, ttl_ms: int) -> Grant:
        """Take over one run, waiting for its row lock; outcome says why when refused."""
        try:
            row = conn.execute(
                self.q.sql("takeover"), {"run_id": run_id, "owner": owner, "ttl_ms": ttl_ms}
            ).fetchone()
        except psycopg.Error:
            metrics.lease_acquire_total.labels("db_error").inc()
            raise
        assert row is not None  # the function always returns one row
        grant = Grant.from_row(row)
        if grant.lock_wait_ms is not None:
            metrics.lease_row_lock_wait_seconds.observe(grant.lock_wait_ms / 1000.0)
        self._observe(grant)
        return grant

    def renew(self, conn: Conn, lease: Lease, ttl_ms: int) -> Renewal:
        row = db.execute(
            conn,
            self.q.sql("renew"),
            {"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch, "ttl_ms": ttl_ms},
            dict_row,
        ).fetchone()
        assert row is not None
        return Renewal(str(row["outcome"]), row["lease_expires_at"])

    def release(self, conn: Conn, lease: Lease) -> str:
        """``released`` or why not (lost, expired is still releasable, missing, terminal)."""
        row = conn.execute(
            self.q.sql("release"),
            {"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch},
        ).fetchone()
        assert row is not None
        return str(row["outcome"])

    @staticmethod
    def _observe(grant: Grant) -> None:
        metrics.lease_acquire_total.labels(_ACQUIRE_LABEL.get(grant.outcome, "busy")).inc()
        if grant.outcome == "held":
            metrics.lease_claim_conflicts_total.inc()
        if grant.acquired and grant.expired_for_ms is not None:
            metrics.workflow_takeover_duration_seconds.observe(grant.expired_for_ms / 1000)
