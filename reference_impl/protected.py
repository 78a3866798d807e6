"""Protected writes (rules 2, 3, 9): the only way workflow state changes.

One short READ COMMITTED transaction locks the lease row, validates owner +
epoch + unexpired (database time), CASes the revision, applies the
transition's ledger change and inserts the checkpoint and outbox rows. It
never contains a network call other than to PostgreSQL.

Two shapes, same checks, same outcomes:
- fast path (no harness): ``fencecheck.protected_write_fast`` in one
  autocommit round trip; a checkpoint locks the row by its UPDATE (owner,
  epoch, revision in the WHERE, expiry judged after the lock), anything
  else, and a checkpoint that matched nothing, runs the lock-first code with
  the same checks inline (migrations 006, 007); run as a
  ``db.LibpqStatement`` (prepared once per connection, text parameters, no
  cursor);
- stepped path (``FENCECHECK_WRITE_PATH=stepped``, which the harness sets
  only for experiments that need a point inside the write's transaction):
  BEGIN; lock_lease; point
  ``after_lease_row_locked``; protected_write (calls lock_lease again: the
  re-lock is a no-op, it re-validates); point ``before_commit``; COMMIT. The
  row lock is held from lock_lease to COMMIT, so a takeover waits at the
  barrier (experiment D). Mutants that overlay ``lock_lease`` or
  ``protected_write`` change this path; the rest of the matrix runs the
  fast path, as production does.

Invariants:
- a commit whose outcome is unknown is read back by its event_id before
  anything else: checkpoint and outbox row both present = committed, both
  absent = retried with the SAME input (same event_id), one present =
  CommitInconsistent (freeze and alert);
- a COMMIT answered with a WARNING (the cancelled wait for synchronous
  replication) is never a durable success: CommitOutcomeUnknown; nor is a
  commit found by read-back where commits wait for a synchronous standby
  (the lost answer may have been the standby's: H[sync_terminated_wait]);
- 40001/40P01 retry the whole transaction within a budget.
"""

from __future__ import annotations

import enum
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from harness import injection
from reference_impl import db, metrics
from reference_impl import errors as e
from reference_impl.db import Conn, Notice, Session
from reference_impl.ids import canonical_hash, canonical_json, new_event_id
from reference_impl.leases import Lease
from reference_impl.logs import log
from reference_impl.queries import Queries
from reference_impl.sqlstate import is_retryable_conflict, outcome_unknown, protocol_error

_log = logging.getLogger("reference_impl.protected")

TRANSITIONS = (
    "start",
    "checkpoint",
    "intent",
    "tool_result",
    "succeed",
    "fail",
    "freeze",
    "pause_human",
    "requeue",
)

_REJECT_REASON: dict[type[e.ProtocolError], str] = {
    e.LeaseLost: "lease",
    e.RunNotFound: "lease",
    e.RevisionConflict: "revision",
    e.StateConflict: "state",
    e.IntentConflict: "ledger",
    e.LedgerConflict: "ledger",
}


@dataclass(frozen=True)
class Write:
    """One protected write. Reuse the same object (same event_id) to retry it."""

    lease: Lease
    expected_revision: int
    transition: str
    state: dict[str, Any]
    schema_version: int
    event_type: str
    payload: dict[str, Any]
    current_step: str | None = None
    effect: dict[str, Any] | None = None
    event_id: uuid.UUID = field(default_factory=new_event_id)

    def params(self) -> dict[str, Any]:
        # One JSON encoding of the state: its canonical text is both what is
        # hashed and what is sent as the jsonb argument.
        state = canonical_json(self.state)
        return {
            "run_id": self.lease.run_id,
            "owner": self.lease.owner,
            "epoch": self.lease.epoch,
            "expected_revision": self.expected_revision,
            "transition": self.transition,
            "state": Jsonb(state, dumps=_encoded),
            "state_hash": canonical_hash(state),
            "schema_version": self.schema_version,
            "current_step": self.current_step,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "payload": Jsonb(self.payload),
            "effect": Jsonb(self.effect) if self.effect is not None else None,
        }


@dataclass(frozen=True)
class Written:
    """A committed protected write."""

    revision: int
    status: str
    event_id: uuid.UUID
    ledger_status: str | None = None
    lock_wait_ms: float | None = None
    read_back: bool = False


def _encoded(text: str) -> str:
    """``dumps`` of a Jsonb whose object is already JSON text."""
    return text


class ReadBack(enum.Enum):
    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    INCONSISTENT = "inconsistent"


class _CommitUnknown(Exception):
    """The statement carrying COMMIT failed without a server verdict."""


