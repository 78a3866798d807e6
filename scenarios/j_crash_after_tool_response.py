"""J: killed after the tool answered, with a tool that offers neither query nor
idempotency: nothing may be resent automatically; the run is frozen in doubt.

Variant ``operator_resolves``: then a person resolves it (issue 15: the way
out of PAUSED_INDOUBT) while workers race to claim the run. A worker that
tries before the decision must be refused; the operator's decision holds
the run's row lock at the barrier ``after_operator_lock`` while a second
worker's takeover waits on it; only after the decision may a worker take
the run, and it must continue from the operator's finding (adopt the
resource found, resend nothing). The decision is audited. Before it, every
operator decision of the contract is sent with every value outside its
argument's enumeration (:func:`harness.contract.spec.invalid_choices`): each
must change nothing, judged from the audit trail.

Variant ``operator_converges``: the person records the fact by hand instead
(``converge_operation``, the tool's console showed the resource). Nothing of
the run is in doubt any more, so the run must go back to the queue in the
same transaction (a run paused in doubt with nothing in doubt is resumed by
nobody), and a worker must finish it from the recorded fact without resending.
"""

from __future__ import annotations

import json

from harness.checking import checkers
from harness.contract import needs, spec
from harness.engine.experiment import ExperimentContext, ExperimentSpec, LoggedOp
from harness.parts.control import Crash, Hold
from harness.parts.processes import WorkerProcess
from scenarios.common import (
    control_plane,
    finding_without_a_resource_refused,
    finish,
    finish_or_take_over,
    neither_failed_on_the_other,
    new_run,
    paused_list_is_the_databases,
    resumed_once_converged,
    wait_claimable,
    writes_name_workflow_steps,
)

# claim_outlives_lease: A's dispatch claim lasts three times its lease, so
# its successor takes the run over while A's claim is still live: B must
# leave the claim alone until its deadline (it may still be answered), and
# ask again after a pause, not in a loop (worker.statements_are_paced).
CLAIM_OUTLIVES_LEASE_MS = 2400

