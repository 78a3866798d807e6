"""Fixtures: a migrated template database built once, one copy per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from harness.parts.postgres import Database, PostgresCluster
from harness.waiting import wait_for
from reference_impl.config import Settings
from reference_impl.leases import Grant, Lease
from reference_impl.migrations import migrate
from reference_impl.protected import Write
from reference_impl.protocol import Protocol
from reference_impl.runtime import Runtime

TENANT = "11111111-1111-1111-1111-111111111111"
OTHER_TENANT = "22222222-2222-2222-2222-222222222222"
# Login roles of the test session (cluster-wide), bound per tenant in the
# template database and so in every copy of it (worker contract v2).
ROLES = {
    (TENANT, "worker"): "fct_worker_1",
    (OTHER_TENANT, "worker"): "fct_worker_2",
    (TENANT, "operator"): "fct_operator_1",
    (OTHER_TENANT, "operator"): "fct_operator_2",
}


def bind_roles(admin_dsn: str) -> None:
    """Create the test login roles (if missing) and bind them in this database."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (tenant, kind), name in ROLES.items():
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone()
            if not exists:
                conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE fencecheck_{kind}".encode())
            conn.execute(
                "INSERT INTO public.tenant_bindings (role_name, tenant_id) VALUES (%s, %s)"
                " ON CONFLICT (role_name) DO UPDATE SET tenant_id = excluded.tenant_id",
                [name, tenant],
            )


def _init(dsn: str) -> None:
    migrate(dsn)
    bind_roles(dsn)


@pytest.fixture(scope="session")
def ref_template(pg_cluster: PostgresCluster) -> str:
    return pg_cluster.create_template("ref_migrated", init=_init)


@pytest.fixture
def ref_db(pg_cluster: PostgresCluster, ref_template: str) -> Iterator[Database]:
    db = pg_cluster.create_database(template=ref_template)
    try:
        yield db
    finally:
        pg_cluster.drop_database(db.name)


@pytest.fixture
def make_rt(ref_db: Database) -> Iterator[Callable[..., Runtime]]:
    made: list[Runtime] = []

    def make(
        worker_id: str = "A", tenant: str = TENANT, role: str = "worker", **kw: Any
    ) -> Runtime:
        settings = Settings(
            dsn=ref_db.dsn(ROLES[(tenant, role)]), worker_id=worker_id, tenant=tenant, **kw
        )
        rt = Runtime(settings, Protocol())
        rt.writer.stepped = False
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()
        ctl = _OPERATORS.pop(id(rt), None)
        if ctl is not None:
            ctl.close()


@pytest.fixture
def rt(make_rt: Callable[..., Runtime]) -> Runtime:
    return make_rt("A")


@pytest.fixture
def ops(make_rt: Callable[..., Runtime]) -> Runtime:
    """The control plane of TENANT (its operator login role)."""
    return make_rt("ctl", role="operator")


_OPERATORS: dict[int, Runtime] = {}


def operator_of(rt: Runtime) -> Runtime:
    """A control-plane runtime for ``rt``'s tenant on the same database (cached)."""
    found = _OPERATORS.get(id(rt))
    if found is None:
        s = rt.settings
        assert s.dsn is not None
        worker_role = ROLES[(s.tenant, "worker")]
        dsn = s.dsn.replace(f"user={worker_role}", f"user={ROLES[(s.tenant, 'operator')]}")
        found = Runtime(Settings(dsn=dsn, worker_id="ctl", tenant=s.tenant), Protocol())
        _OPERATORS[id(rt)] = found
    return found


def new_run(rt: Runtime, input_: dict[str, Any] | None = None) -> uuid.UUID:
    """A task with one queued run of ``rt``'s tenant, created by its control plane."""
    ctl = operator_of(rt)
    out = ctl.runs.create(ctl.conn, f"task-{uuid.uuid4().hex[:8]}", input_ or {})
    return uuid.UUID(out["run_id"])


def take(rt: Runtime, run_id: uuid.UUID, ttl_ms: int = 10_000, owner: str | None = None) -> Grant:
    grant = rt.leases.takeover(rt.conn, run_id, owner or rt.owner, ttl_ms)
    assert grant.acquired, grant
    return grant


def cp(lease: Lease, expected: int, state: dict[str, Any] | None = None, **kw: Any) -> Write:
    """A checkpoint write."""
    return Write(
        lease,
        expected,
        kw.pop("transition", "checkpoint"),
        state or {"n": expected},
        kw.pop("schema_version", 2),
        kw.pop("event_type", "agent.checkpoint"),
        kw.pop("payload", {"tenant_id": TENANT}),
        **kw,
    )


def wait_until_blocked_on_lock(db: Database, pid: int, timeout_s: float = 5.0) -> None:
    """Wait (bounded) until backend ``pid`` is blocked on a lock, as the
    server sees it: proof that a statement is waiting for a lock holder,
    where a sleep only shows that it has not finished yet."""

    def probe() -> list[dict[str, Any]] | None:
        rows = db.query(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 120) AS query"
            " FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [pid],
        )
        return rows or None

    wait_for(probe, what=f"backend {pid} to wait on a lock", timeout_s=timeout_s)
