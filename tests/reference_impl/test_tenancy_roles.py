"""Rule 12: every table is tenant-scoped by RLS keyed on the login role's
binding (worker contract v2); no session can change its own tenant; the
worker role cannot bypass the protected-write path nor act as the control
plane. Also: migrations are idempotent."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from harness.parts.postgres import Database
from reference_impl import errors as e
from reference_impl.migrations import migrate
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import OTHER_TENANT, ROLES, TENANT, cp, new_run, take

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
CONTROL_PLANE = (
    "create_run",
    "retry_run",
    "deliver_callback",
    "operator_cancel",
    "operator_resolve",
    "operator_decide",
    "operator_converge",
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
    with pytest.raises(e.RunNotFound):
        b.writer.write(cp(forged, 1))
    ctl_b = make_rt("ctl-b", tenant=OTHER_TENANT, role="operator")
    with pytest.raises(e.RunNotFound):
        ctl_b.runs.cancel(ctl_b.conn, run)


def test_worker_role_cannot_write_protected_tables(rt: Runtime) -> None:
    run = new_run(rt)
    for stmt in (
        "UPDATE agent_runs SET epoch = 0",
        "UPDATE agent_runs SET owner = 'x', lease_expires_at = now() + interval '1 h'",
        "DELETE FROM agent_checkpoints",
        "INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)"
        " VALUES (gen_random_uuid(), fencecheck.session_tenant(),"
        f" '{run}', 'x', '{{}}')",
        "UPDATE tool_operations SET status = 'prepared'",
        "SELECT * FROM fencecheck._grant(gen_random_uuid(), 'x', 1000, NULL, NULL, 0)",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            rt.conn.execute(stmt)


@pytest.mark.parametrize("fn", CONTROL_PLANE)
def test_worker_role_cannot_execute_control_plane(ref_db: Database, fn: str) -> None:
    rows = ref_db.query(
        "SELECT bool_or(has_function_privilege(%s, p.oid, 'EXECUTE')) AS worker,"
        " bool_or(has_function_privilege(%s, p.oid, 'EXECUTE')) AS operator"
        " FROM pg_proc p WHERE p.pronamespace = 'fencecheck'::regnamespace AND p.proname = %s",
        [ROLES[(TENANT, "worker")], ROLES[(TENANT, "operator")], fn],
    )
    assert rows == [{"worker": False, "operator": True}]


def test_session_cannot_change_its_tenant(rt: Runtime) -> None:
    """No setting, role switch or table write moves a session to another tenant."""
    mine = new_run(rt)
    conn = rt.conn
    attempts = (
        "SELECT set_config('app.tenant_id', %(other)s, false)",
        "SET app.tenant_id = '22222222-2222-2222-2222-222222222222'",
    )
    for stmt in attempts:
        conn.execute(stmt, {"other": OTHER_TENANT})
    row = conn.execute("SELECT fencecheck.session_tenant()::text AS t").fetchone()
    assert row == {"t": TENANT}
    seen = conn.execute("SELECT run_id FROM agent_runs").fetchall()
    assert [r["run_id"] for r in seen] == [mine]
    for stmt in (
        "SET ROLE fencecheck_operator",
        f"SET ROLE {ROLES[(OTHER_TENANT, 'worker')]}",
        f"SET SESSION AUTHORIZATION {ROLES[(OTHER_TENANT, 'worker')]}",
        f"UPDATE tenant_bindings SET tenant_id = '{OTHER_TENANT}'",
        f"INSERT INTO tenant_bindings (role_name, tenant_id) VALUES (session_user, '{OTHER_TENANT}')",
        "DELETE FROM tenant_bindings",
        "SELECT * FROM tenant_bindings",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(stmt)
    assert conn.execute("SELECT fencecheck.session_tenant()::text AS t").fetchone() == {"t": TENANT}


@pytest.fixture
def unbound_role(ref_db: Database) -> Iterator[str]:
    name = f"fct_unbound_{uuid.uuid4().hex[:8]}"
    ref_db.query(f"CREATE ROLE {name} LOGIN IN ROLE fencecheck_worker")
    try:
        yield name
    finally:
        ref_db.query(f"DROP ROLE {name}")


def test_unbound_role_sees_nothing(
    ref_db: Database, rt: Runtime, unbound_role: str, make_rt: Callable[..., Runtime]
) -> None:
    new_run(rt)
    with psycopg.connect(ref_db.dsn(unbound_role), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM agent_runs").fetchone() == (0,)
        assert c.execute("SELECT fencecheck.session_tenant()").fetchone() == (None,)
    wrong = make_rt("X")
    wrong.spec = type(wrong.spec)(ref_db.dsn(unbound_role), TENANT, "X")
    wrong.session.spec = wrong.spec
    with pytest.raises(e.TenantBindingMismatch):
        _ = wrong.conn


def test_migrate_is_idempotent(ref_db: Database) -> None:
    assert migrate(ref_db.admin_dsn) == []
