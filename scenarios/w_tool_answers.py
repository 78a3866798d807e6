"""W: every answer the tool may give the tool step is handled by what it proves.

One ``run``-mode worker works one run whose tool step meets, on its one
create, an answer the mock tool gives by schedule (docs/mock-tool.md, "The
answers a worker must handle"):

* ``conflict_other_body``: 409 under our operation_id, the existing resource
  made from *another* request body (a ``deterministic_id`` tool). It is not our
  success: the ledger must not record it; nothing new was made, nothing is
  resent, and the run stops for a person (in doubt or for a human).
* ``error_after_act``: the tool acts, then answers 500 (a tool without query or
  idempotency). A 5xx is unknown, never a failure: the ledger stays
  ``unknown``, nothing is resent (no promise makes a resend safe), the run is
  paused in doubt.
* ``accepted_without_result``: 202 without a resource id (a query tool). It is
  no result: the worker learns the remote fact by query, sends nothing again,
  records the tool's resource and finishes.
* ``late_answer``: the tool acts at once and answers after the worker's own
  tool timeout (a query tool). The timeout is unknown, not a refusal: converge
  by query, no resend, finish.
* ``found_after_freeze``: the request reaches the tool only after the worker
  gave up on it and its query found nothing (a query tool, ``arrive_held``), so
  the run is paused in doubt; then the tool acts. A reconciler cycle finds the
  resource by query: the operation converges to it and, in the same
  transaction, the run goes back to the queue (nothing else of it is in
  doubt); a worker finishes it without resending. Beside it a bystander run
  of the same tenant stays paused in doubt with its own unknown operation (a
  tool with neither query nor key, its answer lost): another run's doubt
  must neither block this run's resumption nor be touched.
* ``crash_mid_converge``: the same, but the first reconciler is killed
  between the convergence and the run's return to the queue
  (``after_reconcile_converge``). Both halves or neither may be left; a run
  paused in doubt with nothing in doubt is one nobody resumes. Another
  reconciler's cycle must then find the run queued or resume it.
* ``converged_before_freeze``: the same late request, but the worker is held
  after its query found nothing (``after_reconcile_query``) while another
  reconciler's cycle finds the resource and converges the operation. The
  worker's freeze that follows must not commit: nothing is in doubt any more
  (a run paused in doubt with nothing in doubt is one nobody resumes); it
  adopts the result and finishes.

* ``others_in_doubt``: the run has three more operations in doubt, on other
  steps (registered and dispatched through ``ops`` before its tool step, a
  tool with neither query nor key, each answer lost), when its own late
  request freezes it. A person's finding on one (``resolve_indoubt``), a
  manual convergence of another (``converge_operation``) and the
  reconciler's convergence of the tool step's operation must each leave the
  run paused in doubt: something of it is still in doubt, and a claimable
  run with an effect in doubt is one whose workflow may never look at it.
  The convergence of the last one queues it; a worker finishes it without
  resending anything, adopting its tool step's result beside one more
  intent of another step that was registered first and never sent.

* ``resend_unanswered``: every create of the run is still on the network
  (``arrive_late``) when the worker's timeout fires, so its query finds
  nothing and the same-key resend the tool's promise allows is lost alike.
  The run must then pause in doubt: one resend, never a loop of them (the
  tool's log, once everything sent has arrived, holds two creates).

* ``resend_meets_own_resource``: a tool that makes each resource under a
  deterministic id: the run's create is held on the network past the
  worker's timeout, the worker's query finds nothing and it is held there
  (``after_reconcile_query``) while the create arrives and acts. Its same-id
  resend then meets the tool's 409 naming our own request and its resource:
  that is our success, recorded with that resource, and the run finishes
  (a 409 from *another* body is ``conflict_other_body``).

* ``resend_refused``: the same late call, and the same-key resend refused
  with a 429, a callback naming no resource (refused, kept as evidence)
  delivered while the resend's claim is held. The refusal proves only that
  the resend did nothing: the call still on the network may act (here it
  does). The operation stays in doubt,
  never ``prepared`` again (effect.never_prepared_again_once_in_doubt: a
  prepared operation's next dispatch is judged by no key retention); once
  the call arrived, a ``reconcile`` finds its resource and a worker finishes
  the run without another create.

* ``resend_refused_deterministic_id``: the same with a tool that makes each
  resource under a deterministic id: its resend is a same-key resend too, and
  a 429 to it leaves the operation in doubt just the same.

Judged from the tool's own log (requests, resources and their body digests)
and the database (ledger, run), never from the worker's account.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import (
    ExperimentContext,
    ExperimentSpec,
    Inconclusive,
    LoggedOp,
    SetupRefused,
)
from harness.parts.control import Continue, Crash, Hold
from harness.parts.processes import OpReply, WorkerProcess
from mock_tool.client import ToolClient
from scenarios.common import (
    cancel_ends_a_paused_run,
    control_plane,
    crash_in_op,
    finding_without_a_resource_refused,
    finish,
    finish_or_take_over,
    new_run,
    op_and_changes,
    renewals_refused_since,
    resumed_once_converged,
    seen_within,
    wait_claimable,
    writes_name_workflow_steps,
)

# The worker's tool-call timeout (FENCECHECK_TOOL_TIMEOUT_MS) and how late the
# tool answers in variant late_answer: well past it, so that the worker has
# given up on the call before the answer leaves.
TOOL_TIMEOUT_MS = 300
LATE_MS = 900
# found_after_freeze and its kin: the run's create is held on the network
# (mock tool `arrive_held`) until the harness has seen the state it waits for
# (the run frozen, the worker held after its query) and lets it arrive, on a
# busy machine too; this is only the bound if the harness never does.
HELD_MAX_MS = 30_000
FOUND_AFTER_FREEZE = "found_after_freeze"
CRASH_MID_CONVERGE = "crash_mid_converge"
CONVERGED_BEFORE_FREEZE = "converged_before_freeze"
FAILED_BEFORE_FREEZE = "failed_before_freeze"
OTHERS_IN_DOUBT = "others_in_doubt"
RESEND_UNANSWERED = "resend_unanswered"
RESEND_REFUSED = "resend_refused"
RESEND_REFUSED_DETID = "resend_refused_deterministic_id"
RESEND_MEETS_OWN = "resend_meets_own_resource"
# resend_meets_own_resource: the worker's tool timeout. The first create is held
# on the network whatever it is; the resend must be answered within it on a
# busy machine too (a resend that timed out freezes the run, correctly).
RESEND_OWN_TIMEOUT_MS = 1000
LOST_NOT_EXECUTED = "lost_not_executed"
BESIDE_LIVE_CLAIM = "converged_beside_live_claim"
REJECTED_BESIDE_LIVE_CLAIM = "rejected_beside_live_claim"
ANSWERED_BESIDE_LIVE_CLAIM = "answered_beside_live_claim"
LIVE_CLAIM_VARIANTS = (BESIDE_LIVE_CLAIM, REJECTED_BESIDE_LIVE_CLAIM, ANSWERED_BESIDE_LIVE_CLAIM)
#: A person's finding on an operation still dispatching under a claim that ran
#: out, its dispatcher dead and no reconciler's sweep since.
FINDING_ON_EXPIRED_CLAIM = "finding_on_expired_claim"
# finding_on_expired_claim: the dead dispatcher's claim outlives the run's own
# worker (its call timeout and freeze), so nothing of the run sweeps it first.
EXPIRING_CLAIM_TTL_MS = 2000
LEASE_LOST_MID_RECONCILE = "lease_lost_mid_reconcile"
#: The worker's query finds the resource (the tool acted, its answer came
#: after the worker's timeout); while the worker is held after that query,
#: another reconciler converges the operation first.
FOUND_CONVERGED_BY_ANOTHER = "found_converged_by_another"
# lease_lost_mid_reconcile: how long the harness waits for the worker's own
# record of its refused renewal before it lets the worker's reconcile go on
# (the record orders the two; without it the variant's check is not judged).
REFUSED_S = 3.0
#: A run paused for a person (its step refused for good) while another of its
#: operations is in doubt, which a person then converges.
CONVERGED_WHILE_HUMAN = "converged_while_paused_for_a_person"
#: converged_beside_live_claim: the step of the operation a dispatcher holds
#: claimed, and how long its claim lives (past the whole experiment).
LIVE_STEP = "w.live"
#: answered_beside_live_claim: a second operation under a live claim, whose
#: dispatcher's answer comes first.
SECOND_LIVE_STEP = "w.live_2"
LIVE_CLAIM_TTL_MS = 60_000
# resend_unanswered: how late each create of the run reaches the tool (past
# the worker's timeout, its query and its resend), and for how many creates:
# more than a worker that loops would send before the bound on its exit.
RESEND_LATE_MS = 2000
LATE_CREATES = 100
#: others_in_doubt: the steps of the run's other operations (a plain tool).
OTHER_STEPS = ("w.other_1", "w.other_2", "w.other_3", "w.other_4")
#: others_in_doubt: an intent of yet another step, registered first and never
#: sent: the workflow adopts its tool step's result beside it.
PLANNED_STEP = "w.planned"


@dataclass(frozen=True)
class Answer:
    """One variant: the tool, the fault that gives the answer, what the tool's
    log says it did, and what must come of it."""

    tool: str
    mode: str
    logged: str  # the request's outcome in the tool's log
    ledger: tuple[str, ...]  # acceptable final ledger statuses of the operation
    run: tuple[str, ...]  # acceptable final run statuses
    ms: int | None = None


ANSWERS = {
    "conflict_other_body": Answer(
        "detid",
        "conflict_other_body",
        "conflict_other_body",
        ("unknown", "failed_final"),
        ("paused_indoubt", "paused_human"),
    ),
    "error_after_act": Answer(
        "plain", "error_5xx_after_act", "created_then_5xx", ("unknown",), ("paused_indoubt",)
    ),
    "unavailable_after_act": Answer(
        "plain",
        "unavailable_after_act",
        "created_then_503",
        ("unknown",),
        ("paused_indoubt",),
    ),
    "accepted_without_result": Answer(
        "queryable",
        "accept_without_result",
        "created_then_accepted",
        ("succeeded",),
        ("succeeded",),
    ),
    "late_answer": Answer(
        "queryable", "answer_late", "created_then_late", ("succeeded",), ("succeeded",), LATE_MS
    ),
}

#: The capability level of each of the mock tool's tools (docs/mock-tool.md).
CAPABILITY = {"detid": "deterministic_id", "queryable": "query", "plain": "none"}

SPEC = ExperimentSpec(
    id="W",
    title="tool answers",
    seed_section="English seed §8, §9.2, §9.3 (capabilities, unknown); Chinese seed §8.3",
    invariant="a conflict with another body is no success; a 5xx or a late answer is unknown, "
    "never a failure or a refusal; a 202 is no result; the ledger records only the tool's "
    "resource of our request, learnt by query; nothing is resent without a promise; a "
    "reconciler that learns the fact of a run paused in doubt converges it and resumes the "
    "run in one transaction, whatever another run has in doubt, and leaves it paused while "
    "something else of it is in doubt (whoever converges what); a freeze never commits over "
    "an operation that converged since the worker read it",
    fault="the tool's one answer to the tool step, by schedule: 409 from another body, 500 "
    "after acting, 202 without a result, or an answer after the worker's timeout; or the "
    "request reaching the tool only after the run was paused in doubt, beside another run "
    "in doubt, or while the worker is held after its empty query as another reconciler "
    "converges the operation, or beside three more operations of the run in doubt",
    rules=(4, 5),
    variants=(
        *ANSWERS,
        FOUND_AFTER_FREEZE,
        CRASH_MID_CONVERGE,
        CONVERGED_BEFORE_FREEZE,
        FAILED_BEFORE_FREEZE,
        OTHERS_IN_DOUBT,
        RESEND_UNANSWERED,
        RESEND_REFUSED,
        RESEND_REFUSED_DETID,
        RESEND_MEETS_OWN,
        LOST_NOT_EXECUTED,
        BESIDE_LIVE_CLAIM,
        REJECTED_BESIDE_LIVE_CLAIM,
        ANSWERED_BESIDE_LIVE_CLAIM,
        FINDING_ON_EXPIRED_CLAIM,
        CONVERGED_WHILE_HUMAN,
        LEASE_LOST_MID_RECONCILE,
        FOUND_CONVERGED_BY_ANOTHER,
    ),
    variant_faults=(
        (
            FOUND_CONVERGED_BY_ANOTHER,
            "the query tool acts at once and answers after the worker's timeout; the worker "
            "held after its query (which found the resource) while another reconciler's cycle "
            "converges the operation",
        ),
        (
            LEASE_LOST_MID_RECONCILE,
            "the run's create held on the network past the worker's timeout; the worker held "
            "after its empty query with its heartbeat parked until its lease ran out, then its "
            "renewal let go (refused)",
        ),
        (
            RESEND_REFUSED,
            "the run's first create reaches the tool late (past the worker's timeout and its "
            "query), its same-key resend is refused with 429 before that; a callback naming no "
            "resource is delivered while the resend's claim is held",
        ),
        (
            RESEND_REFUSED_DETID,
            "the same with a deterministic-id tool: the run's first create arrives late, its "
            "same-id resend is refused with 429 before that, a callback naming no resource "
            "delivered while the resend's claim is held",
        ),
        (
            RESEND_MEETS_OWN,
            "the run's create (a deterministic-id tool) held on the network past the worker's "
            "timeout and let arrive while the worker is held after its empty query, so its "
            "same-id resend meets a 409 naming its own request",
        ),
        (
            FAILED_BEFORE_FREEZE,
            "the run's create held on the network, then lost there while the worker is held "
            "after its empty query; a person converges the operation to failed_final meanwhile",
        ),
        (
            LOST_NOT_EXECUTED,
            "the run's create (a tool with neither query nor key) held on the network past "
            "the worker's timeout, then lost there once the run is paused in doubt; a person "
            "finds it not executed",
        ),
        (
            BESIDE_LIVE_CLAIM,
            "a dispatcher held right after claiming another operation of the run (its claim "
            "live past the experiment) while the run's own create arrives only after the run "
            "was paused in doubt",
        ),
        (
            REJECTED_BESIDE_LIVE_CLAIM,
            "the same, and the held dispatcher's create then refused with 429 (the tool did "
            "not act)",
        ),
        (
            ANSWERED_BESIDE_LIVE_CLAIM,
            "the same with two operations of the run under live claims, two dispatchers "
            "held; the second's answer comes back while the first's claim is still live",
        ),
        (
            FINDING_ON_EXPIRED_CLAIM,
            "a dispatcher SIGKILLed right after claiming another operation of the run; the "
            "run paused in doubt, and that claim's deadline passed with no sweep since",
        ),
        (
            CONVERGED_WHILE_HUMAN,
            "another operation's answer lost after the tool acted (unknown), then the run's "
            "own create refused for good (422: paused for a person); a person converges the "
            "other operation",
        ),
    ),
    needs=(
        *needs.capabilities("workflow", "ledger"),
        *(needs.capability(f"ledger_tool:{CAPABILITY[a.tool]}", v) for v, a in ANSWERS.items()),
        needs.capability("ledger_tool:query", FOUND_AFTER_FREEZE, CRASH_MID_CONVERGE),
        needs.capability("ledger_tool:none", FOUND_AFTER_FREEZE, CRASH_MID_CONVERGE),
        needs.point("after_reconcile_converge", CRASH_MID_CONVERGE),
        needs.capability("ledger_tool:query", CONVERGED_BEFORE_FREEZE, FAILED_BEFORE_FREEZE),
        needs.point("after_reconcile_query", CONVERGED_BEFORE_FREEZE, FAILED_BEFORE_FREEZE),
        needs.capability("operator_actions", FAILED_BEFORE_FREEZE),
        needs.op("converge_operation", FAILED_BEFORE_FREEZE),
        needs.op("reconcile", FOUND_AFTER_FREEZE, CRASH_MID_CONVERGE, CONVERGED_BEFORE_FREEZE),
        needs.capability("ledger_tool:query", OTHERS_IN_DOUBT),
        needs.capability("ledger_tool:none", OTHERS_IN_DOUBT),
        needs.capability("operator_actions", OTHERS_IN_DOUBT),
        needs.point("after_checkpoint_commit", OTHERS_IN_DOUBT),
        needs.op("reconcile", OTHERS_IN_DOUBT),
        needs.op("resolve_indoubt", OTHERS_IN_DOUBT),
        needs.op("converge_operation", OTHERS_IN_DOUBT),
        needs.capability("ledger_tool:idempotent", RESEND_UNANSWERED, RESEND_REFUSED),
        needs.op("reconcile", RESEND_REFUSED),
        needs.point("after_dispatch_claim_commit", RESEND_REFUSED),
        needs.capability("ledger_tool:deterministic_id", RESEND_REFUSED_DETID),
        needs.op("reconcile", RESEND_REFUSED_DETID),
        needs.point("after_dispatch_claim_commit", RESEND_REFUSED_DETID),
        needs.capability("ledger_tool:deterministic_id", RESEND_MEETS_OWN),
        needs.point("after_reconcile_query", RESEND_MEETS_OWN),
        needs.capability("ledger_tool:none", LOST_NOT_EXECUTED),
        needs.capability("operator_actions", LOST_NOT_EXECUTED),
        needs.op("resolve_indoubt", LOST_NOT_EXECUTED),
        needs.capability("ledger_tool:query", *LIVE_CLAIM_VARIANTS),
        needs.capability("ledger_tool:none", *LIVE_CLAIM_VARIANTS),
        needs.point("after_checkpoint_commit", *LIVE_CLAIM_VARIANTS),
        needs.point("after_dispatch_claim_commit", *LIVE_CLAIM_VARIANTS),
        needs.op("reconcile", *LIVE_CLAIM_VARIANTS),
        needs.capability("ledger_tool:query", FINDING_ON_EXPIRED_CLAIM),
        needs.capability("ledger_tool:none", FINDING_ON_EXPIRED_CLAIM),
        needs.capability("operator_actions", FINDING_ON_EXPIRED_CLAIM),
        needs.point("after_checkpoint_commit", FINDING_ON_EXPIRED_CLAIM),
        needs.point("after_dispatch_claim_commit", FINDING_ON_EXPIRED_CLAIM),
        needs.op("reconcile", FINDING_ON_EXPIRED_CLAIM),
        needs.op("resolve_indoubt", FINDING_ON_EXPIRED_CLAIM),
        needs.capability("ledger_tool:none", CONVERGED_WHILE_HUMAN),
        needs.capability("operator_actions", CONVERGED_WHILE_HUMAN),
        needs.point("after_checkpoint_commit", CONVERGED_WHILE_HUMAN),
        needs.op("converge_operation", CONVERGED_WHILE_HUMAN),
        needs.capability("ledger_tool:idempotent", LEASE_LOST_MID_RECONCILE),
        needs.point("after_reconcile_query", LEASE_LOST_MID_RECONCILE),
        needs.point("before_renew", LEASE_LOST_MID_RECONCILE),
        needs.capability("ledger_tool:query", FOUND_CONVERGED_BY_ANOTHER),
        needs.point("after_reconcile_query", FOUND_CONVERGED_BY_ANOTHER),
        needs.op("reconcile", FOUND_CONVERGED_BY_ANOTHER),
    ),
    variant_waits=(
        ("late_answer", LATE_MS / 1000),
        (FOUND_AFTER_FREEZE, TOOL_TIMEOUT_MS / 1000),
        (CRASH_MID_CONVERGE, TOOL_TIMEOUT_MS / 1000),
        (CONVERGED_BEFORE_FREEZE, TOOL_TIMEOUT_MS / 1000),
        (FAILED_BEFORE_FREEZE, TOOL_TIMEOUT_MS / 1000),
        (OTHERS_IN_DOUBT, (len(OTHER_STEPS) + 1) * TOOL_TIMEOUT_MS / 1000),
        (RESEND_UNANSWERED, RESEND_LATE_MS / 1000),
        (RESEND_REFUSED, RESEND_LATE_MS / 1000),
        (RESEND_REFUSED_DETID, RESEND_LATE_MS / 1000),
        (RESEND_MEETS_OWN, RESEND_OWN_TIMEOUT_MS / 1000),
        (LOST_NOT_EXECUTED, TOOL_TIMEOUT_MS / 1000),
        (BESIDE_LIVE_CLAIM, TOOL_TIMEOUT_MS / 1000),
        (REJECTED_BESIDE_LIVE_CLAIM, TOOL_TIMEOUT_MS / 1000),
        (ANSWERED_BESIDE_LIVE_CLAIM, TOOL_TIMEOUT_MS / 1000),
        (FINDING_ON_EXPIRED_CLAIM, EXPIRING_CLAIM_TTL_MS / 1000),
        (CONVERGED_WHILE_HUMAN, TOOL_TIMEOUT_MS / 1000),
        (LEASE_LOST_MID_RECONCILE, TOOL_TIMEOUT_MS / 1000),
        (FOUND_CONVERGED_BY_ANOTHER, TOOL_TIMEOUT_MS / 1000),
    ),
)


def run(ctx: ExperimentContext) -> None:
    if ctx.variant in (FOUND_AFTER_FREEZE, CRASH_MID_CONVERGE):
        _found_after_freeze(ctx, crash_mid_converge=ctx.variant == CRASH_MID_CONVERGE)
        return
    if ctx.variant in (CONVERGED_BEFORE_FREEZE, FAILED_BEFORE_FREEZE):
        _converged_before_freeze(ctx, failed=ctx.variant == FAILED_BEFORE_FREEZE)
        return
    if ctx.variant == OTHERS_IN_DOUBT:
        _others_in_doubt(ctx)
        return
    if ctx.variant == RESEND_UNANSWERED:
        _resend_unanswered(ctx)
        return
    if ctx.variant in (RESEND_REFUSED, RESEND_REFUSED_DETID):
        # Blind hunt 69 #05: a resend flagged as one for idempotent tools only.
        _resend_refused(ctx, "detid" if ctx.variant == RESEND_REFUSED_DETID else "idem")
        return
    if ctx.variant == RESEND_MEETS_OWN:
        _resend_meets_own_resource(ctx)
        return
    if ctx.variant == LOST_NOT_EXECUTED:
        _lost_then_found_not_executed(ctx)
        return
    if ctx.variant == CONVERGED_WHILE_HUMAN:
        _converged_while_paused_for_a_person(ctx)
        return
    if ctx.variant == LEASE_LOST_MID_RECONCILE:
        _lease_lost_mid_reconcile(ctx)
        return
    if ctx.variant == FOUND_CONVERGED_BY_ANOTHER:
        _found_converged_by_another(ctx)
        return
    if ctx.variant in LIVE_CLAIM_VARIANTS:
        _converged_beside_a_live_claim(
            ctx,
            rejected=ctx.variant == REJECTED_BESIDE_LIVE_CLAIM,
            second=ctx.variant == ANSWERED_BESIDE_LIVE_CLAIM,
        )
        return
    if ctx.variant == FINDING_ON_EXPIRED_CLAIM:
        _finding_on_an_expired_claim(ctx)
        return
    answer = ANSWERS[ctx.variant or "conflict_other_body"]
    run_id = new_run(ctx, tool=answer.tool)
    ctx.env.tool.client().set_fault(answer.tool, answer.mode, ms=answer.ms)
    ctx.command(f"tool: the next create of {answer.tool!r} answers by fault {answer.mode}")
    a = ctx.env.start_worker(
        "A",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)},
    )
    code = finish(ctx, a)
    if answer.ms is not None:
        # The worker may be done before the late answer leaves: the tool logs
        # when it sent it, and that is the proof the answer came late.
        seen_within(
            lambda: all(r.get("answered_at") for r in checkers.tool_requests(ctx, run_id=run_id)),
            what="the tool to send its late answer",
            timeout_s=answer.ms / 1000 + 5,
        )
    requests = checkers.tool_requests(ctx, run_id=run_id)
    first = requests[0] if requests else {}
    op_id = first.get("operation_id")
    resources = [r for r in checkers.tool_resources(ctx) if r["operation_id"] == op_id]
    late = (first.get("answered_at") or 0) - float(first.get("received_at") or 0)
    took = ctx.fault(
        f"the tool answered {answer.mode}",
        first.get("outcome") == answer.logged
        and first.get("fault_mode") == answer.mode
        and len(resources) == 1
        and (answer.ms is None or late * 1000 >= max(answer.ms, TOOL_TIMEOUT_MS)),
        expected=f"the run's first create logged {answer.logged!r} by fault {answer.mode}, one "
        "resource at the tool"
        + (f", answered {answer.ms} ms after it arrived" if answer.ms else ""),
        observed=f"first create {first.get('outcome')!r} by {first.get('fault_mode')!r}; "
        f"{len(resources)} resource(s); answered after {late * 1000:.0f} ms (A exit {code})",
    )
    if not took:
        # What the ledger and the run must show follows from the answer; the
        # scheduled one was not given, so none of it is judged (the verdict is
        # unknown). What holds whatever the answer is still judged below.
        ctx.not_judged(
            "the ledger, the run and the tool's log against the scheduled answer",
            expected=f"judged once the tool answered {answer.mode}",
            observed="the tool did not give the scheduled answer (see the fault check)",
        )
    else:
        _judge_the_answer(ctx, answer, run_id, str(op_id), requests, resources, code)
    checkers.recorded_results_are_the_tools(ctx, run_id)
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _judge_the_answer(
    ctx: ExperimentContext,
    answer: Answer,
    run_id: str,
    op_id: str,
    requests: list[dict[str, Any]],
    resources: list[dict[str, Any]],
    code: int,
) -> None:
    ledger = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    op = ledger.get(str(op_id), {})
    row = checkers.run_row(ctx, run_id)
    # Safety: the ledger never claims more than the answer proves, and the run
    # never ends anywhere else. Progress: A got there (a worker whose own timer
    # fired first leaves the operation unjudged and the run to a successor).
    unjudged = ("dispatching", "unknown")
    ctx.invariant(
        "the ledger claims nothing the answer does not prove",
        op.get("status") in (*answer.ledger, *unjudged),
        expected=f"ledger status of {op_id} in {list(answer.ledger)}, or not judged yet "
        f"{list(unjudged)}",
        observed=f"{op.get('status')!r} (remote_id {op.get('remote_id')!r})",
    )
    ctx.progress(
        "the ledger holds what the answer proves",
        op.get("status") in answer.ledger,
        expected=f"ledger status of {op_id} in {list(answer.ledger)}",
        observed=f"{op.get('status')!r} (remote_id {op.get('remote_id')!r})",
    )
    ctx.invariant(
        "the run ends nowhere else",
        row["status"] in (*answer.run, "running", "waiting_tool", "queued"),
        expected=f"run status in {list(answer.run)}, or still live for a successor",
        observed=f"{row['status']!r} (A exit {code})",
    )
    ctx.progress(
        "the run ends where the answer leads",
        row["status"] in answer.run,
        expected=f"run status in {list(answer.run)}",
        observed=f"{row['status']!r} (A exit {code})",
    )
    ctx.equal(
        "nothing resent",
        [r["outcome"] for r in requests],
        [answer.logged],
        what="the run's create requests in the tool's log",
    )
    if "succeeded" in answer.ledger:
        ctx.equal(
            "converged to the tool's resource",
            op.get("remote_id"),
            resources[0]["resource_id"] if resources else None,
            what=f"remote_id of {op_id}",
        )


def _found_after_freeze(ctx: ExperimentContext, crash_mid_converge: bool = False) -> None:
    """The reconciler learns the remote fact of a run already paused in doubt:
    the operation converges and the run resumes in one transaction, whatever
    another run of the tenant has in doubt (and whatever a reconciler killed
    between the two halves left)."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    # One attempt, which the pause interrupts: the reconciler's resume gives
    # it back, or the worker could never claim the run again.
    run_id = new_run(ctx, tool="queryable", max_attempts=1)
    bystander = new_run(ctx, tool="plain")
    tool = ctx.env.tool.client()
    tool.set_fault("queryable", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    tool.set_fault("plain", "drop_after_act", run_id=bystander)
    ctx.command(
        f"tool: run {run_id}'s create is held on the network until the harness lets it "
        f"arrive; the bystander {bystander}'s create of the plain tool loses its answer"
    )
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    z = ctx.env.start_worker("Z", "run", ["--run-id", bystander, "--once"], env=env)
    # The bystander's worker may cancel itself on a busy machine (a renewal
    # timed out): a successor finds the same lost answer and freezes it too.
    code_a, code_z = finish(ctx, a), finish_or_take_over(ctx, z, bystander)
    _let_arrive(ctx, tool, run_id)
    log = checkers.tool_log(ctx)
    seen = [r for r in log["requests"] if r.get("run_id") == run_id]
    op_id = str(seen[0]["operation_id"]) if seen else ""
    queried = [q for q in log["queries"] if q.get("operation_id") == op_id]
    row = checkers.run_row(ctx, run_id, "the run before the reconciler's cycle")
    by_row = checkers.run_row(ctx, bystander, "the bystander before the reconciler's cycle")
    by_ops = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, bystander)]
    # The state is a run paused in doubt before the tool acted: the freeze's
    # audited time (database clock) before the tool's receipt (same kernel
    # clock). Whether the worker queried first is its own business.
    frozen_at = next(
        (
            r["at"].timestamp()
            for r in checkers.audit(ctx, run_id)
            if r["status"] == "paused_indoubt" and r["old_status"] != "paused_indoubt"
        ),
        None,
    )
    took = ctx.fault(
        "the run was paused in doubt before the tool saw its request, beside a bystander in doubt",
        row["status"] == "paused_indoubt"
        and len(seen) == 1
        and frozen_at is not None
        and frozen_at < float(seen[0]["received_at"])
        and by_row["status"] == "paused_indoubt"
        and [s for _, s in by_ops] == ["unknown"],
        expected="run paused_indoubt, frozen before the tool saw its one request; the bystander "
        "paused_indoubt with one unknown operation",
        observed=f"run {row['status']} (A exit {code_a}), frozen at {frozen_at}; requests "
        f"{[(r['outcome'], round(r['received_at'], 3)) for r in seen]}; queries "
        f"{[(q['outcome'], round(q['received_at'], 3)) for q in queried]}; bystander "
        f"{by_row['status']} with {by_ops} (Z exit {code_z})",
    )
    if not took:
        ctx.not_judged(
            "the reconciler's convergence of a run paused in doubt",
            expected="judged once the run was paused in doubt before the tool acted",
            observed="the state was not reached (see the fault check)",
        )
        checkers.lease_history_is_sound(ctx, [run_id, bystander])
        return
    resources = checkers.tool_resources(ctx, run_id=run_id)
    remote = resources[0]["resource_id"] if len(resources) == 1 else None
    if crash_mid_converge:
        _reconciler_killed_mid_converge(ctx, run_id, remote)
    ctl = control_plane(ctx)
    if ctx.system.capabilities.offers_op("resolve_indoubt") and by_ops:
        _finding_on_another_runs_operation(ctx, ctl, run_id, str(by_ops[0][0]))
    # The contract's paused_indoubt -> queued when the reconciler learnt the
    # remote fact; another run's doubt is no reason to stay.
    reply = ctx.op(ctl, "reconcile")
    resumed_once_converged(ctx, run_id, reply, remote, "the reconciler's cycle")
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"], env=env)
    code_b = finish(ctx, b)
    ctx.equal(
        "nothing resent",
        [r["outcome"] for r in checkers.tool_requests(ctx, run_id=run_id)],
        ["created"],
        what="the run's create requests in the tool's log",
    )
    ctx.progress_equal(
        "the run finished from the reconciled fact",
        checkers.run_row(ctx, run_id, "the run at the end")["status"],
        "succeeded",
        what=f"run status (B exit {code_b})",
    )
    by_after = checkers.run_row(ctx, bystander, "the bystander at the end")
    by_ops_after = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, bystander)]
    ctx.invariant(
        "the bystander's doubt untouched",
        by_after["status"] == "paused_indoubt" and by_ops_after == by_ops,
        expected=f"bystander paused_indoubt, its ledger {by_ops}",
        observed=f"bystander {by_after['status']}, its ledger {by_ops_after}",
    )
    _withdrawn_while_in_doubt(ctx, ctl, bystander, by_ops)
    checkers.recorded_results_are_the_tools(ctx, run_id)
    writes_name_workflow_steps(ctx, [run_id, bystander])
    checkers.lease_history_is_sound(ctx, [run_id, bystander])