SPEC = ExperimentSpec(
    id="J",
    title="crash after tool response",
    seed_section="Chinese seed §8.3, §13.2 (工具响应前崩溃); English seed §9.3",
    invariant="no automatic resend; the ledger entry is in doubt (unknown); the run is paused "
    "in doubt and no worker claims it again",
    fault="SIGKILL at after_tool_response_before_tx2_commit, tool without query or idempotency",
    rules=(4, 5, 9),
    injection_point="after_tool_response_before_tx2_commit",
    needs=(
        *needs.capabilities("workflow", "ledger", "ledger_tool:none"),
        needs.capability("operator_actions", "operator_resolves"),
        needs.capability("operator_actions", "operator_converges"),
        needs.point("after_tool_response_before_tx2_commit"),
        needs.point("after_operator_lock", "operator_resolves"),
        needs.op("resolve_indoubt", "operator_resolves"),
        needs.op("converge_operation", "operator_converges"),
        needs.capability("operator_actions", "retry_races_decision"),
        needs.point("after_operator_lock", "retry_races_decision"),
        needs.op("resolve_indoubt", "retry_races_decision"),
        needs.op("retry_run", "retry_races_decision"),
    ),
    variants=(
        "frozen",
        "operator_resolves",
        "operator_converges",
        "claim_outlives_lease",
        "retry_races_decision",
    ),
    natural_wait_s=0.8,
    variant_waits=(("claim_outlives_lease", CLAIM_OUTLIVES_LEASE_MS / 1000),),
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx, tool="plain")
    ctx.arm("A", "after_tool_response_before_tx2_commit", Crash())
    outlives = ctx.variant == "claim_outlives_lease"
    env_a: dict[str, str | None] = (
        {"FENCECHECK_DISPATCH_TTL_MS": str(CLAIM_OUTLIVES_LEASE_MS)} if outlives else {}
    )
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env_a)
    code_a = finish(ctx, a)
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.fault(
        "the tool acted before A died",
        code_a == -9 and [r["outcome"] for r in sent] == ["created"],
        expected="A killed by SIGKILL after one created resource",
        observed=f"A exit {code_a}; tool requests {[r['outcome'] for r in sent]}",
    )
    if outlives:
        checkers.wait_lease_expired(ctx, run_id)
    else:
        wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    # A successor whose own renewal timed out on a busy machine cancels
    # itself, as it must; the next one freezes the run.
    code_b = finish_or_take_over(ctx, b, run_id)
    c = ctx.env.start_worker("C", "run", ["--exit-when-idle"])
    code_c = finish(ctx, c)
    requests = checkers.tool_requests(ctx, run_id=run_id)
    ctx.equal("no automatic resend", len(requests), 1, what="requests the tool received")
    ops = checkers.ledger(ctx, run_id)
    statuses = [o["status"] for o in ops]
    row = checkers.run_row(ctx, run_id)
    told = f"B exit {code_b}, C exit {code_c}"
    # Safety: nothing claims an outcome nobody can know, the run never moves on.
    # Progress: a successor marks the expired claim unknown and freezes the run
    # (one whose own renewal timed out first leaves it to the next).
    ctx.invariant(
        "ledger claims no outcome it cannot know",
        statuses in (["dispatching"], ["unknown"]),
        expected="one operation, dispatching (not yet judged) or unknown",
        observed=f"ledger statuses {statuses}",
    )
    ctx.progress_equal("ledger in doubt", statuses, ["unknown"], what="ledger statuses")
    ctx.invariant(
        "the run never advanced past the doubt",
        row["status"] not in ("succeeded", "failed", "cancelled"),
        expected="not terminal",
        observed=f"run status {row['status']} ({told})",
    )
    ctx.progress_equal(
        "run paused in doubt", row["status"], "paused_indoubt", what=f"run status ({told})"
    )
    if row["status"] == "paused_indoubt":
        ctx.equal("nobody holds the frozen run", row["owner"], None, what="owner")
        paused_list_is_the_databases(ctx, control_plane(ctx))
    if outlives:
        _live_claim_left_alone(ctx, run_id)
    if ctx.variant == "operator_resolves":
        _operator_resolves(ctx, run_id, ops[0]["operation_id"] if ops else "", sent)
    if ctx.variant == "operator_converges":
        _operator_converges(ctx, run_id, ops[0]["operation_id"] if ops else "", sent)
    if ctx.variant == "retry_races_decision":
        _retry_races_decision(ctx, run_id, ops[0]["operation_id"] if ops else "", sent)
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _live_claim_left_alone(ctx: ExperimentContext, run_id: str) -> None:
    """B took the run over while A's dispatch claim was live (the fault), and
    nobody judged the operation before that claim's deadline: A's call may
    still be answered until then (database time, from the audit trail)."""
    claims = ctx.sql(
        "A's dispatch claim and the successor's grant (audit trail)",
        "SELECT (SELECT max((new->>'dispatch_until')::timestamptz) FROM fencecheck_audit.changes "
        "  WHERE tbl = 'tool_operations' AND app = 'A' AND new->>'run_id' = %s "
        "  AND new->>'status' = 'dispatching') AS claim_until, "
        "(SELECT min(at) FROM fencecheck_audit.changes WHERE tbl = 'agent_runs' AND op = 'UPDATE' "
        "  AND app <> 'A' AND new->>'run_id' = %s "
        "  AND (new->>'epoch') IS DISTINCT FROM (old->>'epoch')) AS successor_granted, "
        "(SELECT min(at) FROM fencecheck_audit.changes WHERE tbl = 'tool_operations' "
        "  AND op = 'UPDATE' AND new->>'run_id' = %s AND old->>'status' = 'dispatching' "
        "  AND new->>'status' <> 'dispatching') AS judged_at",
        [run_id, run_id, run_id],
    )[0]
    until, granted, judged = claims["claim_until"], claims["successor_granted"], claims["judged_at"]
    ctx.fault(
        "a successor took the run over while A's dispatch claim was live",
        until is not None and granted is not None and granted < until,
        expected=f"a grant to a successor before A's claim deadline (A's dispatch claim "
        f"{CLAIM_OUTLIVES_LEASE_MS} ms, its lease {ctx.env.lease_ttl_ms} ms)",
        observed=f"A's claim until {until}; first successor grant {granted}",
    )
    ctx.invariant(
        "A's live dispatch claim left alone until its deadline",
        judged is None or until is None or judged >= until,
        expected=f"the operation leaves dispatching no earlier than A's claim deadline {until} "
        "(database time): the call may still be answered until then",
        observed=f"it left dispatching at {judged}",
    )


