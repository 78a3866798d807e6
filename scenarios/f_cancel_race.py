"""F: cancel forbids dispatch of prepared effects and never pretends an in-flight
one did not happen.

The run is cancelled through the control plane while its tool effect is
(a) registered but not dispatched, (b) claimed by the dispatcher, about to be
sent, or (c) unknown after the dispatcher died past the tool's answer.

A bystander run of the tenant has an intent registered and never sent when
the cancel comes: a cancel forbids the prepared effects of its own run only,
so the bystander's stays prepared and its run untouched.

Variant ``reconciler_after_cancel``: a dispatcher died after its claim and
before its call (an idempotent tool: nothing reached it); a reconciler's
cycle read the run live, asked the tool (nothing found) and is held there
while the run is cancelled; another run of the tenant is live. Let go, it
must claim nothing and send nothing: a cancelled run's effect in doubt is
reconciled, never resent (its same-key retry is refused by the run's own
status, whatever the tenant's other runs are).

Variant ``claim_held_past_cancel``: as ``dispatching``, but the worker held
after its claim is let go only once its own history records the renewal the
cancel refused. That refusal cancels its execution, which starts no new side
effect: the create is never sent (the claim stays the worker's, so the
operation is never ``cancelled`` either).

Variant ``dispatching_expired``: as ``dispatching``, with the worker's claim
(400 ms) run out by database time before the cancel and nothing swept it:
its request may still have left before the deadline, so the operation stays
in flight, never ``cancelled``.

Variant ``held_write``: the cancel comes while a protected write of the run
(stepped path) holds the run's row with everything written, before its
COMMIT. The cancel waits for it, and its audit row's ``before`` must be the
run as that write left it (contract section 7.7), never as it was before.
"""

from __future__ import annotations

import time
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Crash, Hold
from harness.parts.processes import WorkerProcess
from scenarios.common import (
    control_plane,
    finish,
    intent_registered,
    new_run,
    renewals_refused_since,
    seen_within,
    wait_claimable,
)

HELD_WRITE = "held_write"
RECONCILER_AFTER_CANCEL = "reconciler_after_cancel"
CLAIM_HELD_PAST_CANCEL = "claim_held_past_cancel"
#: As ``dispatching``, but the held worker's claim has run out by database
#: time when the cancel comes (nobody swept it): the request may still have
#: left before the deadline, so the operation is in flight all the same.
DISPATCHING_EXPIRED = "dispatching_expired"
EXPIRING_CLAIM_TTL_MS = 400
# claim_held_past_cancel: how long the harness waits for the held worker's own
# record of the renewal the cancel refused (a few heartbeat intervals).
REFUSED_S = 5.0
POINT = {
    "prepared": "after_outbound_intent_commit",
    "dispatching": "after_dispatch_claim_commit",
    "unknown": "after_tool_response_before_tx2_commit",
}


SPEC = ExperimentSpec(
    id="F",
    title="cancel race",
    seed_section="English seed §9.2, §9.3 (cancel rows of the reconciliation table), §11 F",
    invariant="a prepared effect is never dispatched after cancel; a dispatching or unknown "
    "effect is never marked cancelled (it may have happened)",
    fault="cancel while the effect is prepared / dispatching / unknown",
    rules=(4, 6),
    variants=(
        "prepared",
        "dispatching",
        "unknown",
        HELD_WRITE,
        RECONCILER_AFTER_CANCEL,
        CLAIM_HELD_PAST_CANCEL,
        DISPATCHING_EXPIRED,
    ),
    variant_waits=(("unknown", 0.8), (DISPATCHING_EXPIRED, EXPIRING_CLAIM_TTL_MS / 1000)),
    variant_faults=(
        (
            DISPATCHING_EXPIRED,
            "cancel while the worker is held right after its dispatch claim, once that claim "
            "ran out by database time (not swept)",
        ),
        (
            CLAIM_HELD_PAST_CANCEL,
            "cancel while the worker is held right after its dispatch claim; let go once its "
            "heartbeat recorded the renewal the cancel refused",
        ),
        (
            HELD_WRITE,
            "cancel while a stepped protected write of the run holds its row before COMMIT",
        ),
        (
            RECONCILER_AFTER_CANCEL,
            "SIGKILL of the dispatcher after its claim, before its call; cancel while a "
            "reconciler that read the run live is held after its query found nothing",
        ),
    ),
    variant_points=(
        (CLAIM_HELD_PAST_CANCEL, "after_dispatch_claim_commit"),
        (DISPATCHING_EXPIRED, "after_dispatch_claim_commit"),
        (HELD_WRITE, "before_commit"),
        (RECONCILER_AFTER_CANCEL, "after_reconcile_query"),
    ),
    variant_write_paths=((HELD_WRITE, "stepped"),),
    needs=(
        *needs.capabilities("workflow", "ledger"),
        *(needs.point(p, v) for v, p in POINT.items()),
        needs.capability("checkpoints", HELD_WRITE),
        needs.capability("operator_actions", HELD_WRITE),
        needs.point("before_commit", HELD_WRITE),
        needs.capability("ledger_tool:idempotent", RECONCILER_AFTER_CANCEL),
        needs.point("after_dispatch_claim_commit", RECONCILER_AFTER_CANCEL),
        needs.point("after_reconcile_query", RECONCILER_AFTER_CANCEL),
        needs.op("reconcile", RECONCILER_AFTER_CANCEL),
    ),
)


