"""The harness's reused superuser sessions (harness/parts/pg_sessions.py): reused
while idle, replaced when the server ended them, never in the way of a copy or
a drop of their database."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psycopg
import pytest

from harness.parts import pg_sessions
from harness.parts.pg_binaries import PgBinaries
from harness.parts.postgres import Database, PostgresCluster


def _backend(db: Database) -> int:
    return int(db.query("SELECT pg_backend_pid() AS pid")[0]["pid"])


def test_queries_reuse_one_idle_session(fresh_db: Database) -> None:
    first = _backend(fresh_db)
    assert all(_backend(fresh_db) == first for _ in range(5))


def test_a_session_the_server_ended_is_replaced_not_failed(
    fresh_db: Database, pg_cluster: PostgresCluster
) -> None:
    first = _backend(fresh_db)
    with psycopg.connect(fresh_db.admin_dsn, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [first])
    # The terminated session had the server's goodbye waiting on its socket.
    second = _backend(fresh_db)
    assert second != first
    assert fresh_db.query("SELECT 1 AS one") == [{"one": 1}]


def test_a_session_ended_before_its_goodbye_arrived_is_replaced(
    fresh_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of the test above, made certain: the idle check is told the
    session is fine (the goodbye had not arrived yet, as on a busy machine),
    and the backend is gone by the time the statement is sent."""
    first = _backend(fresh_db)
    with psycopg.connect(fresh_db.admin_dsn, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [first])
    monkeypatch.setattr(pg_sessions, "_still_idle", lambda conn: True)
    second = _backend(fresh_db)
    assert second != first


def test_a_failing_statement_closes_its_session(fresh_db: Database) -> None:
    first = _backend(fresh_db)
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        fresh_db.query("SELECT 1/0")
    assert _backend(fresh_db) != first


def test_a_database_with_reused_sessions_can_be_copied_and_dropped(
    pg_cluster: PostgresCluster,
) -> None:
    source = pg_cluster.create_database()
    source.query("CREATE TABLE kept (x int)")
    _backend(source)  # an idle pooled session on it
    copy = pg_cluster.create_database(template=source.name)
    try:
        assert copy.query("SELECT to_regclass('kept') IS NOT NULL AS there") == [{"there": True}]
    finally:
        pg_cluster.drop_database(copy.name)
        pg_cluster.drop_database(source.name)


def test_a_restarted_server_gets_fresh_sessions(pg_binaries: PgBinaries, session_tmp: Path) -> None:
    cluster = PostgresCluster.init_primary(
        pg_binaries, session_tmp / "pg-restarted", name="restarted"
    )
    try:
        before = int(cluster.query("SELECT pg_backend_pid() AS pid")[0]["pid"])
        cluster.stop("fast")
        cluster.start()
        after = int(cluster.query("SELECT pg_backend_pid() AS pid")[0]["pid"])
        assert after != before
    finally:
        cluster.remove()