def _operator_resolves(
    ctx: ExperimentContext, run_id: str, op_id: str, sent: list[dict[str, object]]
) -> None:
    remote = str(sent[0]["resource_id"]) if sent else None
    early = ctx.env.start_worker("W1", "run", ["--run-id", run_id, "--once"])
    code_early = finish(ctx, early)
    self_resolve = ctx.op(
        ctx.env.start_worker("W0", "ops"),
        "resolve_indoubt",
        run_id=run_id,
        operation_id=op_id,
        decision="not_executed",
        reason="a worker deciding for itself",
    )
    ctx.invariant(
        "a worker cannot resolve its own doubt",
        not self_resolve.ok,
        expected="refused by the database (operator functions only)",
        observed=f"{self_resolve.error or 'accepted'}",
    )
    ctl = control_plane(ctx)
    _invalid_decisions_change_nothing(ctx, ctl, run_id, op_id, remote)
    decision, held = _held_decision(ctx, ctl, run_id, op_id, remote, "OPS-42")
    # The point's promise (contract: the decision holds the run's row lock
    # there) is the worker's to keep: a decision that let go of it already
    # (its lock taken outside its transaction, blind hunt 21 #06) fails here,
    # not as a race that did not happen.
    ctx.invariant(
        "the decision holds the run's row at after_operator_lock",
        held,
        expected="the run's row locked by the held decision (the harness's FOR UPDATE NOWAIT "
        "refused)",
        observed="locked" if held else "the harness locked the row at once: nobody held it",
    )
    racer = ctx.env.start_worker("W2", "run", ["--run-id", run_id, "--once"])
    waited = checkers.backend_waiting_on_lock(ctx, "W2")
    if held:
        ctx.fault(
            "a worker's takeover raced the operator's decision",
            waited,
            expected="W2's takeover blocked on the run's row lock while the operator held it",
            observed="blocked on a lock" if waited else "W2 never waited on a lock",
        )
    ctx.release("ctl", "after_operator_lock")
    reply = decision.result(15)
    code_racer = finish(ctx, racer)
    trail = checkers.audit(ctx, run_id)
    resumed = next(
        (r["seq"] for r in trail if (r["old_status"], r["status"]) == ("paused_indoubt", "queued")),
        None,
    )
    frozen_at = max(
        (
            r["seq"]
            for r in trail
            if r["status"] == "paused_indoubt" and r["old_status"] != r["status"]
        ),
        default=None,
    )
    early_grants = [
        r["seq"]
        for r in trail
        if r["old_epoch"] is not None
        and r["epoch"] > r["old_epoch"]
        and frozen_at is not None
        and r["seq"] > frozen_at
        and (resumed is None or r["seq"] < resumed)
    ]
    ctx.invariant(
        "no worker took the run before the operator decided",
        resumed is not None and not early_grants,
        expected="the paused run granted to nobody between the freeze and the decision",
        observed=f"decision at audit seq {resumed}; grants before it: {early_grants or 'none'}"
        f" (W1 exit {code_early})",
    )
    ops_after = checkers.ledger(ctx, run_id)
    row = checkers.run_row(ctx, run_id, "the run after the decision")
    requests = checkers.tool_requests(ctx, run_id=run_id)
    decided = [(o["status"], o["remote_id"]) for o in ops_after]
    ctx.invariant(
        "the operator's decision wins",
        decided == [("succeeded", remote)] and len(requests) == 1,
        expected=f"ledger succeeded with the resource found ({remote}); nothing resent",
        observed=f"ledger {decided}; decision ok={reply.ok}; tool requests {len(requests)}",
    )
    ctx.progress_equal(
        "the run finished from the decision",
        row["status"],
        "succeeded",
        what=f"run status (W2 exit {code_racer})",
    )
    actions = ctx.sql(
        "operator decisions on the run",
        "SELECT action, operator, reason, ticket, before->>'status' AS before,"
        " after->>'status' AS after, at FROM fencecheck_model.operator_actions WHERE run_id = %s ORDER BY id",
        [run_id],
    )
    operator = ctx.env.login_role(ctx.env.tenant_id, "operator")
    ctx.invariant(
        "the decision is audited",
        [(a["action"], a["operator"], a["ticket"], a["before"], a["after"]) for a in actions]
        == [("resolve:executed", operator, "OPS-42", "paused_indoubt", "queued")],
        expected=f"one row: resolve:executed by {operator}, ticket OPS-42, paused_indoubt -> queued",
        observed=f"{[(a['action'], a['operator'], a['ticket'], a['before'], a['after']) for a in actions]}",
    )


