"""Each metric of both seeds' sets moves when its event happens (in process,
against the worker's registry; the cross-process snapshot is checked in
test_worker_process.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from harness.parts.postgres import Database
from mock_tool.process import MockToolProcess
from reference_impl import errors as e
from reference_impl import metrics
from reference_impl.cancellation import Cancellation
from reference_impl.ledger import intent_effect
from reference_impl.metrics import REGISTRY, DatabaseGauges
from reference_impl.protected import Write
from reference_impl.runtime import Runtime
from reference_impl.tools import ToolGateway
from tests.reference_impl.conftest import ROLES, TENANT, cp, new_run, operator_of, take


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Moves:
    """Remember a metric's value; ``by()`` is how much it moved since."""

    def __init__(self, name: str, **labels: str) -> None:
        self.name, self.labels = name, labels
        self.start = value(name, **labels)

    def by(self) -> float:
        return value(self.name, **self.labels) - self.start


@pytest.fixture
def tool(tmp_path: Path) -> Iterator[MockToolProcess]:
    with MockToolProcess(tmp_path / "tool") as proc:
        yield proc


def test_lease_metrics(rt: Runtime, make_rt: Callable[..., Runtime], ref_db: Database) -> None:
    run = new_run(rt)
    success, busy = (
        Moves("lease_acquire_total", outcome="success"),
        Moves("lease_acquire_total", outcome="busy"),
    )
    conflicts, missing = (
        Moves("lease_claim_conflicts_total"),
        Moves("lease_acquire_total", outcome="missing"),
    )
    takeover = Moves("workflow_takeover_duration_seconds_count")
    lease = take(rt, run, ttl_ms=60_000).lease
    b = make_rt("B")
    assert not b.leases.takeover(b.conn, run, b.owner, 1000).acquired
    assert b.leases.takeover(b.conn, uuid.uuid4(), b.owner, 1000).outcome == "missing"
    # expire the lease by the database's clock (no sleep a loaded machine could stretch)
    ref_db.query(
        "UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 s'"
        " WHERE run_id = %s",
        [run],
    )
    assert b.leases.takeover(b.conn, run, b.owner, 1000).acquired
    assert (success.by(), busy.by(), conflicts.by(), missing.by(), takeover.by()) == (2, 1, 1, 1, 1)
    # the old holder: its renewal and its write are refused for a stale fence
    stale, failures = Moves("stale_fence_rejections_total"), Moves("lease_renewal_failures_total")
    renew_lost = Moves("lease_renew_total", outcome="lost")
    rejected = Moves("protected_write_rejected_total", reason="lease")
    hb = rt.heartbeat(lease, Cancellation(), interval_ms=50, timeout_ms=500)
    assert hb.renew_once() == "lost"
    hb.stop()
    with pytest.raises(e.LeaseLost):
        rt.writer.write(cp(lease, 0))
    assert (stale.by(), failures.by(), renew_lost.by(), rejected.by()) == (2, 1, 1, 1)
    db_error = Moves("lease_acquire_total", outcome="db_error")
    closed = rt.conn
    closed.close()
    with pytest.raises(psycopg.Error):
        rt.leases.claim(closed, "x", 1000)
    assert db_error.by() == 1


def test_write_metrics(rt: Runtime) -> None:
    lease = take(rt, new_run(rt)).lease
    latency = Moves("checkpoint_commit_latency_seconds_count", transition="checkpoint")
    lock_wait = Moves("lease_row_lock_wait_seconds_count")
    rt.writer.write(cp(lease, 0))
    assert latency.by() == 1 and lock_wait.by() == 1
    revision = Moves("protected_write_rejected_total", reason="revision")
    with pytest.raises(e.RevisionConflict):
        rt.writer.write(cp(lease, 0))
    assert revision.by() == 1
    unknown = Moves("commit_outcome_unknown_total", resolution="not_committed")
    w = Write(lease, 1, "checkpoint", {"n": 1}, 2, "agent.checkpoint", {})
    assert rt.writer.resolve_unknown(w, TimeoutError("lost")) is None
    assert unknown.by() == 1


