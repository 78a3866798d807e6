"""A container primary and standby streaming through a toxiproxy container.

The replication link is the proxy: cutting it stops the stream, so an
asynchronous commit acknowledged by the primary is missing on the standby
after the primary is fenced (container kill) and the standby promoted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from harness.parts.postgres import PostgresCluster, failover
from harness.parts.processes import ProcessRegistry
from harness.parts.toxiproxy import ToxiproxyServer
from harness.waiting import wait_for

if TYPE_CHECKING:
    from harness.backends.containers import ContainerBackend

pytestmark = [pytest.mark.containers, pytest.mark.slow]


@pytest.fixture
def toxiproxy(backend: ContainerBackend, tmp_path: Path) -> Iterator[ToxiproxyServer]:
    server = backend.start_toxiproxy(tmp_path / "logs", ProcessRegistry())
    try:
        yield server
    finally:
        server.stop()


def _pair(
    backend: ContainerBackend, toxiproxy: ToxiproxyServer, base: Path
) -> tuple[PostgresCluster, PostgresCluster, str]:
    primary = backend.start_primary(base, "primary")
    link = toxiproxy.link("replication", backend.inner_address("127.0.0.1", primary.port))
    standby = backend.start_standby(
        primary,
        base,
        upstream_host=link.listen_host,
        upstream_port=link.listen_port,
        name="replica",
    )
    primary.wait_streaming("replica")
    return primary, standby, link.name


def test_async_commit_acknowledged_then_lost_by_promote_after_cut(
    backend: ContainerBackend, toxiproxy: ToxiproxyServer, tmp_path: Path
) -> None:
    from harness.backends.containers import ContainerPostgres

    primary, standby, link_name = _pair(backend, toxiproxy, tmp_path / "pg")
    try:
        assert isinstance(primary, ContainerPostgres) and isinstance(standby, ContainerPostgres)
        link = toxiproxy.links()[link_name]
        worker = toxiproxy.link("worker_pg", backend.inner_address("127.0.0.1", primary.port))
        with psycopg.connect(
            f"host=127.0.0.1 port={worker.listen_port} user=postgres dbname=postgres"
        ) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # The WAL receiver really streams through the proxy, on the network.
        receiver = standby.query(
            "SELECT sender_host, sender_port, status FROM pg_stat_wal_receiver"
        )
        assert receiver == [
            {
                "sender_host": toxiproxy.inner_host,  # type: ignore[attr-defined]
                "sender_port": link.listen_port,
                "status": "streaming",
            }
        ]
        primary.query("CREATE TABLE t (id int PRIMARY KEY, what text)")
        primary.query("INSERT INTO t VALUES (1, 'replicated')")
        wait_for(
            lambda: standby.query("SELECT count(*) AS n FROM t")[0]["n"] == 1,
            what="row 1 replayed on the standby",
            timeout_s=15,
        )

        cut = link.cut()
        wait_for(
            lambda: not primary.replication_status(),
            what="the primary to see the standby gone",
            timeout_s=15,
        )
        # Autocommit: the primary acknowledges this commit (async replication).
        primary.query("INSERT INTO t VALUES (2, 'acknowledged, never streamed')")
        assert [r["id"] for r in primary.query("SELECT id FROM t ORDER BY id")] == [1, 2]

        record = failover(primary, standby)
        assert cut.started_at < record.fenced_at
        assert not primary.running, "the fence must leave no server running"
        wrapped = primary.container
        assert wrapped is None or wrapped.get_wrapped_container().attrs["State"]["ExitCode"] in (
            137,
            -1,
        )
        assert [r["id"] for r in standby.query("SELECT id FROM t ORDER BY id")] == [1]
        # A client of the fenced primary is refused at once, as by a dead local
        # server, and toxiproxy stays responsive (its dial to a vanished
        # container address would otherwise hang its whole API).
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(
                f"host=127.0.0.1 port={worker.listen_port} user=postgres dbname=postgres "
                "connect_timeout=60"
            )
        # Half the timeout it would otherwise wait: a busy machine cannot
        # stretch a refusal that far, a hang would go past it.
        assert time.monotonic() - started < 30
        started = time.monotonic()
        toxiproxy.remove_link(worker.name)
        toxiproxy.remove_link(link.name)
        assert time.monotonic() - started < 30
        assert standby.query("SELECT pg_is_in_recovery() AS r")[0]["r"] is False
        standby.query("INSERT INTO t VALUES (3, 'new primary writes')")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(primary.admin_dsn(), connect_timeout=2)
    finally:
        standby.remove()
        primary.remove()


def test_pause_freezes_the_server_and_unpause_resumes_it(
    backend: ContainerBackend, tmp_path: Path
) -> None:
    from harness.backends.containers import ContainerPostgres

    primary = backend.start_primary(tmp_path / "pg", "paused")
    try:
        assert isinstance(primary, ContainerPostgres)
        session = primary.connect()
        with primary.paused() as record:
            assert primary.is_paused() and record.kind == "pause"
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(primary.admin_dsn(), connect_timeout=1)
            assert time.monotonic() - started >= 0.9, "a frozen server cannot refuse, only stall"
        assert record.stopped_at is not None and not primary.is_paused()
        # The open session survived the freeze.
        assert session.execute("SELECT 1").fetchone() == (1,)
        session.close()
        # The fence works on a frozen server too, without thawing it first.
        primary.pause()
        assert primary.stop("immediate") < 10
        assert not primary.running
    finally:
        primary.remove()
    assert not primary.running


def test_stop_fast_then_start_keeps_the_data(backend: ContainerBackend, tmp_path: Path) -> None:
    primary = backend.start_primary(tmp_path / "pg", "restarted")
    try:
        primary.query("CREATE TABLE kept (x int)")
        primary.query("INSERT INTO kept VALUES (42)")
        assert primary.stop("fast") > 0
        assert not primary.running
        primary.start()
        assert primary.query("SELECT x FROM kept") == [{"x": 42}]
    finally:
        primary.remove()
    assert (tmp_path / "pg" / "restarted.log").read_text(), "the server log is kept on the host"
