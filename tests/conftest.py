"""Shared fixtures: real PostgreSQL, started once per test session (per xdist worker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.run_records import RunRecord
from harness.parts.pg_binaries import PgBinaries, find_pg_binaries
from harness.parts.postgres import Database, PostgresCluster
from harness.parts.toxiproxy import ToxiproxyServer


@pytest.fixture(scope="session")
def pg_binaries() -> PgBinaries:
    return find_pg_binaries()


@pytest.fixture(scope="session")
def session_tmp() -> Iterator[Path]:
    """The session's own temp directory; removed at the end, whatever happened.
    Written down as a run record first, like a run's, so that a session killed
    with SIGKILL leaves nothing `fencecheck clean` (or the next run) does not
    reap: the directory, the session cluster's server and its shared memory."""
    # Not released by the end of a command a test runs in this process.
    record = RunRecord.create(base=None, kind="test", released_by_command=False)
    try:
        yield record.temp_root
    finally:
        record.release()


@pytest.fixture(scope="session")
def pg_cluster(pg_binaries: PgBinaries, session_tmp: Path) -> Iterator[PostgresCluster]:
    """One primary for the whole session; tests isolate themselves by database."""
    cluster = PostgresCluster.init_primary(pg_binaries, session_tmp / "pg", name="session")
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def fresh_db(pg_cluster: PostgresCluster) -> Iterator[Database]:
    """An empty database of its own for one test."""
    db = pg_cluster.create_database()
    try:
        yield db
    finally:
        pg_cluster.drop_database(db.name)


@pytest.fixture(scope="session")
def toxiproxy(session_tmp: Path) -> Iterator[ToxiproxyServer]:
    """The real toxiproxy server, one per session."""
    with ToxiproxyServer(session_tmp / "toxiproxy") as server:
        yield server