def test_checkpoint_migration_metrics(rt: Runtime) -> None:
    lease = take(rt, new_run(rt)).lease
    legacy = {"step": "lookup", "done": ["plan"], "vars": {"order_id": "o", "amount": 1}}
    rt.writer.write(cp(lease, 0, legacy, schema_version=1))
    migrated = Moves("checkpoint_migrations_total", result="migrated")
    assert rt.runs.read_checkpoint(rt.conn, lease.run_id) is not None
    assert migrated.by() == 1
    rt.writer.write(cp(lease, 1, {"x": 1}, schema_version=99))
    refused, failures = (
        Moves("checkpoint_migrations_total", result="refused"),
        Moves("checkpoint_migration_failures_total"),
    )
    with pytest.raises(e.SchemaVersionUnknown):
        rt.runs.read_checkpoint(rt.conn, lease.run_id)
    assert (refused.by(), failures.by()) == (1, 1)


def test_ledger_and_operator_metrics(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "s", 1)
    rt.writer.write(
        cp(lease, 0, transition="intent", effect=intent_effect(op, "s", 1, "plain", "none", {}))
    )
    claimed = rt.ledger.claim(rt.conn, "D", op)
    assert claimed is not None
    unknown, unknown_cn = Moves("tool_operation_unknown_total"), Moves("tool_unknown_result_total")
    rt.ledger.mark_unknown(rt.conn, claimed, "D", {})
    assert (unknown.by(), unknown_cn.by()) == (1, 1)
    no_result = Moves("reconcile_total", outcome="no_result")
    row = rt.ledger.get(rt.conn, op)
    assert (
        rt.reconciler.reconcile_one(rt.conn, {**dict(row or {}), "run_status": "running"}) is None
    )
    assert no_result.by() == 1
    cancel = Moves("operator_actions_total", action="cancel")
    ctl = operator_of(rt)
    ctl.runs.cancel(ctl.conn, run, "test", None)
    assert cancel.by() == 1


def test_outbox_metrics(rt: Runtime, tool: MockToolProcess) -> None:
    lease = take(rt, new_run(rt)).lease
    rt.writer.write(cp(lease, 0))
    retries = Moves("outbox_publish_retries_total")
    nowhere = ToolGateway("http://127.0.0.1:9", 0.5)
    assert rt.protocol.relay_cls(rt.protocol.queries, nowhere).cycle(rt.conn) == []
    assert retries.by() == 1
    gateway = ToolGateway(tool.base_url, 2.0)
    published = Moves("outbox_published_total")
    relay = rt.protocol.relay_cls(rt.protocol.queries, gateway)
    assert len(relay.cycle(rt.conn)) >= 1 and published.by() >= 1
    consumer = rt.protocol.consumer_cls(rt.protocol.queries, gateway, TENANT)
    consumer.cycle(rt.conn, "c1")
    dupes = Moves("consumer_dedup_conflicts_total")
    fresh = rt.protocol.consumer_cls(rt.protocol.queries, gateway, TENANT)  # reads from seq 0
    assert fresh.cycle(rt.conn, "c1")["duplicates"] >= 1
    assert dupes.by() >= 1


def test_database_gauges(rt: Runtime, ref_db: Database) -> None:
    new_run(rt)
    gauges = DatabaseGauges(lambda: psycopg.connect(ref_db.dsn(ROLES[(TENANT, "worker")])))
    found = {(m.name, s.labels.get("status")): s.value for m in gauges.collect() for s in m.samples}
    assert found[("agent_runs_by_status", "queued")] >= 1
    assert found[("agent_oldest_queued_age_seconds", None)] > 0
    for name in (
        "in_doubt_age_seconds",
        "tool_operation_unknown_oldest_age_seconds",
        "outbox_oldest_pending_age_seconds",
    ):
        assert (name, None) in found
    assert metrics.STATUSES[0] == "queued"
