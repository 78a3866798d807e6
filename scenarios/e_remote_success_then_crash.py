"""E: the tool acted, the worker died before recording it: the successor must not
create a second real resource.

The worker is killed (SIGKILL, from its own crash point) after the tool
answered and before the result transaction commits. The successor then finds
a dispatch claim that expired. What it may do depends on what the tool
promises: retry with the same key (idempotent), ask the tool (query), or
nothing at all but freeze (neither).

Variant ``frozen_dispatcher``: A claims its tool call and is frozen (SIGSTOP)
right after the claim commits, before the call; its lease and claim expire,
B takes the run over, finds the claim expired and converges it with a claim
of its own; then A resumes. A must not send: its claim expired (rule 4, and
rule 8: a lost lease stops new side effects), which a dispatcher can know by
its own clock without a renewal. A's heartbeat is parked between two renewals
for as long (it can only wait), so only that deadline check stands between A
and a stale send: its cancellation cannot win the race for it.

Variant ``frozen_reconciler``: the same for a reconciler's same-key
resend. A dies after its dispatch claim, before its call (so the query
finds nothing); a reconciler R1 claims the operation in doubt for a resend and is frozen right after the claim, before its call; its
claim expires, R2's cycle expires it and converges the operation with a
resend of its own; then R1 resumes. R1 must not send: its claim expired by
its own clock.

Variant ``resend_at_window_end``: an intent registered through ``ops``; its
dispatcher A (``ops``) dies after its claim, before its call; a reconciler
asks in the last claim length (dispatch TTL) before the idempotent tool's key
window ends. A resend claimed then may reach the tool after the window (a new
resource): the claim must be refused (the global
``effect.resend_claim_ends_within_the_tools_retention``, which judges by the
tool's own declared window where the ledger recorded none), and so must one
after the window. The registering ``ops`` process first registers another
run's intent with its link to the tool cut (no window recorded, rightly); its
next intent, after the link healed, must record the tool's window.

Variant ``superseded_claim``: A holds the run's lease (its heartbeat renews
it) and the tool's answer, held before recording it until its dispatch claim
expires; the reconciler turns the claim unknown and converges the operation
by a same-key retry. Then A records its answer: it must change nothing of
the operation, whose claim is no longer A's (a result is recorded only when
the dispatch owner and the ledger revision match).

Variant ``retention_expired``: the idempotent tool keeps its keys for one
second only, and the successor comes after that: the tool no longer knows
the key (its query answers "not found", a repeat would create anew), so a
same-key retry is no longer safe and must not be sent: the run freezes in
doubt with one real resource.

Variant ``stale_timeout``: one ``ops`` process D1 dispatches; its request is
still on the network (``arrive_late``) when its claim expires, and while that
call is out the same process's reconciler cycle expires the claim, queries
(nothing found yet) and claims the operation again for a same-key resend,
held right after that claim. Then D1's first call times out: marking its
own unanswered call unknown must not touch the newer claim, although the
owner is the same session (a mark matches the claim it was made under: its
owner and its ledger revision).

Variant ``expired_claims_one_held``: one ``ops`` dispatcher D claims two
operations of a run (a tool with neither query nor key whose creates hang at
the tool), so both claims are D's at the same ledger revision; both expire.
A reconcile runs while the harness holds the second one's ledger row
locked: its cycle expires the first and skips the held one (or waits for
it); either way its reply must list exactly the operations it changed
(the global ``worker.reconcile_lists_every_change``). The next cycle, the
row let go, expires the second.

Variant ``answer_after_lease_lost``: A holds the tool's answer (a tool
with neither query nor key) before recording it, its heartbeat parked,
until its lease ran out and an ``ops`` session took the run over; its
dispatch claim lives on. Let go, A's result write is refused for its lease,
but the answer is known and the claim is A's: A records it on the ledger
(only the ledger, under its claim), so the successor adopts it instead of
freezing the run for a person. Beside it A2, held the same way with the
tool's final refusal (422): it records that answer (``failed_final``) too.
And A3, whose create arrives only after its tool timeout, which comes after
its lease ran out: the freeze it then tries is refused, and it must stop.

Variant ``slow_claim_answer``: an ``ops`` dispatcher's database link answers
late while it claims an intent; it is held right after the claim and let go
past the claim's deadline by database time, but within that delay. Its
deadline counts from when it sent the claim, which is before the database
made it: it must send nothing. One that counts from the answer still
believes it holds the claim. Variant ``slow_resend_claim_answer``: the same
for a reconciler's same-key resend of an operation left ``unknown`` by a
create lost on the network; its reply must also list that operation.

Variant ``two_unknown_resent``: one ``ops`` dispatcher D leaves two
operations of an idempotent tool ``unknown`` at the same ledger revision
(their creates held on the network past its tool timeout). One reconcile
cycle, its queries finding nothing, resends each under its own key and its
reply lists both; then the run changes hands (a release and another
process's claim) and D's untargeted ``dispatch`` beside those two settled
operations takes the run's new prepared intent, sending it with the new
epoch.

Variant ``refused_beside_own_claim``: one ``ops`` dispatcher holds two
claims made at the same ledger revision; the first one's create hangs at
the tool (it may still act), the second one's is refused with 429. Only
the refused one goes back to ``prepared``; the other stays dispatching
until its answer, which is then recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.checking import checkers
from harness.checking.history import load_history
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, Inconclusive, plain
from harness.model.compile import DECLARED
from harness.parts import clock_skew
from harness.parts.control import Crash, Hit, Hold
from harness.parts.processes import SignalRecord, WorkerProcess
from harness.waiting import WaitTimeout, wait_for
from mock_tool.client import ToolClient
from scenarios.common import (
    CANCELLED,
    control_plane,
    crash_in_op,
    finish,
    intent_registered,
    new_run,
    seen_within,
    wait_claimable,
)

RETENTION_S = 1.0  # the idempotent tool's key memory in variant retention_expired
# Variant resend_at_window_end: the tool's key memory, and where in it the
# reconciler asks (within the last claim length before the window ends).
WINDOW_END_RETENTION_S = 1.5
# How long D1's request stays on the network in variant stale_dispatcher: past
# its dispatch claim's deadline (600 ms) plus the reconciler's claim, within
# the worker's tool timeout (3 s).
ARRIVE_LATE_MS = 2000
# slow_claim_answer: how late the database's answers reach the dispatcher while
# it claims (toxiproxy latency on its link, downstream), and how far past the
# claim's deadline (database time) the harness lets it go on: inside that delay.
# A worker that counts from the answer holds its claim until at least that
# delay past the database's deadline, so the harness must let go in between.
# The point comes one to three round trips after the claim (the reference
# workers read the run's epoch and more in statements of their own), each
# slowed alike; with this claim length and delay the harness has 0.3 s for
# its own stalls whether the point comes one, two or three round trips after
# the claim (250 ms and the default 600 ms claim left 0.1 s, which a machine
# at load 14 outran once).
CLAIM_ANSWER_LATE_MS = 450
SLOW_CLAIM_TTL_MS = 1300
# stale_timeout: D1's tool timeout, past its claim (600 ms) and the reconciler's
# claim after it, and how late its request reaches the tool: after that timeout.
STALE_TIMEOUT_MS = 2000
STALE_TIMEOUT_ARRIVE_MS = 3000
RELEASE_PAST_DEADLINE_S = 0.1
# slow_resend_claim_answer: the first dispatcher's tool timeout (its create is
# held on the network until the harness drops it), and the bound on that hold.
LOST_CALL_TIMEOUT_MS = 300
HELD_MAX_MS = 30_000
# frozen_dispatcher_clock_behind: how far A's wall clock runs behind the
# database's (libfaketime); far more than A stays frozen past its claim.
CLOCK_BEHIND_S = 30.0

TOOL_FOR = {
    "idempotent": "idem",
    "query": "queryable",
    "none": "plain",
    "retention_expired": "idem",
    # The successor's resend of the same id meets the tool's 409 naming our
    # own request and its resource: that is our success, adopted.
    "deterministic_id": "detid",
}
#: The capability level of each of the mock tool's tools (docs/mock-tool.md).
CAPABILITY = {
    "idem": "idempotent",
    "queryable": "query",
    "plain": "none",
    "detid": "deterministic_id",
}

# claim_row_held: how long the harness holds A's intent's ledger row locked
# while A comes to claim it for dispatch.
ROW_HELD_S = 1.0
# expired_claims_one_held: D's two dispatch claims, long enough that a busy
# machine does not expire one before D sends (it then sends nothing), and D's
# tool timeout, past the whole case (its creates hang at the tool until the
# harness lets them go).
TWO_CLAIMS_TTL_MS = 1500
TWO_CLAIMS_TOOL_TIMEOUT_MS = 20_000
EXPIRED_CLAIMS_ONE_HELD = "expired_claims_one_held"
# answer_after_lease_lost: A's dispatch claim, far past its lease and the
# takeover, so that only the lease decides A's result write.
ANSWER_AFTER_LEASE_LOST = "answer_after_lease_lost"
LIVE_CLAIM_MS = 30_000
# answer_after_lease_lost, A3: its tool timeout comes well after its lease ran
# out (the experiment's 800 ms), its create reaches the tool later still; the
# harness watches it with its heartbeat parked for FREEZE_WATCH_S.
FREEZE_TOOL_TIMEOUT_MS = 2500
FREEZE_LATE_MS = 6000
FREEZE_WATCH_S = 1.0
TWO_UNKNOWN_RESENT = "two_unknown_resent"
REFUSED_BESIDE_OWN_CLAIM = "refused_beside_own_claim"

SPEC = ExperimentSpec(
    id="E",
    title="remote success then crash",
    seed_section="English seed §8, §9.3, §11 E; Chinese seed §8.3",
    invariant="idempotent tool: one real resource, converged by same-key retry; query tool: "
    "converged by query without resending; tool with neither: never resent, op stays unknown",
    fault="SIGKILL at after_tool_response_before_tx2_commit, after the tool created the resource",
    rules=(4, 5),
    injection_point="after_tool_response_before_tx2_commit",
    needs=(
        *needs.capabilities("workflow", "ledger"),
        *(needs.capability(f"ledger_tool:{CAPABILITY[t]}", v) for v, t in TOOL_FOR.items()),
        needs.capability(
            "ledger_tool:idempotent",
            "stale_dispatcher",
            "frozen_dispatcher",
            "frozen_dispatcher_clock_behind",
            "frozen_reconciler",
        ),
        needs.op("reconcile", "frozen_reconciler", "resend_at_window_end", "query_unreachable"),
        needs.capability("ledger_tool:query", "query_unreachable"),
        needs.point("after_tool_response_before_tx2_commit", "query_unreachable"),
        needs.capability("ledger_tool:idempotent", "resend_at_window_end"),
        needs.point("after_dispatch_claim_commit", "resend_at_window_end"),
        needs.point(
            "after_tool_response_before_tx2_commit",
            "idempotent",
            "query",
            "none",
            "retention_expired",
        ),
        needs.capability("ledger_tool:idempotent", "stale_timeout"),
        needs.op("reconcile", "stale_timeout"),
        needs.point(
            "after_dispatch_claim_commit",
            "stale_timeout",
            "stale_dispatcher",
            "frozen_dispatcher",
            "frozen_dispatcher_clock_behind",
            "frozen_reconciler",
        ),
        needs.point(
            "before_renew",
            "frozen_dispatcher",
            "frozen_dispatcher_clock_behind",
            "frozen_before_claim",
        ),
        needs.capability("clock_skew", "frozen_dispatcher_clock_behind"),
        needs.capability("ledger_tool:idempotent", "frozen_before_claim"),
        needs.point("after_outbound_intent_commit", "frozen_before_claim", "claim_row_held"),
        needs.capability(
            "ledger_tool:idempotent",
            "superseded_claim",
            "slow_claim_answer",
            "slow_resend_claim_answer",
        ),
        needs.point("after_dispatch_claim_commit", "slow_claim_answer", "slow_resend_claim_answer"),
        needs.op("reconcile", "slow_resend_claim_answer"),
        needs.point("after_tool_response_before_tx2_commit", "superseded_claim"),
        needs.capability("ledger_tool:none", EXPIRED_CLAIMS_ONE_HELD, ANSWER_AFTER_LEASE_LOST),
        needs.point("after_tool_response_before_tx2_commit", ANSWER_AFTER_LEASE_LOST),
        needs.point("before_renew", ANSWER_AFTER_LEASE_LOST),
        needs.op("reconcile", EXPIRED_CLAIMS_ONE_HELD, TWO_UNKNOWN_RESENT),
        needs.capability("ledger_tool:idempotent", TWO_UNKNOWN_RESENT, REFUSED_BESIDE_OWN_CLAIM),
    ),
    variants=(
        "idempotent",
        "query",
        "none",
        "stale_dispatcher",
        "stale_timeout",
        "frozen_dispatcher",
        "frozen_dispatcher_clock_behind",
        "frozen_reconciler",
        "frozen_before_claim",
        "retention_expired",
        "resend_at_window_end",
        "superseded_claim",
        "slow_claim_answer",
        "slow_resend_claim_answer",
        "query_unreachable",
        "claim_row_held",
        "deterministic_id",
        EXPIRED_CLAIMS_ONE_HELD,
        ANSWER_AFTER_LEASE_LOST,
        TWO_UNKNOWN_RESENT,
        REFUSED_BESIDE_OWN_CLAIM,
    ),
    natural_wait_s=0.8,
    variant_waits=(
        ("stale_dispatcher", ARRIVE_LATE_MS / 1000),
        ("stale_timeout", STALE_TIMEOUT_ARRIVE_MS / 1000),
        ("retention_expired", 1.2),
        ("resend_at_window_end", WINDOW_END_RETENTION_S),
        ("claim_row_held", ROW_HELD_S),
        (EXPIRED_CLAIMS_ONE_HELD, TWO_CLAIMS_TTL_MS / 1000),
    ),
    variant_points=(
        ("frozen_dispatcher", "after_dispatch_claim_commit"),
        ("frozen_dispatcher_clock_behind", "after_dispatch_claim_commit"),
        ("frozen_reconciler", "after_dispatch_claim_commit"),
        ("frozen_before_claim", "after_outbound_intent_commit"),
        ("claim_row_held", "after_outbound_intent_commit"),
        ("slow_claim_answer", "after_dispatch_claim_commit"),
        ("slow_resend_claim_answer", "after_dispatch_claim_commit"),
    ),
    variant_faults=(
        (
            ANSWER_AFTER_LEASE_LOST,
            "A held with the tool's answer before recording it (A2 beside it with a 422), its "
            "heartbeat parked, until its lease ran out and another session took the run over; "
            "its dispatch claim live",
        ),
        (
            EXPIRED_CLAIMS_ONE_HELD,
            "one dispatcher's two claims (creates hanging at the tool) expired; the harness "
            "holds the second one's ledger row locked while a reconcile runs",
        ),
        (
            "stale_timeout",
            f"D1's request reaches the idempotent tool {STALE_TIMEOUT_ARRIVE_MS} ms late, after "
            f"its {STALE_TIMEOUT_MS} ms tool timeout and its claim's deadline; D1's own "
            "reconciler cycle claims the operation anew and is held there when that call "
            "times out",
        ),
        (
            "slow_claim_answer",
            f"the dispatcher's database answers delayed {CLAIM_ANSWER_LATE_MS} ms (toxiproxy) "
            "while it claims; it is held right after the claim and let go past the claim's "
            "deadline by database time, within that delay",
        ),
        (
            "slow_resend_claim_answer",
            f"an idempotent tool's create held on the network past the dispatcher's "
            f"{LOST_CALL_TIMEOUT_MS} ms tool timeout, then lost (the operation unknown); a "
            f"reconciler's database answers delayed {CLAIM_ANSWER_LATE_MS} ms while it claims "
            "the same-key resend; it is held right after that claim and let go past its deadline "
            "by database time, within that delay",
        ),
        (
            "superseded_claim",
            "A, its lease kept live by its heartbeat, held with the tool's answer before "
            "recording it until its dispatch claim expired and the reconciler converged the "
            "operation by a same-key retry; then A records its answer",
        ),
        (
            "frozen_dispatcher",
            "SIGSTOP of A right after its dispatch claim commits, before its call, its "
            "heartbeat parked between two renewals; B takes over and converges the "
            "operation; then SIGCONT A",
        ),
        (
            "frozen_dispatcher_clock_behind",
            f"as frozen_dispatcher, with A's wall clock {CLOCK_BEHIND_S:g} s behind the "
            "database's (libfaketime preloaded; its monotonic clock untouched)",
        ),
        (
            "frozen_reconciler",
            "SIGKILL of A after its dispatch claim; SIGSTOP of reconciler R1 right after its "
            "same-key resend's claim commits, before its call; R2 expires that claim and "
            "converges the operation; then SIGCONT R1",
        ),
        (
            "frozen_before_claim",
            "SIGSTOP of A right after its intent commits, before its dispatch claim, its "
            "heartbeat parked; B takes the run's lease over (a newer epoch) and leaves the "
            "intent prepared; then SIGCONT A",
        ),
    ),
    tool_retention=(
        ("retention_expired", RETENTION_S),
        ("resend_at_window_end", WINDOW_END_RETENTION_S),
    ),
)


def run(ctx: ExperimentContext) -> None:
    variant = ctx.variant or "idempotent"
    if variant == "stale_dispatcher":
        _stale_dispatcher(ctx)
        return
    if variant == "stale_timeout":
        _stale_timeout(ctx)
        return
    if variant == "frozen_dispatcher":
        _frozen_dispatcher(ctx)
        return
    if variant == "frozen_dispatcher_clock_behind":
        _frozen_dispatcher(ctx, clock_behind_s=CLOCK_BEHIND_S)
        return
    if variant == "frozen_reconciler":
        _frozen_reconciler(ctx)
        return
    if variant == "resend_at_window_end":
        _resend_at_window_end(ctx)
        return
    if variant == "frozen_before_claim":
        _frozen_before_claim(ctx)
        return
    if variant == "superseded_claim":
        _superseded_claim(ctx)
        return
    if variant == "slow_claim_answer":
        _slow_claim_answer(ctx)
        return
    if variant == "slow_resend_claim_answer":
        _slow_resend_claim_answer(ctx)
        return
    if variant == "query_unreachable":
        _query_unreachable(ctx)
        return
    if variant == "claim_row_held":
        _claim_row_held(ctx)
        return
    if variant == EXPIRED_CLAIMS_ONE_HELD:
        _expired_claims_one_held(ctx)
        return
    if variant == ANSWER_AFTER_LEASE_LOST:
        _answer_after_lease_lost(ctx)
        return
    if variant == TWO_UNKNOWN_RESENT:
        _two_unknown_resent(ctx)
        return
    if variant == REFUSED_BESIDE_OWN_CLAIM:
        _refused_beside_own_claim(ctx)
        return
    run_id = new_run(ctx, tool=TOOL_FOR[variant])
    ctx.arm("A", "after_tool_response_before_tx2_commit", Crash())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    code_a = finish(ctx, a)
    created = checkers.tool_requests(ctx, run_id=run_id)
    ops_before = checkers.ledger(ctx, run_id)
    ctx.fault(
        "the tool acted, then A died before recording it",
        code_a == -9
        and len(created) == 1
        and created[0]["outcome"] == "created"
        and any(o["status"] == "dispatching" for o in ops_before),
        expected="A killed by SIGKILL; one created resource in the tool's log; ledger entry "
        "still dispatching",
        observed=f"A exit {code_a}; tool requests {[r['outcome'] for r in created]}; ledger "
        f"{[o['status'] for o in ops_before]}",
    )
    op_id = created[0]["operation_id"] if created else None
    step = next((o["step_id"] for o in ops_before if o["operation_id"] == op_id), None)
    if variant == "retention_expired":
        if op_id is None:
            # The fault check above is already false (the verdict is unknown);
            # say why instead of waiting on a window of no operation.
            raise Inconclusive(
                "the tool never received A's create request (A lost its lease or died before "
                f"dispatching: exit {code_a}), so there is no retention window to outlive"
            )
        _outlive_retention(ctx, str(op_id))
    wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b)
    ledger_after = checkers.ledger(ctx, run_id)
    step_ops = {o["operation_id"] for o in ledger_after if o["step_id"] == step}
    op = next((o for o in ledger_after if o["operation_id"] == op_id), None)
    resources = [
        r
        for r in checkers.tool_resources(ctx, run_id=run_id)
        if r["operation_id"] in step_ops | {op_id}
    ]
    requests = [
        r
        for r in checkers.tool_requests(ctx, run_id=run_id)
        if r["operation_id"] in step_ops | {op_id}
    ]
    run_row = checkers.run_row(ctx, run_id)
    ctx.equal(
        "one operation identity for the step",
        sorted(step_ops),
        [op_id],
        what=f"ledger operation ids of step {step}",
    )
    ctx.equal(
        "one real resource", len(resources), 1, what=f"resources the tool created for step {step}"
    )
    status = op and op["status"]
    if variant in ("none", "retention_expired"):
        ctx.equal("no resend", len(requests), 1, what="create requests the tool received")
        # Safety: nothing may claim an outcome nobody can know. Progress: B
        # marks the expired claim unknown and freezes the run (a B whose own
        # renewal timed out first leaves both for the next worker).
        ctx.invariant(
            "ledger claims no outcome it cannot know",
            status in ("dispatching", "unknown"),
            expected="dispatching (the expired claim, not yet judged) or unknown",
            observed=f"ledger status of {op_id}: {plain(status)}",
        )
        ctx.progress_equal(
            "ledger marked unknown", status, "unknown", what=f"ledger status of {op_id}"
        )
        ctx.invariant(
            "the run never advanced past the doubt",
            run_row["status"] not in ("succeeded", "failed", "cancelled"),
            expected="not terminal",
            observed=f"run status {run_row['status']}",
        )
        ctx.progress_equal(
            "run frozen in doubt",
            run_row["status"],
            "paused_indoubt",
            what=f"run status (B exit {code_b})",
        )
    else:
        if variant == "query":
            ctx.equal("no resend", len(requests), 1, what="create requests the tool received")
        matches = (
            bool(resources) and op is not None and op["remote_id"] == resources[0]["resource_id"]
        )
        ctx.invariant(
            "ledger agrees with the remote fact",
            status in ("dispatching", "unknown") or (status == "succeeded" and matches),
            expected="not yet judged (dispatching, unknown), or succeeded with the remote "
            "resource id",
            observed=f"ledger {op and (op['status'], op['remote_id'])}; resources "
            f"{[r['resource_id'] for r in resources]}",
        )
        ctx.progress(
            "ledger converged to the remote fact",
            status == "succeeded" and matches,
            expected="ledger succeeded with the remote resource id",
            observed=f"ledger {op and (op['status'], op['remote_id'])}; resources "
            f"{[r['resource_id'] for r in resources]}",
        )
        ctx.progress_equal(
            "successor finished the run",
            run_row["status"],
            "succeeded",
            what=f"run status (B exit {code_b})",
        )
    checkers.lease_history_is_sound(ctx, [run_id])


def _stale_dispatcher(ctx: ExperimentContext) -> None:
    """A dispatcher whose request is still on the network when its claim expires
    comes back with the tool's answer while a newer same-key claim is in flight:
    its answer must not be recorded over the newer claim (rule 4: a result is
    recorded only when dispatch owner and ledger revision match). The tool sees
    D1's request only ARRIVE_LATE_MS after it was sent (mock tool `arrive_late`),
    so the reconciler's query finds nothing, not even a create in progress, and
    its same-key retry claims anew; the reconciler is held there, D1 is held
    with the tool's answer, then D1 goes on first. (Holding D1 before its call
    no longer reaches this: a dispatcher checks its claim's deadline before it
    calls, and one past it sends nothing.)"""
    run_id = new_run(ctx, tool="idem")
    w = ctx.env.start_worker("W", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    intent = ctx.ok(
        w,
        "register_intent",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        step_id="e.label",
        effect_version=1,
        tool="idem",
        request={"kind": "return_label"},
    )
    op_id = intent["operation_id"]
    d1 = ctx.env.start_worker("D1", "ops")
    ctl = control_plane(ctx)  # ready before D1 sends: the window is ARRIVE_LATE_MS
    ctx.env.tool.client().set_fault("idem", "arrive_late", ms=ARRIVE_LATE_MS, run_id=run_id)
    ctx.arm("D1", "after_tool_response_before_tx2_commit", Hold())
    stale = ctx.op_async(d1, "dispatch", {"operation_id": op_id}, worker_async=True)
    first = _claim_expired(ctx, run_id, op_id, "D1's dispatch claim of the operation")
    ctx.arm("ctl", "after_dispatch_claim_commit", Hold())
    newer = ctx.op_async(ctl, "reconcile", {}, worker_async=True)
    ctx.reached("ctl", "after_dispatch_claim_commit", held=True)  # not an earlier pass
    held = next(o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id)
    ctx.reached("D1", "after_tool_response_before_tx2_commit")
    log = checkers.tool_log(ctx)
    seen = [r for r in log["requests"] if r.get("operation_id") == op_id]
    queried = [q for q in log["queries"] if q.get("operation_id") == op_id]
    ctx.fault(
        "a newer claim was in flight when the stale dispatcher came back with the tool's answer",
        held["status"] == "dispatching"
        and held["dispatch_owner"] not in (None, first["dispatch_owner"])
        and len(seen) == 1
        and bool(queried)
        and queried[0]["outcome"] == "not_found"
        and queried[0]["received_at"] < seen[0]["received_at"],
        expected="the reconciler's query found nothing before the tool saw D1's one request; "
        "the reconciler's same-key claim dispatching while D1 holds the tool's answer",
        observed=f"ledger {held['status']} by {held['dispatch_owner']} at revision "
        f"{held['revision']} (D1's claim {first['dispatch_owner']}); tool requests "
        f"{[(r['outcome'], round(r['received_at'], 3)) for r in seen]}, queries "
        f"{[(q['outcome'], round(q['received_at'], 3)) for q in queried]}",
    )
    ctx.release("D1", "after_tool_response_before_tx2_commit")
    stale_reply = stale.result(15)
    after = next(o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id)
    ctx.invariant(
        "the stale answer is not recorded over the newer claim",
        (after["status"], after["dispatch_owner"], after["revision"])
        == ("dispatching", held["dispatch_owner"], held["revision"]),
        expected=f"still dispatching by {held['dispatch_owner']} at revision {held['revision']}",
        observed=f"{after['status']} by {after['dispatch_owner']} at revision "
        f"{after['revision']}; D1's reply {stale_reply.result if stale_reply.ok else stale_reply.error}",
    )
    # The reply is the dispatcher's account (contract: `status`, the ledger's
    # status after its cycle): a result it could not record is no success.
    told = stale_reply.result.get("status") if stale_reply.ok else None
    ctx.invariant(
        "the stale dispatcher does not report the answer it could not record",
        not stale_reply.ok or told == after["status"],
        expected=f"D1 refused (its claim is gone), or its reply's status the ledger's as its "
        f"cycle left it ({after['status']})",
        observed=f"D1's reply {stale_reply.result if stale_reply.ok else stale_reply.error}; "
        f"ledger {after['status']}",
    )
    ctx.release("ctl", "after_dispatch_claim_commit")
    newer.result(15)
    # The reconciler's own claim outlived its deadline while it was held, so it
    # sent nothing and left the operation unknown; its next cycle finds D1's
    # resource by query.
    ctx.op(ctl, "reconcile")
    final = next(o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id)
    resources = [
        r for r in checkers.tool_resources(ctx, run_id=run_id) if r["operation_id"] == op_id
    ]
    ctx.equal("one real resource", len(resources), 1, what="resources for the operation")
    _recorded_the_remote_fact(
        ctx, "the newer claim recorded the remote fact", final, resources,
        expected="ledger succeeded with the resource id",
    )  # fmt: skip


def _stale_timeout(ctx: ExperimentContext) -> None:
    """A dispatcher's call that times out after its claim was superseded by a
    newer claim of the same session: its mark of the unanswered call as
    unknown must leave the newer claim as it is (rule 4: an outcome, unknown
    included, is recorded only under the claim that sent)."""
    run_id = new_run(ctx, tool="idem")
    op_id = intent_registered(
        ctx, ctx.env.start_worker("W", "ops"), run_id, tool="idem", step_id="e.label"
    )
    d1 = ctx.env.start_worker(
        "D1", "ops", env={"FENCECHECK_TOOL_TIMEOUT_MS": str(STALE_TIMEOUT_MS)}
    )
    ctx.env.tool.client().set_fault(
        "idem", "arrive_late", ms=STALE_TIMEOUT_ARRIVE_MS, run_id=run_id
    )
    sent_at = time.monotonic()
    first_call = ctx.op_async(d1, "dispatch", {"operation_id": op_id}, worker_async=True)
    first = _claim_expired(ctx, run_id, op_id, "D1's dispatch claim")
    ctx.arm("D1", "after_dispatch_claim_commit", Hold())
    newer = ctx.op_async(d1, "reconcile", {}, worker_async=True)
    ctx.reached("D1", "after_dispatch_claim_commit", held=True)
    held = _operation(ctx, run_id, op_id)
    claimed_within = time.monotonic() - sent_at
    first_reply = first_call.result(STALE_TIMEOUT_MS / 1000 + 15)
    after = _operation(ctx, run_id, op_id)
    queried = [q for q in checkers.tool_log(ctx)["queries"] if q.get("operation_id") == op_id]
    ctx.fault(
        "the first call timed out while the same session's newer claim was in flight",
        held["status"] == "dispatching"
        and held["revision"] > first["revision"]
        and claimed_within < STALE_TIMEOUT_MS / 1000
        and bool(queried)
        and queried[0]["outcome"] == "not_found"
        and not checkers.tool_requests(ctx, operation_id=op_id)[1:],
        expected=f"the newer claim (a revision past {first['revision']}) dispatching within "
        f"{STALE_TIMEOUT_MS} ms of the first call, after a query that found nothing; one "
        "request at the tool",
        observed=f"ledger {held['status']} by {held['dispatch_owner']} at revision "
        f"{held['revision']} after {claimed_within:.2f} s; queries "
        f"{[q['outcome'] for q in queried]}; first call's reply "
        f"{plain(first_reply.result) if first_reply.ok else first_reply.error}",
    )
    ctx.invariant(
        "a timed-out call's mark leaves the newer claim alone",
        (after["status"], after["dispatch_owner"], after["revision"])
        == ("dispatching", held["dispatch_owner"], held["revision"]),
        expected=f"still dispatching by {held['dispatch_owner']} at revision {held['revision']}",
        observed=f"{after['status']} by {after['dispatch_owner']} at revision {after['revision']}",
    )
    ctx.release("D1", "after_dispatch_claim_commit")
    newer.result(15)
    # The newer claim outlived its deadline while held: it sent nothing. The
    # first request reaches the tool meanwhile; a cycle finds it by query.
    seen_within(
        lambda: checkers.tool_resources(ctx, run_id=run_id) or None,
        what="the tool to act on D1's late request",
        timeout_s=STALE_TIMEOUT_ARRIVE_MS / 1000 + 5,
    )
    ctx.op(control_plane(ctx), "reconcile")
    final = _operation(ctx, run_id, op_id)
    resources = checkers.tool_resources(ctx, run_id=run_id)
    ctx.equal("one real resource", len(resources), 1, what="resources for the operation")
    ctx.progress(
        "the operation converged to the tool's resource",
        final["status"] == "succeeded"
        and len(resources) == 1
        and final["remote_id"] == resources[0]["resource_id"],
        expected="ledger succeeded with the resource id",
        observed=f"ledger {(final['status'], final['remote_id'])}; resources "
        f"{[r['resource_id'] for r in resources]}",
    )


def _query_unreachable(ctx: ExperimentContext) -> None:
    """A's create acted at a query tool, then A died before recording it (as in
    ``query``); the control plane's reconciler asks the tool while the link to
    it is cut. An unreachable tool is no answer: the operation stays in doubt
    (never failed_final, which says the tool did not act, nor prepared); once
    the link heals, the next reconcile converges it to the tool's fact (a
    reconciler that takes a failed query for "nothing found" records an
    effect that happened as never executed)."""
    run_id = new_run(ctx, tool="queryable")
    ctx.arm("A", "after_tool_response_before_tx2_commit", Crash())
    code_a = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"]))
    created = checkers.tool_requests(ctx, run_id=run_id)
    if not (code_a == -9 and len(created) == 1 and created[0]["outcome"] == "created"):
        raise Inconclusive(
            f"the tool did not act once before A died (A exit {code_a}, tool requests "
            f"{[r['outcome'] for r in created]}): there is no effect in doubt to query"
        )
    op_id = str(created[0]["operation_id"])
    _past_deadline(ctx, op_id, "A's dispatch claim")
    ctl = control_plane(ctx)
    fault = ctx.env.links["worker_tool"].cut()
    ctx.command(f"toxiproxy: {fault.detail}")
    cut_at = time.time()
    reply = ctx.op(ctl, "reconcile")
    during = _operation(ctx, run_id, op_id)
    ctx.heal("worker_tool")
    asked = [q for q in checkers.tool_log(ctx).get("queries", []) if q["operation_id"] == op_id]
    ctx.fault(
        "the reconciler met the cut link to the tool",
        fault.kind == "cut" and not asked,
        expected="the tool link cut while the control plane reconciled; no query of the "
        "operation reached the tool",
        observed=f"{fault.detail}; queries the tool logged {len(asked)}; reconcile "
        f"{'ok' if reply.ok else reply.error} {time.time() - cut_at:.2f} s after the cut",
    )
    ctx.invariant(
        "an unreachable tool is no answer",
        during["status"] in ("dispatching", "unknown"),
        expected="the operation still in doubt (dispatching or unknown) after a reconcile "
        "that could not reach the tool",
        observed=f"ledger {during['status']}, remote id {during['remote_id']}",
    )
    ctx.op(ctl, "reconcile")
    after = _operation(ctx, run_id, op_id)
    resources = checkers.tool_resources(ctx, run_id=run_id)
    _recorded_the_remote_fact(
        ctx, "once the link healed, a reconcile converged the operation to the tool's fact",
        after, resources, expected="ledger succeeded with the resource the tool made",
    )  # fmt: skip
    checkers.lease_history_is_sound(ctx, [run_id])


def _recorded_the_remote_fact(
    ctx: ExperimentContext,
    name: str,
    op: dict[str, Any],
    resources: list[dict[str, Any]],
    *,
    expected: str,
) -> None:
    """Progress: the operation succeeded with the id of the resource the tool made."""
    ctx.progress(
        name,
        op["status"] == "succeeded"
        and bool(resources)
        and op["remote_id"] == resources[0]["resource_id"],
        expected=expected,
        observed=f"ledger {(op['status'], op['remote_id'])}; resources "
        f"{[r['resource_id'] for r in resources]}",
    )


def _operation(ctx: ExperimentContext, run_id: str, op_id: str) -> dict[str, Any]:
    return next(o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id)


def _claim_expired(ctx: ExperimentContext, run_id: str, op_id: str, whose: str) -> dict[str, Any]:
    """The operation once dispatching, after waiting for that claim's deadline
    to pass by database time."""
    first: dict[str, Any] = wait_for(
        lambda: next(
            (
                o
                for o in checkers.ledger(ctx, run_id)
                if o["operation_id"] == op_id and o["status"] == "dispatching"
            ),
            None,
        ),
        what=whose,
        timeout_s=10,
    )
    _past_deadline(ctx, op_id, whose)
    return first


def _past_deadline(ctx: ExperimentContext, op_id: str, whose: str) -> None:
    """Wait until the operation's dispatch claim is past its deadline by database time."""
    wait_for(
        lambda: ctx.env.query(
            "SELECT dispatch_until <= clock_timestamp() AS over "
            "FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [op_id],
        )[0]["over"],
        what=f"{whose} to pass its deadline by database time",
        timeout_s=10,
    )