class ProtectedWriter:
    """Runs protected writes on one session (one thread)."""

    def __init__(
        self,
        session: Session,
        queries: Queries,
        *,
        stepped: bool | None = None,
        serialization_budget: int = 5,
        unknown_budget: int = 2,
        readback_budget_s: float = 5.0,
    ) -> None:
        self.session = session
        self.q = queries
        self.stepped = stepped if stepped is not None else stepped_from_env()
        self.serialization_budget = serialization_budget
        self.unknown_budget = unknown_budget
        # A commit whose outcome is unknown usually coincides with a network
        # fault: keep asking for a few seconds before giving up as unknown.
        self.readback_budget_s = readback_budget_s
        self._fast_cache: tuple[str, db.LibpqStatement] | None = None

    # ------------------------------------------------------------ public
    def write(self, w: Write) -> Written:
        """Commit ``w`` or raise why not (LeaseLost, RevisionConflict, ...)."""
        if w.transition not in TRANSITIONS:
            raise ValueError(f"unknown transition {w.transition!r}")
        unknown_left = self.unknown_budget
        serial_left = self.serialization_budget
        started = time.perf_counter()
        while True:
            try:
                written = self._attempt(w)
                metrics.checkpoint_commit_latency_seconds.labels(w.transition).observe(
                    time.perf_counter() - started
                )
                return written
            except _CommitUnknown as exc:
                if unknown_left <= 0:
                    raise e.CommitOutcomeUnknown(f"commit outcome unknown: {exc}") from exc
                unknown_left -= 1
                result = self.resolve_unknown(w, exc)
                if result is not None:
                    return result
                # Not committed: retry with the same input, same event_id.
            except psycopg.Error as exc:
                if is_retryable_conflict(exc) and serial_left > 0:
                    serial_left -= 1
                    continue
                if is_retryable_conflict(exc):
                    raise e.SerializationBudgetExceeded() from exc
                perr = protocol_error(exc)
                if perr is None:
                    raise
                reason = _REJECT_REASON.get(type(perr))
                if reason:
                    metrics.protected_write_rejected_total.labels(reason).inc()
                if isinstance(perr, e.LeaseLost):
                    metrics.stale_fence_rejections_total.inc()
                raise perr from exc

    def resolve_unknown(self, w: Write, cause: BaseException) -> Written | None:
        """Rule 9: decide an unknown commit by reading back its event_id.

        Returns the committed write, None when nothing committed (the caller
        retries the same input), or raises CommitInconsistent.
        """
        outcome = self.read_back(w)
        metrics.commit_outcome_unknown_total.labels(outcome.value).inc()
        log(
            _log,
            logging.WARNING,
            "commit outcome unknown, read back",
            run_id=str(w.lease.run_id),
            owner=w.lease.owner,
            epoch=w.lease.epoch,
            revision=w.expected_revision + 1,
            event_id=str(w.event_id),
            resolution=outcome.value,
            cause=repr(cause),
        )
        if outcome is ReadBack.COMMITTED:
            # Committed on this primary; under synchronous replication the
            # lost answer may have been the standby's wait (its backend ended
            # while waiting): durability is not known, so neither is success.
            waits = self.session.conn.execute(self.q.sql("commits_wait_for_standby")).fetchone()
            if waits is not None and waits["waits"]:
                metrics.commit_outcome_unknown_total.labels("durability_unconfirmed").inc()
                raise e.CommitOutcomeUnknown(
                    f"run {w.lease.run_id}: event {w.event_id} committed on the primary, but "
                    "whether the synchronous standby has it is not known (read back after "
                    f"{cause!r})"
                )
            run = self.session.conn.execute(self.q.sql("run_state"), {"run_id": w.lease.run_id})
            row = run.fetchone()
            status = str(row["status"]) if row else "unknown"
            return Written(w.expected_revision + 1, status, w.event_id, read_back=True)
        if outcome is ReadBack.NOT_COMMITTED:
            return None
        raise e.CommitInconsistent(
            f"run {w.lease.run_id}: checkpoint and outbox row of event {w.event_id} disagree"
        )

    def read_back(self, w: Write) -> ReadBack:
        """Which of the write's two rows exist, asked on a fresh connection."""
        last: BaseException | None = None
        deadline = time.monotonic() + self.readback_budget_s
        delay = 0.05
        while True:
            try:
                self.session.discard()
                row = self.session.conn.execute(
                    self.q.sql("readback_by_event"),
                    {
                        "run_id": w.lease.run_id,
                        "revision": w.expected_revision + 1,
                        "event_id": w.event_id,
                    },
                ).fetchone()
                assert row is not None
                return classify_read_back(bool(row["checkpoint"]), bool(row["outbox"]))
            except psycopg.OperationalError as exc:
                last = exc
                if time.monotonic() + delay > deadline:
                    break
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        raise e.CommitOutcomeUnknown(
            f"read-back impossible within {self.readback_budget_s}s: {last}"
        ) from last

    def on_commit_warning(self, w: Write, notices: list[Notice], written: Written) -> Written:
        """A COMMIT answered with a WARNING is not a durable success (rule 11).

        ``written`` is what the server answered; it is never returned here.
        """
        log(
            _log,
            logging.ERROR,
            "commit answered with a warning: durability unconfirmed",
            run_id=str(w.lease.run_id),
            owner=w.lease.owner,
            epoch=w.lease.epoch,
            revision=w.expected_revision + 1,
            event_id=str(w.event_id),
            notices=[n.__dict__ for n in notices],
        )
        metrics.commit_outcome_unknown_total.labels("durability_unconfirmed").inc()
        raise e.CommitOutcomeUnknown(
            "commit acknowledged with a warning (synchronous replication wait cancelled?):"
            " committed locally, durability unconfirmed",
            reason="durability_unconfirmed",
        )

    # ------------------------------------------------------------ shapes
    def _attempt(self, w: Write) -> Written:
        return self._stepped(w) if self.stepped else self._fast(w)

    def _finish(self, w: Write, row: tuple[Any, ...] | None) -> Written:
        """``row``: revision, status, lock_wait_ms, ledger_status of the write."""
        assert row is not None
        revision, status, lock_wait_ms, ledger_status = row
        if lock_wait_ms is not None:
            metrics.lease_row_lock_wait_seconds.observe(lock_wait_ms / 1000.0)
        written = Written(revision, status, w.event_id, ledger_status, lock_wait_ms)
        notices = self.session.warnings.drain()
        if notices:
            return self.on_commit_warning(w, notices, written)
        return written

    def _fast(self, w: Write) -> Written:
        conn = self.session.conn
        self.session.warnings.drain()
        statement = self._fast_statement()
        try:
            if isinstance(conn, db.Connection):
                text = statement.run(conn, w.params())
                row = None if text is None else _typed_write_row(text)
            else:  # a plain psycopg connection (a caller's own): the cursor path
                row = db.execute(
                    conn, self.q.sql("protected_write_fast"), w.params(), tuple_row
                ).fetchone()
        except psycopg.Error as exc:
            if outcome_unknown(exc):
                self.session.discard()
                raise _CommitUnknown(str(exc)) from exc
            raise
        return self._finish(w, row)

    def _fast_statement(self) -> db.LibpqStatement:
        """The fast write's statement, re-derived only when the query text changes."""
        text = self.q.sql("protected_write_fast")
        if self._fast_cache is None or self._fast_cache[0] is not text:
            self._fast_cache = (text, db.LibpqStatement.from_named(text))
        return self._fast_cache[1]

    def _stepped(self, w: Write) -> Written:
        conn = self.session.conn
        lease = w.lease
        try:
            locked = self._begin_locked(conn, lease)
            injection.point(
                "after_lease_row_locked",
                run_id=lease.run_id,
                epoch=lease.epoch,
                revision=int(locked["revision"]),
            )
            row = conn.execute(self.q.sql("protected_write"), w.params()).fetchone()
            assert row is not None
            injection.point(
                "before_commit",
                run_id=lease.run_id,
                epoch=lease.epoch,
                revision=int(row["revision"]),
            )
        except BaseException:
            # COMMIT was never sent: nothing of this transaction can commit.
            self._rollback_quietly()
            raise
        self.session.warnings.drain()
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            if outcome_unknown(exc):
                self.session.discard()
                raise _CommitUnknown(str(exc)) from exc
            raise
        return self._finish(
            w, (row["revision"], row["status"], row["lock_wait_ms"], row["ledger_status"])
        )

    def _begin_locked(self, conn: Conn, lease: Lease) -> dict[str, Any]:
        """BEGIN, then lock and validate the lease row: the lock is held until COMMIT."""
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        locked = conn.execute(
            self.q.sql("lock_lease"),
            {"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch},
        ).fetchone()
        assert locked is not None
        return locked

    def _rollback_quietly(self) -> None:
        try:
            conn = self.session.conn
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            self.session.discard()


def stepped_from_env() -> bool:
    """The stepped path only when asked for (``FENCECHECK_WRITE_PATH=stepped``)."""
    return os.environ.get("FENCECHECK_WRITE_PATH", "fast") == "stepped"


def _typed_write_row(text: tuple[str | None, ...]) -> tuple[Any, ...]:
    """revision, status, lock_wait_ms, ledger_status from their text form."""
    revision, status, lock_wait_ms, ledger_status = text
    assert revision is not None
    return (
        int(revision),
        status,
        None if lock_wait_ms is None else float(lock_wait_ms),
        ledger_status,
    )


def classify_read_back(checkpoint: bool, outbox: bool) -> ReadBack:
    """Both present = committed; both absent = not committed; else inconsistent."""
    if checkpoint and outbox:
        return ReadBack.COMMITTED
    if not checkpoint and not outbox:
        return ReadBack.NOT_COMMITTED
    return ReadBack.INCONSISTENT