def run(ctx: ExperimentContext) -> None:
    variant = ctx.variant or "prepared"
    if variant == HELD_WRITE:
        _cancel_while_a_write_holds_the_run(ctx)
        return
    if variant == RECONCILER_AFTER_CANCEL:
        _reconciler_after_cancel(ctx)
        return
    if variant == CLAIM_HELD_PAST_CANCEL:
        _claim_held_past_the_cancel(ctx)
        return
    run_id = new_run(ctx, tool="plain")
    ctl = control_plane(ctx)
    expired = variant == DISPATCHING_EXPIRED
    variant = "dispatching" if expired else variant  # the effect's status at the cancel
    point = POINT[variant]
    ctx.arm("A", point, Crash() if variant == "unknown" else Hold())
    env: dict[str, str | None] | None = (
        {"FENCECHECK_DISPATCH_TTL_MS": str(EXPIRING_CLAIM_TTL_MS)} if expired else None
    )
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    if variant == "unknown":
        finish(ctx, a)
        wait_claimable(ctx, run_id)
        ctx.ok(ctl, "reconcile")
    else:
        ctx.reached("A", point)
    ran_out = _claim_ran_out(ctx, run_id) if expired else None
    before = checkers.ledger(ctx, run_id)
    ctx.fault(
        f"effect {variant} when cancel is issued" + (", its claim run out" if expired else ""),
        len(before) >= 1 and before[-1]["status"] == variant and (ran_out or not expired),
        expected=f"the run's tool effect is {variant}"
        + (" and its claim's deadline has passed by database time" if expired else ""),
        observed=f"ledger: {[o['status'] for o in before]}"
        + (f"; claim run out: {ran_out}" if expired else ""),
    )
    by_run = new_run(ctx, tool="plain")
    by_op = intent_registered(ctx, ctx.env.start_worker("Y", "ops"), by_run, tool="plain",
                              step_id="f.bystander")  # fmt: skip
    by_before = (checkers.ledger(ctx, by_run), checkers.run_row(ctx, by_run)["revision"])
    cancel = ctx.op(ctl, "cancel", run_id=run_id)
    at_cancel = checkers.ledger(ctx, run_id)
    if cancel.ok:
        # What the control plane is told is in flight: the run's own ledger
        # as the cancel left it (the bystander's intent makes a lost run
        # match show); nothing moves the ledger between the two.
        ctx.equal(
            "the cancel's reply lists the run's ledger",
            sorted(
                (str(o.get("operation_id")), str(o.get("status")))
                for o in cancel.result.get("operations") or []
                if isinstance(o, dict)
            ),
            sorted((str(o["operation_id"]), str(o["status"])) for o in at_cancel),
            what="(operation_id, status) in the reply's operations vs the run's ledger rows",
        )
    by_after = (checkers.ledger(ctx, by_run), checkers.run_row(ctx, by_run)["revision"])
    ctx.equal(
        "the cancel left another run's prepared intent alone",
        [(o["operation_id"], o["status"]) for o in by_after[0]] + [by_after[1]],
        [(o["operation_id"], o["status"]) for o in by_before[0]] + [by_before[1]],
        what=f"(operation, status) of the bystander's ledger ({by_op} prepared) and its revision",
    )
    if variant != "unknown":
        ctx.release("A", point)
        finish(ctx, a)
    op = before[-1]["operation_id"] if before else None
    after = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    requests = checkers.tool_requests(ctx, operation_id=op)
    ctx.equal(
        "run cancelled",
        checkers.run_row(ctx, run_id)["status"],
        "cancelled",
        what=f"run status (cancel reply ok={cancel.ok})",
    )
    if variant == "prepared":
        ctx.equal(
            "prepared effect never dispatched",
            len(requests),
            0,
            what="requests the tool received for it",
        )
        ctx.equal(
            "prepared effect cancelled",
            after[op]["status"] if op in after else None,
            "cancelled",
            what="ledger status",
        )
    else:
        statuses = [o["status"] for o in at_cancel if o["operation_id"] == op]
        ctx.invariant(
            "in-flight effect not claimed unexecuted",
            "cancelled" not in statuses and after.get(str(op), {}).get("status") != "cancelled",
            expected="ledger keeps dispatching/unknown/succeeded, never cancelled",
            observed=f"at cancel {statuses}, afterwards {after.get(str(op), {}).get('status')}; "
            f"tool requests for it: {len(requests)}",
        )
    if variant == "unknown":
        ctx.equal(
            "still unknown",
            after[op]["status"] if op in after else None,
            "unknown",
            what="ledger status after cancel",
        )
        ctx.equal("not resent", len(requests), 1, what="requests the tool received for it")
    found = _reconciled_after_the_cancel(ctx, ctl) if variant == "unknown" else None
    checkers.lease_history_is_sound(ctx, [run_id] + ([found] if found else []))


