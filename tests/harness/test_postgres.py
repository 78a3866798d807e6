"""Real PostgreSQL: primary, databases, streaming replica in async and sync mode."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from harness.parts.pg_binaries import PgBinaries, PgBinariesNotFound, find_pg_binaries
from harness.parts.postgres import ClusterError, Database, PostgresCluster


def test_binaries_found_and_described(pg_binaries: PgBinaries) -> None:
    assert pg_binaries.major >= 15
    assert "PostgreSQL" in pg_binaries.describe()


def test_explicit_bad_bindir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PgBinariesNotFound, match="lacks initdb"):
        find_pg_binaries(tmp_path)


def test_fresh_database_is_isolated(fresh_db: Database, pg_cluster: PostgresCluster) -> None:
    fresh_db.query("CREATE TABLE t (a int)")
    other = pg_cluster.create_database()
    try:
        assert other.query("SELECT to_regclass('t') AS t")[0]["t"] is None
    finally:
        pg_cluster.drop_database(other.name)


def test_database_from_template_copies_schema(pg_cluster: PostgresCluster) -> None:
    def init(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE seeded (a int)")
            conn.execute("INSERT INTO seeded VALUES (42)")

    template = pg_cluster.create_template("tmpl_test", init)
    db = pg_cluster.create_database(template=template)
    assert db.query("SELECT a FROM seeded") == [{"a": 42}]


def test_server_runs_unprivileged(pg_cluster: PostgresCluster) -> None:
    import os

    import psutil

    assert pg_cluster.process is not None
    uids = psutil.Process(pg_cluster.process.pid).uids()
    if os.geteuid() == 0:
        assert uids.effective != 0


def test_server_facts_for_evidence(pg_cluster: PostgresCluster) -> None:
    facts = pg_cluster.server_facts()
    for key in ("server_version", "synchronous_commit", "synchronous_standby_names", "version"):
        assert key in facts


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches the server to another user")
def test_binaries_the_server_user_cannot_reach_are_refused(
    tmp_path: Path, pg_binaries: PgBinaries, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres", "pg_basebackup"):
        (private / "bin" / name).symlink_to(pg_binaries.bindir / name)
    private.chmod(0o700)
    monkeypatch.setenv("FENCECHECK_PG_BIN", str(private / "bin"))
    with pytest.raises(PgBinariesNotFound, match="cannot enter"):
        find_pg_binaries()


def test_a_server_that_exits_at_start_fails_at_once(
    pg_binaries: PgBinaries, session_tmp: Path
) -> None:
    """The readiness wait ends when the server process exits, not at its timeout."""
    cluster = PostgresCluster.init_primary(pg_binaries, session_tmp / "exits", name="exits")
    try:
        cluster.stop()
        with open(cluster.datadir / "postgresql.conf", "a") as f:
            f.write("\nshared_buffers = 'not-a-size'\n")  # the server refuses to start
        started = time.monotonic()
        with pytest.raises(ClusterError, match="exited with code"):
            cluster.start(timeout_s=120)
        assert time.monotonic() - started < 60  # not the 120 s readiness timeout
    finally:
        cluster.remove()


def test_dropping_an_experiments_roles_never_waits_for_a_missing_sync_standby(
    pg_binaries: PgBinaries, session_tmp: Path
) -> None:
    """An experiment can end with its synchronous standby stopped: the teardown's
    DROP ROLE must not wait for it (it once waited 20 minutes on SyncRep)."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.engine.environment import _drop_roles

    cluster = PostgresCluster.init_primary(pg_binaries, session_tmp / "nosync", name="nosync")
    pool = ThreadPoolExecutor(1)
    try:
        cluster.query("CREATE ROLE fc_probe_login")
        cluster.query("ALTER SYSTEM SET synchronous_standby_names = 'no_such_standby'")
        cluster.query("SELECT pg_reload_conf()")
        done = pool.submit(_drop_roles, cluster, {("t", "worker"): "fc_probe_login"})
        done.result(timeout=30)  # a wait on SyncRep would never end
        rows = cluster.query("SELECT 1 FROM pg_roles WHERE rolname = 'fc_probe_login'")
        assert rows == []
    finally:
        cluster.stop()  # also ends a backend still waiting, so the thread ends
        pool.shutdown(wait=True)


def test_a_stopped_postmaster_is_resumed_and_named(pg_cluster: PostgresCluster) -> None:
    """A postmaster frozen by a stray SIGSTOP times out every probe although its
    log says it is ready: the readiness probe finds it stopped, resumes it, and
    says so (the message names the pid)."""
    assert pg_cluster.process is not None
    pid = pg_cluster.process.pid
    os.killpg(pid, signal.SIGSTOP)
    try:
        assert pg_cluster._ready() is False  # this probe times out on the frozen server
        assert f"postmaster {pid} was found stopped" in pg_cluster._last_probe_error
        assert pg_cluster._ready() is True
        assert f"postmaster {pid} was found stopped" in pg_cluster.log_tail()
    finally:
        os.killpg(pid, signal.SIGCONT)


def test_a_cluster_copied_from_a_stopped_seed_has_its_databases(
    pg_binaries: PgBinaries, session_tmp: Path
) -> None:
    seed = PostgresCluster.init_primary(pg_binaries, session_tmp / "seed-src", name="seed")
    try:

        def init(dsn: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE seeded (a int)")
                conn.execute("INSERT INTO seeded VALUES (7)")

        seed.create_template("migrated", init)
        seed.stop("fast")
        copies = [
            PostgresCluster.from_seed(
                pg_binaries, seed.datadir, session_tmp / f"seed-copy{n}", name="copy",
                templates=["migrated"],
            )
            for n in range(2)
        ]  # fmt: skip
        try:
            assert copies[0].port != copies[1].port
            for copy in copies:
                assert copy.query("SELECT a FROM seeded", dbname="migrated") == [{"a": 7}]
            copies[0].query("INSERT INTO seeded VALUES (8)", dbname="migrated")
            assert copies[1].query("SELECT count(*) AS n FROM seeded", dbname="migrated") == [
                {"n": 1}
            ]  # each copy is a cluster of its own

            # The template is known: nothing is migrated again.
            def never(dsn: str) -> None:
                raise AssertionError(f"migrated again: {dsn}")

            assert copies[0].create_template("migrated", never) == "migrated"
        finally:
            for copy in copies:
                copy.remove()
    finally:
        seed.remove()