def _frozen_at(
    ctx: ExperimentContext, run_id: str, point: str, env: dict[str, str | None] | None = None
) -> tuple[WorkerProcess, Hit, SignalRecord]:
    """A ``run`` worker A on ``run_id``, SIGSTOPped right after ``point`` with
    its heartbeat parked between two renewals; A, its hit at ``point``, the
    stop's record. Parked, because resumed, a renewal that was in flight when
    A froze (it times out) or one refused at once would cancel A before its
    dispatcher decides, and the state the variant probes would never be
    reached (a worker without the deadline check went uncaught at load 8, its
    heartbeat winning the race). Parked, a renewal can only wait."""
    ctx.arm("A", point, Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], env=env)
    hit = ctx.reached("A", point)
    ctx.arm("A", "before_renew", Hold())
    ctx.reached("A", "before_renew", held=True)
    stopped = ctx.pause(a)
    # The barrier's answer waits in A's socket: A reads it the moment it runs.
    ctx.release("A", point)
    return a, hit, stopped


def _frozen_dispatcher(ctx: ExperimentContext, clock_behind_s: float | None = None) -> None:
    """A frozen right after its dispatch claim, before its call; resumed only
    after B took over and converged the operation with a claim of its own.
    With ``clock_behind_s``, A's wall clock runs that far behind the database's
    (blind hunt 13 #06: a claim's deadline taken from the database's
    ``dispatch_until`` and compared with the worker's wall clock is right on
    one host only)."""
    run_id = new_run(ctx, tool="idem")
    a, hit, stopped = _frozen_at(
        ctx, run_id, "after_dispatch_claim_commit", env=_clock_behind(clock_behind_s)
    )
    if clock_behind_s is not None:
        _clock_was_behind(ctx, a, clock_behind_s)
    claim_a = next(
        (o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == hit.operation_id), None
    )
    # B is started while A's lease is still live (A froze right after its
    # claim): a targeted takeover waits for that lease to run out, and never
    # takes "held" for "nothing to take over" (blind hunt 11 #02).
    live = ctx.sql(
        "A's lease when B starts",
        "SELECT lease_expires_at > clock_timestamp() AS live FROM fencecheck_model.agent_runs "
        "WHERE run_id = %s",
        [run_id],
    )
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    ctx.command(f"B started with A's lease {'live' if live and live[0]['live'] else 'gone'}")
    code_b = finish(ctx, b)
    after_b = checkers.run_row(ctx, run_id, "the run once B exited")
    # The state is reached with B started under A's live lease; one that gave
    # up at once is judged here, not taken for a fault that did not happen.
    gave_up = code_b == 0 and after_b["epoch"] <= (hit.epoch or 0)
    ctx.invariant(
        "a targeted takeover started under a live lease waits for it, never gives up",
        not gave_up,
        expected="B (run --run-id --once) took the run over once A's lease ran out, or exited "
        "otherwise than 0 (nothing to take over is no answer while the run is live)",
        observed=f"B exit {code_b}; run {after_b['status']} at epoch {after_b['epoch']} "
        f"(A's {hit.epoch})",
    )
    converged = next(
        (o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == hit.operation_id), None
    )
    state_a = a.kernel_state()
    # Counted, not timed: A writes nothing while stopped, so its records past
    # these are its own after the resume (its clock may be set back).
    records = len(load_history([a.events_path]))
    resumed = ctx.resume(a)
    decided = _dispatcher_moved_on(ctx, a, run_id, resumed.sent_at, records)
    ctx.release("A", "before_renew")
    code_a = finish(ctx, a)
    run_row = checkers.run_row(ctx, run_id)
    ctx.fault(
        "A was frozen between its claim and its call while B took over and claimed anew",
        stopped.state == "stopped"
        and state_a == "stopped"
        and claim_a is not None
        and claim_a["status"] == "dispatching"
        and (
            gave_up
            or (
                converged is not None
                and converged["revision"] > claim_a["revision"]
                and run_row["epoch"] > (hit.epoch or 0)
            )
        ),
        expected="A stopped in the kernel right after its claim (ledger dispatching by A), "
        "still stopped when B had finished, B's claims after A's, the run at a newer epoch",
        observed=f"A {stopped.state!r} then {state_a!r}; A's claim "
        f"{claim_a and (claim_a['status'], claim_a['dispatch_owner'], claim_a['revision'])}; "
        f"after B {converged and (converged['status'], converged['revision'])}; run epoch "
        f"{run_row['epoch']} (A's {hit.epoch}); A resumed at {resumed.confirmed_at}",
    )
    ctx.fault(
        "A's dispatcher moved on while its renewals stayed parked",
        decided is not None,
        expected="after A resumed, and before its heartbeat was let go: A exited, sent a "
        "request, or recorded a step other than a renewal",
        observed=decided or "none of these within 5 s of the resume",
    )
    _sent_nothing_once_resumed(
        ctx, run_id, resumed.sent_at, "the frozen dispatcher", "A", f" (A exit {code_a})"
    )
    resources = [
        r
        for r in checkers.tool_resources(ctx, run_id=run_id)
        if r["operation_id"] == hit.operation_id
    ]
    ctx.equal("one real resource", len(resources), 1, what="resources for the operation")
    ctx.progress_equal(
        "the successor finished the run",
        run_row["status"],
        "succeeded",
        what=f"run status (B exit {code_b})",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _clock_behind(behind_s: float | None) -> dict[str, str | None] | None:
    """The environment that sets a worker's wall clock back, or None."""
    if behind_s is None:
        return None
    try:
        return dict(clock_skew.skewed_env(behind_s))
    except clock_skew.ClockSkewUnavailable as exc:
        raise Inconclusive(str(exc)) from exc


def _clock_was_behind(ctx: ExperimentContext, a: WorkerProcess, behind_s: float) -> None:
    """The skew took effect: on this host (the harness's own probe under the same
    preload) and in A itself (its first history record, stamped with its wall
    clock, reads earlier than the harness started A by nearly the whole skew).
    A worker that reads the clock without the C library is not moved: unknown."""
    probe = clock_skew.measure(behind_s)
    records = load_history([a.events_path])
    first = min((e.time for e in records), default=None)
    lag = None if first is None or a.started_at is None else a.started_at - first
    least = behind_s - 2.0
    ctx.fault(
        f"A's wall clock ran {behind_s:g} s behind the database's",
        probe.behind_s >= least and lag is not None and lag >= least,
        expected=f"the harness's probe and A's first history record both read their clock at "
        f"least {least:g} s behind the harness's (the database's host) at the time",
        observed=f"probe {probe.behind_s:.3f} s behind ({probe.detail}); A's first record "
        + (f"{lag:.3f} s before A was started" if lag is not None else "missing")
        + " (a program that reads the clock without the C library, such as a Go binary, is "
        "not moved: its mapping declares clock_skew: false)",
    )


def _frozen_reconciler(ctx: ExperimentContext) -> None:
    """R1 frozen right after its same-key resend's claim, before its call;
    resumed only after R2 expired that claim and converged the operation
    with a resend of its own (blind bug hunt round 5, #14: a resend claim
    without the dispatcher's own deadline sent once resumed)."""
    point = "after_dispatch_claim_commit"
    run_id = new_run(ctx, tool="idem")
    # Killed before its call: the tool knows nothing, so the reconciler's query
    # finds nothing and only a same-key resend can converge the operation.
    ctx.arm("A", point, Crash())
    code_a = finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"]))
    wait_claimable(ctx, run_id)  # A's claim expired by database time
    ctx.arm("R1", point, Hold())
    r1 = ctx.env.start_worker("R1", "ops")
    pending = ctx.op_async(r1, "reconcile", {})
    hit = ctx.reached("R1", point)
    op_id = str(hit.operation_id)
    claim_r1 = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), None)
    stopped = ctx.pause(r1)
    # The barrier's answer waits in R1's socket: R1 reads it the moment it runs.
    ctx.release("R1", point)
    wait_claimable(ctx, run_id)  # R1's claim expired by database time
    ctx.ok(ctx.env.start_worker("R2", "ops"), "reconcile")
    converged = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), None)
    state_r1 = r1.kernel_state()
    resumed = ctx.resume(r1)
    answered = seen_within(
        lambda: pending.done() or not r1.is_alive(),
        what="R1 to answer its reconcile once resumed",
        timeout_s=10,
    )
    if answered and pending.done():
        pending.result(1.0)  # logged with the experiment's requests
    ctx.fault(
        "R1 was frozen between its resend's claim and its call while R2 expired the claim and "
        "converged the operation",
        stopped.state == "stopped"
        and state_r1 == "stopped"
        and claim_r1 is not None
        and claim_r1["status"] == "dispatching"
        and converged is not None
        and converged["status"] == "succeeded"
        and converged["revision"] > claim_r1["revision"],
        expected="A killed after its claim (exit -9); R1 stopped in the kernel right after "
        "its claim (dispatching), still stopped when R2 had converged the operation "
        "(succeeded, a later ledger revision)",
        observed=f"A exit {code_a}; R1 {stopped.state!r} then {state_r1!r}; R1's claim "
        f"{claim_r1 and (claim_r1['status'], claim_r1['dispatch_owner'], claim_r1['revision'])}"
        f"; after R2 {converged and (converged['status'], converged['revision'])}",
    )
    _sent_nothing_once_resumed(
        ctx, run_id, resumed.sent_at, "the frozen reconciler", "R1",
        "" if answered else " (R1 had not answered within 10 s)",
    )  # fmt: skip
    resources = [
        r for r in checkers.tool_resources(ctx, run_id=run_id) if r["operation_id"] == op_id
    ]
    ctx.equal("one real resource", len(resources), 1, what="resources for the operation")
    checkers.lease_history_is_sound(ctx, [run_id])


