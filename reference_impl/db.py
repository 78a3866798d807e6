"""Connections of the worker role: tenant-scoped, named, watched for warnings.

Invariants:
- Every connection carries ``app.tenant_id`` from its first statement (set as
  a startup option, so no query can run before the tenant is set) and runs
  in autocommit: transactions are explicit and short.
- A connection's notices of severity WARNING are kept until drained, so a
  caller can tell that a COMMIT was answered with a warning (for example the
  cancelled wait for synchronous replication) instead of a clean success.
- Hot statements (the fast protected write, renew, claim) run through
  :func:`execute`: on a cursor the connection keeps for that statement,
  prepared from the first call. psycopg picks a cursor's adapters (a dumper
  per parameter type, a loader per result column) when the cursor first runs
  a query and keeps them while it runs the same query again;
  ``Connection.execute`` makes a new cursor every time and pays for them on
  every call (tens of microseconds for a 13-parameter call).
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.abc import Params
from psycopg.rows import DictRow, RowFactory, dict_row

Conn = psycopg.Connection[DictRow]
Row = TypeVar("Row")


class Connection(psycopg.Connection[DictRow]):
    """A worker connection that keeps one cursor per hot statement."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept: dict[str, psycopg.Cursor[Any]] = {}

    def kept_cursor(self, query: str, row_factory: RowFactory[Row]) -> psycopg.Cursor[Row]:
        """The cursor this connection keeps for ``query`` (one thread at a time)."""
        cur = self._kept.get(query)
        if cur is None or cur.closed:
            cur = self._kept[query] = self.cursor(row_factory=row_factory)
        return cur


def execute(
    conn: Conn, query: LiteralString, params: Params, row_factory: RowFactory[Row]
) -> psycopg.Cursor[Row]:
    """``conn.execute(query, params, prepare=True)``, on the cursor kept for ``query``.

    Pass the same string object every time (a ``Queries.sql`` value is): the
    cursor keeps its adapters only while its query is the same object. One
    statement, one ``row_factory``: the kept cursor has the first one asked.
    """
    if isinstance(conn, Connection):
        cur = conn.kept_cursor(query, row_factory)
    else:
        cur = conn.cursor(row_factory=row_factory)
    return cur.execute(query, params, prepare=True)


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
        if not self.items:  # the usual case, without taking the lock
            return []
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
    conn = Connection.connect(spec.dsn, **kwargs)
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
