"""Classify PostgreSQL errors by SQLSTATE and class, never by message text.

The FC* codes are raised by the fencecheck.* functions (see
``sql/migrations/003_api.sql``). A connection-level failure has no SQLSTATE
(or an 08/57 class one): whether a commit carried in that statement
happened is then unknown.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from reference_impl import errors as e

LEASE_LOST = "FC001"
LEASE_EXPIRED = "FC002"
RUN_NOT_FOUND = "FC003"
STATE_CONFLICT = "FC004"
REVISION_CONFLICT = "FC005"
INTENT_CONFLICT = "FC006"
LEDGER_CONFLICT = "FC007"
NOT_RETRYABLE = "FC008"
TASK_EXISTS = "FC010"
TENANT_UNSET = "FC011"

_PROTOCOL: dict[str, tuple[type[e.ProtocolError], str]] = {
    LEASE_LOST: (e.LeaseLost, "lost"),
    LEASE_EXPIRED: (e.LeaseLost, "expired"),
    RUN_NOT_FOUND: (e.RunNotFound, "missing"),
    STATE_CONFLICT: (e.StateConflict, "state"),
    REVISION_CONFLICT: (e.RevisionConflict, "revision"),
    INTENT_CONFLICT: (e.IntentConflict, "intent"),
    LEDGER_CONFLICT: (e.LedgerConflict, "ledger"),
    NOT_RETRYABLE: (e.RunNotRetryable, "live"),
    TASK_EXISTS: (e.TaskExists, "exists"),
    TENANT_UNSET: (e.TenantUnset, "tenant"),
}


def protocol_error(exc: psycopg.Error) -> e.ProtocolError | None:
    """The protocol error a database rejection stands for, or None."""
    found = _PROTOCOL.get(exc.sqlstate or "")
    if found is None:
        return None
    cls, reason = found
    diag = exc.diag
    text = diag.message_primary or cls.__doc__ or cls.__name__
    if diag.message_detail:
        text = f"{text} ({diag.message_detail})"
    return cls(text, reason=reason)


def is_retryable_conflict(exc: BaseException) -> bool:
    """40001 / 40P01: the transaction did not commit; retry it whole."""
    return isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected)


def outcome_unknown(exc: BaseException) -> bool:
    """True when a statement that carried a COMMIT failed without a server verdict.

    A server error with a SQLSTATE outside classes 08 (connection) and 57
    (operator intervention: admin shutdown, crash) is a definite rollback;
    a broken connection or a terminated backend is not.
    """
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state: str | None = getattr(exc, "sqlstate", None)
    if state is None:
        return True
    return state.startswith("08") or (state.startswith("57") and state != "57014")