def _held_decision(
    ctx: ExperimentContext,
    ctl: WorkerProcess,
    run_id: str,
    op_id: str,
    remote: str | None,
    ticket: str,
) -> tuple[LoggedOp, bool]:
    """A person's decision "executed" on the paused run, sent and held at
    after_operator_lock; returns it with whether the run's row is locked
    there (the point's promise)."""
    ctx.arm("ctl", "after_operator_lock", Hold())
    decision = ctx.op_async(
        ctl,
        "resolve_indoubt",
        {
            "run_id": run_id,
            "operation_id": op_id,
            "decision": "executed",
            "remote_id": remote,
            "reason": "resource found in the tool's console",
            "ticket": ticket,
        },
    )
    # The held arrival: earlier refusal probes may have passed this point
    # too, and under load their hits came first.
    ctx.reached("ctl", "after_operator_lock", held=True)
    return decision, checkers.row_lock_held(ctx, "agent_runs", "run_id", run_id)


def _retry_races_decision(
    ctx: ExperimentContext, run_id: str, op_id: str, sent: list[dict[str, object]]
) -> None:
    """A person's decision on the paused run (which queues it again) holds the
    run's row at after_operator_lock while a second control plane retries
    the task: whichever goes first, the task never has two live runs (blind
    hunt 34 #10: a retry that read the paused run without waiting for that
    lock made a new run, and the decision queued the old one). Either may be
    refused: the outcome is judged, not which one wins. Neither may fail on a
    deadlock between the two (blind hunt 57 #06: a Go decision that read the
    task's row FOR SHARE after the run's, while the retry holds the task and
    waits for the run): two actors whose locks are taken in one order wait
    for each other and both answer."""
    remote = str(sent[0]["resource_id"]) if sent else None
    ctl = control_plane(ctx)
    # Started now: a process start under the hold would stretch it.
    ctl2 = ctx.env.start_worker("ctl2", "ops", role="operator")
    task_id = str(checkers.run_row(ctx, run_id)["task_id"])
    decision, held = _held_decision(ctx, ctl, run_id, op_id, remote, "OPS-43")
    retry = ctx.op_async(ctl2, "retry_run", {"task_id": task_id})
    waited = checkers.backend_waiting_on_lock(ctx, "ctl2", timeout_s=3.0)
    ctx.release("ctl", "after_operator_lock")
    decided, retried = decision.result(15), retry.result(15)
    ctx.fault(
        "the task was retried while the decision held the paused run's row",
        held,
        expected="the run's row locked by the held decision when ctl2's retry_run was sent",
        observed=("locked" if held else "not locked")
        + f"; the retry {'waited on a lock' if waited else 'did not wait on a lock'}",
    )
    live = ctx.sql(
        "the task's live runs after the decision and the retry",
        "SELECT run_id, status FROM fencecheck_model.agent_runs WHERE task_id = %s "
        "AND status IN ('queued', 'running', 'waiting_tool') ORDER BY created_at",
        [task_id],
    )
    ctx.invariant(
        "a retry racing the decision leaves the task one live run",
        len(live) <= 1,
        expected="at most one queued, running or waiting run of the task: a retry that waits "
        "for the decision is refused (the run is live again), one that goes first supersedes "
        "the run, and the decision then leaves it as it is",
        observed=f"live runs {[(str(r['run_id'])[:8], r['status']) for r in live]}; decision "
        + (f"ok {decided.result}" if decided.ok else f"{decided.error}")
        + "; retry "
        + (f"ok {retried.result}" if retried.ok else f"{retried.error}"),
    )
    neither_failed_on_the_other(
        ctx,
        "the decision and the retry both answer, neither failing on the other",
        {"decision": decided, "retry": retried},
        "each ok or refused with the contract's class (a deadlock between the two "
        "is a lock order the two do not share)",
    )