def _reconciled_after_the_cancel(ctx: ExperimentContext, ctl: WorkerProcess) -> str:
    """Another run's dispatcher dies after a queryable tool acted; the run is
    cancelled with its operation dispatching; once the claim's deadline passed,
    the control plane's reconcile learns the fact by query: the operation
    converges to the tool's resource (a cancel never hides an effect), and that
    success asks for compensation in the same transaction (the global
    effect.compensation_required_exactly_for_a_cancelled_runs_success)."""
    run_id = new_run(ctx, tool="queryable")
    ctx.arm("A2", "after_tool_response_before_tx2_commit", Crash())
    code = finish(ctx, ctx.env.start_worker("A2", "run", ["--run-id", run_id, "--once"]))
    ctx.ok(ctl, "cancel", run_id=run_id, reason="customer withdrew")
    expired = _dead_claim_expired(ctx, run_id)
    made = checkers.tool_resources(ctx, run_id=run_id)
    ctx.fault(
        "the tool acted, the dispatcher died and the run was cancelled with its claim expired",
        code == -9 and len(made) == 1 and bool(expired),
        expected="A2 killed after one resource; the run cancelled; its operation dispatching "
        "past the claim's deadline",
        observed=f"A2 exit {code}; resources {len(made)}; claim expired: {bool(expired)}",
    )
    since = time.time()
    ctx.ok(ctl, "reconcile")
    ops = checkers.ledger(ctx, run_id)
    ctx.progress_equal(
        "the control plane's reconcile converges the cancelled run's operation",
        [(o["status"], o["remote_id"]) for o in ops],
        [("succeeded", made[0]["resource_id"] if made else None)],
        what="(status, remote_id) of the run's operations",
        since=since,
    )
    caps = ctx.system.capabilities
    if caps.offers_op("relay") and caps.offers_op("consume"):
        # The compensation event reaches the owning service like any other: the
        # consumer applies each event the broker holds once, whatever its type
        # and payload (a compensation's names no tenant of its own).
        k = ctx.env.start_worker("K", "ops")
        ctx.ok(k, "relay", limit=100)
        for _ in range(2):  # a second pass sees nothing new
            ctx.ok(k, "consume", consumer="billing")
        checkers.every_event_applied_once(ctx, "billing")
    return run_id


def _dead_claim_expired(ctx: ExperimentContext, run_id: str) -> list[dict[str, Any]] | None:
    """Wait until a dispatch claim of the run is past its deadline by database time."""
    found: list[dict[str, Any]] | None = seen_within(
        lambda: ctx.env.query(
            "SELECT 1 FROM fencecheck_model.tool_operations WHERE run_id = %s "
            "AND status = 'dispatching' AND dispatch_until < clock_timestamp()",
            [run_id],
        ),
        what="the dead dispatcher's claim to pass its deadline by database time",
        timeout_s=30.0,
    )
    return found


