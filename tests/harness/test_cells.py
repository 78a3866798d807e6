"""Which cells an experiment's evidence shows reached (harness/explore/cells.py):
each test is one classification the matrix's own evidence needed (an
operation it performs counted in its cell), on a small hand-made audit trail,
ops log and tool export."""

from __future__ import annotations

from typing import Any

from harness.checking.invariants.model import Change
from harness.contract.state_space import ANY, contract_space, derive
from harness.explore.cells import observe

T0 = 1_800_000_000.0
TENANT = "t-1"
RUN = "r-1"
OP_ID = f"{TENANT}/{RUN}/create_label/v1"


class Trail:
    """Builds an audit trail: one change per call, seq and time counting up."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def add(
        self, app: str, table: str, op: str, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> int:
        seq = len(self.changes) + 1
        at = T0 + seq * 0.01
        self.changes.append(Change(seq, at, at, seq, app, table, op, old, new))
        return seq

    @property
    def seq(self) -> int:
        return len(self.changes)


def _iso(offset_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(T0 + offset_s, dt.UTC).isoformat()


def _run(status: str, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": RUN,
        "task_id": "task-1",
        "tenant_id": TENANT,
        "status": status,
        "epoch": 1,
        "owner": None,
        "revision": 3,
        "lease_expires_at": None,
        "attempt_count": 1,
        "max_attempts": 3,
        "input": {"tool": "plain"},
    }
    return row | extra


def _task(t: Trail, active: str = RUN) -> None:
    """The run's task, its active run ``active`` (a retry supersedes the run)."""
    t.add("ctl", "agent_tasks", "INSERT", None,
          {"task_id": "task-1", "tenant_id": TENANT, "active_run_id": active})  # fmt: skip


def _op(status: str) -> dict[str, Any]:
    return {
        "operation_id": OP_ID,
        "run_id": RUN,
        "tenant_id": TENANT,
        "status": status,
        "step_id": "create_label",
        "effect_version": 1,
        "tool_name": "plain",
    }


def _entry(
    worker: str, op: str, args: dict[str, Any], before: int, after: int, **extra: Any
) -> dict[str, Any]:
    return {
        "worker": worker,
        "tenant": TENANT,
        "op": op,
        "args": args,
        "ok": True,
        "error": None,
        "at": T0 + before * 0.01 + 0.001,
        "done": T0 + after * 0.01 + 0.005,
        "seq_before": before,
        "seq_after": after,
    } | extra


def _cells(trail: Trail, log: list[dict[str, Any]], tool: dict[str, Any] | None = None) -> set[str]:
    return {
        s.cell
        for s in observe(contract_space(), trail.changes, log, tool or {}, replication="none")
    }


def test_a_group_s_any_dimension_takes_every_value() -> None:
    """A dimension a group names ``any`` is ``*`` in its cells, and an
    observation with any value of it (or none read) fits."""
    data: dict[str, Any] = {
        "state_space": {
            "dimensions": {
                "run_status": {"kind": "start", "values": ["queued", "failed"]},
                "ledger": {"kind": "start", "values": ["none", "prepared"]},
            }
        },
        "operations": [
            {
                "op": "poke",
                "cells": {
                    "base": {"run_status": "queued", "ledger": "none"},
                    "groups": [{"vary": ["run_status"], "any": ["ledger"]}, {"vary": ["ledger"]}],
                },
            }
        ],
    }
    space = derive(data)
    ids = {c.id for c in space.cells}
    assert ids == {
        "poke[run_status=queued,ledger=*]",
        "poke[run_status=failed,ledger=*]",
        "poke[run_status=queued,ledger=none]",
        "poke[run_status=queued,ledger=prepared]",
    }
    free = next(
        c for c in space.cells if c.get("ledger") == ANY and c.get("run_status") == "failed"
    )
    assert free.fits({"run_status": "failed", "ledger": "prepared"})
    assert free.fits({"run_status": "failed", "ledger": None})
    assert not free.fits({"run_status": "queued", "ledger": "prepared"})