def _operator_converges(
    ctx: ExperimentContext, run_id: str, op_id: str, sent: list[dict[str, object]]
) -> None:
    remote = str(sent[0]["resource_id"]) if sent else None
    bystander = _bystander_in_doubt(ctx)
    before = checkers.run_row(ctx, run_id)["status"]
    ctx.fault(
        "the operator converges an operation of a run paused in doubt",
        before == "paused_indoubt",
        expected="the run paused in doubt before the convergence",
        observed=f"run status {before}",
    )
    finding_without_a_resource_refused(
        ctx, run_id, "converge_operation", operation_id=op_id, outcome="succeeded"
    )
    reply = ctx.op(
        control_plane(ctx),
        "converge_operation",
        operation_id=op_id,
        outcome="succeeded",
        remote_id=remote,
        reason="resource found in the tool's console",
        ticket="OPS-43",
    )
    resumed_once_converged(ctx, run_id, reply, remote, "the operator's convergence")
    w = ctx.env.start_worker("W2", "run", ["--run-id", run_id, "--once"])
    code_w = finish(ctx, w)
    requests = checkers.tool_requests(ctx, run_id=run_id)
    ctx.equal("nothing resent after the convergence", len(requests), 1, what="tool requests")
    ctx.progress_equal(
        "the run finished from the recorded fact",
        checkers.run_row(ctx, run_id, "the run at the end")["status"],
        "succeeded",
        what=f"run status (W2 exit {code_w})",
    )
    # A final operation converges no more: the same decision again, to the
    # other outcome, must be refused and change nothing.
    final = checkers.ledger(ctx, run_id)
    again = ctx.op(
        control_plane(ctx),
        "converge_operation",
        operation_id=op_id,
        outcome="failed_final",
        remote_id=None,
        reason="refusal probe: an operation that is no longer unknown",
        ticket="OPS-44",
    )
    after = checkers.ledger(ctx, run_id)
    ctx.invariant(
        "only an unknown operation converges",
        not again.ok and after == final,
        expected="converge_operation of the succeeded operation refused, the ledger as it was",
        observed=f"reply {'ok' if again.ok else again.error}; ledger "
        f"{[(o['status'], o['remote_id']) for o in final]} -> "
        f"{[(o['status'], o['remote_id']) for o in after]}",
    )
    actions = ctx.sql(
        "operator decisions on the run",
        "SELECT action, ticket, before->>'status' AS before, after->>'status' AS after"
        " FROM fencecheck_model.operator_actions WHERE run_id = %s ORDER BY id",
        [run_id],
    )
    seen = [(a["action"], a["ticket"], a["before"], a["after"]) for a in actions]
    ctx.invariant(
        "the convergence is audited",
        seen == [("converge", "OPS-43", "paused_indoubt", "queued")],
        expected="one row: converge, ticket OPS-43, paused_indoubt -> queued",
        observed=f"{seen}",
    )
    if bystander is not None:
        _superseded_then_resolved(ctx, bystander)


