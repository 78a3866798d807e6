"""Connections of the worker role: tenant-scoped, named, watched for warnings.

Invariants:
- Every connection carries ``app.tenant_id`` from its first statement (set as
  a startup option, so no query can run before the tenant is set) and runs
  in autocommit: transactions are explicit and short.
- A connection's notices of severity WARNING are kept until drained, so a
  caller can tell that a COMMIT was answered with a warning (for example the
  cancelled wait for synchronous replication) instead of a clean success.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

Conn = psycopg.Connection[DictRow]


@dataclass(frozen=True)
class Notice:
    """A server notice as far as classification needs it (no message matching)."""

    severity: str
    sqlstate: str | None
    message: str


@dataclass(frozen=True)
class ConnectionSpec:
    """How to open one connection of the worker role."""

    dsn: str
    tenant: str
    application_name: str | None = None
    connect_timeout_s: float = 5.0
    statement_timeout_ms: int | None = None

    def with_timeouts(self, timeout_ms: int) -> ConnectionSpec:
        return replace(self, connect_timeout_s=timeout_ms / 1000.0, statement_timeout_ms=timeout_ms)


@dataclass
class WarningLog:
    """Collects WARNING-severity notices of one connection."""

    items: list[Notice] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        severity = diag.severity_nonlocalized or diag.severity or ""
        if severity.upper() == "WARNING":
            with self.lock:
                self.items.append(Notice(severity, diag.sqlstate, diag.message_primary or ""))

    def drain(self) -> list[Notice]:
        with self.lock:
            items, self.items = self.items, []
        return items


def connect(spec: ConnectionSpec) -> tuple[Conn, WarningLog]:
    """Open one autocommit connection for ``spec`` with its warning log."""
    options = f"-c app.tenant_id={spec.tenant}"
    if spec.statement_timeout_ms is not None:
        options += f" -c statement_timeout={int(spec.statement_timeout_ms)}"
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "row_factory": dict_row,
        # libpq takes whole seconds and treats values below 2 as 2.
        "connect_timeout": max(2, math.ceil(spec.connect_timeout_s)),
        "options": options,
    }
    if spec.application_name:
        kwargs["application_name"] = spec.application_name
    conn = psycopg.connect(spec.dsn, **kwargs)
    warnings = WarningLog()
    conn.add_notice_handler(warnings)
    return conn, warnings


class Session:
    """One lazily (re)opened connection, used by one thread at a time."""

    def __init__(self, spec: ConnectionSpec) -> None:
        self.spec = spec
        self._conn: Conn | None = None
        self.warnings = WarningLog()

    @property
    def conn(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.discard()
            self._conn, self.warnings = connect(self.spec)
        return self._conn

    def discard(self) -> None:
        """Drop the connection (after an error that may have broken it)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        self.discard()