def _reconciler_after_cancel(ctx: ExperimentContext) -> None:
    """A reconciler that read the run live resends nothing once it was cancelled."""
    run_id = new_run(ctx, tool="idem")
    # Another run of the tenant, live throughout (claimed, its lease let lapse).
    other = new_run(ctx, tool="plain")
    ctx.ok(ctx.env.start_worker("Y", "ops"), "claim", run_id=other)
    ctx.arm("A", "after_dispatch_claim_commit", Crash())
    code = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"]))
    op_id = next((o["operation_id"] for o in checkers.ledger(ctx, run_id)), None)
    _dead_claim_expired(ctx, run_id)
    r = ctx.env.start_worker("R", "ops")
    ctx.arm("R", "after_reconcile_query", Hold())
    cycle = ctx.op_async(r, "reconcile", {}, worker_async=True)
    hit = ctx.reached("R", "after_reconcile_query")
    ctl = control_plane(ctx)
    cancel = ctx.op(ctl, "cancel", run_id=run_id, reason="customer withdrew")
    run_status = checkers.run_row(ctx, run_id)["status"]
    other_status = checkers.run_row(ctx, other)["status"]
    queried = [q for q in checkers.tool_log(ctx)["queries"] if q.get("operation_id") == op_id]
    ctx.fault(
        "a reconciler that asked the tool was held while the run was cancelled, beside a live run",
        code == -9
        and hit.operation_id == op_id
        and [q["outcome"] for q in queried] == ["not_found"]
        and cancel.ok
        and run_status == "cancelled"
        and other_status in ("queued", "running", "waiting_tool"),
        expected=f"A killed after its claim; R held after its query of {op_id} found nothing; "
        "the run cancelled; the other run live",
        observed=f"A exit {code}; R held at {hit.operation_id}; queries "
        f"{[q['outcome'] for q in queried]}; cancel {'ok' if cancel.ok else cancel.error}; "
        f"run {run_status}; other run {other_status}",
    )
    ctx.release("R", "after_reconcile_query")
    reply = cycle.result(15)
    op = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), {})
    sent = checkers.tool_requests(ctx, operation_id=op_id)
    ctx.invariant(
        "a cancelled run's effect in doubt is not resent",
        not sent and op.get("status") == "unknown",
        expected="no request at the tool for it; the operation still unknown (reconciled, "
        "never claimed for a resend)",
        observed=f"tool requests {len(sent)}; ledger {op.get('status')} by "
        f"{op.get('dispatch_owner')}; reconcile reply "
        f"{'ok' if reply.ok else reply.error}",
    )
    checkers.lease_history_is_sound(ctx, [run_id, other])


def _claim_ran_out(ctx: ExperimentContext, run_id: str) -> bool:
    """Wait (bounded) until the run's dispatching operation's claim deadline
    has passed by database time; whether it did (blind hunt 68 #04: a cancel
    that took such a claim for one that sends nothing any more marked the
    operation cancelled, though its request may have left before the
    deadline)."""
    return bool(
        seen_within(
            lambda: ctx.env.query(
                "SELECT 1 FROM fencecheck_model.tool_operations WHERE run_id = %s"
                " AND status = 'dispatching' AND dispatch_until <= clock_timestamp()",
                [run_id],
            ),
            what=f"run {run_id[:8]}'s dispatch claim to run out by database time",
            timeout_s=EXPIRING_CLAIM_TTL_MS / 1000 + 10,
        )
    )