def test_a_supplement_counts_whatever_the_refused_operation_is() -> None:
    """V[supplement]: the run paused for a human after the tool refused for
    good (its operation failed_final); the decision's cell does not depend on
    the ledger."""
    t = Trail()
    _task(t)
    t.add("w", "agent_runs", "INSERT", None, _run("queued"))
    t.add("w", "tool_operations", "INSERT", None, _op("failed_final"))
    paused = t.add("w", "agent_runs", "UPDATE", _run("queued"), _run("paused_human"))
    t.add("ctl", "agent_runs", "UPDATE", _run("paused_human"), _run("queued"))
    args = {"run_id": RUN, "decision": "supplement", "supplement": {"address": "x"}}
    cells = _cells(t, [_entry("ctl", "decide", args, paused, t.seq)])
    assert (
        "decide[run_status=paused_human,decision=supplement,field=new,ledger=*,run_ref=active]"
        in cells
    )


def test_a_supplied_field_already_supplied_is_present() -> None:
    t = Trail()
    _task(t)
    row = _run("paused_human", input={"tool": "plain", "supplement": {"address": "a"}})
    before = t.add("w", "agent_runs", "INSERT", None, row)
    t.add("ctl", "agent_runs", "UPDATE", row, row | {"status": "queued"})
    args = {"run_id": RUN, "decision": "supplement", "supplement": {"address": "b"}}
    cells = _cells(t, [_entry("ctl", "decide", args, before, t.seq)])
    assert (
        "decide[run_status=paused_human,decision=supplement,field=present,ledger=*,run_ref=active]"
        in cells
    )


def test_a_callback_for_a_superseded_run_counts_whatever_its_state() -> None:
    """G[superseded]: the old run was cancelled, then retried: it is no longer
    its task's active run."""
    t = Trail()
    task = {"task_id": "task-1", "tenant_id": TENANT, "active_run_id": RUN}
    t.add("ctl", "agent_tasks", "INSERT", None, task)
    t.add("ctl", "agent_runs", "INSERT", None, _run("cancelled"))
    t.add("w", "tool_operations", "INSERT", None, _op("dispatching"))
    t.add("ctl", "agent_tasks", "UPDATE", task, task | {"active_run_id": "r-2"})
    before = t.seq
    args = {"run_id": RUN, "operation_id": OP_ID, "payload": {"resource_id": "res-1"}}
    tool = {"resources": [{"operation_id": OP_ID, "resource_id": "res-1"}]}
    cells = _cells(t, [_entry("ctl", "deliver_callback", args, before, before)], tool)
    assert "deliver_callback[run_status=*,ledger=*,run_ref=superseded,payload=*]" in cells
    assert "deliver_callback[run_status=cancelled,ledger=*,run_ref=active,payload=*]" not in cells


def test_a_relay_request_s_publishes_are_counted() -> None:
    """L: a relay the harness asked for marks rows published; its own changes
    are judged from the trail (they were once claimed by the request and
    counted nowhere)."""
    t = Trail()
    row = {"event_id": "e1", "tenant_id": TENANT, "run_id": RUN, "published_at": None}
    before = t.add("w", "outbox", "INSERT", None, row)
    t.add("R1", "outbox", "UPDATE", row, row | {"published_at": _iso(1)})
    cells = _cells(t, [_entry("R1", "relay", {}, before, t.seq)])
    assert "relay[outbox=unpublished,broker_answer=ack]" in cells
    assert "relay[outbox=empty,broker_answer=ack]" not in cells


