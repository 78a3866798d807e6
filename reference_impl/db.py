"""Connections of a login role: tenant-bound, named, watched for warnings.

Invariants:
- A connection's tenant is the one the database binds to its login role
  (``fencecheck.session_tenant()``, worker contract v2); the worker never
  sets a tenant itself. Each new connection checks that binding against
  the tenant the worker was told (``FENCECHECK_TENANT``) and refuses to be
  used when they differ (:class:`~reference_impl.errors.TenantBindingMismatch`).
  Connections run in autocommit: transactions are explicit and short.
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
- The hottest one, the fast protected write, runs below the cursor as a
  :class:`LibpqStatement` (a prepared statement, text in and out): about 40 us
  less per checkpoint than a kept cursor, measured against pgbench by
  ``python -m reference_impl.bench`` (figures in docs/reference-impl.md).
  It classifies failures as the cursor path does: a server error by its
  SQLSTATE, a broken connection as ``OperationalError`` (outcome unknown).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, LiteralString, TypeVar, cast

import psycopg
from psycopg import generators, pq
from psycopg.abc import Params
from psycopg.errors import error_from_result
from psycopg.rows import DictRow, RowFactory, dict_row
from psycopg.types.json import Jsonb

from reference_impl.errors import TenantBindingMismatch
from reference_impl.ids import canonical_json

Conn = psycopg.Connection[DictRow]
Row = TypeVar("Row")


class Connection(psycopg.Connection[DictRow]):
    """A worker connection that keeps one cursor per hot statement."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept: dict[str, psycopg.Cursor[Any]] = {}
        self.prepared: set[bytes] = set()  # LibpqStatement names prepared here

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


_NAMED = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True)
class LibpqStatement:
    """One statement prepared and run through libpq itself, text in, text out.

    Built from a named-parameter query (``%(name)s``, as in the ``.sql``
    files): ``names`` are its parameters in ``$n`` order. The prepared name
    is derived from the text, so a changed statement (a mutant's overlay) is
    prepared anew. It waits as psycopg does (see ``_answer``): the GIL is
    free meanwhile, so a heartbeat thread keeps running; the connection's
    notice handlers still see every WARNING.
    """

    name: bytes
    text: bytes
    names: tuple[str, ...]

    @classmethod
    def from_named(cls, query: str) -> LibpqStatement:
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        text = _NAMED.sub(number, query)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return cls(f"fencecheck_{digest}".encode(), text.encode(), tuple(names))

    def run(self, conn: Connection, params: Mapping[str, Any]) -> tuple[str | None, ...] | None:
        """The first row of the answer as text (None: no row), or raise as psycopg would."""
        values = [_as_text(params[n]) for n in self.names]
        with conn.lock:
            pgconn = conn.pgconn
            if self.name not in conn.prepared:
                pgconn.send_prepare(self.name, self.text)
                _check(conn, _answer(conn))
                conn.prepared.add(self.name)
            # None is SQL NULL (libpq's NULL pointer); psycopg's stub omits it.
            pgconn.send_query_prepared(self.name, cast(Any, values))
            res = _check(conn, _answer(conn))
        if res.ntuples == 0:
            return None
        return tuple(_text_or_none(res.get_value(0, i)) for i in range(res.nfields))


def _answer(conn: Connection) -> pq.abc.PGresult:
    """The last result of what was just sent, waited for as psycopg waits.

    ``Connection.wait`` runs psycopg's own (C) send-and-fetch generator and
    wakes every 0.1 s, so signal handlers run and Ctrl-C cancels the query
    on the server, as on the cursor path; a lost connection raises
    ``OperationalError``. (Blocking ``PQexecPrepared`` costs the same and
    could not be interrupted.)
    """
    results: list[pq.abc.PGresult] = conn.wait(generators.execute(conn.pgconn))
    if not results:
        raise psycopg.InterfaceError("the server sent no result")
    return results[-1]


def _jsonb_text(value: Jsonb) -> bytes:
    dumped = (value.dumps or canonical_json)(value.obj)
    return dumped.encode() if isinstance(dumped, str) else dumped


def _str_text(value: Any) -> bytes:
    return str(value).encode()


# Text input form per exact parameter type: one dict lookup per parameter.
_TEXT_FORM: dict[type, Callable[[Any], bytes]] = {
    str: str.encode,
    int: _str_text,
    float: _str_text,
    uuid.UUID: _str_text,
    bool: lambda v: b"t" if v else b"f",
    bytes: lambda v: b"\\x" + v.hex().encode(),
    Jsonb: _jsonb_text,
}


def _as_text(value: Any) -> bytes | None:
    """A parameter in PostgreSQL's text input form."""
    if value is None:
        return None
    form = _TEXT_FORM.get(type(value))
    if form is None:  # a subclass (an IntEnum, a str enum): its nearest known base
        bases = (_TEXT_FORM.get(base) for base in type(value).__mro__)
        form = next((f for f in bases if f is not None), None)
    if form is None:
        raise TypeError(f"no text form for a parameter of type {type(value).__name__}")
    return form(value)


def _text_or_none(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _check(conn: Connection, res: pq.abc.PGresult) -> pq.abc.PGresult:
    """``res`` if it succeeded; else the error psycopg's cursor path would raise."""
    if res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        return res
    if conn.pgconn.status == pq.ConnStatus.BAD:
        # No server verdict (connection lost mid-statement): OperationalError,
        # as the cursor path raises, so the caller reads the outcome back.
        raise psycopg.OperationalError(res.get_error_message(conn.info.encoding))
    raise error_from_result(res, encoding=conn.info.encoding)


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
    """Open one autocommit connection for ``spec`` with its warning log.

    Raises TenantBindingMismatch (the connection closed) when the login
    role is bound to another tenant than ``spec.tenant``, or to none.
    """
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "row_factory": dict_row,
        # libpq takes whole seconds and treats values below 2 as 2.
        "connect_timeout": max(2, math.ceil(spec.connect_timeout_s)),
    }
    if spec.statement_timeout_ms is not None:
        kwargs["options"] = f"-c statement_timeout={int(spec.statement_timeout_ms)}"
    if spec.application_name:
        kwargs["application_name"] = spec.application_name
    conn = Connection.connect(spec.dsn, **kwargs)
    try:
        row = conn.execute(
            "SELECT fencecheck.session_tenant()::text AS tenant, session_user AS role"
        ).fetchone()
    except BaseException:
        conn.close()
        raise
    if row is None or row["tenant"] != spec.tenant:
        conn.close()
        bound = row["tenant"] if row else None
        role = row["role"] if row else "?"
        raise TenantBindingMismatch(
            f"login role {role} is bound to tenant {bound or 'none'}, but this worker acts for"
            f" tenant {spec.tenant} (FENCECHECK_TENANT): bind the role to that tenant in"
            " public.tenant_bindings, or log in as a role bound to it",
            reason="binding",
        )
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