def _sent_nothing_once_resumed(
    ctx: ExperimentContext, run_id: str, since: float, who: str, name: str, note: str
) -> None:
    """No create request of the run reached the tool after ``since`` (when the
    frozen ``name`` was resumed: its claim expired while it was frozen)."""
    late = [r for r in checkers.tool_requests(ctx, run_id=run_id) if r["received_at"] >= since]
    ctx.invariant(
        f"{who} sent nothing once resumed",
        not late,
        expected=f"no create request reaches the tool after {name} resumed (its claim expired "
        "while it was frozen)",
        observed=f"requests after {name} resumed: {[(r['seq'], r['epoch']) for r in late]}{note}",
    )


def _resend_at_window_end(ctx: ExperimentContext) -> None:
    """A reconciler asks when less than one claim length of the tool's key
    window is left (blind bug hunt round 6, #02: the claim judged by its
    start, not its end, was granted and the resend could land after it)."""
    point = "after_dispatch_claim_commit"
    run_id = new_run(ctx, tool="idem")
    # Registered and dispatched through ops (E[retention_expired] takes the
    # workflow's path): every path that registers an intent must record the
    # tool's key window the reconciler's claim is bound by.
    registrar = ctx.env.start_worker("W", "ops")
    early_op = _first_lookup_meets_a_cut_link(ctx, registrar)
    op_id = intent_registered(ctx, registrar, run_id, tool="idem", step_id="e.label")
    _window_recorded_once_the_tool_answers(ctx, early_op, op_id)
    # A dies before its call: the tool knows nothing.
    code_a = crash_in_op(ctx, "A", point, "dispatch", {"operation_id": op_id})
    ttl_s = ctx.env.dispatch_ttl_ms / 1000
    # Nine tenths of a claim length before the end: the query and the claim
    # that follow it come later (a loaded machine: up to half a second),
    # still inside the last claim length. R is up before the wait begins.
    ask_at = WINDOW_END_RETENTION_S - ttl_s * 9 / 10  # seconds after the first dispatch
    reconciler = ctx.env.start_worker("R", "ops")
    _since_first_dispatch(ctx, op_id, ask_at, f"{ask_at:.2f}s after the first dispatch of {op_id}")
    reply = ctx.op(reconciler, "reconcile")
    first = ctx.sql(
        "the first dispatch, by the database clock",
        "SELECT extract(epoch FROM first_dispatched_at) AS at FROM "
        "fencecheck_model.tool_operations WHERE operation_id = %s",
        [op_id],
    )[0]["at"]
    ends = float(first) + WINDOW_END_RETENTION_S
    asked = [
        float(q["received_at"])
        for q in checkers.tool_log(ctx)["queries"]
        if q.get("operation_id") == op_id
    ]
    ctx.fault(
        "the reconciler asked within the last claim length of the tool's key window",
        code_a == -9 and any(ends - ttl_s < at < ends for at in asked),
        expected=f"A killed after its claim (exit -9); the reconciler's query of {op_id} between "
        f"{ttl_s:g}s before the window's end and its end ({WINDOW_END_RETENTION_S:g}s after the "
        "first dispatch)",
        observed=f"A exit {code_a}; queries at {[round(at - ends, 3) for at in asked]}s from the "
        f"window's end; reconcile reply {'ok' if reply.ok else reply.error}",
    )
    # Past the window, another cycle: no resend claim either.
    _since_first_dispatch(
        ctx, op_id, WINDOW_END_RETENTION_S, f"the end of the tool's key window for {op_id}"
    )
    later = ctx.op(reconciler, "reconcile")
    resources = [
        r for r in checkers.tool_resources(ctx, run_id=run_id) if r["operation_id"] == op_id
    ]
    ctx.invariant(
        "at most one real resource",
        len(resources) <= 1,
        expected="the tool made at most one resource for the operation",
        observed=f"{len(resources)} resource(s) (the later cycle "
        f"{'ok' if later.ok else later.error})",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _first_lookup_meets_a_cut_link(ctx: ExperimentContext, registrar: WorkerProcess) -> str:
    """The registrar's first intent, for another run, is registered while its link
    to the tool is down: it cannot ask the tool for its key window and rightly
    records none. The link is healed before the experiment's own intent (blind
    bug hunt round 12, #12: a client that kept the default tool set after one
    failed /health recorded no window for every later intent of the process)."""
    early_run = new_run(ctx, tool="idem")
    ctx.cut("worker_tool")
    try:
        early_op = intent_registered(ctx, registrar, early_run, tool="idem", step_id="e.label")
    finally:
        ctx.heal("worker_tool")
    ctx.command(f"the registrar's first intent {early_op} registered with the tool's link cut")
    return early_op


def _window_recorded_once_the_tool_answers(
    ctx: ExperimentContext, early_op: str, op_id: str
) -> None:
    """Once the link is healed, the same process asks the tool again: its next
    intent records the window the tool declares. Not judged where the mapping
    records no window, or where the first intent recorded one anyway (the
    process learnt the window before the cut: the state was not reached)."""
    judges = "an intent registered once the tool answers again records the tool's key window"
    declared_ms = int(WINDOW_END_RETENTION_S * 1000)
    mapped = ctx.env.query(
        f"SELECT EXISTS (SELECT 1 FROM {DECLARED} WHERE relation = 'tool_operations' "
        "AND column_name = 'retention_ms') AS mapped"
    )[0]["mapped"]
    rows = {
        str(r["operation_id"]): r["retention_ms"]
        for r in ctx.sql(
            "the window each of the registrar's intents recorded",
            "SELECT operation_id, retention_ms FROM fencecheck_model.tool_operations "
            "WHERE operation_id = ANY(%s)",
            [[early_op, op_id]],
        )
    }
    if not ctx.probe_reached(
        "the registrar's first capability lookup met the tool's link cut",
        bool(mapped) and early_op in rows and rows[early_op] is None,
        judges=judges,
        expected=f"the mapping records retention_ms; the intent {early_op} registered with the "
        "link cut records none",
        observed=f"mapped: {mapped}; recorded {rows}",
    ):
        return
    ctx.invariant(
        judges,
        rows.get(op_id) == declared_ms,
        expected=f"{op_id}, registered by the same process after the link healed, records "
        f"retention_ms {declared_ms} (the tool's idempotency_retention_s "
        f"{WINDOW_END_RETENTION_S:g}); a window left unrecorded bounds no resend",
        observed=f"recorded {rows.get(op_id)}",
    )


def _since_first_dispatch(ctx: ExperimentContext, op_id: str, seconds: float, what: str) -> None:
    """Wait until ``seconds`` after the operation's first dispatch, by the database clock."""
    wait_for(
        lambda: ctx.env.query(
            "SELECT clock_timestamp() >= first_dispatched_at + %s * interval '1 s' AS due "
            "FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [seconds, op_id],
        )[0]["due"],
        what=f"{what} (database clock)",
        timeout_s=10,
    )


def _frozen_before_claim(ctx: ExperimentContext) -> None:
    """A frozen after registering its intent, before claiming it for dispatch,
    past its lease; B takes the run over and leaves the intent prepared. A
    dispatch claim is not fenced by the run's lease (the ledger's claim is),
    so A, resumed, may claim and send it: then its request must carry the
    run's epoch as it stood at the claim, never A's own lapsed one (global
    effect.sent_only_under_a_dispatch_claim), and the tool acts once. A that
    gives up instead (its lease lost) is as good: nothing may be sent twice."""
    run_id = new_run(ctx, tool="idem")
    a, hit, stopped = _frozen_at(ctx, run_id, "after_outbound_intent_commit")
    wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "ops")
    lease_b = ctx.ok(b, "claim", run_id=run_id)
    before = next(
        (o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == hit.operation_id), None
    )
    state_a = a.kernel_state()
    # Counted, not timed: A writes nothing while stopped, so its records past
    # these are its own after the resume (its clock may be set back).
    records = len(load_history([a.events_path]))
    resumed = ctx.resume(a)
    decided = _dispatcher_moved_on(ctx, a, run_id, resumed.sent_at, records)
    ctx.release("A", "before_renew")
    code_a = finish(ctx, a)
    ctx.fault(
        "A was frozen past its lease between its intent and its dispatch claim while B took over",
        stopped.state == "stopped"
        and state_a == "stopped"
        and before is not None
        and before["status"] == "prepared"
        and int(lease_b["epoch"]) > (hit.epoch or 0),
        expected="A stopped in the kernel right after its intent committed, still stopped when "
        "B held the run at a newer epoch, the intent still prepared",
        observed=f"A {stopped.state!r} then {state_a!r}; intent "
        f"{before and before['status']}; B's epoch {lease_b['epoch']} (A's {hit.epoch})",
    )
    ctx.fault(
        "A's workflow moved on while its renewals stayed parked",
        decided is not None,
        expected="after A resumed, and before its heartbeat was let go: A exited, sent a "
        "request, or recorded a step other than a renewal",
        observed=decided or "none of these within 5 s of the resume",
    )
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.invariant(
        "a request sent after the takeover carries the run's epoch, not the sender's lapsed one",
        all(int(r["epoch"]) >= int(lease_b["epoch"]) for r in sent),
        expected=f"every create of the run at epoch {lease_b['epoch']} or later (B's), none at "
        f"A's {hit.epoch}",
        observed=f"requests {[(r['seq'], r['epoch'], r['outcome']) for r in sent]} (A exit {code_a})",
    )
    _at_most_one_resource(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _at_most_one_resource(ctx: ExperimentContext, run_id: str) -> None:
    """A run of one tool step whose outcome may be unknown: at most one
    resource at the tool (none when nothing was sent, never two)."""
    resources = checkers.tool_resources(ctx, run_id=run_id)
    ctx.invariant(
        "at most one real resource",
        len(resources) <= 1,
        expected="the tool made at most one resource for the run",
        observed=f"{len(resources)} resource(s)",
    )


def _claim_row_held(ctx: ExperimentContext) -> None:
    """A's own prepared intent is locked by another session (the harness, as
    a reconciler or an operator mid-transaction would hold it) when A comes to
    claim it for dispatch, for ROW_HELD_S: A waits for it, asking again after
    a pause (the global worker.statements_are_paced counts its reads), then
    dispatches it once."""
    run_id = new_run(ctx, tool="idem")
    ctx.arm("A", "after_outbound_intent_commit", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    hit = ctx.reached("A", "after_outbound_intent_commit")
    op_id = str(hit.operation_id)
    with checkers.row_locked(ctx, "tool_operations", "operation_id", op_id):
        ctx.release("A", "after_outbound_intent_commit")
        released_at = time.time()
        time.sleep(ROW_HELD_S)
        held_s = time.time() - released_at
        during = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), None)
        alive = a.is_alive()
    code_a = finish(ctx, a)
    # A gone by then is A's doing, not a missed fault: it was let go into the
    # held row and must ask again; the progress check below judges the run
    # (blind hunt 64 #07: a claim FOR UPDATE NOWAIT errored and A exited 1,
    # which this fault had called "not in effect").
    ctx.fault(
        "A's intent stayed unclaimed while the harness held its ledger row",
        during is not None and during["status"] == "prepared" and held_s >= ROW_HELD_S,
        expected=f"A let go past its intent, the intent still prepared after {ROW_HELD_S} s "
        "of the harness's lock on its row",
        observed=f"intent {during and during['status']} after {held_s:.2f} s; A "
        f"{'running' if alive else f'gone (exit {code_a})'} by then",
    )
    _at_most_one_resource(ctx, run_id)
    row = checkers.run_row(ctx, run_id)
    ctx.progress_equal(
        "the run finished once the row was let go", row["status"], "succeeded", what=f"run "
        f"status (A exit {code_a})",
    )  # fmt: skip
    checkers.lease_history_is_sound(ctx, [run_id])