def _claim_held_past_the_cancel(ctx: ExperimentContext) -> None:
    """A ``run`` worker held right after its dispatch claim while the control
    plane cancels the run, let go only once its history records the renewal
    the cancel refused: the first refused renewal cancels the execution, and a
    cancelled execution sends nothing (blind hunt 66 #08: a Go heartbeat that
    took a refusal for a terminal run as no lost lease left the execution
    running, and it sent the create after its own heartbeat had seen the run
    cancelled). The operation stays in flight, never ``cancelled``."""
    run_id = new_run(ctx, tool="plain")
    point = "after_dispatch_claim_commit"
    ctx.arm("A", point, Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    ctx.reached("A", point)
    cancel = ctx.op(control_plane(ctx), "cancel", run_id=run_id)
    answered_at = time.time()
    refused = renewals_refused_since(a, run_id, answered_at, timeout_s=REFUSED_S)
    ctx.release("A", point)
    code = finish(ctx, a)
    row = checkers.run_row(ctx, run_id, "the run at the end")
    ops = checkers.ledger(ctx, run_id)
    creates = checkers.tool_requests(ctx, run_id=run_id)
    name = "a worker whose renewal the cancel refused sends nothing"
    if not ctx.probe_reached(
        "the run cancelled while A held its claim, and A's renewal refused after it",
        cancel.ok and bool(refused) and [o["status"] for o in ops][-1:] != ["prepared"],
        judges=name,
        expected="the cancel answered ok while A was held after its dispatch claim; A's history "
        "records a renewal refused (or unconfirmed) after the cancel's answer, before A is let go",
        observed=f"cancel {'ok' if cancel.ok else cancel.error}; renewals after it "
        f"{[(e.type, e.error) for e in refused or []]}; ledger {[o['status'] for o in ops]}",
    ):
        return
    ctx.invariant(
        name,
        not creates,
        expected="no create reaches the tool: the refused renewal cancelled A's execution, and "
        "a cancelled execution starts no new side effect",
        observed=f"creates {[(r['outcome'], r.get('epoch')) for r in creates]}; A exit {code}",
    )
    ctx.invariant(
        "in-flight effect not claimed unexecuted",
        all(o["status"] != "cancelled" for o in ops) and row["status"] == "cancelled",
        expected="the run cancelled; its claimed operation dispatching or unknown, never cancelled",
        observed=f"run {row['status']}; ledger {[o['status'] for o in ops]}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _cancel_while_a_write_holds_the_run(ctx: ExperimentContext) -> None:
    """W's checkpoint (stepped write) holds the run's row at before_commit; the
    operator's cancel is sent then and must wait for it. Its audit `before` is
    judged by the global operator.audit_shows_the_rows_before_and_after, and
    here against the revision W's write left."""
    run_id = new_run(ctx)
    ctl = control_plane(ctx)
    w = ctx.env.start_worker("W", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    ctx.arm("W", "before_commit", Hold())
    write = ctx.op_async(
        w,
        "save_checkpoint",
        {"run_id": run_id, "epoch": lease["epoch"], "expected_revision": lease["revision"],
         "state": {"by": "W"}},
    )  # fmt: skip
    ctx.reached("W", "before_commit")
    cancel = ctx.op_async(ctl, "cancel", {"run_id": run_id, "reason": "customer withdrew"})
    waited = checkers.backend_waiting_on_lock(ctx, "ctl")
    ctx.release("W", "before_commit")
    written, cancelled = write.result(15.0), cancel.result(15.0)
    # The fault is what the harness did (W held with the run's row locked when
    # the cancel went out); whether the cancel waited is the implementation's
    # answer (blind hunt 57 #07: a Go decision that skipped a locked run and
    # answered RunNotFound had turned this experiment's fail into unknown).
    ctx.fault(
        "the cancel was sent while W's write held the run's row",
        written.ok,
        expected="ctl's cancel sent while W's checkpoint, held before its COMMIT, held the "
        "run's row; the checkpoint then committed",
        observed=f"checkpoint {'ok ' + str(written.result) if written.ok else written.error}",
    )
    ctx.progress(
        "the cancel waited on the run while W's write held it",
        bool(waited),
        expected="a session of ctl waiting on a lock while W's write held the run's row",
        observed=f"ctl waited: {waited}",
    )
    ctx.invariant(
        "the cancel of the live run cancelled it",
        cancelled.ok and checkers.run_row(ctx, run_id)["status"] == "cancelled",
        expected="cancel ok once W's write committed; the run cancelled",
        observed=f"cancel {'ok ' + str(cancelled.result) if cancelled.ok else cancelled.error}"
        f" {cancelled.message or ''}; run {checkers.run_row(ctx, run_id)['status']}",
    )
    audited = ctx.sql(
        "the cancel's audit row",
        "SELECT (before->>'revision')::bigint AS before_revision, before->>'status' AS before, "
        "after->>'status' AS after FROM fencecheck_model.operator_actions WHERE run_id = %s "
        "ORDER BY id",
        [run_id],
    )
    ctx.equal(
        "the cancel's audit starts from the run as the write left it",
        [(a["before_revision"], a["before"], a["after"]) for a in audited],
        [(written.result.get("revision") if written.ok else None, "running", "cancelled")],
        what=f"(before revision, before status, after status) of operator_actions (cancel "
        f"{'ok' if cancelled.ok else cancelled.error})",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
