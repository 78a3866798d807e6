"""Streaming replication through a toxiproxy link: what a commit means in each mode."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.parts.pg_binaries import PgBinaries
from harness.parts.postgres import PostgresCluster, failover
from harness.parts.toxiproxy import Link, ToxiproxyServer
from harness.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def pair(
    pg_binaries: PgBinaries, session_tmp: Path, toxiproxy: ToxiproxyServer
) -> Iterator[tuple[PostgresCluster, PostgresCluster, Link]]:
    base = session_tmp / f"repl-{uuid.uuid4().hex[:6]}"
    primary = PostgresCluster.init_primary(pg_binaries, base, name="primary")
    link = toxiproxy.link(f"repl_{uuid.uuid4().hex[:6]}", f"127.0.0.1:{primary.port}")
    standby: PostgresCluster | None = None
    try:
        standby = primary.create_standby(
            base, upstream_host=link.listen_host, upstream_port=link.listen_port
        )
        primary.wait_streaming("replica")
        primary.query("CREATE TABLE t (id int PRIMARY KEY, v text)")
        # Every test starts with a standby that has replayed all there is.
        wait_for(
            lambda: primary.replication_status()[0]["replay_lag_bytes"] == 0,
            what="the standby to replay the table's creation",
            timeout_s=15,
        )
        yield primary, standby, link
    finally:
        link.heal()
        toxiproxy.client.delete_proxy(link.name)
        if standby is not None:
            standby.remove()
        primary.remove()


def _wait_link_down(primary: PostgresCluster) -> None:
    wait_for(
        lambda: not primary.replication_status(),
        what="the primary to drop the cut standby from pg_stat_replication",
        timeout_s=15,
    )


def test_async_commit_acknowledged_while_cut_is_lost_after_promotion(
    pair: tuple[PostgresCluster, PostgresCluster, Link],
) -> None:
    primary, standby, link = pair
    primary.query("INSERT INTO t VALUES (1, 'replicated')")
    wait_for(
        lambda: standby.query("SELECT count(*) AS n FROM t")[0]["n"] == 1,
        what="row 1 on the standby",
        timeout_s=10,
    )
    link.cut()
    _wait_link_down(primary)
    primary.query("INSERT INTO t VALUES (2, 'acknowledged while cut')")  # commit returns
    lag = primary.query("SELECT pg_current_wal_lsn()::text AS lsn")[0]["lsn"]
    record = failover(primary, standby)
    rows = standby.query("SELECT id FROM t ORDER BY id")
    assert rows == [{"id": 1}], f"after failover at primary LSN {lag}: {rows}"
    assert record.promote_seconds < 30


def test_sync_commit_blocks_while_standby_cut_and_survives_failover(
    pair: tuple[PostgresCluster, PostgresCluster, Link],
) -> None:
    primary, standby, link = pair
    primary.set_sync_standby("replica")
    link.cut()
    _wait_link_down(primary)
    finished = threading.Event()
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            with psycopg.connect(primary.admin_dsn(), autocommit=True) as conn:
                conn.execute("INSERT INTO t VALUES (3, 'waits for the standby')")
        except BaseException as exc:
            errors.append(exc)
        finished.set()

    threading.Thread(target=commit, daemon=True).start()
    assert not finished.wait(1.0), "a synchronous commit returned with the standby cut off"
    waiting = primary.query("SELECT wait_event FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
    assert waiting, "the blocked backend is not waiting on SyncRep"
    link.heal()
    assert finished.wait(15), "the commit did not return after the link healed"
    assert not errors
    failover(primary, standby)
    assert standby.query("SELECT id FROM t WHERE id = 3") == [{"id": 3}]


def test_replication_lag_reported_in_bytes(
    pair: tuple[PostgresCluster, PostgresCluster, Link],
) -> None:
    primary, standby, link = pair
    link.cut()
    _wait_link_down(primary)
    primary.query("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(10, 500) g")
    written = primary.query("SELECT pg_current_wal_lsn()::text AS lsn")[0]["lsn"]
    lag = standby.query(
        "SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())::bigint AS behind",
        [written],
    )[0]["behind"]
    assert lag > 0, "the standby replayed WAL written while its link was cut"
    assert standby.query("SELECT count(*) AS n FROM t")[0]["n"] == 0
    link.heal()
    primary.wait_streaming("replica")
    wait_for(
        lambda: primary.replication_status()[0]["replay_lag_bytes"] == 0,
        what="replay lag 0 after heal",
        timeout_s=15,
    )
    assert standby.query("SELECT count(*) AS n FROM t")[0]["n"] == 491