def test_a_relay_that_found_the_outbox_empty_is_its_own_cell() -> None:
    t = Trail()
    row = {"event_id": "e1", "tenant_id": TENANT, "run_id": RUN, "published_at": None}
    t.add("w", "outbox", "INSERT", None, row)
    t.add("R1", "outbox", "UPDATE", row, row | {"published_at": _iso(1)})
    other = {"event_id": "e2", "tenant_id": "t-other", "run_id": "r-9", "published_at": None}
    t.add("w", "outbox", "INSERT", None, other)  # another tenant's: not this relay's outbox
    cells = _cells(t, [_entry("R2", "relay", {}, t.seq, t.seq)])
    assert "relay[outbox=empty,broker_answer=ack]" in cells


def test_consumptions_are_read_from_the_broker_s_exported_deliveries() -> None:
    """The tool's export lists a delivery's events as ``event_ids`` (a list)."""
    t = Trail()
    delivered = {
        "id": 1,
        "delivered_at": T0 - 1,
        "event_ids": ["e1", "e2", "e1"],
        "fault_mode": "deliver_duplicate",
    }
    again = {"id": 2, "delivered_at": T0 + 3, "event_ids": ["e2"], "fault_mode": None}
    t.add("K", "consumed_events", "INSERT", None, {"event_id": "e2"})  # before the second read
    cells = _cells(t, [], {"deliveries": [delivered, again]})
    assert "consume[consumer=new,delivery=duplicate]" in cells
    assert "consume[consumer=seen,delivery=in_order]" in cells


def test_a_request_the_session_may_not_make_is_no_cell() -> None:
    """J: a worker-role session asking for an operator's decision is refused
    for its privileges; the decision never ran against the state."""
    t = Trail()
    t.add("w", "agent_runs", "INSERT", None, _run("paused_indoubt"))
    t.add("w", "tool_operations", "INSERT", None, _op("unknown"))
    args = {"run_id": RUN, "operation_id": OP_ID, "decision": "not_executed"}
    refused = _entry("W0", "resolve_indoubt", args, t.seq, t.seq, ok=False)
    refused["error"] = "InsufficientPrivilege"
    assert not {c for c in _cells(t, [refused]) if c.startswith("resolve_indoubt")}
    allowed = _entry(
        "ctl", "resolve_indoubt", args, t.seq, t.seq, ok=False, error="InvalidParameter"
    )
    assert (
        "resolve_indoubt[run_status=paused_indoubt,ledger=unknown,finding=executed,others=none_in_doubt]"
        not in _cells(t, [allowed])
    )
    assert (
        "resolve_indoubt[run_status=paused_indoubt,ledger=unknown,finding=not_executed,others=none_in_doubt]"
        in _cells(t, [allowed])
    )


def test_a_refusal_while_a_successor_renews_is_placed_when_every_version_agrees() -> None:
    """R: the old owner's requests are refused while the new owner's heartbeat
    moves the lease's expiry; the run's identity and revision stay the same
    through every version, so the start is not ambiguous."""
    t = Trail()
    lease = {"owner": "B/2", "epoch": 2, "lease_expires_at": _iso(60)}
    t.add("A", "agent_runs", "UPDATE", None, _run("running", owner="A/1", epoch=1))
    t.add("B", "agent_runs", "UPDATE", None, _run("running", **lease))
    before = t.seq
    t.add(
        "B", "agent_runs", "UPDATE", None, _run("running", **lease | {"lease_expires_at": _iso(61)})
    )
    args = {"run_id": RUN, "epoch": 1, "owner": "A/1"}
    refused = _entry("A", "renew", args, before, t.seq, ok=False, error="LeaseLost")
    assert "renew[lease=live,identity=stale_epoch]" in _cells(t, [refused])
    # A version between that changes what the request is judged by (the
    # successor released: no lease) leaves it ambiguous.
    t.add("B", "agent_runs", "UPDATE", None, _run("queued", epoch=2))
    refused = _entry("A", "renew", args, before, t.seq, ok=False, error="LeaseLost")
    assert not {c for c in _cells(t, [refused]) if c.startswith("renew")}