def _withdrawn_while_in_doubt(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, ops: list[tuple[Any, Any]]
) -> None:
    """The bystander, still paused in doubt, is cancelled (its task withdrawn);
    a person then establishes that its lost create did act. The cancel must
    be taken, and that late success asks for compensation (the global
    effect.compensation_required_exactly_for_a_cancelled_runs_success judges
    the event): nobody wants the effect any more."""
    if not cancel_ends_a_paused_run(ctx, ctl, run_id) or len(ops) != 1:
        return
    if not ctx.system.capabilities.offers_op("converge_operation"):
        return
    reply, remote, after, status = _found_by_a_person(ctx, ctl, run_id, str(ops[0][0]), "OPS-77")
    ctx.invariant(
        "a cancelled run's operation in doubt still converges",
        reply.ok and after == [("succeeded", remote)] and status == "cancelled",
        expected=f"converge_operation to succeeded ({remote}) accepted; the run stays cancelled",
        observed=f"reply {'ok' if reply.ok else f'{reply.error}: {reply.message}'}; ledger "
        f"{after}; run {status}",
    )


def _let_arrive(
    ctx: ExperimentContext, tool: ToolClient, run_id: str, name: str = "queryable"
) -> list[dict[str, Any]] | None:
    """Let the run's create held on the network reach the tool ``name``, now
    that the state it had to come after is there; the run's requests of that
    tool once it has."""
    released = tool.release()
    ctx.command(f"tool: let run {run_id}'s held create arrive ({released} held)")
    found: list[dict[str, Any]] | None = seen_within(
        lambda: (
            [r for r in checkers.tool_requests(ctx, run_id=run_id) if r["tool"] == name] or None
        ),
        what=f"the {name} tool to see run {run_id}'s held request",
        timeout_s=5,
    )
    return found