def _expired_claims_one_held(ctx: ExperimentContext) -> None:
    """Two expired claims of one dispatcher at the same ledger revision, the
    second held locked by another session while a reconcile runs: its reply
    lists exactly what its cycle changed (generated 02395871: an expiry whose
    condition matched any expired claim of the same owner and revision also
    moved the held one, unlisted, once let go)."""
    run_id, _registrar, first, second = _two_intents(ctx, "plain")
    tool = ctx.env.tool.client()
    tool.set_fault("plain", "hang", count=2, ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: the next two creates of run {run_id} hang until the harness lets them go")
    d = ctx.env.start_worker(
        "D",
        "ops",
        env={
            "FENCECHECK_DISPATCH_TTL_MS": str(TWO_CLAIMS_TTL_MS),
            "FENCECHECK_TOOL_TIMEOUT_MS": str(TWO_CLAIMS_TOOL_TIMEOUT_MS),
        },
    )
    ctl = control_plane(ctx)
    calls = [
        ctx.op_async(d, "dispatch", {"operation_id": op}, worker_async=True)
        for op in (first, second)
    ]
    hung = seen_within(
        lambda: len(tool.faults()["hung"]) >= 2 or None,
        what=f"D's two creates of run {run_id} to hang at the tool",
        timeout_s=10,
    )
    for op in (first, second):
        _past_deadline(ctx, op, f"D's dispatch claim of {op}")
    claims = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    pair = [claims.get(first), claims.get(second)]
    ctx.fault(
        "one dispatcher's two claims expired at the same revision",
        bool(hung)
        and all(o is not None and o["status"] == "dispatching" for o in pair)
        and len({(o or {}).get("dispatch_owner") for o in pair}) == 1
        and len({(o or {}).get("revision") for o in pair}) == 1,
        expected="both operations dispatching by one owner at one revision, past their "
        "deadlines, their creates hanging at the tool",
        observed=f"hanging {bool(hung)}; claims "
        f"{[(o or {}).get('status') for o in pair]} by "
        f"{[(o or {}).get('dispatch_owner') for o in pair]} at revisions "
        f"{[(o or {}).get('revision') for o in pair]}",
    )
    with checkers.row_locked(ctx, "tool_operations", "operation_id", second) as lock:
        cycle = ctx.op_async(ctl, "reconcile", {})
        waited = lock.answered_or_waiting(cycle, ctl.worker_id)
        ctx.command(f"the reconcile beside the held claim: {waited or 'answered'}")
    reply = cycle.result(15.0)
    after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.invariant(
        "the cycle beside the held claim expired the one it could take",
        reply.ok and after.get(first) == "unknown",
        expected=f"reconcile ok; {first} unknown (its claim expired)",
        observed=f"reconcile {reply.result if reply.ok else reply.error} "
        f"({waited or 'answered while the row was held'}); ledger {after}",
    )
    later = ctx.op(ctl, "reconcile")
    after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.progress(
        "the next cycle expired the claim once let go",
        later.ok and after.get(second) == "unknown",
        expected=f"reconcile ok; {second} unknown",
        observed=f"reconcile {later.result if later.ok else later.error}; ledger {after}",
    )
    # D's creates act now; its answers meet claims that are no longer its own.
    ctx.command(f"tool: let the hanging creates go ({tool.release()} hung)")
    for call in calls:
        call.result(15.0)
    checkers.lease_history_is_sound(ctx, [run_id])


def _two_unknown_resent(ctx: ExperimentContext) -> None:
    """Two operations of an idempotent tool unknown at the same ledger
    revision, and one reconcile cycle: each is resent under its own key and
    the reply lists both (generated 353543a5: a same-key claim without its
    operation's id also claimed every other unknown operation at that
    revision, sent only its own and left the other dispatching, unlisted).
    Then the run changes hands, and D's untargeted dispatch beside the two
    settled operations must take the run's new prepared intent (generated
    7775685a: a pick without ``status = 'prepared'`` took the oldest settled
    one, whose claim matched nothing, and answered that there was nothing to
    dispatch), sending it with the run's new epoch."""
    # W's lease outlives the case: it gives the run up at the end.
    run_id, registrar, first, second = _two_intents(ctx, "idem", lease_ttl_ms=60_000)
    tool = ctx.env.tool.client()
    tool.set_fault("idem", "arrive_held", count=2, ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id}'s next two creates are held on the network")
    d = ctx.env.start_worker(
        "D", "ops", env={"FENCECHECK_TOOL_TIMEOUT_MS": str(LOST_CALL_TIMEOUT_MS)}
    )
    for op in (first, second):
        ctx.op(d, "dispatch", operation_id=op)
    held = {str(h["operation_id"]) for h in tool.faults()["hung"]}
    before = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    pair = [before.get(first), before.get(second)]
    ctx.fault(
        "two operations of an idempotent tool unknown at one revision, their creates held",
        held >= {first, second}
        and all(o is not None and o["status"] == "unknown" for o in pair)
        and len({(o or {}).get("revision") for o in pair}) == 1,
        expected="both operations unknown at one ledger revision, both creates held on "
        "the network (a query finds nothing)",
        observed=f"held {sorted(held)}; ledger "
        f"{[((o or {}).get('status'), (o or {}).get('revision')) for o in pair]}",
    )
    ctl = control_plane(ctx)
    started = time.time()
    cycle = ctx.op(ctl, "reconcile")
    after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.progress(
        "one cycle resent both unknown operations under their own keys",
        cycle.ok and after.get(first) == "succeeded" and after.get(second) == "succeeded",
        expected=f"reconcile ok; {first} and {second} succeeded (the tool's query found "
        "neither, so each was resent with its key)",
        observed=f"reconcile {cycle.result if cycle.ok else cycle.error}; ledger {after}",
        since=started,
    )
    # The calls still on the network are lost there now: the resends did their work.
    ctx.command(f"tool: drop the held creates ({tool.release(drop=True)} held)")
    # The run changes hands before its next intent, and D, the process that
    # dispatched its first two at the old epoch, takes it: its request must
    # carry the new epoch (global effect.sent_only_under_a_dispatch_claim;
    # blind hunt 44 #03 and #10: a run's epoch kept per dispatcher process).
    given = checkers.run_row(ctx, run_id, "the run before it changes hands")
    ctx.ok(registrar, "release", run_id=run_id, epoch=given["epoch"])
    taken = ctx.ok(ctx.env.start_worker("W2", "ops"), "claim", run_id=run_id)
    name = "an untargeted dispatch beside settled operations took the prepared one"
    if ctx.probe_reached(
        "the run changed hands between D's dispatches",
        int(taken["epoch"]) > int(given["epoch"]),
        judges=name,
        expected=f"W2 holds the run at an epoch past {given['epoch']}",
        observed=f"W2's epoch {taken['epoch']}",
    ):
        third = _another_intent(ctx, ctx.env.workers["W2"], run_id, "e.third")
        started = time.time()
        picked = ctx.op(d, "dispatch")
        after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
        ctx.progress(
            name,
            picked.ok and after.get(third) == "succeeded",
            expected=f"dispatch ok; {third} (the run's only prepared intent) succeeded",
            observed=f"dispatch {picked.result if picked.ok else picked.error}; ledger {after}",
            since=started,
        )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _refused_beside_own_claim(ctx: ExperimentContext) -> None:
    """One dispatcher's three claims at the same ledger revision, two of them
    (``second`` and ``twin``, one request body under two steps) hanging at the
    tool while the third's create is refused with 429: only the refused claim
    goes back to prepared (generated d3f4a5b2 and c3cdaa69: a return without
    its operation's id sent every claim of that owner and revision back,
    though the hanging requests may still act). Let go, each answer lands on
    its own operation (generated 9b38b4b1: a result write whose condition
    bound as "this claim, or any operation at this revision with this body"
    also wrote one twin's resource over the other)."""
    run_id, registrar, first, second = _two_intents(ctx, "idem", lease_ttl_ms=60_000)
    twin = _another_intent(ctx, registrar, run_id, "e.twin", request={"kind": "e.second"})
    before = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    digests = {
        str(r["operation_id"]): str(r["request_digest"])
        for r in ctx.env.query(
            "SELECT operation_id, request_digest FROM fencecheck_model.tool_operations"
            " WHERE run_id = %s",
            [run_id],
        )
    }
    tool = ctx.env.tool.client()
    tool.set_fault("idem", "hang", count=2, ms=HELD_MAX_MS, run_id=run_id)
    tool.set_fault("idem", "reject_429", count=1, run_id=run_id)
    ctx.command(f"tool: run {run_id}'s next two creates hang, the one after them gets 429")
    # Claims and tool calls that outlive the case: only the answers settle them.
    d = ctx.env.start_worker(
        "D",
        "ops",
        env={
            "FENCECHECK_DISPATCH_TTL_MS": str(LIVE_CLAIM_MS),
            "FENCECHECK_TOOL_TIMEOUT_MS": str(LIVE_CLAIM_MS),
        },
    )
    hanging = []
    for op in (second, twin):
        hanging.append(ctx.op_async(d, "dispatch", {"operation_id": op}, worker_async=True))
        _hanging_at_the_tool(tool, op, f"D's create of {op}")
    refused = ctx.op(d, "dispatch", operation_id=first)
    ops = (first, second, twin)
    creates = {
        str(r["operation_id"]): r.get("outcome") for r in checkers.tool_requests(ctx, run_id=run_id)
    }
    hung = {str(h["operation_id"]) for h in tool.faults()["hung"]}
    ctx.fault(
        "one dispatcher's three claims at one revision: two creates hanging, one refused",
        hung >= {second, twin}
        and creates.get(first) == "rejected_429"
        and len({(before.get(op) or {}).get("revision") for op in ops}) == 1
        and digests.get(second) == digests.get(twin) is not None,
        expected=f"three intents prepared at one revision, {second} and {twin} of one request "
        f"body; their creates hanging at the tool, {first}'s answered 429",
        observed=f"hanging {sorted(hung)}; creates {creates}; (revision, digest) "
        f"{[((before.get(op) or {}).get('revision'), digests.get(op, '')[:8]) for op in ops]}",
    )
    after = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    ctx.invariant(
        "a 429 returns only its own claim",
        [(after.get(op) or {}).get("status") for op in (first, second, twin)]
        == ["prepared", "dispatching", "dispatching"],
        expected=f"{first} prepared; {second} and {twin} dispatching (their requests may "
        "still act)",
        observed=f"dispatch of {first}: {refused.result if refused.ok else refused.error}; "
        f"ledger {[(k, o['status'], o['revision']) for k, o in after.items()]}",
    )
    ctx.command(f"tool: let the hanging creates go ({tool.release()} hung)")
    answers = [call.result(15.0) for call in hanging]
    status = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    ctx.progress(
        "the hanging calls' answers were recorded",
        all(a.ok for a in answers) and status.get(second) == status.get(twin) == "succeeded",
        expected=f"both dispatches ok; {second} and {twin} succeeded",
        observed=f"dispatches {[a.result if a.ok else a.error for a in answers]}; ledger {status}",
    )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _hanging_at_the_tool(tool: ToolClient, op_id: str, what: str) -> None:
    """Wait until ``op_id``'s create hangs at the tool (fault ``hang``)."""
    seen_within(
        lambda: [h for h in tool.faults()["hung"] if h["operation_id"] == op_id] or None,
        what=f"{what} to hang at the tool",
        timeout_s=10,
    )


def _two_intents(
    ctx: ExperimentContext, tool: str, lease_ttl_ms: int | None = None
) -> tuple[str, WorkerProcess, str, str]:
    """A new run of ``tool`` with two prepared intents, registered by an ``ops``
    process W that claimed it (its lease ``lease_ttl_ms`` long, if given): the
    run, W and the two operation_ids, in the order registered."""
    run_id = new_run(ctx, tool=tool)
    env: dict[str, str | None] = {}
    if lease_ttl_ms is not None:
        env["FENCECHECK_LEASE_TTL_MS"] = str(lease_ttl_ms)
    registrar = ctx.env.start_worker("W", "ops", env=env)
    first = intent_registered(ctx, registrar, run_id, tool=tool, step_id="e.label")
    return run_id, registrar, first, _another_intent(ctx, registrar, run_id, "e.second", tool)


def _another_intent(
    ctx: ExperimentContext,
    registrar: WorkerProcess,
    run_id: str,
    step: str,
    tool: str = "idem",
    request: dict[str, Any] | None = None,
) -> str:
    """One more intent of ``tool`` on ``run_id`` (its request ``request``, or
    one naming the step), registered by the ``ops`` process that holds its
    lease; its operation_id."""
    row = checkers.run_row(ctx, run_id, f"the run before intent {step}")
    return str(
        ctx.ok(
            registrar,
            "register_intent",
            run_id=run_id,
            epoch=row["epoch"],
            expected_revision=row["revision"],
            step_id=step,
            effect_version=1,
            tool=tool,
            request=request or {"kind": step},
        )["operation_id"]
    )


def _answer_after_lease_lost(ctx: ExperimentContext) -> None:
    """A's result write is refused for its lease while its dispatch claim is
    live: the tool's answer is recorded on the ledger under that claim, never
    lost (blind hunt 40 #09: the Go worker compared the refusal with ``==``
    instead of ``errors.Is`` and dropped the answer; a tool with neither
    query nor key then leaves the run to a person). Beside it A2, whose
    create the tool refuses for good (422): that answer is as final and is
    recorded too (blind hunt 49 #02: only a success was kept)."""
    point = "after_tool_response_before_tx2_commit"
    cases = {"A": new_run(ctx, tool="plain"), "A2": new_run(ctx, tool="plain")}
    approved = ctx.system.capabilities.offers_op("decide")
    refusals = 2 if approved else 1
    ctx.env.tool.client().set_fault("plain", "reject_final", count=refusals, run_id=cases["A2"])
    ctx.command(f"tool: run {cases['A2']}'s first {refusals} create(s) refused for good (422)")
    if approved:
        _refused_then_approved(ctx, cases["A2"])
    frozen = _freeze_after_lease_lost(ctx)
    env: dict[str, str | None] = {"FENCECHECK_DISPATCH_TTL_MS": str(LIVE_CLAIM_MS)}
    workers, hits = {}, {}
    for name, run_id in cases.items():
        ctx.arm(name, point, Hold())
        workers[name] = ctx.env.start_worker(name, "run", ["--run-id", run_id, "--once"], env=env)
    for name in cases:
        hits[name] = ctx.reached(name, point)
        ctx.arm(name, "before_renew", Hold())
    for name, run_id in cases.items():
        ctx.reached(name, "before_renew", held=True)
        checkers.wait_lease_expired(ctx, run_id)
    t = ctx.env.start_worker("T", "ops")
    taken = {name: ctx.ok(t, "claim", run_id=run_id) for name, run_id in cases.items()}
    answers = {"A": "created", "A2": "rejected_final"}
    created = {
        name: [
            r
            for r in checkers.tool_requests(ctx, run_id=run_id)
            if r.get("operation_id") == str(hits[name].operation_id)
        ]
        for name, run_id in cases.items()
    }
    claims = {
        name: ctx.sql(
            f"{name}'s dispatch claim after the takeover",
            "SELECT status, dispatch_until > clock_timestamp() AS live "
            "FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [str(hits[name].operation_id)],
        )
        for name in cases
    }
    ctx.fault(
        "A and A2 held the tool's answers while another session took their runs over, their "
        "claims live",
        all(
            [r["outcome"] for r in created[name]] == [answers[name]]
            and taken[name]["epoch"] > (hits[name].epoch or 0)
            and [(c["status"], c["live"]) for c in claims[name]] == [("dispatching", True)]
            for name in cases
        ),
        expected=f"the tool's answers {answers}; each run taken over at an epoch above its "
        "holder's; each operation dispatching under its holder's live claim",
        observed="; ".join(
            f"{name}: tool {[r['outcome'] for r in created[name]]}, epoch {hits[name].epoch} -> "
            f"{taken[name]['epoch']}, claim {claims[name][0] if claims[name] else 'none'}"
            for name in cases
        ),
    )
    mark = checkers.audit_mark(ctx)
    released_at = time.time()
    for name in cases:
        ctx.release(name, point)
    # The heartbeats stay parked until each holder's answer is on the ledger
    # (or it exited): a refused renewal let through first cancels the work
    # before the result write meets the lease, which is also correct, and
    # is not this case (the Go worker beside a loaded campaign: its answer
    # rightly dropped, which failed the progress check below).
    seen_within(
        lambda: (
            all(
                not w.is_alive()
                or any(
                    r["tbl"] == "tool_operations"
                    for r in checkers.changes_by(ctx, [name], after_seq=mark)
                )
                for name, w in workers.items()
            )
            or None
        ),
        what="each holder's answer on the ledger, or its exit, before its heartbeat goes on",
        timeout_s=10,
    )
    for name in cases:
        ctx.release(name, "before_renew")
    codes = {name: finish(ctx, w) for name, w in workers.items()}
    for name, run_id in cases.items():
        op_id = str(hits[name].operation_id)
        op = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), {})
        by = [
            r
            for r in checkers.changes_by(ctx, [name], after_seq=mark)
            if r["tbl"] == "tool_operations"
        ]
        remote = created[name][0]["resource_id"] if created[name] else None
        want = ("succeeded", remote) if name == "A" else ("failed_final", None)
        ctx.progress(
            f"the answer {name} held is recorded under its claim",
            (op.get("status"), op.get("remote_id")) == want and bool(by),
            expected=f"{op_id} {want[0]} with remote id {want[1]} (the tool's answer), written "
            f"by {name}'s session (its result write refused for the lease, the claim its own)",
            observed=f"ledger {(op.get('status'), op.get('remote_id'))}; {name}'s changes to "
            f"tool_operations {[(r['seq'], r['op']) for r in by]} ({name} exit {codes[name]})",
            since=released_at,
        )
        # Exit 10 is the contract's "cancelled: the lease was lost" (generated
        # 5d7611b4: the refusal swallowed after the answer was kept, the tool
        # step went on to a name never bound and the worker exited 1).
        ctx.invariant(
            f"{name} exits 10 (its lease lost)",
            codes[name] == 10,
            expected="exit 10: execution cancelled because the lease was lost",
            observed=f"{name} exit {codes[name]}",
        )
        row = checkers.run_row(ctx, run_id, f"the run once {name} exited")
        ctx.invariant(
            f"{name} wrote no checkpoint under its lost lease",
            (row["epoch"], row["revision"]) == (taken[name]["epoch"], taken[name]["revision"]),
            expected=f"the run at the takeover's epoch {taken[name]['epoch']} and revision "
            f"{taken[name]['revision']}",
            observed=f"epoch {row['epoch']}, revision {row['revision']}",
        )
        checkers.recorded_results_are_the_tools(ctx, run_id)
    _refusal_nobody_paused_for(ctx, cases["A2"], approved)
    frozen()
    checkers.lease_history_is_sound(ctx, list(cases.values()))


