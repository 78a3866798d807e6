"""The operational half (issue 15): the state table in one place and a model
test over it, operator decisions with their audit rows, leaving a pause,
effect versions, the retention window of same-key retries, backoff, the
freeze after an inconsistent read-back, the durability refusal of ``run``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from harness.parts.postgres import Database
from reference_impl import backoff, states
from reference_impl import errors as e
from reference_impl.leases import Lease
from reference_impl.ledger import intent_effect
from reference_impl.runner import EXIT_DURABILITY, EXIT_INDOUBT, Runner
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import ROLES, TENANT, cp, new_run, operator_of, take


def test_state_table_is_one_table(ref_db: Database) -> None:
    rows = ref_db.query(
        "SELECT action, from_status, to_status, actor FROM fencecheck._state_table()"
    )
    assert sorted(tuple(r.values()) for r in rows) == sorted(states.TABLE)
    # and the guard refuses any status change outside it
    for frm in states.STATUSES:
        for to in states.STATUSES:
            allowed = any(f == frm and t == to for _, f, t, _ in states.TABLE) or frm == to
            assert allowed == (frm == to or (frm, to) in {(f, t) for _, f, t, _ in states.TABLE})


def test_guard_refuses_a_jump(ref_db: Database, rt: Runtime) -> None:
    run = new_run(rt)
    with pytest.raises(Exception, match="cannot go from queued to succeeded"):
        ref_db.query("UPDATE agent_runs SET status = 'succeeded' WHERE run_id = %s", [run])


def test_run_lifecycle_matches_the_state_table(make_rt: Callable[..., Runtime]) -> None:
    """Worker transitions, operator decisions and the lease against the model."""
    worker, ctl = make_rt("A"), make_rt("ctl", role="operator")

    class RunMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run = new_run(worker)
            self.status = "queued"
            self.lease: Lease | None = None
            self.revision = 0
            self.requeued = False  # a requeue's backoff may still be running

        def _write(self, transition: str) -> None:
            allowed = self.lease is not None and self.status in states.LIVE
            try:
                assert self.lease is not None
                out = worker.writer.write(cp(self.lease, self.revision, transition=transition))
            except (e.LeaseLost, e.RunNotFound, AssertionError):
                assert not allowed
                return
            assert allowed
            self.revision = out.revision
            self.requeued = transition == "requeue" or self.requeued
            target = states.target(transition, self.status)
            assert out.status == target
            self.status = out.status
            if self.status not in states.LIVE:
                self.lease = None

        @rule()
        def claim(self) -> None:
            g = worker.leases.takeover(worker.conn, self.run, worker.owner, 60_000)
            if self.status == "queued" and g.outcome == "not_due" and self.requeued:
                return  # never claimed before next_attempt_at: the backoff has not run out
            if self.status == "queued":
                assert g.acquired, g
                self.requeued = False  # granted: that backoff has run out
                self.lease, self.status = g.lease, states.target("grant", "queued") or ""
            else:
                assert not g.acquired

        @rule(
            t=st.sampled_from(["checkpoint", "requeue", "freeze", "pause_human", "succeed", "fail"])
        )
        def write(self, t: str) -> None:
            self._write(t)

        @rule(d=st.sampled_from(["approve", "supplement", "terminate", "cancel"]))
        def operator(self, d: str) -> None:
            allowed = states.target(d, self.status)
            try:
                if d == "cancel":
                    out = ctl.runs.cancel(ctl.conn, self.run, "model", "T-1")
                    got = out["run_status"]
                    if self.status in states.TERMINAL:  # cancel of a terminal run changes nothing
                        assert got == self.status
                        return
                else:
                    sup = {"note": "x"} if d == "supplement" else None
                    got = ctl.runs.decide(ctl.conn, self.run, d, sup, "model", "T-1")["run_status"]
            except e.StateConflict:
                assert allowed is None
                return
            assert got == allowed
            self.status, self.lease = got, None

        @invariant()
        def database_agrees(self) -> None:
            row = worker.runs.state(worker.conn, self.run)
            assert row["status"] == self.status

    run_state_machine_as_test(
        RunMachine,
        settings=settings(
            max_examples=10,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def _frozen_in_doubt(rt: Runtime) -> tuple[uuid.UUID, str]:
    """A run paused in doubt with one unknown operation of the 'plain' tool."""
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    effect = intent_effect(op, "label", 1, "plain", "none", {"kind": "label"})
    rt.writer.write(cp(lease, 0, transition="intent", effect=effect))
    claimed = rt.ledger.claim(rt.conn, "D1", op)
    assert claimed is not None
    rt.ledger.mark_unknown(rt.conn, claimed, "D1", {"class": "timeout"})
    rt.writer.write(cp(lease, 1, transition="freeze", effect={"operation_id": op}))
    return run, op


def test_operator_resolves_in_doubt_with_an_audit_row(rt: Runtime, ref_db: Database) -> None:
    run, op = _frozen_in_doubt(rt)
    ctl = operator_of(rt)
    with pytest.raises(Exception, match="permission denied"):
        rt.conn.execute(
            "SELECT * FROM fencecheck.operator_resolve(%s, %s, 'executed', 'r', 'x', NULL)",
            [run, op],
        )
    out = ctl.runs.resolve(ctl.conn, run, op, "executed", "res-1", "found in console", "OPS-7")
    assert (out["run_status"], out["operation_status"]) == ("queued", "succeeded")
    (act,) = ctl.runs.actions(ctl.conn, run)
    assert act["operator"] == ROLES[(TENANT, "operator")] and act["ticket"] == "OPS-7"
    assert act["before"]["status"] == "paused_indoubt" and act["after"]["status"] == "queued"
    assert act["before"]["operation"]["status"] == "unknown"
    assert act["after"]["operation"]["remote_id"] == "res-1"
    with pytest.raises(e.StateConflict):  # nothing in doubt any more
        ctl.runs.resolve(ctl.conn, run, op, "not_executed", None, "again", None)
    other, _ = _frozen_in_doubt(rt)
    with pytest.raises(Exception, match="needs a reason"):
        ctl.runs.decide(ctl.conn, other, "terminate", None, "", None)
    assert rt.runs.state(rt.conn, other)["status"] == "paused_indoubt"


def test_an_operators_convergence_resumes_the_paused_run(rt: Runtime) -> None:
    # Nothing of the run in doubt any more: left paused in doubt, resolve would
    # refuse it (its operation is no longer unknown) and nothing would resume it.
    run, op = _frozen_in_doubt(rt)
    ctl = operator_of(rt)
    ctl.runs.converge(ctl.conn, op, "succeeded", "res-1", "found in console", "OPS-8")
    assert rt.runs.state(rt.conn, run)["status"] == "queued"
    (act,) = ctl.runs.actions(ctl.conn, run)
    assert (act["action"], act["before"]["status"], act["after"]["status"]) == (
        "converge",
        "paused_indoubt",
        "queued",
    )


def test_reconciled_operation_resumes_the_paused_run(rt: Runtime) -> None:
    run, op = _frozen_in_doubt(rt)
    row = rt.ledger.get(rt.conn, op)
    assert row is not None
    rt.ledger.converge(
        rt.conn, op, int(row["revision"]), "failed_final", None, {"executed": False}, {"q": 1}
    )
    assert rt.runs.state(rt.conn, run)["status"] == "queued"
    # and the next version of the step may now be planned, not before
    lease = take(rt, run).lease
    op2 = rt.protocol.operation_id(TENANT, str(run), "label", 2)
    effect = intent_effect(op2, "label", 2, "plain", "none", {"kind": "label", "v": 2})
    rev = int(rt.runs.state(rt.conn, run)["revision"])
    assert (
        rt.writer.write(cp(lease, rev, transition="intent", effect=effect)).status == "waiting_tool"
    )


def test_next_effect_version_refused_while_an_earlier_may_have_happened(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op1 = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    rt.writer.write(
        cp(
            lease,
            0,
            transition="intent",
            effect=intent_effect(op1, "label", 1, "idem", "idempotent", {}),
        )
    )
    op2 = rt.protocol.operation_id(TENANT, str(run), "label", 2)
    with pytest.raises(e.IntentConflict):
        rt.writer.write(
            cp(
                lease,
                1,
                transition="intent",
                effect=intent_effect(op2, "label", 2, "idem", "idempotent", {"x": 1}),
            )
        )


def test_same_key_retry_refused_past_the_tools_retention(rt: Runtime, ref_db: Database) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    effect = intent_effect(op, "label", 1, "idem", "idempotent", {"k": 1}, retention_ms=60_000)
    rt.writer.write(cp(lease, 0, transition="intent", effect=effect))
    claimed = rt.ledger.claim(rt.conn, "D1", op)
    assert claimed is not None
    rt.ledger.mark_unknown(rt.conn, claimed, "D1", {})
    row = rt.ledger.get(rt.conn, op)
    assert row is not None and row["key_remembered"]
    # inside the window: a same-key retry may be claimed
    again = rt.ledger.claim_retry(rt.conn, "R1", op, int(row["revision"]))
    assert again is not None
    rt.ledger.mark_unknown(rt.conn, again, "R1", {})
    ref_db.query(
        "UPDATE tool_operations SET first_dispatched_at = clock_timestamp() - interval '61 s'"
        " WHERE operation_id = %s",
        [op],
    )
    row = rt.ledger.get(rt.conn, op)
    assert row is not None and row["key_remembered"] is False
    assert rt.ledger.claim_retry(rt.conn, "R2", op, int(row["revision"])) is None


def test_backoff_grows_with_bounded_jitter() -> None:
    run = str(uuid.uuid4())
    delays = [backoff.delay_ms(run, a) for a in range(1, 12)]
    for a, d in enumerate(delays, start=1):
        full = min(backoff.BASE_MS * 2 ** (a - 1), backoff.CAP_MS)
        assert full // 2 <= d <= full
    assert delays == [backoff.delay_ms(run, a) for a in range(1, 12)]  # deterministic
    assert delays[-1] <= backoff.CAP_MS and delays[3] > delays[0]
    other = [backoff.delay_ms(str(uuid.uuid4()), 5) for _ in range(20)]
    assert len(set(other)) > 1  # jitter spreads runs


def test_inconsistent_read_back_freezes_the_run(rt: Runtime) -> None:
    run = new_run(rt)
    grant = take(rt, run)
    rt.writer.write(cp(grant.lease, 0, transition="start"))
    Runner(rt)._freeze_inconsistent(grant.lease, e.CommitInconsistent("checkpoint without outbox"))
    row = rt.runs.state(rt.conn, run)
    assert (row["status"], row["owner"]) == ("paused_indoubt", None)
    events = rt.conn.execute(
        "SELECT payload FROM outbox WHERE run_id = %s AND event_type = 'agent.commit_inconsistent'",
        [run],
    ).fetchall()
    assert len(events) == 1 and events[0]["payload"]["reason"] == "commit_inconsistent"
    assert EXIT_INDOUBT == 11


def test_run_refuses_to_start_below_the_required_durability(
    make_rt: Callable[..., Runtime], caplog: Any
) -> None:
    rt = make_rt("A", require_durability="sync")
    assert Runner(rt).run(once=True) == EXIT_DURABILITY
    ok = make_rt("B", require_durability="none")
    assert Runner(ok).run(exit_when_idle=True) == 0


def test_cancel_then_late_success_asks_for_compensation(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    rt.writer.write(
        cp(
            lease,
            0,
            transition="intent",
            effect=intent_effect(op, "label", 1, "idem", "idempotent", {}),
        )
    )
    claimed = rt.ledger.claim(rt.conn, "D1", op)
    assert claimed is not None
    ctl = operator_of(rt)
    ctl.runs.cancel(ctl.conn, run, "user asked", "T-9")
    from reference_impl.ledger import Answer

    assert (
        rt.ledger.record_result(rt.conn, claimed, "D1", Answer("succeeded", "res-9", {}))
        == "succeeded"
    )
    assert rt.runs.state(rt.conn, run)["status"] == "cancelled"
    rows = rt.conn.execute(
        "SELECT payload FROM outbox WHERE run_id = %s AND event_type = 'agent.compensation_required'",
        [run],
    ).fetchall()
    assert [r["payload"]["remote_id"] for r in rows] == ["res-9"]


def test_late_mismatched_result_is_kept_as_evidence(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    rt.writer.write(
        cp(
            lease,
            0,
            transition="intent",
            effect=intent_effect(op, "label", 1, "idem", "idempotent", {}),
        )
    )
    stale = rt.ledger.claim(rt.conn, "D1", op)
    assert stale is not None
    rt.ledger.mark_unknown(rt.conn, stale, "D1", {})
    from reference_impl.ledger import Answer

    with pytest.raises(e.LedgerConflict):
        rt.ledger.record_result(rt.conn, stale, "D1", Answer("succeeded", "res-late", {}))
    row = rt.conn.execute(
        "SELECT status, evidence FROM tool_operations WHERE operation_id = %s", [op]
    ).fetchone()
    assert row is not None and row["status"] == "unknown"
    late = [ev for ev in row["evidence"] if ev.get("event") == "late_result_refused"]
    assert late and late[0]["remote_id"] == "res-late"


def test_no_freeze_once_the_operation_converged(rt: Runtime) -> None:
    """The worker read its operation unknown and writes the freeze, but a
    callback converged it in between (explore found it: the run stayed paused
    in doubt with nothing in doubt): the freeze is refused and rolled back,
    the run stays live, and the worker goes on from the ledger."""
    run = new_run(rt)
    lease = take(rt, run).lease
    op = rt.protocol.operation_id(TENANT, str(run), "label", 1)
    effect = intent_effect(op, "label", 1, "plain", "none", {"kind": "label"})
    rt.writer.write(cp(lease, 0, transition="intent", effect=effect))
    claimed = rt.ledger.claim(rt.conn, "D1", op)
    assert claimed is not None
    rt.ledger.mark_unknown(rt.conn, claimed, "D1", {"class": "timeout"})
    ctl = operator_of(rt)
    accepted = ctl.conn.execute(
        "SELECT fencecheck.deliver_callback(%s, %s, %s::jsonb) AS ok",
        [run, op, '{"resource_id": "res-cb"}'],
    ).fetchone()
    assert accepted is not None and accepted["ok"] is True
    with pytest.raises(e.LedgerConflict):
        rt.writer.write(cp(lease, 1, transition="freeze", effect={"operation_id": op}))
    assert rt.runs.state(rt.conn, run)["status"] == "waiting_tool"
    converged = rt.ledger.get(rt.conn, op)
    assert converged is not None and converged["status"] == "succeeded"