def _superseded_then_resolved(ctx: ExperimentContext, run_id: str) -> None:
    """The bystander, still paused in doubt, is superseded by a retry of its
    task; then a person's ``resolve_indoubt`` finds its create executed: the
    finding is taken and the old run ends cancelled, its doubt settled (blind
    hunt 49 #05: the Go decision refused every move of a superseded run, the
    finding included, and left it paused for good)."""
    caps = ctx.system.capabilities
    if not (caps.offers_op("retry_run") and caps.offers_op("resolve_indoubt")):
        return
    ctl = control_plane(ctx)
    (op,) = checkers.ledger(ctx, run_id)
    made = [str(r["resource_id"]) for r in checkers.tool_resources(ctx, run_id=run_id)]
    task_id = str(checkers.run_row(ctx, run_id)["task_id"])
    retried = ctx.op(ctl, "retry_run", task_id=task_id)
    reply = ctx.op(
        ctl, "resolve_indoubt", run_id=run_id, operation_id=op["operation_id"],
        decision="executed", remote_id=made[0] if made else None,
        reason="found in the tool's console",
    )  # fmt: skip
    after = [(o["status"], o["remote_id"]) for o in checkers.ledger(ctx, run_id)]
    old = checkers.run_row(ctx, run_id, "the superseded bystander after the finding")
    ctx.invariant(
        "a person's finding on a superseded run's doubt is taken and ends that run",
        retried.ok
        and reply.ok
        and after == [("succeeded", made[0] if made else None)]
        and old["status"] == "cancelled",
        expected=f"retry_run and resolve_indoubt executed ({made}) taken; the operation "
        "succeeded with that resource; the old run cancelled (no longer its task's active run)",
        observed=f"retry {'ok' if retried.ok else retried.error}; resolve "
        f"{'ok' if reply.ok else f'{reply.error}: {reply.message}'}; ledger {after}; old run "
        f"{old['status']}",
    )


def _bystander_in_doubt(ctx: ExperimentContext) -> str | None:
    """Another run of the tenant paused in doubt on its own unknown operation
    while the operator converges this one's last: whether this run has nothing
    left in doubt is asked of its own operations only (generated mutant
    2e2128fe, blind hunt 17 #12 in the reconciler's path: a NOT EXISTS
    without its run)."""
    bystander = new_run(ctx, tool="plain")
    ctx.env.tool.client().set_fault("plain", "drop_after_act", run_id=bystander)
    ctx.command(f"tool: the bystander {bystander[:8]}'s create of 'plain' loses its answer")
    z = ctx.env.start_worker("Z", "run", ["--run-id", bystander, "--once"])
    code = finish_or_take_over(ctx, z, bystander)
    row = checkers.run_row(ctx, bystander, "the bystander before the convergence")
    ops = [o["status"] for o in checkers.ledger(ctx, bystander)]
    ctx.fault(
        "another run of the tenant is in doubt during the convergence",
        row["status"] == "paused_indoubt" and ops == ["unknown"],
        expected="the bystander paused_indoubt on its one unknown operation",
        observed=f"bystander {row['status']}, ledger {ops} (Z exit {code})",
    )
    return bystander if row["status"] == "paused_indoubt" and ops == ["unknown"] else None


