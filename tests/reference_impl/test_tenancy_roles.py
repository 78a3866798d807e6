"""Rule 12: every table is tenant-scoped by RLS; the worker role cannot
bypass the protected-write path. Also: migrations are idempotent."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from harness.parts.postgres import Database
from reference_impl.migrations import migrate
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import OTHER_TENANT, cp, new_run, take

TABLES = (
    "tenants",
    "agent_tasks",
    "agent_runs",
    "agent_checkpoints",
    "tool_operations",
    "outbox",
    "consumed_events",
    "consumer_effects",
)


def test_cross_tenant_read_claim_write_refused(make_rt: Callable[..., Runtime]) -> None:
    """Experiment N at the SQL level."""
    a, b = make_rt("A"), make_rt("B", tenant=OTHER_TENANT)
    run = new_run(a)
    lease = take(a, run).lease
    a.writer.write(cp(lease, 0))
    for t in TABLES:
        assert b.conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone() == {"n": 0}
    assert b.leases.claim(b.conn, b.owner, 1000).outcome == "none"
    assert b.leases.takeover(b.conn, run, b.owner, 1000).outcome == "missing"
    forged = type(lease)(run, lease.owner, lease.epoch)
    from reference_impl import errors as e

    with pytest.raises(e.RunNotFound):
        b.writer.write(cp(forged, 1))
    with pytest.raises(e.RunNotFound):
        b.runs.cancel(b.conn, run)


def test_worker_role_cannot_write_protected_tables(rt: Runtime) -> None:
    run = new_run(rt)
    for stmt in (
        "UPDATE agent_runs SET epoch = 0",
        "UPDATE agent_runs SET owner = 'x', lease_expires_at = now() + interval '1 h'",
        "DELETE FROM agent_checkpoints",
        "INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)"
        " VALUES (gen_random_uuid(), current_setting('app.tenant_id')::uuid,"
        f" '{run}', 'x', '{{}}')",
        "UPDATE tool_operations SET status = 'prepared'",
        "SELECT * FROM fencecheck._grant(gen_random_uuid(), 'x', 1000, NULL, NULL, 0)",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            rt.conn.execute(stmt)


def test_unset_tenant_sees_nothing(ref_db: Database, rt: Runtime) -> None:
    new_run(rt)
    with psycopg.connect(ref_db.dsn("fencecheck_worker"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM agent_runs").fetchone() == (0,)


def test_migrate_is_idempotent(ref_db: Database) -> None:
    assert migrate(ref_db.admin_dsn) == []
