"""Rules 4, 5, 6, 7: intents, dispatch claims, results, reconciliation, cancel,
retries and callbacks, at the SQL/API level."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.parts.postgres import Database
from mock_tool.process import MockToolProcess
from reference_impl import errors as e
from reference_impl.ids import operation_id, request_digest
from reference_impl.leases import Lease
from reference_impl.ledger import Answer, Operation, intent_effect
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import TENANT, cp, new_run, operator_of, take

REQUEST = {"order_id": "o1", "amount": 10}


def _intent(
    rt: Runtime,
    lease: Lease,
    rev: int,
    tool: str = "idem",
    cap: str = "idempotent",
    request: dict[str, Any] | None = None,
) -> str:
    op = rt.protocol.operation_id(TENANT, str(lease.run_id), "create_label", 1)
    effect = intent_effect(op, "create_label", 1, tool, cap, request or REQUEST)
    out = rt.writer.write(cp(lease, rev, transition="intent", effect=effect))
    assert out.ledger_status == "prepared" and out.status == "waiting_tool"
    return op


def test_operation_id_is_intent_only() -> None:
    a = operation_id(TENANT, "r1", "create_label", 1)
    assert a == operation_id(TENANT, "r1", "create_label", 1)
    assert a != operation_id(TENANT, "r1", "create_label", 2)
    assert request_digest({"a": 1, "b": [1, 2]}) == request_digest({"b": [1, 2], "a": 1})


def test_intent_is_idempotent_but_conflicts_are_refused(rt: Runtime, ref_db: Database) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op = _intent(rt, lease, 0)
    # Same intent again (e.g. after a takeover): accepted, one ledger row.
    _intent(rt, lease, 1)
    assert ref_db.query("SELECT count(*) AS n FROM tool_operations")[0]["n"] == 1
    with pytest.raises(e.IntentConflict):
        _intent(rt, lease, 2, request={"order_id": "o1", "amount": 999})
    assert ref_db.query("SELECT request_digest FROM tool_operations WHERE operation_id = %s", [op])[
        0
    ]["request_digest"] == request_digest(REQUEST)


def test_dispatch_claim_skip_locked_and_deadline(rt: Runtime, make_rt: Any) -> None:
    other = make_rt("B")
    run1, run2 = new_run(rt), new_run(rt)
    op1 = _intent(rt, take(rt, run1).lease, 0)
    op2 = _intent(rt, take(rt, run2).lease, 0)
    with rt.conn.transaction():
        first = rt.ledger.claim(rt.conn, "D1")  # its row stays locked until commit
        second = other.ledger.claim(other.conn, "D2")  # skips it, does not wait
        assert first is not None and second is not None
        assert {first.operation_id, second.operation_id} == {op1, op2}
    row = rt.ledger.get(rt.conn, op1)
    assert row is not None and row["status"] == "dispatching" and row["dispatch_until"]


def test_result_recorded_only_for_matching_claim(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    _intent(rt, lease, 0)
    op = rt.ledger.claim(rt.conn, "D1")
    assert op is not None and op.status == "dispatching"
    ok = Answer("succeeded", "res-1", {"resource_id": "res-1"})
    for bad, reason in (
        (Operation(**{**op.__dict__, "revision": op.revision - 1}), "revision_mismatch"),
        (Operation(**{**op.__dict__, "request_digest": "x"}), "digest_mismatch"),
    ):
        with pytest.raises(e.LedgerConflict) as err:
            rt.ledger.record_result(rt.conn, bad, "D1", ok)
        assert err.value.reason == reason
    with pytest.raises(e.LedgerConflict) as err:
        rt.ledger.record_result(rt.conn, op, "D2", ok)
    assert err.value.reason == "owner_mismatch"
    assert rt.ledger.record_result(rt.conn, op, "D1", ok) == "succeeded"
    with pytest.raises(e.LedgerConflict):  # zero rows never ignored: second write refused
        rt.ledger.record_result(rt.conn, op, "D1", ok)


def test_expired_claim_becomes_unknown_never_prepared(rt: Runtime) -> None:
    rt.ledger.dispatch_ttl_ms = 100
    run = new_run(rt)
    lease = take(rt, run).lease
    op_id = _intent(rt, lease, 0)
    op = rt.ledger.claim(rt.conn, "D1")
    assert op is not None
    assert rt.ledger.expire_claims(rt.conn) == []  # not yet expired
    time.sleep(0.15)
    assert rt.ledger.expire_claims(rt.conn) == [
        {"operation_id": op_id, "from": "dispatching", "to": "unknown"}
    ]
    row = rt.ledger.get(rt.conn, op_id)
    assert row is not None and row["status"] == "unknown"
    assert rt.ledger.claim(rt.conn, "D2") is None  # unknown is never dispatched again as new
    with pytest.raises(e.LedgerConflict):  # the late answer of the expired claim
        rt.ledger.record_result(rt.conn, op, "D1", Answer("succeeded", "r", {}))


def test_timeout_is_unknown_not_failure(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op_id = _intent(rt, lease, 0)
    op = rt.ledger.claim(rt.conn, rt.owner)
    assert op is not None
    status = rt.dispatcher.settle_without_result(rt.conn, op, Answer("unknown", error={}))
    assert status == "unknown"
    # Same-key retry is allowed only for tools that promise it:
    assert rt.ledger.claim_retry(rt.conn, rt.owner, op_id, op.revision + 1) is not None


def test_same_key_retry_refused_for_plain_tools(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op_id = _intent(rt, lease, 0, tool="plain", cap="none")
    op = rt.ledger.claim(rt.conn, rt.owner)
    assert op is not None
    rt.ledger.mark_unknown(rt.conn, op, rt.owner, {})
    assert rt.ledger.claim_retry(rt.conn, rt.owner, op_id, op.revision + 1) is None
    row = rt.ledger.get(rt.conn, op_id) or {}
    assert rt.reconciler.reconcile_one(rt.conn, {**row, "run_status": "running"}) is None


def test_tx2_records_result_and_advances_run_together(rt: Runtime, ref_db: Database) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op_id = _intent(rt, lease, 0)
    op = rt.ledger.claim(rt.conn, rt.owner)
    assert op is not None
    effect = {
        "mode": "record",
        "operation_id": op_id,
        "outcome": "succeeded",
        "dispatch_owner": rt.owner,
        "ledger_revision": op.revision,
        "request_digest": op.request_digest,
        "remote_id": "res-9",
        "result": {},
    }
    bad = {**effect, "ledger_revision": op.revision + 7}
    with pytest.raises(e.LedgerConflict):
        rt.writer.write(cp(lease, 1, transition="tool_result", effect=bad))
    assert rt.runs.state(rt.conn, run)["revision"] == 1  # nothing of Tx2 committed
    out = rt.writer.write(cp(lease, 1, transition="tool_result", effect=effect))
    assert out.status == "running" and out.ledger_status == "succeeded"


def test_cancel_forbids_prepared_and_keeps_in_flight(rt: Runtime, make_rt: Any) -> None:
    """Experiment F at the SQL level."""
    ctl = operator_of(rt)
    run1, run2 = new_run(rt), new_run(rt)
    l1 = take(rt, run1).lease
    l2 = take(rt, run2).lease
    prepared = _intent(rt, l1, 0)
    inflight = _intent(rt, l2, 0)
    assert rt.ledger.claim(rt.conn, "D1", inflight) is not None
    out1 = ctl.runs.cancel(ctl.conn, run1)
    out2 = ctl.runs.cancel(ctl.conn, run2)
    assert out1["run_status"] == "cancelled"
    assert out1["operations"] == [{"operation_id": prepared, "status": "cancelled"}]
    assert out2["operations"] == [{"operation_id": inflight, "status": "dispatching"}]
    assert rt.ledger.claim(rt.conn, "D2") is None
    with pytest.raises(e.LeaseLost):  # the worker of a cancelled run lost its write right
        rt.writer.write(cp(l1, 1))


def test_retry_is_new_run_and_old_callbacks_cannot_advance_it(
    rt: Runtime, ref_db: Database
) -> None:
    """Experiment G at the SQL level."""
    ctl = operator_of(rt)
    task = "task-g"
    run1 = uuid.UUID(ctl.runs.create(ctl.conn, task, {"tool": "idem"})["run_id"])
    l1 = take(rt, run1).lease
    op1 = _intent(rt, l1, 0)
    assert rt.ledger.claim(rt.conn, "D1", op1) is not None
    with pytest.raises(e.RunNotRetryable):
        ctl.runs.retry(ctl.conn, task)
    ctl.runs.cancel(ctl.conn, run1)
    run2 = uuid.UUID(ctl.runs.retry(ctl.conn, task)["run_id"])
    assert run2 != run1
    assert (
        ref_db.query("SELECT active_run_id FROM agent_tasks WHERE task_id = %s", [task])[0][
            "active_run_id"
        ]
        == run2
    )
    l2 = take(rt, run2).lease
    op2 = _intent(rt, l2, 0)
    assert op2 != op1
    payload = {"resource_id": "late-1"}
    assert not ctl.runs.deliver_callback(ctl.conn, run1, op1, payload)  # old run: refused
    assert not ctl.runs.deliver_callback(ctl.conn, run2, op1, payload)  # not run2's op
    st2 = rt.runs.state(rt.conn, run2)
    assert (st2["revision"], st2["status"]) == (1, "waiting_tool")
    assert rt.ledger.claim(rt.conn, "D2", op2) is not None
    assert ctl.runs.deliver_callback(ctl.conn, run2, op2, payload)  # its own: accepted
    assert (
        ref_db.query("SELECT status FROM tool_operations WHERE operation_id = %s", [op1])[0][
            "status"
        ]
        == "dispatching"
    )


@pytest.fixture
def tool(tmp_path: Path) -> Iterator[MockToolProcess]:
    with MockToolProcess(tmp_path / "tool") as proc:
        yield proc


@pytest.mark.parametrize("remote_request", ["same", "other"])
def test_reconciler_converges_only_to_a_resource_of_the_same_request(
    make_rt: Callable[..., Runtime], ref_db: Database, tool: MockToolProcess, remote_request: str
) -> None:
    """The query answer carries the digest of the body the tool acted on: a
    resource created under the operation_id from another request body is not
    this intent's effect, so the operation stays unknown with evidence."""
    rt = make_rt("A", tool_url=tool.base_url)
    run = new_run(rt)
    lease = take(rt, run).lease
    op_id = _intent(rt, lease, 0, tool="queryable", cap="query")
    op = rt.ledger.claim(rt.conn, rt.owner)
    assert op is not None
    body = REQUEST if remote_request == "same" else {**REQUEST, "amount": 99}
    tool.client().create("queryable", op_id, str(run), lease.epoch, body)
    rt.ledger.mark_unknown(rt.conn, op, rt.owner, {})
    row = rt.ledger.get(rt.conn, op_id) or {}
    change = rt.reconciler.reconcile_one(rt.conn, {**row, "run_status": "waiting_tool"})
    after = rt.ledger.get(rt.conn, op_id) or {}
    if remote_request == "same":
        assert change == {"operation_id": op_id, "from": "unknown", "to": "succeeded"}
        assert after["status"] == "succeeded"
    else:
        assert change is None and after["status"] == "unknown"
        evidence = ref_db.query(
            "SELECT evidence FROM tool_operations WHERE operation_id = %s", [op_id]
        )[0]["evidence"]
        assert evidence[-1]["event"] == "query_digest_mismatch"
