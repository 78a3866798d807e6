"""The harness's own superuser sessions to one server, kept open between queries.

The harness asks a server many small questions (fault checks poll a lease
every 20 ms, checkers read the audit trail, teardown drops roles); opening a
session for each cost a backend fork and its catalog warm-up every time:
2 490 sessions in one matrix run, a fifth of the machine's CPU. A
:class:`SessionPool` keeps a few idle autocommit sessions per database.

Safety of reuse: a session is only ever taken by one thread at a time and is
idle in autocommit when it comes back, so no transaction, lock or snapshot
crosses queries. A session the server has ended while it sat idle (a server
stop, ``pg_terminate_backend``, ``DROP DATABASE ... WITH (FORCE)``) has the
server's goodbye or EOF waiting on its socket: :meth:`SessionPool.take`
sees that without blocking and opens a fresh session instead. The goodbye
can still be on its way (``pg_terminate_backend`` returns before the
backend has sent it, and on a busy machine it arrives after the check): a
statement on a reused session the server ended as it was sent
(``AdminShutdown``, SQLSTATE 57P01: a backend that is dying runs no
statement) is sent once more on a fresh session (:meth:`SessionPool.call`),
so a reused session never fails where a new one would not. Sessions that
raised are closed, never reused. The cluster empties the pool whenever it stops a
server or drops a database.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import psycopg
from psycopg import pq

# Idle sessions kept per database: enough for an experiment's threads that
# poll at once (a fault check and a barrier watcher), few enough that 3-6
# experiments at a time stay far below max_connections.
MAX_IDLE_PER_DB = 3

Connect = Callable[[str], "psycopg.Connection[object]"]
T = TypeVar("T")


def _still_idle(conn: psycopg.Connection[object]) -> bool:
    """The session is open, idle outside a transaction, and the server has sent
    nothing since (anything readable on an idle session is its end: an error
    before the close, or EOF)."""
    if conn.closed or conn.broken:
        return False
    if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class SessionPool:
    """Idle autocommit sessions per database name, opened with ``connect``."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._idle: dict[str, list[psycopg.Connection[object]]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def session(self, dbname: str) -> Iterator[psycopg.Connection[object]]:
        """A session to ``dbname`` for the block: reused when one is idle, else
        new; back to the pool after the block, closed when the block raised."""
        conn = self.take(dbname)
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self.give_back(dbname, conn)

    def call(self, dbname: str, fn: Callable[[psycopg.Connection[object]], T]) -> T:
        """``fn`` on a session to ``dbname``; once more on a fresh session when
        a reused one turns out to have been ended by the server as it was sent."""
        conn, reused = self._take(dbname)
        try:
            result = fn(conn)
        except psycopg.errors.AdminShutdown:
            with contextlib.suppress(Exception):
                conn.close()
            if not reused:
                raise
            conn = self._connect(dbname)
            try:
                result = fn(conn)
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.close()
                raise
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self.give_back(dbname, conn)
        return result

    def take(self, dbname: str) -> psycopg.Connection[object]:
        return self._take(dbname)[0]

    def _take(self, dbname: str) -> tuple[psycopg.Connection[object], bool]:
        """A session to ``dbname``, and whether it was reused (not new)."""
        while True:
            with self._lock:
                idle = self._idle.get(dbname)
                conn = idle.pop() if idle else None
            if conn is None:
                return self._connect(dbname), False
            if _still_idle(conn):
                return conn, True
            with contextlib.suppress(Exception):
                conn.close()

    def give_back(self, dbname: str, conn: psycopg.Connection[object]) -> None:
        if _still_idle(conn):
            with self._lock:
                idle = self._idle.setdefault(dbname, [])
                if len(idle) < MAX_IDLE_PER_DB:
                    idle.append(conn)
                    return
        with contextlib.suppress(Exception):
            conn.close()

    def forget(self, dbname: str | None = None) -> None:
        """Close the idle sessions to ``dbname`` (every database: None), before
        the database is dropped or copied, or the server stops."""
        with self._lock:
            if dbname is None:
                dropped = [c for conns in self._idle.values() for c in conns]
                self._idle.clear()
            else:
                dropped = self._idle.pop(dbname, [])
        for conn in dropped:
            with contextlib.suppress(Exception):
                conn.close()

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(c) for c in self._idle.values())