def test_a_request_no_cell_holds_is_listed_unplaced() -> None:
    """An archive says which of the harness's requests it could not place."""
    t = Trail()
    t.add("w", "agent_runs", "INSERT", None, _run("paused_indoubt"))
    refused = _entry("W0", "resolve_indoubt", {"run_id": RUN}, t.seq, t.seq, ok=False)
    refused["error"] = "InsufficientPrivilege"
    unplaced: list[str] = []
    observe(contract_space(), t.changes, [refused], {}, replication="none", unplaced=unplaced)
    assert unplaced == [f"resolve_indoubt by W0 at audit seq {t.seq} (InsufficientPrivilege)"]


def test_a_campaign_says_when_it_reached_its_final_coverage() -> None:
    from harness.explore.cell_coverage import CellCoverage

    cov = CellCoverage()
    cov.add({"create_run[key=new]": 1}, "X-s0001", after_s=4.0)
    cov.add({"create_run[key=new]": 2, "relay[outbox=empty,broker_answer=ack]": 1}, "X-s0002", 9.5)
    facts = cov.as_dict()
    assert facts["final_coverage_after_s"] == 9.5
    assert facts["first_reached_after_s"]["create_run[key=new]"] == 4.0
    assert facts["full_coverage_after_s"] is None  # most cells were never reached
    assert "the last of them first reached after 10 s" in cov.table()


def test_a_convergence_beside_another_operation_in_doubt_is_its_own_cell() -> None:
    """W[others_in_doubt]: a person converges one of two unknown operations of
    a run paused in doubt; the other is still in doubt when it starts."""
    t = Trail()
    _task(t)
    t.add("w", "agent_runs", "INSERT", None, _run("paused_indoubt"))
    t.add("w", "tool_operations", "INSERT", None, _op("unknown"))
    other = {**_op("unknown"), "operation_id": f"{TENANT}/{RUN}/notify/v1", "step_id": "notify"}
    t.add("w", "tool_operations", "INSERT", None, other)
    before = t.seq
    t.add("ctl", "tool_operations", "UPDATE", _op("unknown"), _op("succeeded"))
    args = {"operation_id": OP_ID, "outcome": "succeeded", "reason": "console"}
    cells = _cells(t, [_entry("ctl", "converge_operation", args, before, t.seq, ok=True)])
    assert (
        "converge_operation[ledger=unknown,outcome=succeeded,others=in_doubt,run_ref=active]"
        in cells
    )


def test_a_decision_or_convergence_on_a_superseded_run_is_its_own_cell() -> None:
    """G[retried_paused_in_doubt] and V[purge]: the run paused, then its task
    retried; a person's converge_operation of its operation, or an approve
    of it, names a run that is no longer its task's active run."""
    t = Trail()
    _task(t, active="r-2")
    t.add("w", "agent_runs", "INSERT", None, _run("paused_indoubt"))
    t.add("w", "tool_operations", "INSERT", None, _op("unknown"))
    before = t.seq
    t.add("ctl", "tool_operations", "UPDATE", _op("unknown"), _op("succeeded"))
    args = {"operation_id": OP_ID, "outcome": "succeeded", "reason": "console"}
    cells = _cells(t, [_entry("ctl", "converge_operation", args, before, t.seq)])
    assert (
        "converge_operation[ledger=unknown,outcome=*,others=none_in_doubt,run_ref=superseded]"
        in cells
    )
    t = Trail()
    _task(t, active="r-2")
    paused = t.add("w", "agent_runs", "INSERT", None, _run("paused_human"))
    args = {"run_id": RUN, "decision": "approve", "reason": "probe"}
    cells = _cells(t, [_entry("ctl", "decide", args, paused, t.seq, ok=False)])
    assert (
        "decide[run_status=paused_human,decision=approve,field=new,ledger=*,run_ref=superseded]"
        in cells
    )