def _refusal_nobody_paused_for(ctx: ExperimentContext, run_id: str, approved: bool) -> None:
    """A2's refusal is on the ledger, recorded by A2 beside the lease it lost,
    and nobody paused the run for it (the same state as a worker killed
    between recording a refusal and pausing). Once the taker's lease ran out,
    the next worker of the run must pause it for a person: only a person's
    decision moves a refused step on (blind hunt 56: both references planned
    the step's next version at once and sent it; the global
    ``effect.refused_step_moved_on_only_by_a_person`` judges every run)."""
    checkers.wait_lease_expired(ctx, run_id)
    code = finish(ctx, ctx.env.start_worker("A2next", "run", ["--run-id", run_id, "--once"]))
    row = checkers.run_row(ctx, run_id, "A2's run once its next worker exited")
    ctx.progress_equal(
        "the next worker of A2's run pauses it for a person",
        (row["status"], code),
        ("paused_human", 0),
        what="run status, the worker's exit code",
    )
    ops = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    sent = [r["outcome"] for r in checkers.tool_requests(ctx, run_id=run_id)]
    versions = 2 if approved else 1
    ctx.invariant(
        "A2's refused step is not planned again without a person",
        ops == [(v, "failed_final") for v in range(1, versions + 1)]
        and sent == ["rejected_final"] * versions,
        expected=f"the ledger holds versions 1-{versions} failed_final only (version 1 refused "
        "and approved by a person first, where decide is offered); the tool saw the refused "
        "creates",
        observed=f"ledger {ops}; tool {sent}",
    )


