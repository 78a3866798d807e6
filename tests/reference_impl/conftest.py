"""Fixtures: a migrated template database built once, one copy per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

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


def _init(dsn: str) -> None:
    migrate(dsn)


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

    def make(worker_id: str = "A", tenant: str = TENANT, **kw: Any) -> Runtime:
        settings = Settings(
            dsn=ref_db.dsn("fencecheck_worker"), worker_id=worker_id, tenant=tenant, **kw
        )
        rt = Runtime(settings, Protocol())
        rt.writer.stepped = False
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


@pytest.fixture
def rt(make_rt: Callable[..., Runtime]) -> Runtime:
    return make_rt("A")


def new_run(rt: Runtime, input_: dict[str, Any] | None = None) -> uuid.UUID:
    out = rt.runs.create(rt.conn, f"task-{uuid.uuid4().hex[:8]}", input_ or {})
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
