"""The global invariants on small hand-built histories: each one holds on a clean
history and breaks, naming the offending rows, on one that violates it.

The clean history is one run of the built-in workflow: created, claimed
(epoch 1), a checkpoint, a tool intent, the dispatch claim, the tool's
request, the tool result, completion, the outbox relay and a consumer. Each
violating history is the clean one with one thing changed.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.checking.history import Event
from harness.checking.invariants import INVARIANTS, Change, Evidence, check
from harness.checking.invariants.model import WorkerLogs, with_purged
from harness.checking.worker_logs import read_worker_logs
from harness.contract.spec import reply_problems

RUN, RUN2, TASK, TENANT = "r-1", "r-2", "t-1", "x"
OP, OP2 = "x/r-1/create_label/v1", "x/r-1/notify/v1"
FAST = "SELECT revision FROM fencecheck.protected_write_fast($1)"
STEPPED = "SELECT revision FROM fencecheck.protected_write($1)"
T0 = 1_800_000_000.0


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


KEYS = {
    "agent_runs": ("run_id",),
    "agent_checkpoints": ("run_id", "revision"),
    "tool_operations": ("operation_id",),
    "outbox": ("event_id",),
    "consumer_effects": ("consumer_name", "event_id", "n"),
    "consumed_events": ("consumer_name", "event_id"),
    "agent_tasks": ("tenant_id", "task_id"),
    "operator_actions": ("id",),
}


class Story:
    """Builds an audit trail change by change, and the final tables from it."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.txid = 0

    def tx(self, at: float, app: str = "A", statement: str = "") -> Callable[..., None]:
        self.txid += 1
        txid, start = self.txid, T0 + at

        def change(table: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            op = "INSERT" if old is None else "UPDATE" if new is not None else "DELETE"
            seq = len(self.changes) + 1
            full_new = None if new is None else {**(old or {}), **new}
            self.changes.append(
                Change(
                    seq, start + 0.0001 * seq, start, txid, app, table, op, old, full_new, statement
                )
            )

        return change

    def state(self, table: str, key: tuple[Any, ...]) -> dict[str, Any]:
        """The current row (after the last change) of ``table`` with ``key``."""
        for c in reversed(self.changes):
            if c.table == table and c.new is not None and _key(table, c.new) == key:
                return c.new
        raise KeyError(key)

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
        for c in self.changes:
            table = rows.setdefault(c.table, {})
            key = _key(c.table, c.row)
            if c.new is None:
                table.pop(key, None)
            else:
                table[key] = c.new
        return {t: list(r.values()) for t, r in rows.items()}


def _key(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in KEYS[table])


def run_row(**kw: Any) -> dict[str, Any]:
    base = {
        "run_id": RUN,
        "tenant_id": TENANT,
        "task_id": TASK,
        "status": "queued",
        "revision": 0,
        "owner": None,
        "epoch": 0,
        "lease_expires_at": None,
        "current_step": None,
        "attempt_count": 0,
        "max_attempts": 12,
    }
    return {**base, **kw}


def protected(s: Story, at: float, rev: int, event: str, **run: Any) -> Callable[..., None]:
    """One protected write by A/1 at epoch 1: run revision + 1, checkpoint, outbox."""
    tx = s.tx(at, statement=FAST)
    old = s.state("agent_runs", (RUN,))
    tx("agent_runs", old, {"revision": rev, "checkpoint_schema_version": 2, **run})
    tx(
        "agent_checkpoints",
        None,
        {
            "run_id": RUN,
            "revision": rev,
            "epoch": 1,
            "owner": "A/1",
            "event_id": event,
            "schema_version": 2,
        },
    )
    tx("outbox", None, {"id": rev, "event_id": event, "tenant_id": TENANT, "run_id": RUN,
                        "published_at": None})  # fmt: skip
    return tx


def clean_story() -> Story:
    s = Story()
    s.tx(0.0, app="ctl")("agent_runs", None, run_row())
    s.tx(0.010)(
        "agent_runs",
        run_row(),
        run_row(status="running", owner="A/1", epoch=1, lease_expires_at=iso(T0 + 0.8)),
    )
    protected(s, 0.100, 1, "e1", current_step="plan")
    tx = protected(s, 0.200, 2, "e2", status="waiting_tool", current_step="create_label")
    op = {"operation_id": OP, "tenant_id": TENANT, "run_id": RUN, "step_id": "create_label",
          "effect_version": 1}  # fmt: skip
    tx("tool_operations", None, {**op, "tool_name": "idem", "status": "prepared", "revision": 0})
    s.tx(0.300)(
        "tool_operations",
        s.state("tool_operations", (OP,)),
        {
            "status": "dispatching",
            "dispatch_owner": "A/1",
            "dispatch_until": iso(T0 + 0.9),
            "revision": 1,
            "first_dispatched_at": iso(T0 + 0.3),
        },
    )
    tx = protected(s, 0.400, 3, "e3", status="running")
    tx("tool_operations", s.state("tool_operations", (OP,)), {"status": "succeeded", "revision": 2})
    protected(s, 0.500, 4, "e4", status="succeeded", owner=None, lease_expires_at=None)
    s.tx(0.700, app="R")("outbox", s.state("outbox", ("e1",)), {"published_at": iso(T0 + 0.7)})
    consume = s.tx(0.800, app="K")
    consume("consumed_events", None, {"consumer_name": "billing", "event_id": "e1"})
    consume("consumer_effects", None, {"consumer_name": "billing", "event_id": "e1", "n": 1})
    return s


def evidence(s: Story) -> Evidence:
    return Evidence(
        changes=s.changes,
        tables=with_purged(s.tables(), s.changes),
        tool={
            "tools": {"idem": "idempotent", "plain": "none"},
            "requests": [request(1, 0.35)],
            "resources": [
                {
                    "tool": "idem",
                    "operation_id": OP,
                    "resource_id": "res-1",
                    "request": {"kind": "return_label", "customer_token": "ct_" + "0f" * 12},
                }
            ],
            "messages": [message("e1", 0.65)],
        },
        history=[
            account("ok", "claim", epoch=1),
            account("ok", "save_checkpoint", event_id="e1"),
            account("fail", "save_checkpoint", event_id="e-lost"),
            account("info", "renew", epoch=1, error="TimeoutError"),
        ],
        lease_ttl_ms=800,
        dispatch_ttl_ms_by_app={"A": 600},
        worker_logs=WorkerLogs(files=3),
        write_paths={"fast": "protected_write_fast(", "stepped": "protected_write("},
        asked_write_path="fast",
        replies=[
            reply_entry(
                "create_run",
                {"id": 0, "ok": True, "result": {"run_id": RUN, "task_id": TASK}},
                args={"task_id": TASK, "input": {}},
                run_id=RUN,
            ),
            reply_entry("reconcile", {"id": 1, "ok": True, "result": {"changes": []}}),
        ],
        functions_called={"fencecheck.claim": 3, "fencecheck.renew": 2},
        statements_called=[
            {"role": "fcw_x_1", "query": "SELECT fencecheck.claim($1, $2)", "calls": 3},
            {"role": "fcw_x_1", "query": "SELECT fencecheck.renew($1, $2, $3)", "calls": 2},
        ],
        worker_lifetimes_s=[1.5, 0.9],
        connection_attempts={"worker_pg": 5, "worker_tool": 1},
        link_cuts=[{"link": "worker_pg", "seconds": 0.3, "attempts": 2}],
    )


def reply_entry(op: str, line: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """An entry of the harness's ops log, judged against ops.schema.json."""
    return {
        "worker": "ctl",
        "op": op,
        "ok": line.get("ok"),
        "schema_problems": reply_problems(op, line),
        **kw,
    }


def message(event_id: str, at: float, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A message the broker logged, its payload naming its event and run."""
    body = {"event_id": event_id, "run_id": RUN, "tenant_id": TENANT, **(payload or {})}
    return {"event_id": event_id, "received_at": T0 + at, "payload": body}


def request(seq: int, at: float, **kw: Any) -> dict[str, Any]:
    base = {
        "seq": seq,
        "tool": "idem",
        "capability": "idempotent",
        "operation_id": OP,
        "run_id": RUN,
        "epoch": 1,
        "received_at": T0 + at,
        "outcome": "created",
    }
    return {**base, **kw}


def account(kind: str, op: str, **kw: Any) -> Event:
    # A fail or info line names its class (worker.failures_name_their_class).
    if kind in ("fail", "info"):
        kw.setdefault("error", "RevisionConflict" if kind == "fail" else "TimeoutError")
    return Event(time=T0, worker="A", pid=1, type=kind, op=op, run_id=RUN, **kw)


def clean() -> Evidence:
    return evidence(clean_story())


def test_clean_history_breaks_nothing() -> None:
    results = {r.name: r for r in check(clean())}
    assert set(results) == set(INVARIANTS)
    broken = {n: (r.observed, r.violations) for n, r in results.items() if not r.ok}
    assert broken == {}
    # Not vacuous: each invariant judged something of the clean run, except what
    # the clean run has none of (a cancel, a return to prepared, a risky tool,
    # a takeover, a renewal, a resend, a run leaving a pause in doubt, a sealed value).
    assert {n for n, r in results.items() if r.checked == 0} == {
        "effect.sealed_values_never_share_a_nonce",
        "lease.takeover_counts_no_attempt",
        "lease.takeover_keeps_the_status",
        "lease.renewed_only_while_unexpired",
        "effect.cancelled_intent_never_sent",
        "effect.no_resend_without_idempotency",
        "effect.resend_claim_ends_within_the_tools_retention",
        "effect.claim_back_to_prepared_only_after_a_proven_rejection",
        "effect.never_prepared_again_once_in_doubt",
        "effect.not_executed_only_where_the_tool_did_not_act",
        "run.only_finished_tasks_are_purged",
        "operator.audit_shows_the_rows_before_and_after",
        "operator.a_decision_changes_only_its_run",
        "outbox.a_relay_cycle_publishes_in_outbox_order",
        "worker.reconcile_lists_every_change",
        "worker.relay_lists_what_it_marked",
        "worker.cancel_reports_the_runs_status",
        "worker.consume_counts_what_it_applied",
        "run.purged_only_past_the_retention",
        "run.leaves_doubt_only_with_nothing_in_doubt",
        "effect.ledger_records_the_tools_own_retention",
        "effect.refused_step_moved_on_only_by_a_person",
        "run.freeze_leaves_no_claim_of_its_own",
        "worker.history_is_appended_to",
    }


# ------------------------------------------------------------ violations
def regrant(s: Story, at: float, epoch: int, owner: str, expires: float) -> None:
    s.tx(at, app=owner[0])(
        "agent_runs",
        s.state("agent_runs", (RUN,)),
        {"epoch": epoch, "owner": owner, "lease_expires_at": iso(T0 + expires)},
    )


def epoch_jump(s: Story) -> None:
    regrant(s, 0.9, 3, "B/1", 1.7)


def second_owner(s: Story) -> None:
    s.tx(0.05, app="B")(
        "agent_runs", s.state("agent_runs", (RUN,)), {"owner": "B/1", "status": "running"}
    )


def grant_over_live_lease(s: Story) -> None:
    # Changes are judged in audit order: this one comes last, over A's live lease.
    held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
    s.tx(0.9, app="B")(
        "agent_runs",
        {**held, "lease_expires_at": iso(T0 + 1.5)},
        {"epoch": 2, "owner": "B/1", "lease_expires_at": iso(T0 + 1.7)},
    )


def revived_lease(s: Story) -> None:
    # A renews its lease 100 ms after it expired at 0.8, nobody having taken it over.
    held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
    s.tx(0.9)(
        "agent_runs",
        {**held, "lease_expires_at": iso(T0 + 0.8)},
        {"lease_expires_at": iso(T0 + 1.7)},
    )


def takeover_counted_as_attempt(s: Story) -> None:
    # B takes over A's expired lease (the run was running, not queued) and
    # counts an attempt: the run would spend its budget on a changed hand.
    held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
    s.tx(0.9, app="B")(
        "agent_runs",
        {**held, "lease_expires_at": iso(T0 + 0.8), "attempt_count": 1},
        {"epoch": 2, "owner": "B/1", "lease_expires_at": iso(T0 + 1.7), "attempt_count": 2},
    )


def takeover_moves_the_status(s: Story) -> None:
    # B takes over A's expired lease while A's intent is in flight and makes
    # the run running: only a tool intent or result moves waiting_tool.
    held = {**s.state("agent_runs", (RUN,)), "status": "waiting_tool", "owner": "A/1"}
    s.tx(0.9, app="B")(
        "agent_runs",
        {**held, "lease_expires_at": iso(T0 + 0.8)},
        {"epoch": 2, "owner": "B/1", "lease_expires_at": iso(T0 + 1.7), "status": "running"},
    )


def released_by_another_session(s: Story) -> None:
    # B's session gives up A's live lease at A's own epoch, naming A as owner:
    # the owner text is no secret, the session that took the grant is.
    held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
    s.tx(0.9, app="B")(
        "agent_runs",
        {**held, "lease_expires_at": iso(T0 + 1.5)},
        {"owner": None, "lease_expires_at": None, "status": "queued"},
    )


def lease_too_long(s: Story) -> None:
    regrant(s, 0.9, 2, "B/1", 10.0)


def stale_checkpoint(s: Story) -> None:
    regrant(s, 0.9, 2, "B/1", 1.7)
    s.tx(1.0, statement=FAST)(
        "agent_checkpoints",
        None,
        {"run_id": RUN, "revision": 5, "epoch": 1, "owner": "A/1", "event_id": "e5"},
    )


def revision_skips(s: Story) -> None:
    s.tx(0.9)("agent_runs", s.state("agent_runs", (RUN,)), {"revision": 6})


def checkpoint_apart_from_outbox(s: Story) -> None:
    s.changes = [
        Change(**{**c.__dict__, "txid": 99})
        if c.table == "outbox" and c.row["event_id"] == "e3"
        else c
        for c in s.changes
    ]


def checkpoint_updated(s: Story) -> None:
    s.tx(0.9, app="A")(
        "agent_checkpoints", s.state("agent_checkpoints", (RUN, 1)), {"event_id": "e1b"}
    )


def in_flight(s: Story) -> dict[str, Any]:
    return {**s.state("tool_operations", (OP,)), "status": "dispatching"}


def inflight_cancelled(s: Story) -> None:
    s.tx(0.9, app="ctl")("tool_operations", in_flight(s), {"status": "cancelled"})


RUN2 = "00000000-0000-0000-0000-0000000000b2"
RUN3 = "00000000-0000-0000-0000-0000000000b3"


def result_after_cancel(s: Story, *, compensated: bool) -> None:
    """A second run, cancelled while its operation was in flight; the tool's
    success recorded afterwards (with the compensation event, or without)."""
    s.tx(0.81, app="ctl")("agent_runs", None, run_row(run_id=RUN2, task_id="task-2"))
    op = {"operation_id": "op-2", "run_id": RUN2, "step_id": "x", "effect_version": 1}
    s.tx(0.82, app="B")(
        "tool_operations", None, {**op, "tool_name": "idem", "status": "dispatching", "revision": 1}
    )
    s.tx(0.83, app="ctl")("agent_runs", s.state("agent_runs", (RUN2,)), {"status": "cancelled"})
    tx = s.tx(0.90, app="B")
    tx(
        "tool_operations",
        s.state("tool_operations", ("op-2",)),
        {"status": "succeeded", "revision": 2},
    )
    if compensated:
        payload = {"run_id": RUN2, "operation_id": "op-2"}
        tx("outbox", None, compensation_row("e-comp", RUN2, payload))


def result_after_retry(s: Story, *, compensated: bool) -> None:
    """A second run paused with its operation in doubt, its task retried (the
    task's active run moves to a third); the operation's success recorded
    afterwards, in the transaction that ends the superseded run cancelled."""
    task = {"tenant_id": TENANT, "task_id": "task-2", "active_run_id": RUN2}
    s.tx(0.80, app="ctl")("agent_tasks", None, task)
    s.tx(0.81, app="ctl")("agent_runs", None, run_row(run_id=RUN2, task_id="task-2"))
    op = {"operation_id": "op-2", "run_id": RUN2, "step_id": "x", "effect_version": 1}
    s.tx(0.82, app="B")(
        "tool_operations", None, {**op, "tool_name": "idem", "status": "unknown", "revision": 1}
    )
    retry = s.tx(0.84, app="ctl")
    retry("agent_runs", None, run_row(run_id=RUN3, task_id="task-2"))
    retry("agent_tasks", task, {"active_run_id": RUN3})
    tx = s.tx(0.90, app="ctl")
    tx("tool_operations", s.state("tool_operations", ("op-2",)),
       {"status": "succeeded", "revision": 2})  # fmt: skip
    if compensated:
        payload = {"run_id": RUN2, "operation_id": "op-2"}
        tx("outbox", None, compensation_row("e-comp", RUN2, payload))
    tx("agent_runs", s.state("agent_runs", (RUN2,)), {"status": "cancelled"})


def compensation_row(event: str, run: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": event, "run_id": run, "event_type": "agent.compensation_required",
            "payload": payload, "published_at": None}  # fmt: skip


def compensation_for_a_live_runs_success(s: Story) -> None:
    """The clean run's own success (its run never cancelled) asks for compensation."""
    success = next(
        c for c in s.changes if c.table == "tool_operations" and c.after("status") == "succeeded"
    )
    payload = {"run_id": RUN, "operation_id": OP}
    s.changes.append(
        dataclasses.replace(
            success, seq=len(s.changes) + 1, table="outbox", op="INSERT", old=None,
            new=compensation_row("e-comp", RUN, payload),
        )
    )  # fmt: skip


def test_a_success_after_the_cancel_with_its_compensation_breaks_nothing() -> None:
    s = clean_story()
    result_after_cancel(s, compensated=True)
    broken = broken_by(evidence(s))
    assert "effect.compensation_required_exactly_for_a_cancelled_runs_success" not in broken


def test_a_superseded_runs_success_asks_for_compensation() -> None:
    """A retry supersedes the run: its task's next run does the step again, so
    the old run's late success is unwanted, as after a cancel."""
    s = clean_story()
    result_after_retry(s, compensated=False)
    (row,) = broken_by(evidence(s))[
        "effect.compensation_required_exactly_for_a_cancelled_runs_success"
    ]
    assert row["why"].startswith("no agent.compensation_required in its transaction; run "
                                 "superseded by a retry")  # fmt: skip
    s = clean_story()
    result_after_retry(s, compensated=True)
    broken = broken_by(evidence(s))
    assert "effect.compensation_required_exactly_for_a_cancelled_runs_success" not in broken


def test_a_compensation_names_the_resource_the_ledger_recorded() -> None:
    """Blind hunt 46 #02: the event took remote_id from the row before the
    success (NULL), so the owning service had nothing to undo by."""
    s = clean_story()
    result_after_retry(s, compensated=True)
    at = next(
        k
        for k, c in enumerate(s.changes)
        if c.table == "tool_operations" and c.after("status") == "succeeded"
        and c.row.get("operation_id") == "op-2"
    )  # fmt: skip
    success = s.changes[at]
    s.changes[at] = dataclasses.replace(success, new={**(success.new or {}), "remote_id": "res-9"})
    (row,) = broken_by(evidence(s))[
        "effect.compensation_required_exactly_for_a_cancelled_runs_success"
    ]
    assert "names remote_id None" in row["why"] and "res-9" in row["why"]


def test_a_run_frozen_for_an_inconsistent_commit_can_wait_for_a_person() -> None:
    """Rule 9: paused in doubt with nothing in its ledger in doubt, but with its
    agent.commit_inconsistent event; without that event the pause is named."""
    s = clean_story()
    paused_without_doubt(s)
    assert "run.every_run_can_progress_at_the_end" in broken_by(evidence(s))
    s.tx(0.95, app="A")(
        "outbox",
        None,
        {"event_id": "e-alert", "run_id": RUN, "event_type": "agent.commit_inconsistent"},
    )
    assert "run.every_run_can_progress_at_the_end" not in broken_by(evidence(s))


def test_compensation_for_a_live_runs_success_is_named() -> None:
    s = clean_story()
    compensation_for_a_live_runs_success(s)
    (row,) = broken_by(evidence(s))[
        "effect.compensation_required_exactly_for_a_cancelled_runs_success"
    ]
    assert row["why"] == "its run was neither cancelled nor superseded"


def ledger_step_without_revision(s: Story) -> None:
    """A result recorded without advancing the ledger revision: a stale result
    naming the revision it saw would still match."""
    op = s.state("tool_operations", (OP,))
    s.tx(0.9, app="D")("tool_operations", op, {"remote_id": "res-9", "revision": op["revision"]})


def run_names_an_older_version(s: Story) -> None:
    """A checkpoint write that leaves the run naming the version it had before."""
    first = next(c for c in s.changes if c.table == "agent_checkpoints")
    i = next(i for i, c in enumerate(s.changes) if c.txid == first.txid and c.table == "agent_runs")
    c = s.changes[i]
    s.changes[i] = dataclasses.replace(c, new={**(c.new or {}), "checkpoint_schema_version": 1})


def not_executed_though_acted(s: Story) -> None:
    """A worker records failed_final for an operation the tool made a resource
    for (a 5xx after acting taken for a refusal)."""
    s.tx(0.9, app="D")("tool_operations", in_flight(s), {"status": "failed_final"})


def test_an_operators_not_executed_finding_is_the_operators_call() -> None:
    s = clean_story()
    decide = s.tx(0.9, app="ctl")
    decide("tool_operations", in_flight(s), {"status": "failed_final"})
    decide("operator_actions", None, {"id": 1, "run_id": RUN, "action": "resolve:not_executed"})
    assert "effect.not_executed_only_where_the_tool_did_not_act" not in broken_by(evidence(s))


def back_to_prepared(s: Story) -> None:
    s.tx(0.9, app="D")("tool_operations", in_flight(s), {"status": "prepared"})


def prepared_after_doubt(s: Story) -> None:
    """A same-key resend's claim of an unknown operation answered 429, put
    back to prepared: the request that left it unknown may still act."""
    s.tx(0.7, app="R")("tool_operations", in_flight(s), {"status": "unknown"})
    s.tx(0.8, app="R")(
        "tool_operations", s.state("tool_operations", (OP,)), {"status": "dispatching"}
    )
    s.tx(0.9, app="R")("tool_operations", s.state("tool_operations", (OP,)), {"status": "prepared"})


def cancelled_then_sent(s: Story) -> None:
    tx = s.tx(0.45, app="ctl")
    op2 = {"operation_id": OP2, "run_id": RUN, "step_id": "notify", "status": "prepared"}
    tx("tool_operations", None, op2)
    s.tx(0.46, app="ctl")("tool_operations", op2, {"status": "cancelled"})


def advanced_after_end(s: Story) -> None:
    s.tx(0.9, statement=FAST)(
        "agent_checkpoints",
        None,
        {"run_id": RUN, "revision": 5, "epoch": 1, "owner": "A/1", "event_id": "e5"},
    )


def two_live_runs(s: Story) -> None:
    s.tx(0.9, app="ctl")("agent_runs", None, run_row(run_id=RUN2))
    s.tx(0.95, app="ctl")("agent_runs", None, run_row(run_id="r-3"))


def paused_without_doubt(s: Story) -> None:
    s.changes = [
        Change(**{**c.__dict__, "new": {**c.new, "status": "paused_indoubt"}})
        if c.table == "agent_runs" and c.new and c.new.get("status") == "succeeded"
        else c
        for c in s.changes
    ]


def second_effect(s: Story) -> None:
    s.tx(0.9, app="K")(
        "consumer_effects", None, {"consumer_name": "billing", "event_id": "e1", "n": 2}
    )


def effect_of_undelivered(s: Story) -> None:
    s.tx(0.9, app="K")(
        "consumer_effects", None, {"consumer_name": "billing", "event_id": "e2", "n": 1}
    )


def dedup_apart_from_effect(s: Story) -> None:
    """The consumer of consumer_ack_before_effect: its dedup row, then (a crash
    could come between) its effect in a transaction of its own."""
    s.tx(0.9, app="K")("consumed_events", None, {"consumer_name": "billing", "event_id": "e2"})
    s.tx(1.0, app="K")(
        "consumer_effects", None, {"consumer_name": "billing", "event_id": "e2", "n": 1}
    )


def stepped_write(s: Story) -> None:
    s.changes = [
        Change(**{**c.__dict__, "statement": STEPPED}) if c.table == "agent_checkpoints" else c
        for c in s.changes
    ]


# ------------------------------------------------------------ retention purge
TASK_ROW = {"tenant_id": TENANT, "task_id": TASK, "active_run_id": RUN}


def purge(s: Story, *, publish: bool = True, task: bool = True, only: str = "") -> None:
    """The operator's purge of the finished task: every row of its run, then
    the task, in one transaction (``only``: that table's rows alone)."""
    if publish:
        for e in ("e2", "e3", "e4"):
            s.tx(0.9, app="R")("outbox", s.state("outbox", (e,)), {"published_at": iso(T0 + 0.9)})
    tx = s.tx(1.0, app="ctl")
    for table in ("agent_checkpoints", "outbox", "tool_operations", "agent_runs"):
        if only and table != only:
            continue
        for row in s.tables().get(table, []):
            if row.get("run_id") == RUN:
                tx(table, row, None)
    if task:
        tx("agent_tasks", TASK_ROW, None)


def first_dispatch_moved(s: Story) -> None:
    # A later ledger step restamps the first dispatch: the retention window
    # a same-key resend is judged by would start late.
    s.tx(0.45)(
        "tool_operations",
        s.state("tool_operations", (OP,)),
        {"first_dispatched_at": iso(T0 + 0.45), "revision": 3},
    )


def resend_past_retention(s: Story) -> None:
    # The first call's outcome turned unknown; a same-key resend is claimed
    # 0.2 s before the tool's 0.5 s key window (from the first dispatch at
    # 0.3) ends, for 0.6 s: the resend may reach the tool after the window.
    s.tx(0.31, app="ctl")(
        "tool_operations",
        s.state("tool_operations", (OP,)),
        {"status": "unknown", "dispatch_owner": None, "revision": 2, "retention_ms": 500},
    )
    s.tx(0.60, app="ctl")(
        "tool_operations",
        s.state("tool_operations", (OP,)),
        {"status": "dispatching", "dispatch_owner": "R/1", "dispatch_until": iso(T0 + 1.2)},
    )


# ------------------------------------------------------------ operator decisions
RUN3, OP3 = "r-3", "x/r-3/create_label/v1"
RUN_SNAPSHOT = ("status", "revision", "epoch", "owner", "attempt_count", "max_attempts")


def snapshot(run: dict[str, Any], op: dict[str, Any] | None) -> dict[str, Any]:
    """The run (and operation) as an operator_actions row keeps it (contract 7.7)."""
    out: dict[str, Any] = {k: run.get(k) for k in RUN_SNAPSHOT}
    out["operation"] = (
        None
        if op is None
        else {k: op.get(k) for k in ("operation_id", "status", "remote_id", "revision")}
    )
    return out


def paused_in_doubt(s: Story) -> tuple[dict[str, Any], dict[str, Any]]:
    """A second run paused in doubt on its unknown operation (planted by the harness)."""
    run = run_row(run_id=RUN3, task_id="t-3", status="paused_indoubt", epoch=1)
    op = {
        "operation_id": OP3,
        "run_id": RUN3,
        "step_id": "create_label",
        "status": "unknown",
        "remote_id": None,
        "revision": 2,
    }
    plant = s.tx(0.9, app="fencecheck-harness")
    plant("agent_runs", None, run)
    plant("tool_operations", None, op)
    return run, op


def operator_resolves(
    s: Story, *, before_taken_late: bool = False, touches_another_run: bool = False
) -> None:
    """An operator's resolve_indoubt: the operation converges, the run is queued
    and the decision audited, in one transaction. ``before_taken_late``: the
    ``before`` snapshot read after the ledger change (the operation already
    succeeded). ``touches_another_run``: the same transaction also changes the
    first run (generated mutants: a supplement or a terminate without its
    run's filter)."""
    run, op = paused_in_doubt(s)
    tx = s.tx(1.0, app="ctl")
    if touches_another_run:
        tx("agent_runs", s.state("agent_runs", (RUN,)), {"max_attempts": 9})
    tx("tool_operations", op, {"status": "succeeded", "remote_id": "res-3", "revision": 3})
    resolved = s.state("tool_operations", (OP3,))
    tx("agent_runs", run, {"status": "queued"})
    before = snapshot(run, resolved if before_taken_late else op)
    after = snapshot(s.state("agent_runs", (RUN3,)), resolved)
    audit = {"id": 1, "run_id": RUN3, "operation_id": OP3, "action": "resolve:executed"}
    tx("operator_actions", None, {**audit, "before": before, "after": after})


def resumed_beside_another_doubt(s: Story) -> None:
    """A manual convergence of one operation queues the run while a second
    operation of it is still unknown (hidden-set bug: the guard keyed on the
    operation just converged)."""
    run, op = paused_in_doubt(s)
    other = {**op, "operation_id": f"{OP3}-b", "step_id": "notify"}
    s.tx(0.95, app="fencecheck-harness")("tool_operations", None, other)
    tx = s.tx(1.0, app="ctl")
    tx("tool_operations", op, {"status": "succeeded", "remote_id": "res-3", "revision": 3})
    tx("agent_runs", run, {"status": "queued"})


def first_intent_at_version_two(s: Story) -> None:
    # The run's first intent of its step numbered after another run's ledger.
    for c in s.changes:
        if c.table == "tool_operations":
            for image in (c.old, c.new):
                if image is not None:
                    image["effect_version"] = 2


def operation_id_with_step_before_run(s: Story) -> None:
    # The id's parts in another order (tenant, step, run, version).
    for c in s.changes:
        if c.table == "tool_operations" and c.new is not None:
            c.new["operation_id"] = f"{TENANT}/create_label/{RUN}/v1"


STORY_CHANGES: dict[str, Callable[[Story], None]] = {
    "effect.operation_id_names_its_intent": operation_id_with_step_before_run,
    "effect.versions_of_a_step_count_from_one": first_intent_at_version_two,
    "lease.epoch_grows_by_one_on_every_grant": epoch_jump,
    "lease.one_owner_per_epoch": second_owner,
    "lease.granted_only_when_free_or_expired": grant_over_live_lease,
    "lease.live_lease_moved_only_by_its_holder": released_by_another_session,
    "lease.takeover_counts_no_attempt": takeover_counted_as_attempt,
    "lease.takeover_keeps_the_status": takeover_moves_the_status,
    "lease.renewed_only_while_unexpired": revived_lease,
    "lease.expiry_within_lease_duration": lease_too_long,
    "write.only_under_the_current_unexpired_lease": stale_checkpoint,
    "write.revision_advances_by_one": revision_skips,
    "write.checkpoint_and_outbox_event_in_one_transaction": checkpoint_apart_from_outbox,
    "write.run_names_its_checkpoints_schema_version": run_names_an_older_version,
    "run.history_is_append_only": checkpoint_updated,
    "effect.in_flight_never_marked_cancelled": inflight_cancelled,
    "effect.claim_back_to_prepared_only_after_a_proven_rejection": back_to_prepared,
    "effect.never_prepared_again_once_in_doubt": prepared_after_doubt,
    "effect.not_executed_only_where_the_tool_did_not_act": not_executed_though_acted,
    "run.nothing_advances_after_terminal": advanced_after_end,
    "run.one_live_run_per_task": two_live_runs,
    "run.every_run_can_progress_at_the_end": paused_without_doubt,
    "run.leaves_doubt_only_with_nothing_in_doubt": resumed_beside_another_doubt,
    "consumer.business_effect_at_most_once_per_event": second_effect,
    "consumer.effect_only_for_a_delivered_event": effect_of_undelivered,
    "consumer.dedup_row_and_effect_in_one_transaction": dedup_apart_from_effect,
    "effect.ledger_revision_advances_by_one": ledger_step_without_revision,
    "effect.compensation_required_exactly_for_a_cancelled_runs_success": lambda s: (
        result_after_cancel(s, compensated=False)
    ),
    "harness.write_path_as_asked": stepped_write,
    "run.only_finished_tasks_are_purged": lambda s: purge(s, publish=False),
    "effect.first_dispatch_is_kept": first_dispatch_moved,
    "effect.resend_claim_ends_within_the_tools_retention": resend_past_retention,
    "operator.audit_shows_the_rows_before_and_after": lambda s: operator_resolves(
        s, before_taken_late=True
    ),
    "operator.a_decision_changes_only_its_run": lambda s: operator_resolves(
        s, touches_another_run=True
    ),
}


def gap(ev: Evidence) -> None:
    ev.tables["agent_checkpoints"] = [
        r for r in ev.tables["agent_checkpoints"] if r["revision"] != 2
    ]


def duplicate_resource(ev: Evidence) -> None:
    ev.tool["resources"].append({"tool": "idem", "operation_id": OP, "resource_id": "res-2"})


def resent_without_promise(ev: Evidence) -> None:
    plain = {"tool": "plain", "capability": "none"}
    ev.tool["requests"] = [request(1, 0.35, **plain), request(2, 0.38, **plain)]


def sent_before_claim(ev: Evidence) -> None:
    ev.tool["requests"] = [request(1, 0.25)]


def sent_with_epoch_zero(ev: Evidence) -> None:
    ev.tool["requests"] = [request(1, 0.35, epoch=0)]


def sent_after_cancel(ev: Evidence) -> None:
    ev.tool["requests"].append(request(2, 0.47, operation_id=OP2))


def marked_before_broker(ev: Evidence) -> None:
    ev.tool["messages"] = [message("e1", 0.75)]


def payload_names_another_event(ev: Evidence) -> None:
    # The outbox row's surrogate key in place of its event_id.
    ev.tool["messages"] = [message("e1", 0.65, {"event_id": "17"})]


def payload_without_tenant(ev: Evidence) -> None:
    # A compensation request's payload as the worker wrote it: no tenant.
    ev.tool["messages"] = [
        {"event_id": "e1", "received_at": T0 + 0.65, "payload": {"event_id": "e1", "run_id": RUN}}
    ]


def sealed_value_sent(ev: Evidence) -> None:
    planted = ev.tool["resources"][0]["request"]  # the clean history's one: in clear
    sealed = {**planted, "customer_token": {"$sealed": "v1:AAAA"}}
    ev.tool["resources"].append(
        {"tool": "idem", "operation_id": OP2, "resource_id": "res-2", "request": sealed}
    )


def lying_account(ev: Evidence) -> None:
    ev.history.append(account("ok", "save_checkpoint", event_id="e-never"))


def stored_in_clear(ev: Evidence) -> None:
    # A checkpoint whose state keeps a nested sensitive field unsealed.
    row = ev.tables["agent_checkpoints"][0]
    row["state"] = {"billing": {"payment_token": "ct_" + "0f" * 12}}


def sealed_part_by_part(ev: Evidence) -> None:
    # Blind hunt 67 #04: a card_number object sealed leaf by leaf, its fields
    # (and so its shape) in clear.
    row = ev.tables["agent_checkpoints"][0]
    row["state"] = {
        "card_number": {"pan": sealed(b"a" * 12, b"4111"), "expiry": sealed(b"b" * 12, b"12/29")}
    }


def test_a_structure_sealed_whole_breaks_nothing() -> None:
    ev = clean()
    ev.tables["agent_checkpoints"][0]["state"] = {"card_number": sealed(b"c" * 12, b"whole")}
    assert "effect.sensitive_structure_sealed_whole" not in broken_by(ev)


def sealed(nonce: bytes, ciphertext: bytes) -> dict[str, str]:
    return {"$sealed": "v1:" + base64.b64encode(nonce + ciphertext).decode()}


def sealed_under_one_nonce(ev: Evidence) -> None:
    # Two different values sealed with one nonce (a nonce drawn once per process).
    row = ev.tables["agent_checkpoints"][0]
    row["state"] = {
        "customer_token": sealed(b"n" * 12, b"first value"),
        "billing": {"payment_token": sealed(b"n" * 12, b"other value")},
    }


def test_one_sealed_value_copied_as_it_was_shares_its_nonce_rightly() -> None:
    ev = clean()
    same = sealed(b"n" * 12, b"one value")
    ev.tables["agent_checkpoints"][0]["state"] = {"customer_token": same, "again": [same]}
    assert "effect.sealed_values_never_share_a_nonce" not in broken_by(ev)


def null_reconcile_item(ev: Evidence) -> None:
    # A reconcile reply listing an operation it learnt nothing about as null.
    line = {"id": 2, "ok": True, "result": {"changes": [None]}}
    ev.replies.append(reply_entry("reconcile", line))


def claim_longer_than_asked(ev: Evidence) -> None:
    # A's claim is 0.6 s long; A was given 0.4 s (a lease's duration taken
    # for the claim's would do the same).
    ev.dispatch_ttl_ms_by_app = {"A": 400}


def token_logged(ev: Evidence) -> None:
    assert ev.worker_logs is not None
    ev.worker_logs.planted_at.append({"file": "worker-A.stderr.log", "line": 7})


def relayed_out_of_order(ev: Evidence) -> None:
    """One relay transaction marks e2 and e3, whose copies reached the broker
    e3 first (blind hunt 17 #03: a batch ordered by the random event_id)."""
    s = clean_story()
    relay = s.tx(0.75, app="R")
    for e in ("e2", "e3"):
        relay("outbox", s.state("outbox", (e,)), {"published_at": iso(T0 + 0.75)})
    ev.changes[:] = s.changes
    ev.tool["messages"] += [message("e3", 0.72), message("e2", 0.73)]


def reconcile_leaves_out_a_move(ev: Evidence, *, listed: bool = False) -> None:
    """A reconcile reply of the session that moved the operation, alone in its
    window, that does not list it (blind hunt 19 #07: a resend's move there
    and back left out as "no change")."""
    move = next(c for c in ev.changes if c.table == "tool_operations" and c.changed("status"))
    ev.replies.append(
        {
            **reply_entry("reconcile", {"id": 9, "ok": True, "result": {"changes": []}}),
            "worker": move.app,
            "changes": [str(move.row["operation_id"])] if listed else [],
            "at": move.at - 0.01,
            "done": move.at + 0.01,
            "seq_before": move.seq - 1,
            "seq_after": move.seq,
        }
    )


def relay_lists_run_ids(ev: Evidence, *, listed: str | None = None) -> None:
    """A relay reply of the session that marked e1 published, alone in its
    window, that lists the row's run id instead of its event id (blind hunt
    24 #10: a Go loop appending the row's neighbouring field)."""
    mark = next(c for c in ev.changes if c.table == "outbox" and c.changed("published_at"))
    ev.replies.append(
        {
            **reply_entry("relay", {"id": 9, "ok": True, "result": {"published": []}}),
            "worker": mark.app,
            "published": [listed or str(mark.row["run_id"])],
            "at": mark.at - 0.01,
            "done": mark.at + 0.01,
            "seq_before": mark.seq - 1,
            "seq_after": mark.seq,
        }
    )


def consume_counts_a_duplicate(ev: Evidence, *, consumed: int = 2) -> None:
    """A consume reply of the session that inserted e1's dedup row, alone in
    its window, that counts a duplicate it turned away as applied (blind hunt
    25 #10: a Go flag set before the dedup insert decided it)."""
    dedup = next(c for c in ev.changes if c.table == "consumed_events")
    ev.replies.append(
        {
            **reply_entry("consume", {"id": 8, "ok": True, "result": {"consumed": consumed}}),
            "worker": dedup.app,
            "consumed": consumed,
            "at": dedup.at - 0.01,
            "done": dedup.at + 0.01,
            "seq_before": dedup.seq - 1,
            "seq_after": dedup.seq,
        }
    )


def purged_inside_the_retention(ev: Evidence, *, older_than_ms: int = 1000) -> None:
    """A purge request with a retention of ``older_than_ms`` deletes the run
    that ended (its last write) 0.5 s before (blind hunt 19 #01: the cut-off
    judged by when a run was created)."""
    s = clean_story()
    purge(s)
    ev.changes[:] = s.changes
    tx = [c for c in ev.changes if c.app == "ctl" and c.op == "DELETE"]
    gone = next(c for c in tx if c.table == "agent_runs")
    assert gone.old is not None
    gone.old["updated_at"] = iso(T0 + 0.5)
    ev.replies.append(
        {
            **reply_entry("purge", {"id": 9, "ok": True, "result": {"purged": 1}}),
            "args": {"older_than_ms": older_than_ms, "limit": 100},
            "seq_before": tx[0].seq - 1,
            "seq_after": tx[-1].seq,
        }
    )


def refusal_recorded_unknown(ev: Evidence) -> None:
    """A worker-role cancel the server refused for want of privilege, recorded
    as an outcome unknown."""
    ev.history.append(account("info", "cancel", error="InsufficientPrivilege"))


def unknown_without_a_class(ev: Evidence) -> None:
    """Generated 2a29c0ae: a renewal that timed out recorded ``info`` with no
    error class."""
    ev.history.append(account("info", "renew", error=None))


def history_truncated_at_a_restart(ev: Evidence) -> None:
    """Blind hunt 70 #07: a worker started again opened its history with
    O_TRUNC, so the file no longer began with the first process's lines."""
    ev.history_restarts.append({"worker": "A", "bytes_before": 812, "kept": False})


def created_with_a_budget_of_three(ev: Evidence) -> None:
    """A create_run without max_attempts that stored 3, not the contract's 12."""
    ev.replies[0]["args"] = {"task_id": TASK, "input": {}, "max_attempts": 3}


def granted_past_the_budget(ev: Evidence) -> None:
    """A run approved with its budget spent and granted again: attempt_count
    one above max_attempts."""
    last = next(c for c in reversed(ev.changes) if c.table == "agent_runs" and c.new)
    assert last.new is not None
    last.new["attempt_count"], last.new["max_attempts"] = 3, 2


def prepared_keeps_a_deadline(ev: Evidence) -> None:
    """Blind hunt 33 #02: a 429's return to prepared that cleared the owner
    and kept the claim's deadline."""
    c = next(c for c in ev.changes if c.table == "tool_operations" and c.new)
    assert c.new is not None
    c.new.update(status="prepared", dispatch_owner=None, dispatch_until=iso(T0 + 1.0))


def busy_claim_loop(ev: Evidence) -> None:
    """A worker that asks for a lease someone else holds without a pause:
    thousands of takeovers in its 2.4 worker-seconds."""
    ev.functions_called = {"fencecheck.claim": 3, "fencecheck.takeover": 4200}


def busy_ledger_poll(ev: Evidence) -> None:
    """A worker that polls a ledger row someone else's claim holds without a
    pause: one statement thousands of times in its 2.4 worker-seconds."""
    poll = "SELECT status FROM tool_operations WHERE operation_id = $1"
    ev.statements_called = [
        {"role": "fcw_x_1", "query": poll, "calls": 2900},
        {"role": "fcw_x_2", "query": poll, "calls": 1000},
        {"role": "fcw_x_1", "query": "SELECT fencecheck.claim($1, $2)", "calls": 3},
    ]


def reconnect_loop_in_a_cut(ev: Evidence) -> None:
    """A worker that reconnects to a cut link without a pause: a hundred
    refused attempts in the 0.11 s the harness held it cut (generated
    8bf81b91: the read-back's sleep dropped)."""
    ev.worker_lifetimes_s = [0.7, 1.2]
    ev.connection_attempts = {"worker_pg": 118, "worker_tool": 0}
    ev.link_cuts = [{"link": "worker_pg", "seconds": 0.114, "attempts": 109}]


def cancel_reports_another_runs_status(ev: Evidence) -> None:
    """A cancel reply, right after the run was made, whose run_status is one
    the run never had (generated a83ac9a7: the status of another run's row)."""
    made = next(c for c in ev.changes if c.table == "agent_runs" and c.op == "INSERT")
    ev.replies.append(
        {
            **reply_entry(
                "cancel",
                {"id": 9, "ok": True, "result": {"run_status": "paused_human", "operations": []}},
            ),
            "args": {"run_id": str(made.row["run_id"])},
            "run_status": "paused_human",
            "seq_before": made.seq,
            "seq_after": made.seq,
        }
    )


EVIDENCE_CHANGES: dict[str, Callable[[Evidence], None]] = {
    "worker.cancel_reports_the_runs_status": cancel_reports_another_runs_status,
    "worker.statements_are_paced": busy_ledger_poll,
    "worker.connections_are_paced": reconnect_loop_in_a_cut,
    "lease.acquisition_attempts_are_paced": busy_claim_loop,
    "effect.prepared_holds_no_claim": prepared_keeps_a_deadline,
    "run.created_with_its_initial_values": created_with_a_budget_of_three,
    "run.attempts_never_exceed_the_budget": granted_past_the_budget,
    "worker.refusals_are_not_recorded_unknown": refusal_recorded_unknown,
    "worker.failures_name_their_class": unknown_without_a_class,
    "worker.history_is_appended_to": history_truncated_at_a_restart,
    "effect.sensitive_field_never_logged": token_logged,
    "effect.dispatch_claim_within_its_duration": claim_longer_than_asked,
    "write.revisions_gapless": gap,
    "effect.one_real_resource_per_operation": duplicate_resource,
    "effect.no_resend_without_idempotency": resent_without_promise,
    "effect.sent_only_under_a_dispatch_claim": sent_before_claim,
    "outbox.marked_published_only_after_the_broker_has_it": marked_before_broker,
    "outbox.a_relay_cycle_publishes_in_outbox_order": relayed_out_of_order,
    "worker.reconcile_lists_every_change": reconcile_leaves_out_a_move,
    "worker.relay_lists_what_it_marked": relay_lists_run_ids,
    "worker.consume_counts_what_it_applied": consume_counts_a_duplicate,
    "run.purged_only_past_the_retention": purged_inside_the_retention,
    "outbox.message_payload_names_its_event_and_run": payload_names_another_event,
    "outbox.message_payload_names_its_tenant": payload_without_tenant,
    "worker.accounts_match_the_evidence": lying_account,
    "worker.replies_match_the_contract": null_reconcile_item,
    "effect.sensitive_field_stored_sealed": stored_in_clear,
    "effect.sensitive_structure_sealed_whole": sealed_part_by_part,
    "effect.sealed_values_never_share_a_nonce": sealed_under_one_nonce,
    "effect.sensitive_field_reaches_the_tool_in_clear": sealed_value_sent,
}


def test_every_invariant_has_a_violating_history() -> None:
    covered = set(STORY_CHANGES) | set(EVIDENCE_CHANGES)
    # Each with a test of its own (below).
    covered |= {
        "effect.cancelled_intent_never_sent",
        "effect.ledger_records_the_tools_own_retention",
        "effect.refused_step_moved_on_only_by_a_person",
        "run.freeze_leaves_no_claim_of_its_own",
    }
    assert covered == set(INVARIANTS)


def broken_by(ev: Evidence) -> dict[str, list[dict[str, Any]]]:
    return {r.name: r.violations for r in check(ev) if not r.ok}


@pytest.mark.parametrize("name", sorted(STORY_CHANGES))
def test_story_violation_is_named(name: str) -> None:
    s = clean_story()
    STORY_CHANGES[name](s)
    broken = broken_by(evidence(s))
    assert name in broken, broken
    assert broken[name], "the offending rows are reported"


@pytest.mark.parametrize("name", sorted(EVIDENCE_CHANGES))
def test_evidence_violation_is_named(name: str) -> None:
    ev = clean()
    EVIDENCE_CHANGES[name](ev)
    broken = broken_by(ev)
    assert name in broken, broken
    assert broken[name]


def test_cancelled_intent_sent_afterwards() -> None:
    s = clean_story()
    cancelled_then_sent(s)
    ev = evidence(s)
    assert "effect.cancelled_intent_never_sent" not in broken_by(ev)
    sent_after_cancel(ev)
    rows = broken_by(ev)["effect.cancelled_intent_never_sent"]
    assert rows[0]["operation_id"] == OP2 and rows[0]["request_seqs"] == [2]


def test_only_the_sealed_value_is_named() -> None:
    ev = clean()
    sealed_value_sent(ev)
    rows = broken_by(ev)["effect.sensitive_field_reaches_the_tool_in_clear"]
    assert [r["resource_id"] for r in rows] == ["res-2"] and rows[0]["value_kind"] == "dict"


def test_request_epoch_must_be_the_runs() -> None:
    ev = clean()
    sent_with_epoch_zero(ev)
    (row,) = broken_by(ev)["effect.sent_only_under_a_dispatch_claim"]
    assert row["request_seq"] == 1 and "epoch 0" in row["why"]


def test_grant_over_live_lease_reports_the_row() -> None:
    s = clean_story()
    grant_over_live_lease(s)
    (row,) = broken_by(evidence(s))["lease.granted_only_when_free_or_expired"]
    assert row["epoch"] == [1, 2] and row["owner"] == ["A/1", "B/1"]


def test_a_renewal_is_judged_against_its_transactions_start() -> None:
    name = "lease.renewed_only_while_unexpired"
    s = clean_story()
    revived_lease(s)
    (row,) = broken_by(evidence(s))[name]
    assert row["expired_ms_before_the_renewal_began"] == pytest.approx(100.0)
    # Renewed while live, or begun while live and granted the row after it ran
    # out (a wait for the row lock): the protocol allows both.
    for began in (0.5, 0.79):
        s = clean_story()
        held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
        tx = s.tx(began)
        tx(
            "agent_runs",
            {**held, "lease_expires_at": iso(T0 + 0.8)},
            {"lease_expires_at": iso(T0 + 1.6)},
        )
        s.changes[-1] = dataclasses.replace(s.changes[-1], at=T0 + 0.85)
        result = next(r for r in check(evidence(s)) if r.name == name)
        assert result.ok and result.checked == 1, began


def test_live_lease_moves_allowed_to_its_holder_and_a_cancel() -> None:
    name = "lease.live_lease_moved_only_by_its_holder"
    for app, status in (("A", "queued"), ("ctl", "cancelled")):
        s = clean_story()
        held = {**s.state("agent_runs", (RUN,)), "status": "running", "owner": "A/1"}
        s.tx(0.9, app=app)(
            "agent_runs",
            {**held, "lease_expires_at": iso(T0 + 1.5)},
            {"owner": None, "lease_expires_at": None, "status": status},
        )
        assert name not in broken_by(evidence(s)), (app, status)
    s = clean_story()
    released_by_another_session(s)
    (row,) = broken_by(evidence(s))[name]
    assert row["app"] == "B" and "granted to session 'A'" in row["why"]


def test_harness_plants_are_not_protocol_writes() -> None:
    s = clean_story()
    s.tx(0.9, app="fencecheck-harness")(
        "agent_checkpoints",
        None,
        {"run_id": RUN, "revision": 5, "epoch": 1, "owner": "older-code", "event_id": "p"},
    )
    assert "write.only_under_the_current_unexpired_lease" not in broken_by(evidence(s))


def test_a_fail_later_retried_is_not_a_lie() -> None:
    ev = clean()
    ev.history = [
        account("fail", "save_checkpoint", event_id="e1"),
        account("ok", "x", event_id="e1"),
    ]
    assert "worker.accounts_match_the_evidence" not in broken_by(ev)


def test_exemption_reports_without_failing() -> None:
    s = clean_story()
    epoch_jump(s)
    reason = "the experiment jumps epochs by design"
    (result,) = [
        r
        for r in check(evidence(s), {"lease.epoch_grows_by_one_on_every_grant": reason})
        if r.name == "lease.epoch_grows_by_one_on_every_grant"
    ]
    assert not result.ok and result.exempt == reason and not result.broken


def test_exemption_of_an_unknown_invariant_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown invariant"):
        check(clean(), {"lease.no_such_thing": "typo"})


def test_write_path_not_judged_without_a_declaration() -> None:
    ev = copy.deepcopy(clean())
    ev.write_paths = {}
    (result,) = [r for r in check(ev) if r.name == "harness.write_path_as_asked"]
    assert result.ok and result.checked == 0 and "not judged" in result.observed


@pytest.mark.parametrize(("committed", "broken"), [(0.36, False), (0.295, True)])
def test_request_epoch_is_judged_by_commit_time(committed: float, broken: bool) -> None:
    # A takeover to epoch 2 is audited (trigger time) before A's claim at 0.300
    # but commits only after the request left with epoch 1: the dispatcher could
    # not have read epoch 2, so the request is in order. Committed before the
    # claim, epoch 2 was readable and epoch 1 is stale.
    ev = clean()
    run = next(c for c in reversed(ev.changes) if c.table == "agent_runs").row
    takeover = Change(
        len(ev.changes) + 1, T0 + 0.29, T0 + 0.29, 99, "B", "agent_runs", "UPDATE",
        run, {**run, "owner": "B/1", "epoch": 2}, committed_at=T0 + committed,
    )  # fmt: skip
    ev.changes.append(takeover)
    rows = broken_by(ev).get("effect.sent_only_under_a_dispatch_claim", [])
    assert bool(rows) == broken, rows
    if broken:
        assert "epoch 1 outside 2..2" in rows[0]["why"]


def test_back_to_prepared_after_nothing_reached_the_tool() -> None:
    """A refused connection: no request of the claim ever arrived, so going back
    to prepared undid nothing; a request of that claim that did arrive (acted)
    still breaks it, also when it arrived after the return to prepared."""
    s = clean_story()
    back_to_prepared(s)
    ev = evidence(s)
    ev.tool["requests"] = []
    assert "effect.claim_back_to_prepared_only_after_a_proven_rejection" not in broken_by(ev)
    ev.tool["requests"] = [request(1, 0.35, outcome="rejected_429")]
    assert "effect.claim_back_to_prepared_only_after_a_proven_rejection" not in broken_by(ev)
    ev.tool["requests"] = [request(1, 0.95)]
    (row,) = broken_by(ev)["effect.claim_back_to_prepared_only_after_a_proven_rejection"]
    assert row["requests_of_the_claim"] == [(1, "created")]
    ev.tool["requests"] = [request(1, 0.35, outcome="rejected_429"), request(2, 0.36)]
    assert "effect.claim_back_to_prepared_only_after_a_proven_rejection" in broken_by(ev)


def test_a_change_begun_before_the_end_committed_is_not_after_it() -> None:
    """Audit order is not commit order (explore found it on the correct worker):
    a cancel updates the run row, then a dispatch claim that read the run
    live, in a transaction begun before the cancel committed, moves a ledger
    row the cancel had not locked, and commits first. That claim is not after
    the end; one begun after the end committed is."""
    s = clean_story()
    end = next(c for c in s.changes if c.table == "agent_runs" and c.after("status") == "succeeded")
    op2 = {"operation_id": OP2, "run_id": RUN, "step_id": "notify", "status": "prepared"}
    s.tx(0.45)("tool_operations", None, op2)
    s.tx(0.49, app="D")("tool_operations", op2, {"status": "dispatching"})
    ended_at = end.at + 0.05  # its commit came after D's claim began
    s.changes = [
        Change(**{**c.__dict__, "committed_at": ended_at}) if c.txid == end.txid else c
        for c in s.changes
    ]
    claim = s.changes[-1]
    s.changes[-1] = Change(**{**claim.__dict__, "seq": end.seq + 100, "at": ended_at + 0.01})
    assert "run.nothing_advances_after_terminal" not in broken_by(evidence(s))
    s.changes[-1] = Change(**{**s.changes[-1].__dict__, "tx_start": ended_at + 0.005})
    assert "run.nothing_advances_after_terminal" in broken_by(evidence(s))


def test_a_purge_of_a_finished_task_breaks_nothing() -> None:
    s = clean_story()
    purge(s)
    ev = evidence(s)
    ev.tool["messages"] += [message(e, 0.85) for e in ("e2", "e3", "e4")]
    results = {r.name: r for r in check(ev)}
    broken = {n: r.violations for n, r in results.items() if not r.ok}
    assert broken == {}
    assert results["run.only_finished_tasks_are_purged"].checked == 11


@pytest.mark.parametrize(
    ("story", "why"),
    [
        (lambda s: purge(s, publish=False), "the outbox row was not published"),
        (lambda s: purge(s, task=False, only="agent_checkpoints"), "its task is not deleted"),
        (lambda s: purge(s, only="outbox"), "its runs ['r-1'] are not deleted with it"),
    ],
)
def test_a_purge_of_what_is_not_finished_breaks(story: Callable[[Story], None], why: str) -> None:
    s = clean_story()
    story(s)
    results = {r.name: r for r in check(evidence(s))}
    purged = results["run.only_finished_tasks_are_purged"]
    assert not purged.ok and any(why in v["why"] for v in purged.violations)


def test_a_live_run_purged_breaks() -> None:
    s = clean_story()
    purge(s)
    live = next(c for c in s.changes if c.table == "agent_runs" and c.op == "DELETE")
    s.changes[s.changes.index(live)] = Change(
        live.seq,
        live.at,
        live.tx_start,
        live.txid,
        live.app,
        live.table,
        "DELETE",
        {**(live.old or {}), "status": "running"},
        None,
    )
    purged = {r.name: r for r in check(evidence(s))}["run.only_finished_tasks_are_purged"]
    assert [v["why"] for v in purged.violations] == ["the run was running"]


def test_a_deletion_outside_a_purge_is_history_rewritten() -> None:
    s = clean_story()
    purge(s, task=False, only="agent_checkpoints")
    results = {r.name: r for r in check(evidence(s))}
    assert not results["run.history_is_append_only"].ok


def never_stamped() -> Story:
    """The clean story by a system whose first-dispatch stamp is never written."""
    s = clean_story()
    for c in s.changes:
        for row in (c.old, c.new):
            if row is not None:
                row.pop("first_dispatched_at", None)
    return s


@pytest.mark.parametrize(
    ("declared", "broken"),
    [
        (None, False),  # not known: a column never seen reads as no column
        (frozenset({"operation_id", "status"}), False),  # the mapping has none
        (frozenset({"operation_id", "status", "first_dispatched_at"}), True),
    ],
)
def test_a_declared_first_dispatch_never_stamped_breaks(
    declared: frozenset[str] | None, broken: bool
) -> None:
    ev = evidence(never_stamped())
    ev.declared = None if declared is None else {"tool_operations": declared}
    result = {r.name: r for r in check(ev)}["effect.first_dispatch_is_kept"]
    assert result.ok is not broken
    if broken:
        assert result.violations[0]["why"] == "not set by the first dispatch claim"


def test_a_claim_reported_refused_that_its_own_session_was_granted_is_a_lie() -> None:
    # A's session got epoch 1 (the audit trail), and A said its claim was refused.
    ev = clean()
    ev.history = [e for e in ev.history if e.op != "claim"]
    ev.history.append(account("fail", "claim", epoch=1))
    (row,) = broken_by(ev)["worker.accounts_match_the_evidence"]
    assert row["why"].startswith("reported a claim refused")
    # Not when A had reported that grant ok before (a later claim of the run it
    # holds is refused naming its epoch), nor for another session's grant.
    ev = clean()
    ev.history.append(account("fail", "claim", epoch=1))
    assert "worker.accounts_match_the_evidence" not in broken_by(ev)
    ev = clean()
    ev.history = [e for e in ev.history if e.op != "claim"]
    ev.history.append(dataclasses.replace(account("fail", "claim", epoch=1), worker="B"))
    assert "worker.accounts_match_the_evidence" not in broken_by(ev)


def test_a_claim_reported_ok_for_another_sessions_grant_is_a_lie() -> None:
    """B says it was granted epoch 1, which the audit trail gave A's session
    (blind hunt 23 #03: refused claims logged ok with the holder's epoch).
    Also for a worker no grant names, when the grant went to another worker's
    id (blind hunt 58 #03: a takeover of a paused run logged ok with an old
    grant); not where the grant's session carries no worker id (a system
    whose sessions carry another application_name is not told apart so)."""
    s = clean_story()
    regrant(s, 0.9, 2, "B/1", 1.7)
    ev = evidence(s)
    ev.history.append(dataclasses.replace(account("ok", "claim", epoch=1), worker="B"))
    (row,) = broken_by(ev)["worker.accounts_match_the_evidence"]
    assert row["why"] == "reported a claim the audit trail granted to another session (A)"
    ev = clean()
    ev.history.append(dataclasses.replace(account("ok", "claim", epoch=1), worker="C"))
    (row,) = broken_by(ev)["worker.accounts_match_the_evidence"]
    assert row["worker"] == "C"
    ev = clean()
    ev.history = [dataclasses.replace(e, worker="C") for e in ev.history]
    assert "worker.accounts_match_the_evidence" not in broken_by(ev)


def test_a_relay_reply_listing_what_it_marked_holds() -> None:
    ev = clean()
    relay_lists_run_ids(ev, listed="e1")
    result = {r.name: r for r in check(ev)}["worker.relay_lists_what_it_marked"]
    assert result.ok and result.checked == 1
    ev = clean()
    relay_lists_run_ids(ev)
    (row,) = broken_by(ev)["worker.relay_lists_what_it_marked"]
    assert row["marked_not_listed"] == ["e1"] and row["listed_not_marked"] == [RUN]


def test_a_consume_reply_counting_what_it_applied_holds() -> None:
    ev = clean()
    consume_counts_a_duplicate(ev, consumed=1)
    result = {r.name: r for r in check(ev)}["worker.consume_counts_what_it_applied"]
    assert result.ok and result.checked == 1
    ev = clean()
    consume_counts_a_duplicate(ev)
    (row,) = broken_by(ev)["worker.consume_counts_what_it_applied"]
    assert (row["consumed"], row["dedup_rows_inserted"]) == (2, 1)


OPERATOR_AUDIT = "operator.audit_shows_the_rows_before_and_after"


def test_an_audited_decision_shows_the_rows_before_and_after() -> None:
    s = clean_story()
    operator_resolves(s)
    results = {r.name: r for r in check(evidence(s))}
    assert {n: r.violations for n, r in results.items() if not r.ok} == {}
    assert results[OPERATOR_AUDIT].checked == 1
    s = clean_story()
    operator_resolves(s, before_taken_late=True)
    (row,) = broken_by(evidence(s))[OPERATOR_AUDIT]
    assert row["part"] == "before.operation" and row["action"] == "resolve:executed"
    assert row["differs"] == {"status": ["succeeded", "unknown"], "remote_id": ["res-3", None],
                              "revision": [3, 2]}  # fmt: skip


def converge_while_the_run_moves(s: Story, *, after_epoch: int | None = None) -> None:
    """converge_operation of an unknown operation of a queued run, while another
    session's grant of that run commits during the decision: the run, which
    the decision does not change, may show either image, and must show one."""
    run, op = paused_in_doubt(s)
    queued = {**run, "status": "queued"}
    s.tx(0.95, app="ctl")("agent_runs", run, {"status": "queued"})
    decision = s.tx(1.0, app="ctl")
    s.tx(1.0, app="B")("agent_runs", queued, {"status": "running", "owner": "B/2", "epoch": 2})
    granted = s.state("agent_runs", (RUN3,))
    decision("tool_operations", op, {"status": "succeeded", "remote_id": "res-3", "revision": 3})
    after = snapshot(granted, s.state("tool_operations", (OP3,)))
    if after_epoch is not None:
        after["epoch"] = after_epoch
    audit = {"id": 1, "run_id": RUN3, "operation_id": OP3, "action": "converge"}
    decision("operator_actions", None, {**audit, "before": snapshot(queued, op), "after": after})


def test_a_run_the_decision_did_not_change_shows_an_image_it_had_meanwhile() -> None:
    s = clean_story()
    converge_while_the_run_moves(s)
    assert OPERATOR_AUDIT not in broken_by(evidence(s))
    s = clean_story()
    converge_while_the_run_moves(s, after_epoch=7)  # an epoch the run never had
    (row,) = broken_by(evidence(s))[OPERATOR_AUDIT]
    assert row["part"] == "after" and row["differs"] == {"epoch": [7, 2]}


def test_two_decisions_in_one_transaction_break() -> None:
    s = clean_story()
    operator_resolves(s)
    last = s.changes[-1]
    twin = {**(last.new or {}), "id": 2}
    s.changes.append(Change(**{**last.__dict__, "seq": last.seq + 1, "new": twin}))
    rows = broken_by(evidence(s))[OPERATOR_AUDIT]
    assert {r["why"] for r in rows} == {"another decision shares its transaction"}


def test_not_judged_where_the_system_keeps_no_before_after() -> None:
    s = clean_story()
    operator_resolves(s, before_taken_late=True)
    ev = evidence(s)
    ev.declared = {"operator_actions": frozenset()}
    result = {r.name: r for r in check(ev)}[OPERATOR_AUDIT]
    assert result.ok and result.checked == 0 and "not judged" in result.observed


def test_a_resend_past_the_tools_own_window_breaks_it_when_the_ledger_records_none() -> None:
    """An intent registered without the tool's key retention (a path that
    forgot to record it) is judged by the window the idempotent tool itself
    declares; without either, a resend is not judged."""
    s = clean_story()
    resend_past_retention(s)
    s.changes = [
        dataclasses.replace(c, new={**c.new, "retention_ms": None})
        if c.table == "tool_operations" and c.new
        else c
        for c in s.changes
    ]
    ev = evidence(s)
    name = "effect.resend_claim_ends_within_the_tools_retention"
    assert next(r for r in check(ev) if r.name == name).checked == 0
    ev.tool["server"] = {"idempotency_retention_s": 0.5}
    result = next(r for r in check(ev) if r.name == name)
    assert not result.ok and result.violations[0]["operation_id"] == OP


def test_a_write_reported_failed_beside_an_event_the_harness_planted_is_no_lie() -> None:
    """O[half_found]: the harness plants an outbox row with the write's event_id
    and no checkpoint; the worker reports the write failed (CommitInconsistent).
    The planted row is no write of the worker's; one a worker inserted is."""
    s = clean_story()
    s.tx(0.95, app="fencecheck-harness")(
        "outbox", None, {"event_id": "e-planted", "tenant_id": TENANT, "run_id": RUN}
    )
    ev = evidence(s)
    ev.history.append(account("fail", "save_checkpoint", event_id="e-planted"))
    assert "worker.accounts_match_the_evidence" not in broken_by(ev)
    s = clean_story()
    s.tx(0.95, app="A")(
        "outbox", None, {"event_id": "e-planted", "tenant_id": TENANT, "run_id": RUN}
    )
    ev = evidence(s)
    ev.history.append(account("fail", "save_checkpoint", event_id="e-planted"))
    (row,) = broken_by(ev)["worker.accounts_match_the_evidence"]
    assert row["why"] == "reported fail, but its event_id is in the outbox"


def test_a_grant_counted_from_before_its_row_lock_is_short() -> None:
    """A takeover that waited on the row lock and counted its expiry from its
    transaction's start gets less than the lease duration after the previous
    change committed: a violation for a worker whose lease duration the
    harness gave it, nothing for a session it knows nothing of."""
    s = clean_story()
    last = max(c.visible_at for c in s.changes if c.table == "agent_runs") - T0
    regrant(s, last + 0.6, 2, "B/1", last + 0.5)  # 0.5 s after the previous commit
    ev = evidence(s)
    assert "lease.expiry_within_lease_duration" not in broken_by(ev)
    ev.lease_ttl_ms_by_app = {"B": 800}
    rows = broken_by(ev)["lease.expiry_within_lease_duration"]
    assert rows and rows[0]["after_previous_commit_ms"] < 800
    ev.lease_ttl_ms_by_app = {"B": 400}
    assert "lease.expiry_within_lease_duration" not in broken_by(ev)


def test_the_workers_logs_are_read_for_planted_values(tmp_path: Path) -> None:
    """Every line of each log holding a value of the planted shape is noted,
    by file and line; a file never written is no file read."""
    (tmp_path / "worker-A.stderr.log").write_text(
        "started\nrequest customer_token=ct_" + "ab" * 12 + "\n"
    )
    (tmp_path / "A.events.jsonl").write_text('{"op": "claim"}\n')
    logs = read_worker_logs(
        [tmp_path / "worker-A.stderr.log", tmp_path / "A.events.jsonl", tmp_path / "absent.log"]
    )
    assert logs.files == 2
    assert logs.planted_at == [{"file": "worker-A.stderr.log", "line": 2}]


def test_a_retention_recorded_in_the_wrong_unit_breaks() -> None:
    """An intent of the idempotent tool records the window the tool declares,
    in milliseconds; seconds taken for milliseconds is a window 1000 times
    too short. Not judged where the tool declares none."""
    s = clean_story()
    resend_past_retention(s)  # records retention_ms 500 on the operation
    ev = evidence(s)
    name = "effect.ledger_records_the_tools_own_retention"
    assert next(r for r in check(ev) if r.name == name).checked == 0
    ev.tool["server"] = {"idempotency_retention_s": 0.5}
    result = next(r for r in check(ev) if r.name == name)
    assert result.ok and result.checked == 1
    ev.tool["server"] = {"idempotency_retention_s": 500}
    result = next(r for r in check(ev) if r.name == name)
    assert not result.ok and result.violations[0]["declared_ms"] == 500_000


def test_a_relay_cycle_in_outbox_order_breaks_nothing() -> None:
    ev = clean()
    relayed_out_of_order(ev)
    ev.tool["messages"][-2:] = [message("e2", 0.72), message("e3", 0.73)]
    result = {r.name: r for r in check(ev)}["outbox.a_relay_cycle_publishes_in_outbox_order"]
    assert result.ok and result.checked == 1


def cancel_after_a_write(s: Story, *, before_read_early: bool) -> None:
    """A cancel of a run another session wrote to after the cancel's
    transaction began and before it locked the run (blind hunt 18 #03: the
    audit's ``before`` read ahead of the lock shows the row as it was at the
    start, not as the cancel's own change found it)."""
    run, _ = paused_in_doubt(s)
    decision = s.tx(1.0, app="ctl")
    s.tx(1.0, app="B")("agent_runs", run, {"revision": 5})
    written = s.state("agent_runs", (RUN3,))
    decision("agent_runs", written, {"status": "cancelled"})
    before = snapshot(run if before_read_early else written, None)
    after = snapshot(s.state("agent_runs", (RUN3,)), None)
    audit = {"id": 1, "run_id": RUN3, "operation_id": None, "action": "cancel"}
    decision("operator_actions", None, {**audit, "before": before, "after": after})


def test_a_changed_rows_before_is_the_image_its_own_change_found() -> None:
    s = clean_story()
    cancel_after_a_write(s, before_read_early=False)
    assert OPERATOR_AUDIT not in broken_by(evidence(s))
    s = clean_story()
    cancel_after_a_write(s, before_read_early=True)
    (row,) = broken_by(evidence(s))[OPERATOR_AUDIT]
    assert row["part"] == "before" and row["differs"] == {"revision": [0, 5]}


def test_a_reconcile_reply_that_lists_its_move_breaks_nothing() -> None:
    ev = clean()
    reconcile_leaves_out_a_move(ev, listed=True)
    result = {r.name: r for r in check(ev)}["worker.reconcile_lists_every_change"]
    assert result.ok and result.checked == 1


def test_a_run_purged_past_its_retention_breaks_nothing() -> None:
    ev = clean()
    purged_inside_the_retention(ev, older_than_ms=400)
    result = {r.name: r for r in check(ev)}["run.purged_only_past_the_retention"]
    assert result.ok and result.checked == 1


def test_acquisitions_the_harness_asked_for_are_allowed() -> None:
    ev = clean()
    ev.functions_called = {"fencecheck.claim": 400}
    assert "lease.acquisition_attempts_are_paced" in broken_by(ev)
    ev.replies = [{"op": "claim", "ok": True}] * 400
    assert "lease.acquisition_attempts_are_paced" not in broken_by(ev)


def test_acquisitions_unknown_or_of_another_schema_are_not_judged() -> None:
    for called in (None, {"myapp.acquire": 100_000}):
        ev = clean()
        ev.functions_called = called
        found = {r.name: r for r in check(ev)}["lease.acquisition_attempts_are_paced"]
        assert found.ok and found.checked == 0 and "not judged" in found.observed


def test_a_reconcile_reply_that_lists_an_operation_it_did_not_move_breaks() -> None:
    """Blind hunt 33 #04: expired claims the cycle skipped (held by another
    session) listed as changes."""
    ev = clean()
    reconcile_leaves_out_a_move(ev, listed=True)
    ev.replies[-1]["changes"].append("some-other-operation")
    broken = broken_by(ev)["worker.reconcile_lists_every_change"]
    assert broken[0]["listed_but_not_changed"] == ["some-other-operation"]
    assert broken[0]["not_listed"] == []


def test_server_counts_not_known_name_why() -> None:
    """A count the runner could not read is not judged, and the note says why
    (the runner's reason), so an auditor can tell a failover from a failure."""
    ev = evidence(clean_story())
    ev.functions_called, ev.statements_called = None, None
    ev.server_counts_unknown = "reading the statement counts failed: OperationalError()"
    for name in ("worker.statements_are_paced", "lease.acquisition_attempts_are_paced"):
        result = next(r for r in check(ev) if r.name == name)
        assert result.ok and result.checked == 0
        assert "not judged" in result.observed and "OperationalError" in result.observed


def test_paced_reconnects_in_a_cut_hold() -> None:
    """A few reconnects with a pause during a cut, and a link nobody cut, are
    within the bound; without the run's count nothing is judged, and the
    note says why."""
    ev = evidence(clean_story())
    ev.worker_lifetimes_s = [0.7, 1.2]
    ev.connection_attempts = {"worker_pg": 9, "worker_tool": 0}
    ev.link_cuts = [{"link": "worker_pg", "seconds": 0.5, "attempts": 6}]
    result = next(r for r in check(ev) if r.name == "worker.connections_are_paced")
    assert result.ok and result.checked == 3, result
    ev.connection_attempts, ev.connections_unknown = None, "no firewall table"
    result = next(r for r in check(ev) if r.name == "worker.connections_are_paced")
    assert result.ok and result.checked == 0 and "no firewall table" in result.observed


REFUSED = "op-refused-v1"
REPLANNED = "op-refused-v2"
REFUSAL = "effect.refused_step_moved_on_only_by_a_person"


def refused_then_planned_again(*, person_decided: bool) -> Evidence:
    """RUN2's create_label v1 refused for good by the tool (422), recorded
    failed_final; then v2 registered, with or without a person's decision
    (the run paused for a person and queued again) in between."""
    s = clean_story()
    s.tx(0.81, app="ctl")("agent_runs", None, run_row(run_id=RUN2, task_id="task-2"))
    op = {"operation_id": REFUSED, "run_id": RUN2, "step_id": "create_label", "effect_version": 1}
    s.tx(0.82, app="B")(
        "tool_operations", None, {**op, "tool_name": "idem", "status": "dispatching", "revision": 1}
    )
    s.tx(0.84, app="B")(
        "tool_operations",
        s.state("tool_operations", (REFUSED,)),
        {"status": "failed_final", "revision": 2},
    )
    if person_decided:
        s.tx(0.85, app="B")(
            "agent_runs", s.state("agent_runs", (RUN2,)), {"status": "paused_human"}
        )
        s.tx(0.86, app="ctl")("agent_runs", s.state("agent_runs", (RUN2,)), {"status": "queued"})
    s.tx(0.88, app="C")(
        "tool_operations",
        None,
        {**op, "operation_id": REPLANNED, "effect_version": 2, "status": "prepared", "revision": 0},
    )
    ev = evidence(s)
    ev.tool["requests"].append(
        request(2, 0.83, operation_id=REFUSED, run_id=RUN2, outcome="rejected_final")
    )
    return ev


def test_a_refused_step_planned_again_without_a_person() -> None:
    (row,) = broken_by(refused_then_planned_again(person_decided=False))[REFUSAL]
    assert (row["refused"], row["next_version"], row["registered_by"]) == (
        REFUSED,
        REPLANNED,
        "C",
    )
    results = {r.name: r for r in check(refused_then_planned_again(person_decided=True))}
    assert results[REFUSAL].ok and results[REFUSAL].checked == 1
    # An ops client that asked for the next version made that call itself.
    ev = refused_then_planned_again(person_decided=False)
    seq = ev.changes[-1].seq
    ev.replies.append({"op": "register_intent", "worker": "C", "seq_before": seq - 1,
                       "seq_after": seq, "ok": True})  # fmt: skip
    assert REFUSAL not in broken_by(ev)


def cancel_reply(run_status: str) -> Evidence:
    """RUN3 made queued, then cancelled by ctl; the cancel's reply names
    ``run_status``."""
    s = clean_story()
    s.tx(0.81, app="ctl")("agent_runs", None, run_row(run_id=RUN3, task_id="task-3"))
    s.tx(0.82, app="ctl")("agent_runs", s.state("agent_runs", (RUN3,)), {"status": "cancelled"})
    ev = evidence(s)
    made, cancelled = ev.changes[-2], ev.changes[-1]
    result = {"run_status": run_status, "operations": []}
    ev.replies.append(
        {
            **reply_entry("cancel", {"id": 9, "ok": True, "result": result}),
            "args": {"run_id": RUN3},
            "run_status": run_status,
            "seq_before": made.seq,
            "seq_after": cancelled.seq,
        }
    )
    return ev


def test_a_cancel_reply_names_the_status_after_the_cancel() -> None:
    """Blind hunt 58 #08: the status read before the move, reported as the
    run's status after the cancel."""
    name = "worker.cancel_reports_the_runs_status"
    (row,) = broken_by(cancel_reply("queued"))[name]
    assert (row["reported"], row["once_cancelled"]) == ("queued", "cancelled")
    assert name not in broken_by(cancel_reply("cancelled"))


def frozen_beside_own_claim(*, claim_turned_unknown: bool) -> Evidence:
    """B claims RUN2's operation and then pauses RUN2 in doubt; its freeze
    turns that claim unknown in the same transaction, or leaves it live."""
    s = clean_story()
    s.tx(0.81, app="ctl")("agent_runs", None, run_row(run_id=RUN2, task_id="task-2"))
    s.tx(0.815, app="B")(
        "agent_runs", s.state("agent_runs", (RUN2,)), {"status": "running", "owner": "B/1"}
    )
    op = {"operation_id": "op-f", "run_id": RUN2, "step_id": "create_label", "effect_version": 1}
    s.tx(0.82, app="B")("tool_operations", None, {**op, "status": "prepared", "revision": 0})
    s.tx(0.83, app="B")(
        "tool_operations",
        s.state("tool_operations", ("op-f",)),
        {"status": "dispatching", "dispatch_until": iso(T0 + 5), "revision": 1},
    )
    freeze = s.tx(0.85, app="B")
    freeze(
        "agent_runs", s.state("agent_runs", (RUN2,)), {"status": "paused_indoubt", "owner": None}
    )
    if claim_turned_unknown:
        freeze("tool_operations", s.state("tool_operations", ("op-f",)),
               {"status": "unknown", "dispatch_until": None, "revision": 2})  # fmt: skip
    return evidence(s)


def test_a_freeze_leaves_no_live_claim_of_its_own() -> None:
    """Generated 7ecb66a7: the freeze's ledger half matched every owner but its own."""
    name = "run.freeze_leaves_no_claim_of_its_own"
    (row,) = broken_by(frozen_beside_own_claim(claim_turned_unknown=False))[name]
    assert row["own_live_claims"][0]["operation_id"] == "op-f"
    results = {r.name: r for r in check(frozen_beside_own_claim(claim_turned_unknown=True))}
    assert results[name].ok and results[name].checked == 1


@pytest.mark.parametrize("carried", [True, False])
def test_a_retry_starts_from_its_previous_runs_input(carried: bool) -> None:
    """Blind hunt 67 #02: a retry_run that dropped the person's supplement
    from the input it copied; the retry inserted with it breaks nothing."""
    supplemented = {"tool": "idem", "supplement": {"address": "corrected by support"}}
    s = clean_story()
    s.tx(0.9, app="ctl")("agent_runs", s.state("agent_runs", (RUN,)), {"input": supplemented})
    retry = "9b3f6d52-0c3e-4d7e-9f51-3a2f1c6e8d10"
    given = supplemented if carried else {"tool": "idem"}
    s.tx(1.0, app="ctl")("agent_runs", None, run_row(run_id=retry, input=given))
    ev = evidence(s)
    ev.replies.append(
        reply_entry(
            "retry_run",
            {"id": 2, "ok": True, "result": {"run_id": retry, "task_id": TASK}},
            args={"task_id": TASK},
            run_id=retry,
        )
    )
    broken = broken_by(ev)
    assert ("run.created_with_its_initial_values" in broken) is not carried, broken