def _resend_unanswered(ctx: ExperimentContext) -> None:
    """A same-key resend that goes unanswered like the first call: the run
    pauses in doubt after it (contract section 10), never resends again."""
    run_id = new_run(ctx, tool="idem")
    # Every create of the run stays on the network past the worker's timeout
    # (a query meanwhile finds nothing, not even a create in progress), so
    # the tool's promise allows a same-key resend, which is lost alike.
    ctx.env.tool.client().set_fault(
        "idem", "arrive_late", count=LATE_CREATES, ms=RESEND_LATE_MS, run_id=run_id
    )
    ctx.command(f"tool: every create of run {run_id} reaches the tool {RESEND_LATE_MS} ms late")
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    code = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env))
    # An observation window, not a wait for something: every create A sent
    # reaches the tool within RESEND_LATE_MS of its exit. Another case fills it.
    window_ends = time.time() + RESEND_LATE_MS / 1000 + 0.2
    ctx.command(f"observe the tool's log for {RESEND_LATE_MS} ms after A's exit")
    _terminated_beside_prepared(ctx, env)
    time.sleep(max(0.0, window_ends - time.time()))
    log = checkers.tool_log(ctx)
    creates = [r for r in log["requests"] if r.get("run_id") == run_id]
    op_id = creates[0].get("operation_id") if creates else None
    queried = [q for q in log["queries"] if q.get("operation_id") == op_id]
    ctx.fault(
        "a same-key resend went out after a query that found nothing, and was lost too",
        len(creates) >= 2
        and all(r.get("fault_mode") == "arrive_late" for r in creates)
        and bool(queried)
        and queried[0].get("outcome") == "not_found"
        and float(queried[0]["received_at"]) < float(creates[0]["received_at"]),
        expected="a query answered not found before any create reached the tool; the call "
        "and its resend both arrived late",
        observed=f"creates {[r.get('fault_mode') for r in creates]}; queries "
        f"{[q.get('outcome') for q in queried]} (A exit {code})",
    )
    ctx.invariant(
        "an unanswered resend is the last one",
        len(creates) <= 2,
        expected="two creates of the operation at the tool: the call and one same-key "
        "resend; then the run pauses in doubt",
        observed=f"{len(creates)} creates of {op_id} reached the tool",
    )
    ops = [o["status"] for o in checkers.ledger(ctx, run_id)]
    status = checkers.run_row(ctx, run_id, "the run at the end")["status"]
    ctx.progress_equal(
        "the run paused in doubt", (status, ops), ("paused_indoubt", ["unknown"]),
        what=f"run status and ledger (A exit {code})",
    )  # fmt: skip
    if (status, ops) == ("paused_indoubt", ["unknown"]) and op_id is not None:
        _terminated_then_found(ctx, run_id, str(op_id))
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _resend_refused(ctx: ExperimentContext, tool_name: str) -> None:
    """A same-key resend refused with 429 while the call it repeats is still
    on the network: the operation stays in doubt; the call then acts, and
    the reconciler's query finds what it made."""
    run_id = new_run(ctx, tool=tool_name)
    tool = ctx.env.tool.client()
    # Oldest fault first: the call arrives late, the next create (the resend) gets 429.
    tool.set_fault(tool_name, "arrive_late", count=1, ms=RESEND_LATE_MS, run_id=run_id)
    tool.set_fault(tool_name, "reject_429", count=1, run_id=run_id)
    ctx.command(
        f"tool: run {run_id}'s first create reaches the tool {RESEND_LATE_MS} ms late, its "
        "next create is refused with 429"
    )
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    # A's second dispatch claim (the resend's) is held while a callback naming
    # no resource is delivered and kept as evidence on the operation's row
    # (blind hunt 49 #01: "was the refused claim a same-key resend?" judged
    # on the row's newest evidence alone put the operation back to prepared).
    ctx.arm("A", "after_dispatch_claim_commit", Continue())
    ctx.arm("A", "after_dispatch_claim_commit", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    _refused_callback_during_resend(ctx, run_id)
    code = finish(ctx, a)
    in_doubt = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    # The late call reaches the tool RESEND_LATE_MS after it was sent; wait for
    # exactly that arrival (bounded well past it), not a fixed time.
    seen_within(
        lambda: (
            any(
                r.get("run_id") == run_id and r.get("fault_mode") == "arrive_late"
                for r in checkers.tool_log(ctx)["requests"]
            )
            or None
        ),
        what=f"run {run_id}'s late create to reach the tool",
        timeout_s=RESEND_LATE_MS / 1000 + 5,
    )
    creates = [r for r in checkers.tool_log(ctx)["requests"] if r.get("run_id") == run_id]
    late = [r for r in creates if r.get("fault_mode") == "arrive_late"]
    refused = [r for r in creates if r.get("outcome") == "rejected_429"]
    ctx.fault(
        "the same-key resend was refused with 429 before the call it repeats arrived",
        bool(late and refused)
        and float(refused[0]["received_at"]) < float(late[0]["received_at"])
        and refused[0].get("operation_id") == late[0].get("operation_id"),
        expected="a 429 for the operation's second create, then its first create arriving late",
        observed=f"creates {[(r.get('fault_mode'), r.get('outcome')) for r in creates]} "
        f"(A exit {code})",
    )
    ctx.invariant(
        "a resend refused with 429 leaves its operation in doubt",
        all(status != "prepared" for _op, status in in_doubt),
        expected="the operation unknown when A exits (the call it repeated may still act)",
        observed=f"ledger when A exited {in_doubt}",
    )
    ctx.ok(control_plane(ctx), "reconcile")
    b = finish(ctx, ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"], env=env))
    creates = [r for r in checkers.tool_log(ctx)["requests"] if r.get("run_id") == run_id]
    ctx.invariant(
        "nothing sent after the call was found",
        len(creates) == len(late) + len(refused),
        expected="the call and its refused resend, no third create",
        observed=f"{len(creates)} creates of the run at the tool",
    )
    ctx.progress_equal(
        "the run finished from the call's resource",
        checkers.run_row(ctx, run_id, "the run at the end")["status"],
        "succeeded",
        what=f"run status (A exit {code}, B exit {b})",
    )
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _refused_callback_during_resend(ctx: ExperimentContext, run_id: str) -> None:
    """Deliver a callback naming no resource while A's resend claim is held
    at ``after_dispatch_claim_commit``; it must converge nothing. Not reached
    (no second claim, or no ``deliver_callback``): W's own checks stand."""
    judged = "a callback naming no resource during a resend converged nothing"
    try:
        hit = ctx.reached("A", "after_dispatch_claim_commit", RESEND_LATE_MS / 1000 + 5, held=True)
    except Inconclusive as exc:
        ctx.not_judged(judged, expected="A's resend claim held", observed=f"not reached: {exc}")
        return
    op_id = str(hit.operation_id)
    try:
        reply: OpReply | None = ctx.op(
            control_plane(ctx), "deliver_callback", run_id=run_id, operation_id=op_id,
            payload={"status": "processing"},
        )  # fmt: skip
    except Inconclusive:
        reply = None  # the control plane takes no callbacks
    finally:
        after = checkers.ledger(ctx, run_id)
        ctx.release("A", "after_dispatch_claim_commit")
    if not ctx.probe_reached(
        "a callback was delivered while A's resend claim was held",
        reply is not None and (reply.ok or reply.error is not None),
        judges=judged,
        expected="the control plane answered the delivery (accepted or refused)",
        observed=f"reply {reply and (reply.result if reply.ok else reply.error)}",
    ):
        return
    assert reply is not None
    ctx.invariant(
        judged,
        [(o["status"], o["remote_id"]) for o in after] == [("dispatching", None)],
        expected="the operation still dispatching under the resend's claim, no resource",
        observed=f"ledger after the callback {[(o['status'], o['remote_id']) for o in after]}; "
        f"reply {reply.result if reply.ok else reply.error}",
    )


def _held_after_an_empty_query(
    ctx: ExperimentContext, name: str, timeout_ms: int
) -> tuple[str, ToolClient, WorkerProcess]:
    """A run of tool ``name`` whose create is held on the network until the
    harness lets it arrive, and its ``run`` worker A (tool timeout
    ``timeout_ms``) held at ``after_reconcile_query``: its call timed out and
    its query found nothing. The run, the tool's client and A."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(timeout_ms)}
    run_id = new_run(ctx, tool=name)
    tool = ctx.env.tool.client()
    tool.set_fault(name, "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(
        f"tool: run {run_id}'s create is held on the network until the harness lets it arrive"
    )
    ctx.arm("A", "after_reconcile_query", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    ctx.reached("A", "after_reconcile_query")
    return run_id, tool, a


def _lease_lost_mid_reconcile(ctx: ExperimentContext) -> None:
    """The worker's lease runs out while it holds its empty query (its heartbeat
    parked meanwhile); once its renewal is refused, its execution is cancelled,
    and the same-key resend its tool's promise would otherwise allow is a new
    side effect after a lost lease: never claimed, never sent (blind hunt 53
    #06: a Go reconcile run on a context the cancellation never reached sent
    it). The run is left in doubt for whoever holds it next."""
    run_id, tool, a = _held_after_an_empty_query(ctx, "idem", TOOL_TIMEOUT_MS)
    ctx.arm("A", "before_renew", Hold())
    ctx.reached("A", "before_renew", held=True)
    wait_claimable(ctx, run_id)  # A's lease ran out by database time
    released_at = time.time()
    ctx.release("A", "before_renew")
    refused = renewals_refused_since(a, run_id, released_at, timeout_s=REFUSED_S)
    ctx.release("A", "after_reconcile_query")
    code = finish(ctx, a)
    released = tool.release()  # every create of the run held so far arrives now
    ctx.command(f"tool: let run {run_id}'s held creates arrive ({released} held)")
    seen_within(
        lambda: len(checkers.tool_requests(ctx, run_id=run_id)) >= released or None,
        what=f"the tool to see run {run_id}'s {released} held create(s)",
        timeout_s=5,
    )
    creates = checkers.tool_requests(ctx, run_id=run_id)
    name = "no resend once the lease was lost"
    if not ctx.probe_reached(
        "A's renewal was refused while it held its empty query, its lease run out",
        bool(refused),
        judges=name,
        expected="A's lease expired by database time while A held after_reconcile_query with "
        "its heartbeat parked; its renewal, let go, recorded refused before A went on",
        observed=f"renewals after the release: {[(e.type, e.error) for e in refused or []]}",
    ):
        return
    ctx.invariant(
        name,
        len(creates) == 1,
        expected="the tool receives the run's first create only: no same-key resend after "
        "the renewal was refused (the execution is cancelled: no new side effect)",
        observed=f"creates {[(r['outcome'], r.get('epoch')) for r in creates]}; A exit {code}",
    )


def _resend_meets_own_resource(ctx: ExperimentContext) -> None:
    """A same-id resend to a deterministic-id tool meets the resource its own
    first call made after the worker's query found nothing: the 409 names our
    request and its resource, which is our success (generated 8f2c6753: a 409
    naming our own request taken for a conflict froze the run in doubt)."""
    run_id, tool, a = _held_after_an_empty_query(ctx, "detid", RESEND_OWN_TIMEOUT_MS)
    arrived = _let_arrive(ctx, tool, run_id, "detid")
    released_at = time.time()
    ctx.release("A", "after_reconcile_query")
    code = finish(ctx, a)
    log = checkers.tool_log(ctx)
    creates = [r for r in log["requests"] if r.get("run_id") == run_id]
    op_id = str(creates[0]["operation_id"]) if creates else ""
    queried = [q for q in log["queries"] if q.get("operation_id") == op_id]
    ctx.fault(
        "the worker's query found nothing, then its call made the resource, then its resend met it",
        bool(arrived)
        and len(creates) == 2
        and [r["outcome"] for r in creates] == ["created", "conflict"]
        and all(r.get("operation_id") == op_id for r in creates)
        and bool(queried)
        and queried[0].get("outcome") == "not_found"
        and float(queried[0]["received_at"]) < float(creates[0]["received_at"]),
        expected="a query of the operation answered not found before its held create "
        "arrived and created; then a same-id resend answered 409 (conflict)",
        observed=f"queries {[q.get('outcome') for q in queried]}; creates "
        f"{[(r.get('outcome'), round(float(r['received_at']), 3)) for r in creates]} "
        f"(A exit {code})",
    )
    resources = checkers.tool_resources(ctx, run_id=run_id)
    ops = checkers.ledger(ctx, run_id)
    op = next((o for o in ops if str(o["operation_id"]) == op_id), None)
    remote = resources[0]["resource_id"] if len(resources) == 1 else None
    ctx.equal("one real resource", len(resources), 1, what="resources the tool made for the run")
    ctx.invariant(
        "ledger agrees with the remote fact",
        op is not None
        and (
            op["status"] == "unknown" or (op["status"] == "succeeded" and op["remote_id"] == remote)
        ),
        expected=f"the operation unknown, or succeeded with the tool's resource {remote}",
        observed=f"ledger {op and (op['status'], op['remote_id'])}",
    )
    row = checkers.run_row(ctx, run_id, "the run at the end")
    ctx.progress(
        "the 409 naming our own request was taken as our success",
        op is not None
        and op["status"] == "succeeded"
        and op["remote_id"] == remote
        and row["status"] == "succeeded",
        expected=f"the operation succeeded with {remote}; the run succeeded",
        observed=f"ledger {op and (op['status'], op['remote_id'])}; run {row['status']} "
        f"(A exit {code})",
        since=released_at,
    )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _terminated_beside_prepared(ctx: ExperimentContext, env: dict[str, str | None]) -> None:
    """A run paused in doubt (its create's answer lost at a tool with neither
    query nor key) holding a prepared intent of another step is terminated:
    that intent is cancelled in the same decision, the one in doubt stays
    (blind hunt 49 #08: the Go terminate cancelled prepared intents only of a
    run paused for a person)."""
    caps = ctx.system.capabilities
    if not (caps.offers_op("decide") and caps.offers("ledger_tool:none")):
        return
    judged = "a terminate of a run paused in doubt cancels its prepared operations"
    run_id = new_run(ctx, tool="plain")
    (planned,) = _registered_beside_first_checkpoint(ctx, run_id, env, (PLANNED_STEP,))
    ctx.env.tool.client().set_fault("plain", "drop_after_act", count=1, run_id=run_id)
    ctx.command(f"tool: run {run_id}'s create loses its answer after acting")
    code = finish(ctx, ctx.env.start_worker("A2", "run", ["--run-id", run_id, "--once"], env=env))
    before = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    status = checkers.run_row(ctx, run_id, "the run before its terminate")["status"]
    if not ctx.probe_reached(
        "a run paused in doubt beside a prepared intent of another step",
        status == "paused_indoubt" and before.get(planned) == "prepared",
        judges=judged,
        expected=f"run paused_indoubt, {planned} prepared",
        observed=f"run {status} (A2 exit {code}); ledger {before}",
    ):
        return
    reply = ctx.op(control_plane(ctx), "decide", run_id=run_id, decision="terminate",
                   reason="give up")  # fmt: skip
    after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    ended = checkers.run_row(ctx, run_id, "the run after its terminate")["status"]
    ctx.invariant(
        judged,
        reply.ok and ended == "failed" and after.get(planned) == "cancelled",
        expected=f"terminate taken, the run failed, {planned} cancelled",
        observed=f"reply {'ok' if reply.ok else f'{reply.error}: {reply.message}'}; run "
        f"{ended}; ledger {after}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _terminated_then_found(ctx: ExperimentContext, run_id: str, op_id: str) -> None:
    """A person gives the run paused in doubt up (``decide terminate``: failed);
    later another finds that its late create did act and converges the
    operation to that resource. The run stays failed, and no compensation
    is asked for: nobody cancelled it (the global
    effect.compensation_required_exactly_for_a_cancelled_runs_success)."""
    caps = ctx.system.capabilities
    if not (caps.offers_op("decide") and caps.offers_op("converge_operation")):
        return
    ctl = control_plane(ctx)
    ended = ctx.op(ctl, "decide", run_id=run_id, decision="terminate", reason="give up")
    found, remote, after, status = _found_by_a_person(ctx, ctl, run_id, op_id, "OPS-78")
    ctx.invariant(
        "a terminated run's operation in doubt converges, the run stays failed",
        ended.ok and found.ok and after == [("succeeded", remote)] and status == "failed",
        expected=f"decide terminate and converge_operation to succeeded ({remote}) accepted; "
        "the run failed",
        observed=f"terminate {'ok' if ended.ok else ended.error}; converge "
        f"{'ok' if found.ok else f'{found.error}: {found.message}'}; ledger {after}; run {status}",
    )


def _others_in_doubt(ctx: ExperimentContext) -> None:
    """Four operations of the run on other steps are in doubt when its own
    tool step freezes it: every convergence but the last leaves it paused. The
    last two are converged by two operators at once, the harness holding the
    run's row until each has waited on it or answered: a convergence that
    judged "nothing else in doubt" without the run's row read the other's
    operation still unknown, and neither queued the run (generated mutants
    d0a61808, b5a0091c)."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    run_id = new_run(ctx, tool="queryable")
    tool = ctx.env.tool.client()
    tool.set_fault("plain", "drop_after_act", count=len(OTHER_STEPS), run_id=run_id)
    planned, *others = _registered_beside_first_checkpoint(
        ctx, run_id, env, (PLANNED_STEP, *OTHER_STEPS), dispatched=OTHER_STEPS
    )
    tool.set_fault("queryable", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(
        f"tool: run {run_id}'s plain creates ({len(others)}, through ops) lose their answers; "
        "its tool step's create is held on the network until the harness lets it arrive"
    )
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    code_a = finish(ctx, a)
    _let_arrive(ctx, tool, run_id)
    ledger = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    own = [k for k in ledger if k not in (*others, planned)]
    row = checkers.run_row(ctx, run_id, "the run before the decisions")
    took = ctx.fault(
        "the run was paused in doubt with four operations in doubt",
        row["status"] == "paused_indoubt"
        and len(own) == 1
        and all(ledger.get(o, {}).get("status") == "unknown" for o in [*others, *own])
        and ledger.get(planned, {}).get("status") == "prepared",
        expected=f"run paused_indoubt; its tool step's operation and {others} unknown, "
        f"{planned} prepared",
        observed=f"run {row['status']} (A exit {code_a}); ledger "
        f"{[(k, o['status']) for k, o in ledger.items()]}",
    )
    if not took:
        ctx.not_judged(
            "convergences of a run with other operations in doubt",
            expected="judged once the run was paused in doubt with four operations in doubt",
            observed="the state was not reached (see the fault check)",
        )
        checkers.lease_history_is_sound(ctx, [run_id])
        return
    made = {str(r["operation_id"]): str(r["resource_id"]) for r in checkers.tool_resources(ctx)}
    ctl = control_plane(ctx)
    steps: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
        ("a person's finding on one", "resolve_indoubt", others[0],
         {"run_id": run_id, "decision": "executed", "reason": "found in the tool's console"}),
        ("a manual convergence of another", "converge_operation", others[1],
         {"outcome": "succeeded", "reason": "found in the tool's console", "ticket": "OPS-45"}),
        ("the reconciler's convergence of the tool step's", "reconcile", own[0], {}),
    )  # fmt: skip
    for what, op, op_id, args in steps:
        if op != "reconcile":
            args = {**args, "operation_id": op_id, "remote_id": made.get(op_id)}
        reply = ctx.op(ctl, op, **args)
        after = checkers.ledger(ctx, run_id)
        status = checkers.run_row(ctx, run_id, f"the run after {what}")["status"]
        doubt = [o["operation_id"] for o in after if o["status"] in ("unknown", "dispatching")]
        converged = next((o["status"] for o in after if o["operation_id"] == op_id), None)
        ctx.invariant(
            f"{what} leaves the run paused while another operation is in doubt",
            status == "paused_indoubt" or not doubt,
            expected="run paused_indoubt as long as an operation of it is unknown or dispatching",
            observed=f"run {status}; in doubt {doubt}",
        )
        ctx.progress_equal(
            f"{what} converged it", (reply.ok, converged), (True, "succeeded"),
            what=f"{op}'s reply ok and {op_id}'s status",
        )  # fmt: skip
    _last_two_converged_together(ctx, ctl, run_id, others[2:], made)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"], env=env)
    code_b = finish(ctx, b)
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.equal(
        "nothing resent",
        sorted(str(r["operation_id"]) for r in sent),
        sorted([*others, *own]),
        what="operations of the run's create requests in the tool's log",
    )
    ctx.progress_equal(
        "the run finished from the recorded facts",
        checkers.run_row(ctx, run_id, "the run at the end")["status"],
        "succeeded",
        what=f"run status (B exit {code_b})",
    )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _last_two_converged_together(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, last: list[str],
    made: dict[str, str],
) -> None:  # fmt: skip
    """Two operators converge the run's last two operations in doubt at once
    (one to failed_final: a person found it never took effect, which settles
    a doubt as much as a success does); the run must leave paused_indoubt."""
    ctl2 = ctx.env.start_worker("ctl2", "ops", role="operator")
    outcomes = (("failed_final", None, "OPS-46"), ("succeeded", made.get(last[1]), "OPS-47"))
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        pending = [
            ctx.op_async(worker, "converge_operation", {
                "operation_id": op_id, "outcome": outcome, "remote_id": remote,
                "reason": "checked in the tool's console", "ticket": ticket,
            })
            for worker, op_id, (outcome, remote, ticket)
            in zip((ctl, ctl2), last, outcomes, strict=True)
        ]  # fmt: skip
        seen = [
            lock.answered_or_waiting(p, w) for p, w in zip(pending, ("ctl", "ctl2"), strict=True)
        ]
    ctx.command(
        "while the harness held the run's row: "
        + "; ".join(f"{w}: {s or 'answered'}" for w, s in zip(("ctl", "ctl2"), seen, strict=True))
    )
    replies = [p.result(15.0) for p in pending]
    ops_after = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    status = checkers.run_row(ctx, run_id, "the run after the last convergences")["status"]
    left = [o for o, s in ops_after if s in ("unknown", "dispatching")]
    ctx.invariant(
        "a run with nothing left in doubt is not left paused in doubt",
        not all(r.ok for r in replies) or status != "paused_indoubt" or bool(left),
        expected="both convergences accepted, nothing left in doubt, the run out of "
        "paused_indoubt at once, whichever committed first",
        observed=f"replies {[('ok' if r.ok else r.error) for r in replies]}; run {status}; "
        f"ledger {ops_after}",
    )
    ctx.progress(
        "both last convergences were taken",
        all(r.ok for r in replies),
        expected="converge_operation of each of the last two unknown operations accepted",
        observed=f"{[(r.error, r.message) for r in replies if not r.ok] or 'both ok'}",
    )


def _claim_held(ctx: ExperimentContext, worker: str, pending: LoggedOp, op_id: str) -> None:
    """Wait for ``worker``'s dispatch of ``op_id`` (prepared, its run live) to
    stop right after its claim. A dispatch that answered it had nothing to
    dispatch never will: the contract's ``dispatch`` claims a prepared
    operation of a live run, so that answer is the worker's refusal of a
    setup op (unmet progress), not a wait the machine ran out (unknown; blind
    hunt 33 #01: a dispatcher that skipped queued runs' intents)."""
    try:
        ctx.reached(worker, "after_dispatch_claim_commit", held=True)
    except Inconclusive:
        if not pending.done():
            raise
        reply = pending.result(0)
        if reply.ok and reply.result.get("status") is None:
            raise SetupRefused(
                worker,
                "dispatch",
                "NothingDispatched",
                f"dispatch of {op_id}, prepared and its run live, answered that there was "
                "nothing to dispatch",
            ) from None
        raise


def _registered_beside_first_checkpoint(
    ctx: ExperimentContext,
    run_id: str,
    env: dict[str, str | None],
    steps: tuple[str, ...],
    *,
    dispatched: tuple[str, ...] = (),
) -> list[str]:
    """The workflow's first checkpoint, from the worker itself (A0 crashes
    right after it); then, under an ops process's lease, one intent of the
    plain tool per step of ``steps`` (those of ``dispatched`` dispatched), the
    workflow's state put back on top (the intents' checkpoints hold the ops
    interface's own) and the lease given up, so the run resumes from its first
    checkpoint with those operations registered. Their ids, in ``steps``' order."""
    ctx.arm("A0", "after_checkpoint_commit", Crash(), times=1)
    finish(ctx, ctx.env.start_worker("A0", "run", ["--run-id", run_id, "--once"], env=env))
    first = checkers.checkpoints(ctx, run_id)
    start = checkers.run_row(ctx, run_id, "the run after its first checkpoint")
    wait_claimable(ctx, run_id)
    y = ctx.env.start_worker("Y", "ops", env=env)
    lease = ctx.ok(y, "claim", run_id=run_id)
    revision, ops = lease["revision"], []
    for step in steps:
        intent = ctx.ok(
            y,
            "register_intent",
            run_id=run_id,
            epoch=lease["epoch"],
            expected_revision=revision,
            step_id=step,
            effect_version=1,
            tool="plain",
            request={"kind": "notice", "step": step},
        )
        revision = intent["revision"]
        ops.append(str(intent["operation_id"]))
    for step, op_id in zip(steps, ops, strict=True):
        if step in dispatched:
            ctx.op(y, "dispatch", operation_id=op_id)
    if first:  # either may have lapsed: judged by what follows
        was = checkers.run_row(ctx, run_id, "the run before Y's checkpoint")["status"]
        saved = ctx.op(
            y,
            "save_checkpoint",
            run_id=run_id,
            epoch=lease["epoch"],
            expected_revision=revision,
            state=first[-1]["state_json"],
            schema_version=first[-1]["schema_version"],
            step=start.get("current_step"),
        )
        now = checkers.run_row(ctx, run_id, "the run after Y's checkpoint")["status"]
        if saved.ok:
            # Only a tool intent or result moves running <-> waiting_tool (blind
            # hunt 14 #11: a checkpoint that set running hid the intents).
            ctx.invariant(
                "a checkpoint leaves the run's status as it was",
                now == was,
                expected=f"status {was} after Y's save_checkpoint, as before it",
                observed=f"status {now}",
            )
    ctx.op(y, "release", run_id=run_id, epoch=lease["epoch"])
    wait_claimable(ctx, run_id)
    return ops


def _converged_while_paused_for_a_person(ctx: ExperimentContext) -> None:
    """A run paused for a person (its tool step refused for good) with
    another of its operations in doubt; a person converges that one. A
    convergence settles a doubt, not a person's question: the run stays
    paused_human until someone decides it (blind hunt 27 #11: a resume after
    a convergence that also took runs paused for a person)."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    run_id = new_run(ctx, tool="plain")
    tool = ctx.env.tool.client()
    tool.set_fault("plain", "drop_after_act", count=1, run_id=run_id)
    (beside,) = _registered_beside_first_checkpoint(
        ctx, run_id, env, (LIVE_STEP,), dispatched=(LIVE_STEP,)
    )
    tool.set_fault("plain", "reject_final", count=1, run_id=run_id)
    ctx.command(f"tool: run {run_id[:8]}'s next create of 'plain' refused for good (422)")
    code = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env))
    row = checkers.run_row(ctx, run_id, "the run before the convergence")
    ledger = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    took = ctx.fault(
        "the run paused for a person with another operation in doubt",
        row["status"] == "paused_human" and ledger.get(beside) == "unknown",
        expected=f"run paused_human (its step refused for good); {beside} unknown",
        observed=f"run {row['status']} (A exit {code}); ledger {ledger}",
    )
    if not took:
        checkers.lease_history_is_sound(ctx, [run_id])
        return
    made = {str(r["operation_id"]): str(r["resource_id"]) for r in checkers.tool_resources(ctx)}
    reply = ctx.op(
        control_plane(ctx),
        "converge_operation",
        operation_id=beside,
        outcome="succeeded",
        remote_id=made.get(beside),
        reason="resource found in the tool's console",
        ticket="OPS-61",
    )
    after = checkers.run_row(ctx, run_id, "the run after the convergence")
    settled = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.invariant(
        "a convergence leaves a run paused for a person paused",
        after["status"] == "paused_human",
        expected="run still paused_human: only a person's decision ends that pause",
        observed=f"converge {'ok' if reply.ok else reply.error}; run {after['status']}; "
        f"ledger {settled}",
    )
    ctx.progress_equal(
        "the person's convergence was recorded",
        (reply.ok, settled.get(beside)),
        (True, "succeeded"),
        what=f"converge reply ok and {beside}'s status",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _finding_on_another_runs_operation(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, other_op: str
) -> None:
    """A person's finding names the run and an operation in doubt of another
    run (the bystander's): refused, and nothing of either changes."""
    reply, changes = op_and_changes(
        ctx,
        ctl,
        "resolve_indoubt",
        run_id=run_id,
        operation_id=other_op,
        decision="not_executed",
        reason="refusal probe: an operation of another run",
        ticket="OPS-47",
    )
    changed = [(r["seq"], r["tbl"], r["op"]) for r in changes]
    ctx.invariant(
        "a finding on another run's operation is refused",
        not reply.ok and not changed,
        expected=f"resolve_indoubt of run {run_id[:8]} naming {other_op} (another run's, in "
        "doubt) refused, nothing written",
        observed=f"reply {'ok' if reply.ok else reply.error}; changes {changed}",
    )


def _reconciler_killed_mid_converge(
    ctx: ExperimentContext, run_id: str, remote: str | None
) -> None:
    """A reconciler killed at ``after_reconcile_converge`` (its convergence
    written, the run not yet queued) leaves both halves or neither: judged
    from the database right after its death."""
    code = crash_in_op(ctx, "R", "after_reconcile_converge", "reconcile", {})
    hits = [
        h
        for h in ctx.env.control.hits()
        if h.worker == "R" and h.point == "after_reconcile_converge" and h.run_id in (None, run_id)
    ]
    ctx.fault(
        "the reconciler was killed between the convergence and the run's return to the queue",
        bool(hits) and code == -9,
        expected="R reached after_reconcile_converge for the run and died by SIGKILL (exit -9)",
        observed=f"R's hits at the point: {len(hits)}; exit {code}",
    )
    row = checkers.run_row(ctx, run_id, "the run after the reconciler's death")
    ops = [(o["status"], o["remote_id"]) for o in checkers.ledger(ctx, run_id)]
    neither = row["status"] == "paused_indoubt" and [st for st, _ in ops] == ["unknown"]
    both = row["status"] == "queued" and ops == [("succeeded", remote)]
    ctx.invariant(
        "a reconciler killed mid-convergence leaves both halves or neither",
        neither or both,
        expected="run paused_indoubt with its operation unknown (rolled back), or run queued "
        f"with its operation succeeded with {remote} (one statement)",
        observed=f"run {row['status']}; ledger {ops}",
    )


def _converged_before_freeze(ctx: ExperimentContext, *, failed: bool = False) -> None:
    """Another reconciler converges the operation between the worker's query
    (nothing found) and its freeze: the freeze must not commit. With
    ``failed`` the create is lost on the network instead (the tool never
    acts) and a person converges the operation to failed_final meanwhile:
    settled as much as by a success, nothing is left to freeze (blind hunt
    11 #04: a freeze refused only over a success)."""
    ctl = control_plane(ctx)
    run_id, tool, a = _held_after_an_empty_query(ctx, "queryable", TOOL_TIMEOUT_MS)
    if failed:
        took = _failed_while_held(ctx, tool, ctl, run_id)
    else:
        took = _succeeded_while_held(ctx, tool, ctl, run_id)
    ctx.release("A", "after_reconcile_query")
    code = finish(ctx, a)
    trail = checkers.audit(ctx, run_id)
    frozen = [r["seq"] for r in trail if r["status"] == "paused_indoubt"]
    row = checkers.run_row(ctx, run_id, "the run at the end")
    if took:
        ctx.invariant(
            "no freeze once nothing is in doubt",
            not frozen,
            expected="the run never paused in doubt: its one operation had converged before "
            "the worker's freeze",
            observed=f"paused_indoubt at audit seq {frozen or 'never'}; run {row['status']}; "
            f"ledger {[o['status'] for o in checkers.ledger(ctx, run_id)]} (A exit {code})",
        )
        # A success finishes the run; after a failure for good the workflow
        # goes on as after the tool's own refusal (the step's next version,
        # or a person's decision): never back in doubt.
        ctx.progress(
            "the run went on from the converged result",
            row["status"] in (("succeeded", "paused_human") if failed else ("succeeded",)),
            expected="run succeeded" + (" or paused for a person" if failed else ""),
            observed=f"run {row['status']} (A exit {code})",
        )
    else:
        ctx.not_judged(
            "no freeze once nothing is in doubt",
            expected="judged once the operation converged while the worker held its query",
            observed="the state was not reached (see the fault check)",
        )
    ledger = checkers.ledger(ctx, run_id)  # by step, then version: version 1 first
    first = str(ledger[0]["operation_id"]) if ledger else ""
    ctx.equal(
        "nothing resent",
        [r["outcome"] for r in checkers.tool_requests(ctx, run_id=run_id)
         if str(r["operation_id"]) == first],
        [] if failed else ["created"],
        what=f"the tool's log of creates for the run's first operation {first}"
        + (" (lost on the network, then settled by a person)" if failed else ""),
    )  # fmt: skip
    checkers.recorded_results_are_the_tools(ctx, run_id)
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _found_converged_by_another(ctx: ExperimentContext) -> None:
    """The worker's query found the tool's resource, and another reconciler
    converged the operation while the worker was held after that query: the
    worker's own convergence then meets a ledger that moved on, which is no
    error. It goes on from what the ledger says and finishes the run (blind
    hunt 57's reader: both references let that refusal end the execution,
    exit 1, the run left under its lease for a successor). A third
    reconciler's own ``reconcile`` cycle, held after its query found the
    resource as well, loses the same race: its reply is still ok (blind hunt
    59's reader: both references answered the whole cycle LedgerConflict,
    leaving the rest of the cycle's operations unreconciled)."""
    ctl = control_plane(ctx)
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    run_id = new_run(ctx, tool="queryable")
    ctx.env.tool.client().set_fault("queryable", "answer_late", ms=LATE_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id}'s create acts at once and is answered {LATE_MS} ms late")
    ctx.arm("A", "after_reconcile_query", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    ctx.reached("A", "after_reconcile_query")
    # Another run's operation in doubt, after A's in ctl2's list: a cycle that
    # lost the race on A's goes on to it (blind hunt 71 #02: a cycle that
    # stopped at its first lost race answered ok with the rest untried).
    second = _second_in_doubt(ctx, env)
    # A second reconciler's own cycle is held after its query found the
    # resource too: its convergence also loses the race.
    ctl2 = ctx.env.start_worker("ctl2", "ops", role="operator")
    ctx.arm("ctl2", "after_reconcile_query", Hold())
    cycle = ctx.op_async(ctl2, "reconcile", {})
    ctx.reached("ctl2", "after_reconcile_query")
    ctx.op(ctl, "reconcile")
    ops = checkers.ledger(ctx, run_id)
    op_id = str(ops[0]["operation_id"]) if ops else ""
    queried = [
        q["outcome"] for q in checkers.tool_log(ctx)["queries"] if q.get("operation_id") == op_id
    ]
    ctx.fault(
        "another reconciler converged the operation after the worker's query found it",
        queried[:2] == ["found", "found"] and [o["status"] for o in ops] == ["succeeded"],
        expected="the worker's query (the first) and ctl2's (the second) found the resource; "
        "the ledger then succeeded, converged by the other reconciler while both were held",
        observed=f"queries of {op_id}: {queried}; ledger {[o['status'] for o in ops]}",
    )
    if second is not None:
        _second_arrives(ctx, second[0])
    released_at = time.time()
    ctx.release("ctl2", "after_reconcile_query")
    lost = cycle.result(15.0)
    if second is not None:
        _cycle_went_on(ctx, lost, *second, since=released_at)
    ctx.progress(
        "a reconcile cycle whose convergence lost the race answers what it changed",
        lost.ok
        and not any(str(c.get("operation_id")) == op_id for c in lost.result.get("changes") or []),
        expected=f"ctl2's reconcile ok, listing no change of {op_id} (another reconciler "
        "converged it after ctl2's query; nothing of ctl2's changed it)",
        observed=f"ok, changes {lost.result.get('changes')}"
        if lost.ok
        else f"{lost.error}: {lost.message}",
    )
    ctx.release("A", "after_reconcile_query")
    code = finish(ctx, a)
    row = checkers.run_row(ctx, run_id, "the run once A exited")
    ctx.progress(
        "the worker went on from the converged result and finished the run",
        (row["status"], code) == ("succeeded", 0),
        expected="run succeeded by A, exit 0",
        observed=f"run {row['status']} (A exit {code})",
    )
    ctx.equal(
        "nothing resent",
        [r["outcome"] for r in checkers.tool_requests(ctx, run_id=run_id)
         if str(r["operation_id"]) == op_id],
        ["created_then_late"],
        what=f"the tool's log of creates for {op_id}",
    )  # fmt: skip
    checkers.recorded_results_are_the_tools(ctx, run_id)
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _second_in_doubt(ctx: ExperimentContext, env: dict[str, str | None]) -> tuple[str, str] | None:
    """Another run (query tool, one attempt) whose create is held on the
    network past its worker's timeout: the worker finds nothing and pauses
    the run in doubt. (run id, operation id), or None if it did not."""
    run_id = new_run(ctx, tool="queryable", max_attempts=1)
    ctx.env.tool.client().set_fault("queryable", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id}'s create held on the network")
    code = finish(ctx, ctx.env.start_worker("A2", "run", ["--run-id", run_id, "--once"], env=env))
    ops = checkers.ledger(ctx, run_id)
    row = checkers.run_row(ctx, run_id, "the second run in doubt")
    if row["status"] != "paused_indoubt" or [o["status"] for o in ops] != ["unknown"]:
        ctx.not_judged(
            "a reconcile cycle goes on past a lost race",
            expected="a second run paused in doubt with its one operation unknown",
            observed=f"run {row['status']}, ledger {[o['status'] for o in ops]} (A2 exit {code})",
        )
        return None
    return run_id, str(ops[0]["operation_id"])


def _second_arrives(ctx: ExperimentContext, run_id: str) -> None:
    """The second run's held create arrives and acts (the cycle held on A's
    operation finds it when it gets there)."""
    ctx.env.tool.client().release()
    seen_within(
        lambda: bool(checkers.tool_resources(ctx, run_id=run_id)) or None,
        what=f"run {run_id}'s held create to make its resource",
        timeout_s=10,
    )


def _cycle_went_on(
    ctx: ExperimentContext, reply: OpReply, run_id: str, op_id: str, *, since: float
) -> None:
    """The cycle that lost the race on the first operation converged the
    second, by its query, and listed it."""
    listed = [
        str(c.get("operation_id")) for c in (reply.result.get("changes") or [] if reply.ok else [])
    ]
    status = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.progress(
        "a reconcile cycle goes on past a lost race",
        reply.ok and op_id in listed and status.get(op_id) == "succeeded",
        expected=f"ctl2's cycle, after losing the race on the first operation in its list, "
        f"converges the next one ({op_id}, its create arrived) and lists it",
        observed=f"reply {'ok' if reply.ok else reply.error}, changes {listed}; "
        f"{op_id} {status.get(op_id)}",
        since=since,
    )


def _succeeded_while_held(
    ctx: ExperimentContext, tool: ToolClient, ctl: WorkerProcess, run_id: str
) -> bool:
    """The held create arrives and another reconciler converges it to succeeded."""
    arrived = _let_arrive(ctx, tool, run_id)
    converged = ctx.op(ctl, "reconcile")
    ops = checkers.ledger(ctx, run_id)
    log = checkers.tool_log(ctx)
    op_id = str(ops[0]["operation_id"]) if ops else ""
    queried = [
        (q["outcome"], q["received_at"]) for q in log["queries"] if q.get("operation_id") == op_id
    ]
    seen = [r for r in log["requests"] if r.get("run_id") == run_id]
    return ctx.fault(
        "the operation converged while the worker held its empty query",
        bool(arrived)
        and len(seen) == 1
        and bool(queried)
        and queried[0][0] == "not_found"
        and queried[0][1] < float(seen[0]["received_at"])
        and [o["status"] for o in ops] == ["succeeded"],
        expected="A's query found nothing before the tool saw the one request; then another "
        "reconciler's cycle converged the operation to succeeded while A was held",
        observed=f"queries {[(o, round(t, 3)) for o, t in queried]}; requests "
        f"{[(r['outcome'], round(r['received_at'], 3)) for r in seen]}; reconcile "
        f"{'ok' if converged.ok else converged.error}; ledger {[o['status'] for o in ops]}",
    )


def _failed_while_held(
    ctx: ExperimentContext, tool: ToolClient, ctl: WorkerProcess, run_id: str
) -> bool:
    """The held create is lost on the network (the tool never acts) and a
    person converges the operation to failed_final."""
    lost = tool.release(drop=True)
    ctx.command(f"tool: run {run_id[:8]}'s held create lost on the network ({lost} held)")
    ops = checkers.ledger(ctx, run_id)
    op_id = str(ops[0]["operation_id"]) if ops else ""
    reply = ctx.op(
        ctl,
        "converge_operation",
        operation_id=op_id,
        outcome="failed_final",
        reason="never reached the tool",
        ticket="OPS-47",
    )
    after = [o["status"] for o in checkers.ledger(ctx, run_id)]
    seen = [r for r in checkers.tool_log(ctx)["requests"] if r.get("run_id") == run_id]
    return ctx.fault(
        "the operation converged to failed_final while the worker held its empty query",
        lost >= 1 and not seen and reply.ok and after == ["failed_final"],
        expected="A's create lost on the network (the tool saw none); a person's "
        "converge_operation to failed_final taken while A was held",
        observed=f"held requests lost {lost}; requests at the tool {len(seen)}; converge "
        f"{'ok' if reply.ok else reply.error}; ledger {after} (was "
        f"{[o['status'] for o in ops]})",
    )


def _lost_then_found_not_executed(ctx: ExperimentContext) -> None:
    """A create that never reached the tool (a tool with neither query nor
    key): the worker's call times out, it cannot learn the outcome, so the
    run is paused in doubt; the request is then lost on the network. A person
    who finds nothing in the tool's console records not_executed (no remote
    id): the finding is taken (the operation failed_final, the run queued,
    audited), and a worker then plans the step again as version 2 and finishes
    the run with one resource, made by version 2; version 1 never reached the
    tool. The run has one attempt, which the pause interrupted: queued again
    after the finding, it must still be worked (blind hunt 66's reader: at a
    spent budget the Go guard refused the finding, and Python queued a run
    whose next grant took it past its budget)."""
    run_id = new_run(ctx, tool="plain", max_attempts=1)
    tool = ctx.env.tool.client()
    tool.set_fault("plain", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id[:8]}'s create of 'plain' held on the network")
    a = ctx.env.start_worker(
        "A",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)},
    )
    code_a = finish(ctx, a)
    frozen = checkers.run_row(ctx, run_id, "the run once A has exited")
    lost = tool.release(drop=True)
    ctx.command(f"tool: {lost} held create(s) lost on the network (released with drop)")
    ops = checkers.ledger(ctx, run_id)
    requests = checkers.tool_requests(ctx, run_id=run_id)
    ctx.fault(
        "the create was lost on the network while the run was paused in doubt",
        lost == 1
        and frozen["status"] == "paused_indoubt"
        and [(o["effect_version"], o["status"]) for o in ops] == [(1, "unknown")]
        and not requests,
        expected="one create held, then lost; the run paused in doubt with version 1 unknown; "
        "nothing in the tool's log",
        observed=f"held creates lost {lost}; run {frozen['status']} (A exit {code_a}); ledger "
        f"{[(o['effect_version'], o['status']) for o in ops]}; tool requests {len(requests)}",
    )
    op_id = str(ops[0]["operation_id"]) if ops else ""
    reply = ctx.op(
        control_plane(ctx),
        "resolve_indoubt",
        run_id=run_id,
        operation_id=op_id,
        decision="not_executed",
        reason="nothing in the tool's console",
        ticket="OPS-44",
    )
    after = checkers.run_row(ctx, run_id, "the run after the finding")
    found = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    ctx.invariant(
        "a not_executed finding is taken",
        reply.ok and found == [(1, "failed_final")] and after["status"] == "queued",
        expected="resolve_indoubt not_executed (no remote id) accepted: version 1 failed_final, "
        "the run queued (nothing else in doubt)",
        observed=f"reply {'ok' if reply.ok else reply.error}; ledger {found}; run "
        f"{after['status']}",
    )
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b)
    final = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    sent = checkers.tool_requests(ctx, run_id=run_id)
    versions = {str(o["operation_id"]): o["effect_version"] for o in checkers.ledger(ctx, run_id)}
    ctx.invariant(
        "the version found not executed is never sent",
        all(versions.get(str(r["operation_id"])) != 1 for r in sent),
        expected="no create for version 1 in the tool's log, then or after",
        observed=f"creates by version {[versions.get(str(r['operation_id'])) for r in sent]}",
    )
    ctx.progress_equal(
        "the run finishes with version 2",
        (checkers.run_row(ctx, run_id)["status"], final, len(sent)),
        ("succeeded", [(1, "failed_final"), (2, "succeeded")], 1),
        what=f"(run status, ledger (version, status), creates) (B exit {code_b})",
    )
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _converged_beside_a_live_claim(
    ctx: ExperimentContext, *, rejected: bool = False, second: bool = False
) -> None:
    """The last unknown operation of a run paused in doubt converges while
    another of its operations is dispatching under a live claim (a dispatcher
    held right after claiming it): that one may still act, so the run stays
    paused in doubt (run.leaves_doubt_only_with_nothing_in_doubt judges the
    same from the audit trail). Then the dispatcher is let go: its answer,
    recorded, settles the run's last doubt, and the same transaction must put
    the run back in the queue (a run paused with nothing in doubt is one
    nobody resumes; both reference workers left it paused until this state
    showed it). With ``rejected`` the tool refuses that create with 429: the
    operation goes back to prepared, nothing is in doubt, and the run is
    queued alike. With ``second`` a second dispatcher holds another operation
    under a live claim; its answer, recorded first, must leave the run paused
    while the first's claim lives (blind hunt 21 #01: the resume after a
    recorded answer counted only ``unknown`` as in doubt), and the first's,
    a final refusal (422), must queue it."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    # Queued bystanders, one created before the run and one after, so that a
    # scan of the runs is likely to meet one of them first (where the run's
    # many updates leave its row is the heap's business): the resume must look
    # at the settled run, not at whatever row comes first (generated mutant
    # 30d6aae5 read any row; caught with the bystander created after). No
    # worker is started for them; they stay queued.
    bystanders = [new_run(ctx, tool="plain")]
    run_id = new_run(ctx, tool="queryable")
    bystanders.append(new_run(ctx, tool="plain"))
    steps = (LIVE_STEP, SECOND_LIVE_STEP) if second else (LIVE_STEP,)
    live_op, *seconds = _registered_beside_first_checkpoint(ctx, run_id, env, steps)
    claim_env = {**env, "FENCECHECK_DISPATCH_TTL_MS": str(LIVE_CLAIM_TTL_MS)}
    d = ctx.env.start_worker("D", "ops", env=claim_env)
    ctx.arm("D", "after_dispatch_claim_commit", Hold())
    held = ctx.op_async(d, "dispatch", {"operation_id": live_op})
    _claim_held(ctx, "D", held, live_op)
    held_2 = None
    if seconds:
        d2 = ctx.env.start_worker("D2", "ops", env=claim_env)
        ctx.arm("D2", "after_dispatch_claim_commit", Hold())
        held_2 = ctx.op_async(d2, "dispatch", {"operation_id": seconds[0]})
        _claim_held(ctx, "D2", held_2, seconds[0])
    tool = ctx.env.tool.client()
    tool.set_fault("queryable", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id[:8]}'s create of 'queryable' held on the network")
    code_a = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env))
    # A reconcile while A's create is still on the network: its query finds
    # nothing, and the same control plane must ask again in its next cycle
    # (blind hunt 44 #08: a reconciler that remembered "not found" per process
    # never asked again, and the operation stayed in doubt).
    early = ctx.op(control_plane(ctx), "reconcile")
    ctx.command(
        f"a reconcile before A's create arrived: {early.result if early.ok else early.error}"
    )
    _let_arrive(ctx, tool, run_id)
    ledger = {str(o["operation_id"]): o for o in checkers.ledger(ctx, run_id)}
    own = [k for k in ledger if k != live_op and k not in seconds]
    live = ctx.env.query(
        "SELECT status, dispatch_until > clock_timestamp() AS live"
        " FROM fencecheck_model.tool_operations WHERE operation_id = %s",
        [live_op],
    )
    row = checkers.run_row(ctx, run_id, "the run before the reconciler")
    took = ctx.fault(
        "the run paused in doubt beside a live dispatch claim",
        row["status"] == "paused_indoubt"
        and len(own) == 1
        and ledger[own[0]]["status"] == "unknown"
        and bool(live)
        and live[0]["status"] == "dispatching"
        and bool(live[0]["live"]),
        expected=f"run paused_indoubt; its tool step's operation unknown, {live_op} dispatching "
        "under a live claim",
        observed=f"run {row['status']} (A exit {code_a}); ledger "
        f"{[(k, o['status']) for k, o in ledger.items()]}; {live_op}: {live}",
    )
    if not took:
        checkers.lease_history_is_sound(ctx, [run_id])
        return
    if not rejected:
        _no_finding_under_a_live_claim(ctx, run_id, live_op)
    if rejected and ctx.system.capabilities.offers_op("resolve_indoubt"):
        # Here a person finds the tool step executed instead of the
        # reconciler: the finding is taken and the run stays paused, the other
        # operation dispatching (blind hunt 69 #07: a Go resolve that counted
        # only unknown operations as in doubt tried to queue the run, and its
        # guard refused the whole finding).
        made = [
            r["resource_id"]
            for r in checkers.tool_resources(ctx, run_id=run_id)
            if r["operation_id"] == own[0]
        ]
        finding_without_a_resource_refused(
            ctx, run_id, "resolve_indoubt", run_id=run_id, operation_id=own[0], decision="executed"
        )
        reply = ctx.op(
            control_plane(ctx), "resolve_indoubt", run_id=run_id, operation_id=own[0],
            decision="executed", remote_id=made[0] if made else None,
            reason="the label is in the tool's console", ticket="OPS-83",
        )  # fmt: skip
        ctx.invariant(
            "a finding beside another operation under a live claim is taken",
            reply.ok,
            expected=f"resolve_indoubt executed of {own[0]} (unknown) accepted while {live_op} "
            "is dispatching under a live claim",
            observed=f"reply {reply.result if reply.ok else reply.error}",
        )
    else:
        reply = ctx.op(control_plane(ctx), "reconcile")
    after = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    status = checkers.run_row(ctx, run_id, "the run after the reconciler")["status"]
    ctx.invariant(
        "a convergence leaves the run paused while another operation is dispatching",
        status == "paused_indoubt",
        expected=f"run paused_indoubt while {live_op} is dispatching under a live claim",
        observed=f"run {status}; ledger {after}",
    )
    ctx.progress_equal(
        "the tool step's operation converged (the reconciler's, or a person's finding)",
        (reply.ok, after.get(own[0])),
        (True, "succeeded"),
        what=f"reconcile's reply ok and {own[0]}'s status",
    )
    if held_2 is not None:
        ctx.release("D2", "after_dispatch_claim_commit")
        answered_2 = held_2.result(15)
        now = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
        status = checkers.run_row(ctx, run_id, "the run after D2's answer")["status"]
        ctx.invariant(
            "a recorded answer leaves the run paused while another operation is dispatching",
            status == "paused_indoubt" or now.get(live_op) != "dispatching",
            expected=f"run paused_indoubt while {live_op} is dispatching under a live claim, "
            "whatever D2's answer settled",
            observed=f"D2 {'ok' if answered_2.ok else answered_2.error}; run {status}; "
            f"ledger {now}",
        )
    if rejected:
        ctx.env.tool.client().set_fault("plain", "reject_429", count=1, run_id=run_id)
        ctx.command(f"tool: the held dispatcher's create of 'plain' for run {run_id[:8]} gets 429")
    elif second:
        # A final refusal settles the doubt as much as a success (blind hunt
        # 51 #03: the resume after a recorded answer came only for a success).
        ctx.env.tool.client().set_fault("plain", "reject_final", count=1, run_id=run_id)
        ctx.command(f"tool: the held dispatcher's create of 'plain' for run {run_id[:8]} gets 422")
    ctx.release("D", "after_dispatch_claim_commit")
    answered = held.result(15)
    settled = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    status = checkers.run_row(ctx, run_id, "the run after the dispatcher's answer")["status"]
    doubt = [k for k, st in settled.items() if st in ("unknown", "dispatching")]
    ctx.invariant(
        "the answer that settles the last doubt resumes the run",
        status != "paused_indoubt" or bool(doubt),
        expected="once nothing of the run is in doubt, it is not left paused in doubt",
        observed=f"dispatch reply {'ok' if answered.ok else answered.error}; ledger {settled}; "
        f"run {status}",
    )
    ctx.progress_equal(
        "the dispatcher's answer was recorded and the run queued",
        (settled.get(live_op), status),
        ("prepared" if rejected else "failed_final" if second else "succeeded", "queued"),
        what=f"({live_op}'s status, run status)",
    )
    left = [checkers.run_row(ctx, b, "a bystander at the end")["status"] for b in bystanders]
    ctx.invariant(
        "the bystander runs are untouched",
        left == ["queued", "queued"],
        expected="both bystanders still queued",
        observed=f"bystanders {left}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _finding_on_an_expired_claim(ctx: ExperimentContext) -> None:
    """A run paused in doubt beside another of its operations still
    ``dispatching`` under a claim whose deadline passed (its dispatcher
    SIGKILLed right after the claim, before any call; no reconciler has swept
    it since): that operation is in doubt like an unknown one, and a person's
    finding on it is taken (blind hunt 66 #05: a Go ``resolve_indoubt`` that
    took every dispatching row for one under a live claim refused it, so the
    run stayed paused until a sweep that a person's finding must not need).
    Then the run's own create arrives, the control plane's ``reconcile``
    converges it, and with nothing left in doubt the run is queued."""
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)}
    run_id = new_run(ctx, tool="queryable")
    (dead_op,) = _registered_beside_first_checkpoint(ctx, run_id, env, (LIVE_STEP,))
    d = ctx.env.start_worker(
        "D", "ops", env={**env, "FENCECHECK_DISPATCH_TTL_MS": str(EXPIRING_CLAIM_TTL_MS)}
    )
    ctx.arm("D", "after_dispatch_claim_commit", Hold())
    held = ctx.op_async(d, "dispatch", {"operation_id": dead_op})
    _claim_held(ctx, "D", held, dead_op)
    killed = ctx.kill(d)
    tool = ctx.env.tool.client()
    tool.set_fault("queryable", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id[:8]}'s create of 'queryable' held on the network")
    code_a = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env))

    def claim_ran_out() -> list[dict[str, Any]] | None:
        rows = ctx.env.query(
            "SELECT status, dispatch_until <= clock_timestamp() AS ran_out"
            " FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [dead_op],
        )
        return rows if rows and (rows[0]["ran_out"] or rows[0]["status"] != "dispatching") else None

    dead = seen_within(
        claim_ran_out,
        what=f"D's claim of {dead_op} to run out by database time",
        timeout_s=EXPIRING_CLAIM_TTL_MS / 1000 + 10,
    )
    ledger = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    own = [k for k in ledger if k != dead_op]
    row = checkers.run_row(ctx, run_id, "the run before the finding")
    if not ctx.fault(
        "the run paused in doubt beside a dispatching operation whose claim ran out",
        killed.confirmed_at is not None
        and row["status"] == "paused_indoubt"
        and len(own) == 1
        and ledger[own[0]] == "unknown"
        and bool(dead)
        and ledger.get(dead_op) == "dispatching",
        expected=f"D killed while held after its claim; run paused_indoubt, its tool step's "
        f"operation unknown, {dead_op} dispatching with its claim's deadline passed",
        observed=f"D {killed.detail}; run {row['status']} (A exit {code_a}); ledger {ledger}; "
        f"{dead_op}: {dead}",
    ):
        checkers.lease_history_is_sound(ctx, [run_id])
        return
    reply, changed = op_and_changes(
        ctx, control_plane(ctx), "resolve_indoubt", run_id=run_id, operation_id=dead_op,
        decision="not_executed", reason="its dispatcher died before calling", ticket="OPS-81",
    )  # fmt: skip
    found = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    status = checkers.run_row(ctx, run_id, "the run after the finding")["status"]
    ctx.invariant(
        "a finding on an operation whose dispatch claim ran out is taken",
        reply.ok and found.get(dead_op) == "failed_final" and status == "paused_indoubt",
        expected=f"resolve_indoubt not_executed of {dead_op} (dispatching, its claim run out) "
        f"accepted: failed_final; the run still paused_indoubt ({own[0]} unknown)",
        observed=f"reply {'ok' if reply.ok else reply.error}; {len(changed)} change(s); "
        f"ledger {found}; run {status}",
    )
    _let_arrive(ctx, tool, run_id)
    cycle = ctx.op(control_plane(ctx), "reconcile")
    settled = {str(o["operation_id"]): o["status"] for o in checkers.ledger(ctx, run_id)}
    status = checkers.run_row(ctx, run_id, "the run after the reconciler")["status"]
    ctx.progress_equal(
        "the run is queued once its last doubt converged",
        (settled.get(own[0]), settled.get(dead_op), status),
        ("succeeded", "failed_final", "queued"),
        what=f"({own[0]}'s status, {dead_op}'s status, run status) after a reconcile "
        f"({'ok' if cycle.ok else cycle.error})",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _no_finding_under_a_live_claim(ctx: ExperimentContext, run_id: str, op_id: str) -> None:
    """A person's ``converge_operation``, and a person's ``resolve_indoubt``
    (each where offered), name an operation a dispatcher holds under a live
    claim (its request may be on its way): that is no operation in doubt,
    and the finding must be refused with nothing written. Taken, a
    ``failed_final`` lets the workflow plan the step again while the tool
    acts (blind hunt 62's reader: both references' ``resolve_indoubt`` took
    a dispatching operation whatever its claim's deadline)."""
    caps = ctx.system.capabilities
    findings = [
        (op, args)
        for op, args in (
            ("converge_operation", {"operation_id": op_id, "outcome": "failed_final"}),
            ("resolve_indoubt", {"run_id": run_id, "operation_id": op_id}),
        )
        if caps.offers_op(op)
    ]
    for op, args in findings:
        extra = {"remote_id": None} if op == "converge_operation" else {"decision": "not_executed"}
        reply, changed = op_and_changes(
            ctx, control_plane(ctx), op, **args, **extra,
            reason="no label in the tool's console yet", ticket="OPS-79",
        )  # fmt: skip
        row = ctx.env.query(
            "SELECT status FROM fencecheck_model.tool_operations WHERE operation_id = %s", [op_id]
        )
        ctx.invariant(
            f"no finding on an operation under a live dispatch claim ({op})",
            not reply.ok and not changed and [r["status"] for r in row] == ["dispatching"],
            expected=f"{op} of {op_id} (dispatching, its claim live) refused; nothing written; "
            "the operation still dispatching",
            observed=f"reply {'ok' if reply.ok else reply.error}; {len(changed)} change(s) "
            f"{[(c['tbl'], c['op']) for c in changed]}; status {[r['status'] for r in row]}",
        )


def _found_by_a_person(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, op_id: str, ticket: str
) -> tuple[OpReply, str | None, list[tuple[Any, Any]], str]:
    """A person's ``converge_operation`` of ``op_id`` to succeeded with the
    resource the tool made for the run (one, whatever its creates): the reply,
    that resource, the run's ledger (status, remote id) and status after."""
    made = {str(r["resource_id"]) for r in checkers.tool_resources(ctx, run_id=run_id)}
    remote = next(iter(made)) if len(made) == 1 else None
    reply = ctx.op(
        ctl,
        "converge_operation",
        operation_id=op_id,
        outcome="succeeded",
        remote_id=remote,
        reason="the label exists in the tool's console",
        ticket=ticket,
    )
    after = [(o["status"], o["remote_id"]) for o in checkers.ledger(ctx, run_id)]
    status = str(checkers.run_row(ctx, run_id, "the run after the person's finding")["status"])
    return reply, remote, after, status