def _refused_then_approved(ctx: ExperimentContext, run_id: str) -> None:
    """A2's run first goes the rarer way: its step's version 1 refused for good,
    the run paused for a person, who approves. A2's own refusal is then of
    version 2, and the pause of version 1 must not count for it (blind hunt 70
    #04: a worker that took any "paused for a person" mark on the step's result
    as the one for the newest refused version planned version 3 itself)."""
    code = finish(ctx, ctx.env.start_worker("A2first", "run", ["--run-id", run_id, "--once"]))
    paused = checkers.run_row(ctx, run_id, "A2's run after its first refusal")
    if paused["status"] != "paused_human":
        raise Inconclusive(
            f"A2's run is {paused['status']} after its first refusal (A2first exit {code}), "
            "not paused for a person: the approve this variant needs cannot be given"
        )
    ctx.ok(
        control_plane(ctx), "decide", run_id=run_id, decision="approve",
        reason="the customer confirmed", ticket="CS-70",
    )  # fmt: skip
    wait_claimable(ctx, run_id, timeout_s=15)


def _freeze_after_lease_lost(ctx: ExperimentContext) -> Callable[[], None]:
    """A3, its heartbeat parked, whose create (a tool with neither query nor
    key) reaches the tool only after A3's tool timeout, which comes after its
    lease ran out: the operation is unknown, nothing can settle it, and the
    freeze that would pause the run is refused for the lease. A3 must stop
    there (exit 10), not go round again (blind hunt 51 #08: the Go tool step
    took any refusal of the freeze for "it converged meanwhile" and spun,
    reconciling and freezing, until its heartbeat noticed; the global
    ``worker.statements_are_paced`` counts the spin). Started now, judged by
    the function it returns, once the other holders are done."""
    run_id = new_run(ctx, tool="plain")
    ctx.env.tool.client().set_fault(
        "plain", "arrive_late", count=1, ms=FREEZE_LATE_MS, run_id=run_id
    )
    ctx.command(f"tool: run {run_id}'s create reaches the tool {FREEZE_LATE_MS} ms late")
    ctx.arm("A3", "before_renew", Hold())
    env: dict[str, str | None] = {"FENCECHECK_TOOL_TIMEOUT_MS": str(FREEZE_TOOL_TIMEOUT_MS)}
    a3 = ctx.env.start_worker("A3", "run", ["--run-id", run_id, "--once"], env=env)

    def judge() -> None:
        unknown = seen_within(
            lambda: [o for o in checkers.ledger(ctx, run_id) if o["status"] == "unknown"] or None,
            what="A3's operation to be unknown (its tool timeout past its lease)",
            timeout_s=FREEZE_TOOL_TIMEOUT_MS / 1000 + 10,
        )
        row = checkers.run_row(ctx, run_id, "A3's run once its operation was unknown")
        expired = ctx.env.query(
            "SELECT lease_expires_at < clock_timestamp() AS expired "
            "FROM fencecheck_model.agent_runs WHERE run_id = %s",
            [run_id],
        )
        # Room for a spin to show, with the heartbeat still parked.
        time.sleep(FREEZE_WATCH_S)
        ctx.release("A3", "before_renew")
        code = finish(ctx, a3)
        if not ctx.probe_reached(
            "A3's operation unknown after its lease ran out, its heartbeat parked",
            bool(unknown) and bool(expired) and bool(expired[0]["expired"]),
            judges="a freeze refused for the lease ends the work",
            expected="A3's operation unknown, its lease expired by database time",
            observed=f"ledger {[o['status'] for o in unknown or []]}; run {row['status']}, "
            f"lease expired {expired}",
        ):
            return
        ctx.invariant(
            "a freeze refused for the lease ends the work",
            code == CANCELLED and row["status"] != "paused_indoubt",
            expected="A3 exits 10 (its lease lost); the run not paused by it",
            observed=f"A3 exit {code}; run {row['status']}",
        )

    return judge