def _invalid_decisions_change_nothing(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, op_id: str, remote: str | None
) -> None:
    """Every operator decision with a value outside its enumeration, on the run
    paused in doubt and its unknown operation: no audited change by ctl, the run
    and the ledger as they were. An op the worker does not implement is skipped
    (they are optional); the reply is kept as detail, never judged."""
    ops = spec.by_name()
    values = {"run_id": run_id, "operation_id": op_id}
    before = (checkers.run_row(ctx, run_id)["status"], checkers.ledger(ctx, run_id))
    mark = checkers.audit_mark(ctx)
    tried: list[str] = []
    skipped: set[str] = set()
    # Beside the values outside an enumeration, a finding the contract leaves
    # incomplete: "executed" names the resource found (remote_id); without it
    # there is nothing to converge the operation to.
    probes: list[tuple[str, str, object, str | None, dict[str, object]]] = [
        (op, arg, value, remote, {}) for op, arg, value in spec.invalid_choices(list(ops.values()))
    ]
    if "resolve_indoubt" in ops:
        probes.append(("resolve_indoubt", "decision", "executed", None, {}))
    # And an operation nobody registered: nothing to converge.
    if "converge_operation" in ops:
        probes.append(("converge_operation", "operation_id", f"{op_id}-nobody", remote, {}))
    # And decisions of the vocabulary made for the wrong pause: approve and
    # supplement answer a person's question (paused_human); a doubt ends only
    # by a finding, a convergence or a terminate (contract: decide).
    if "decide" in ops:
        probes.append(("decide", "decision", "approve", None, {}))
        probes.append(("decide", "decision", "supplement", None, {"supplement": {"note": "x"}}))
    # And decisions naming a run nobody made: RunNotFound, nothing audited.
    nobody = ctx.uuid()
    if "resolve_indoubt" in ops:
        probes.append(("resolve_indoubt", "run_id", nobody, remote, {"decision": "executed"}))
    if "decide" in ops:
        probes.append(("decide", "run_id", nobody, None, {"decision": "terminate"}))
    # And decisions that would be taken but for their reason: the contract
    # audits every operator action with a non-empty reason (blank is none).
    if "resolve_indoubt" in ops:
        probes.append(("resolve_indoubt", "reason", "  ", None, {"decision": "not_executed"}))
    if "decide" in ops:
        probes.append(("decide", "reason", "", None, {"decision": "terminate"}))
    for op, arg, value, remote_id, extra in probes:
        if op in skipped:
            continue
        args = {
            **spec.fill(dict(ops[op].example), values),
            arg: value,
            "remote_id": remote_id,
            **extra,
        }
        if arg != "reason":
            args["reason"] = f"refusal probe: {arg}={value}, remote_id={remote_id}"
        reply = ctx.op_async(ctl, op, args).result(15)
        ctx.command(
            f"ctl: {op} {json.dumps(args, default=str)} -> "
            f"{'ok' if reply.ok else f'{reply.error}: {reply.message}'}"
        )
        if reply.unsupported:
            skipped.add(op)
            continue
        tried.append(
            f"{op} {arg}={value} remote_id={remote_id}: {'accepted' if reply.ok else reply.error}"
        )
    changed = checkers.changes_by(ctx, ["ctl"], after_seq=mark)
    after = (checkers.run_row(ctx, run_id)["status"], checkers.ledger(ctx, run_id))
    ctx.invariant(
        "an operator decision outside its vocabulary changes nothing",
        bool(tried) and not changed and after == before,
        expected="every decision and outcome outside the contract's enumeration, a finding "
        "'executed' without the resource found, a convergence of an operation nobody "
        "registered, an approve or a supplement of a run paused in doubt, a finding or a "
        "terminate naming a run nobody made, and a finding or a terminate with a blank "
        "reason, refused: no "
        "audited change by the operator's session, run and ledger as before",
        observed=f"{len(tried)} probes ({'; '.join(tried)}); skipped (not implemented): "
        f"{sorted(skipped) or 'none'}; audited changes: "
        f"{[(c['tbl'], c['op'], c['statement']) for c in changed] or 'none'}"
        f"{'' if after == before else f'; run/ledger moved: {before} -> {after}'}",
    )