def _superseded_claim(ctx: ExperimentContext) -> None:
    """A holds the run's lease and the tool's answer, but its dispatch claim
    expired meanwhile and the reconciler converged the operation with a claim
    of its own (a same-key retry of the idempotent tool). A's recording of its
    answer must be refused: a result is recorded only by the dispatch claim
    that holds the operation (rule 4), never over another one's."""
    point = "after_tool_response_before_tx2_commit"
    run_id = new_run(ctx, tool="idem")
    ctx.arm("A", point, Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    hit = ctx.reached("A", point)
    op_id = str(hit.operation_id)
    _past_deadline(ctx, op_id, f"A's dispatch claim on {op_id}")
    ctl = control_plane(ctx)
    ctx.ok(ctl, "reconcile")
    converged = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), {})
    held = checkers.run_row(ctx, run_id, "the run while A holds the tool's answer")
    ctx.fault(
        "A kept its lease while the reconciler converged its operation under another claim",
        converged.get("status") == "succeeded"
        and not held["lease_expired"]
        and held["epoch"] == hit.epoch,
        expected=f"operation {op_id} succeeded by the reconciler's same-key retry; A's lease "
        f"(epoch {hit.epoch}) live by database time",
        observed=f"operation {converged.get('status')} (revision {converged.get('revision')}); "
        f"run epoch {held['epoch']}, lease expired: {held['lease_expired']}",
    )
    mark = checkers.audit_mark(ctx)
    ctx.release("A", point)
    code_a = finish(ctx, a)
    late = [
        r for r in checkers.changes_by(ctx, ["A"], after_seq=mark) if r["tbl"] == "tool_operations"
    ]
    after = next((o for o in checkers.ledger(ctx, run_id) if o["operation_id"] == op_id), {})
    ctx.invariant(
        "A's answer did not overwrite the operation another claim converged",
        not late
        and (after.get("status"), after.get("revision"), after.get("remote_id"))
        == (converged.get("status"), converged.get("revision"), converged.get("remote_id")),
        expected="no change by A to the operation's ledger row once the reconciler's claim "
        "converged it",
        observed=f"A's changes to tool_operations: {[(r['seq'], r['op']) for r in late]}; "
        f"operation {(converged.get('status'), converged.get('revision'))} -> "
        f"{(after.get('status'), after.get('revision'))} (A exit {code_a})",
    )
    resources = checkers.tool_resources(ctx, run_id=run_id)
    ctx.equal("one real resource", len(resources), 1, what="resources for the run")
    row = checkers.run_row(ctx, run_id)
    if row["status"] != "succeeded":
        wait_claimable(ctx, run_id)
        b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
        finish(ctx, b)
        row = checkers.run_row(ctx, run_id)
    ctx.progress_equal(
        "the run finished on the converged result",
        row["status"],
        "succeeded",
        what=f"run status (A exit {code_a})",
    )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _dispatcher_moved_on(
    ctx: ExperimentContext, a: WorkerProcess, run_id: str, since: float, records: int
) -> str | None:
    """How A showed that its dispatcher got past its resume (its heartbeat still
    parked), or None after 5 s: ``records`` is how many history records A had
    before it. A's own account only decides when the wait ends; what A sent
    is judged from the tool's log."""

    def moved_on() -> str | None:
        if not a.is_alive():
            return f"A exited (code {a.returncode})"
        sent = [r for r in checkers.tool_requests(ctx, run_id=run_id) if r["received_at"] >= since]
        if sent:
            return f"the tool received request {sent[0]['seq']}"
        steps = [e for e in load_history([a.events_path])[records:] if e.op != "renew"]
        return f"A recorded {steps[0].type} {steps[0].op}" if steps else None

    try:
        return wait_for(moved_on, what="A's dispatcher to move on after its resume", timeout_s=5)
    except WaitTimeout:
        return None


def _outlive_retention(ctx: ExperimentContext, op_id: str) -> None:
    """Wait until the tool's key window is over by the database's clock (from the
    first dispatch), then confirm with the tool itself that it forgot the key."""
    wait_for(
        lambda: ctx.env.query(
            "SELECT clock_timestamp() > first_dispatched_at + retention_ms * interval '1 ms'"
            " + interval '200 ms' AS over FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [op_id],
        )[0]["over"],
        what=f"the tool's retention window of {op_id} to pass by database time",
        timeout_s=10,
    )
    forgotten = ctx.env.tool.client().query("idem", op_id) is None
    row = ctx.sql(
        "the ledger's record of the tool's promise",
        "SELECT retention_ms, first_dispatched_at FROM fencecheck_model.tool_operations WHERE operation_id = %s",
        [op_id],
    )
    ctx.fault(
        "the tool forgot the key before the successor came",
        forgotten and bool(row) and row[0]["retention_ms"] == int(RETENTION_S * 1000),
        expected=f"the tool's query answers not found; the ledger holds retention_ms "
        f"{int(RETENTION_S * 1000)}",
        observed=f"query not found: {forgotten}; ledger {plain(row)}",
    )


def _slow_claim_answer(ctx: ExperimentContext) -> None:
    """D's dispatch claim is answered CLAIM_ANSWER_LATE_MS late (its database
    link slowed downstream); D is held right after the claim and let go once
    the claim's deadline has passed by database time, sooner after it than
    the answer was late. A dispatcher that counts its deadline from when it
    sent the claim sees it passed and sends nothing; one that counts from the
    answer (blind bug hunt round 6, #14) believes it still holds the claim and
    sends, after the database's deadline (the global
    ``effect.sent_only_under_a_dispatch_claim`` fails it)."""
    run_id = new_run(ctx, tool="idem")
    op_id = intent_registered(
        ctx, ctx.env.start_worker("W", "ops"), run_id, tool="idem", step_id="e.label"
    )
    _let_go_past_a_slow_claim(ctx, "D", "dispatch", {"operation_id": op_id}, run_id, op_id)


def _slow_resend_claim_answer(ctx: ExperimentContext) -> None:
    """The same for a reconciler's same-key resend (blind hunt 19 #12, a resend
    deadline counted from the claim's answer): the operation is ``unknown``
    when the cycle starts, its first create lost on the network (so a query
    finds nothing), and R's resend claim is answered late. R must send
    nothing, and its reply must list the operation, whose status its cycle
    moved ``unknown -> dispatching -> unknown`` (blind hunt 19 #07: a reply
    that leaves out a move back to where it began; the global
    ``worker.reconcile_lists_every_change`` judges it)."""
    run_id = new_run(ctx, tool="idem")
    op_id = intent_registered(
        ctx, ctx.env.start_worker("W", "ops"), run_id, tool="idem", step_id="e.label"
    )
    tool = ctx.env.tool.client()
    tool.set_fault("idem", "arrive_held", ms=HELD_MAX_MS, run_id=run_id)
    ctx.command(f"tool: run {run_id[:8]}'s create of 'idem' held on the network")
    d = ctx.env.start_worker(
        "D", "ops", env={"FENCECHECK_TOOL_TIMEOUT_MS": str(LOST_CALL_TIMEOUT_MS)}
    )
    first = ctx.op(d, "dispatch", operation_id=op_id)
    lost = tool.release(drop=True)
    ctx.command(f"tool: {lost} held create(s) lost on the network (released with drop)")
    ops = [o["status"] for o in checkers.ledger(ctx, run_id)]
    if not ctx.fault(
        "the operation unknown, nothing at the tool",
        lost == 1 and ops == ["unknown"] and not checkers.tool_requests(ctx, run_id=run_id),
        expected="D's create held on the network past its tool timeout, then lost: the "
        "operation unknown, the tool's log empty",
        observed=f"D answered {plain(first.result) if first.ok else first.error}; held creates "
        f"lost {lost}; ledger {ops}",
    ):
        return
    _let_go_past_a_slow_claim(ctx, "R", "reconcile", {}, run_id, op_id)


def _let_go_past_a_slow_claim(
    ctx: ExperimentContext,
    who: str,
    op: str,
    args: dict[str, Any],
    run_id: str,
    op_id: str,
) -> None:
    """``who`` (an ``ops`` process on a link of its own) runs ``op``, whose
    claim of ``op_id`` is answered late; held right after the claim, it is let
    go past the claim's deadline by database time, within that delay: the
    tool must receive nothing for the run."""
    link_name = f"pg_{who}"
    ctx.env.add_pg_link(link_name)
    env: dict[str, str | None] = {"FENCECHECK_DISPATCH_TTL_MS": str(SLOW_CLAIM_TTL_MS)}
    d = ctx.env.start_worker(who, "ops", pg_link=link_name, env=env)
    link = ctx.env.links[link_name]
    if ctx.system.capabilities.offers_op("durability"):
        # The session's connection made before the link is slowed: a
        # handshake of several round trips under the delay only costs time.
        ctx.ok(d, "durability")
    ctx.arm(who, "after_dispatch_claim_commit", Hold())
    slow = link.latency(CLAIM_ANSWER_LATE_MS)
    ctx.command(f"toxiproxy: {slow.detail}")
    pending = ctx.op_async(d, op, args, worker_async=True)
    hit = ctx.reached(who, "after_dispatch_claim_commit")
    link.stop(slow)
    late_s = CLAIM_ANSWER_LATE_MS / 1000

    def claim_row() -> dict[str, Any]:
        return ctx.env.query(
            "SELECT dispatch_until, extract(epoch FROM dispatch_until) AS until_s, "
            "extract(epoch FROM clock_timestamp()) AS now_s, status, dispatch_owner "
            "FROM fencecheck_model.tool_operations WHERE operation_id = %s",
            [op_id],
        )[0]

    claim = claim_row()
    until_s = float(claim["until_s"] or 0)
    # Let go RELEASE_PAST_DEADLINE_S past the deadline by database time.
    seen_within(
        lambda: float(claim_row()["now_s"]) >= until_s + RELEASE_PAST_DEADLINE_S,
        what="the claim's deadline to pass by database time",
        timeout_s=10.0,
    )
    released = claim_row()
    ctx.release(who, "after_dispatch_claim_commit")
    reply = pending.result(15)
    claimed_at_s = until_s - SLOW_CLAIM_TTL_MS / 1000
    answer_late_s = hit.received_at - claimed_at_s
    past_s = float(released["now_s"]) - until_s
    # The claim's answer reached the worker at least late_s after the database
    # made it, whatever else the worker did before the point: a deadline
    # counted from that answer lies at least late_s past the database's.
    ctx.fault(
        f"{who}'s claim was answered late and {who} let go past its deadline, within that delay",
        claim["status"] == "dispatching" and answer_late_s >= late_s and 0 < past_s < late_s - 0.05,
        expected=f"{who}'s claim (dispatching, for {SLOW_CLAIM_TTL_MS} ms) answered at least "
        f"{late_s:.2f} s after the database made it; {who} let go after the claim's deadline by "
        f"database time, by less than {late_s - 0.05:.2f} s",
        observed=f"claim {claim['status']} by {claim['dispatch_owner']} until "
        f"{claim['dispatch_until']}; {who} at the point {answer_late_s:.3f} s after the claim; "
        f"let go {past_s:.3f} s past the deadline; {who} answered "
        + (f"ok {plain(reply.result)}" if reply.ok else f"{reply.error}"),
    )
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.equal(
        f"a {'dispatcher' if op == 'dispatch' else 'reconciler'} past its claim's deadline "
        "sends nothing",
        [r["outcome"] for r in sent],
        [],
        what="requests the tool received for the run (its claim expired before it went on)",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
