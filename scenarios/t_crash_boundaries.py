"""T: a crash at every boundary: SIGKILL wherever a component spans two
transactions, or a transaction and a remote call.

A component that does its work in two steps (claim, then call the tool; call
the tool, then record; lock an outbox batch, publish, then mark; read the
broker, then commit the effect; renew, then go on working) leaves a state
behind when it dies between them. The protocol is correct only if every such
state is one a successor can take over from: a successor worker, a second
relay, a second consumer, the reconciler. Each variant of T kills a worker at
one named run-side boundary (the control protocol's ``crash`` answer:
SIGKILL, no cleanup), sometimes after an earlier crash that produced the
state the boundary needs (an expired claim, an operation in doubt), and in
some also the first relay or consumer at one of theirs; then it lets the
successors run and checks liveness from evidence:

* the run succeeded, at an epoch above every crashed holder's, with exactly
  one real resource at the tool for its tool step;
* every outbox event of the run reached the broker (at least once) and is
  marked published;
* the consumer's business effect exists exactly once per event of the run.

Variant ``sigterm_between_steps``: the graceful stop instead of the crash.
A worker told to stop (SIGTERM) stops claiming, cancels the work it can and
finishes only the database transaction in progress (Chinese seed §14). A is
held right after its second checkpoint commits, signalled there and let go:
it may finish the step it had begun as the signal raced in, never begin
another (no tool request, no further write), leaves the run to a successor
(not terminal, not paused) and exits by itself; the successor finishes the
run from A's last checkpoint with no step redone.

The fault is confirmed by the control socket's own record (the crashed
worker reached the point, for this run) and the kernel's (exit by SIGKILL).
The global invariants judge the rest of the history. The table of points,
with what is committed at each, is in docs/worker-contract.md §3; points a
single other experiment already crashes at are named in ``COVERED_ELSEWHERE``.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any, Literal

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Continue, Crash, Hold
from harness.parts.processes import WorkerProcess
from scenarios.common import (
    crash_in_op,
    finish,
    finish_or_kill,
    finish_or_take_over,
    new_run,
    wait_claimable,
    workflow_steps,
)

Stage = Literal["run", "relay", "consume"]
CONSUMER = "billing"


@dataclass(frozen=True)
class Boundary:
    """One row of the table: the point crashed at (``name`` is its short name), in
    which component, and the crashes before it that produce the state it needs."""

    name: str
    point: str
    component: str
    stage: Stage
    committed: str
    before: tuple[str, ...] = ()
    tool: str = "idem"
    input: tuple[tuple[str, Any], ...] = ()
    wait_s: float = 0.0
    #: The ledger status the point promises committed for the run's operation
    #: when its worker dies there (judged at once, before any successor).
    ledger_after: str | None = None

    @property
    def run_crashes(self) -> tuple[str, ...]:
        """The points ``run``-mode workers die at, one worker each, in order."""
        return self.before + ((self.point,) if self.stage == "run" else ())


BOUNDARIES: tuple[Boundary, ...] = (
    Boundary(
        "lease_acquired", "after_lease_acquired", "claim", "run",
        "the claim (epoch +1, owner, expiry); no work", wait_s=0.8,
    ),
    Boundary(
        "renew", "after_renew_commit", "heartbeat", "run",
        "a renewal: the lease lives one more lease duration with nobody working",
        input=(("step_delay_ms", 400),), wait_s=0.8,
    ),
    Boundary(
        "intent", "after_outbound_intent_commit", "checkpoint writer / dispatcher", "run",
        "the intent checkpoint and its ledger row (prepared) and outbox event; nothing "
        "claimed", wait_s=0.8,
    ),
    Boundary(
        "claim", "after_dispatch_claim_commit", "dispatcher", "run",
        "the dispatch claim (dispatching, with a deadline); the tool not called", wait_s=0.8,
    ),
    Boundary(
        "claims_expired", "after_claims_expired_commit", "reconciler", "run",
        "an expired claim turned unknown; nobody has asked the tool yet",
        before=("after_dispatch_claim_commit",), wait_s=1.6,
    ),
    Boundary(
        "reconcile_query", "after_reconcile_query", "reconciler", "run",
        "nothing new: the tool answered the query (it has the resource), the answer is "
        "recorded nowhere", before=("after_tool_response_before_tx2_commit",),
        tool="queryable", wait_s=1.6,
    ),
    Boundary(
        "dispatch_outcome", "after_dispatch_outcome_commit", "reconciler / dispatcher", "run",
        "a ledger-only outcome (here the reconciler's convergence by query: succeeded); the run "
        "not moved", before=("after_tool_response_before_tx2_commit",), wait_s=1.6,
        ledger_after="succeeded",
    ),
    Boundary(
        "relay_locked", "after_outbox_batch_locked", "outbox relay", "relay",
        "nothing: the batch is locked in an open transaction, nothing published",
    ),
    Boundary(
        "relay_marked", "after_outbox_mark_commit", "outbox relay", "relay",
        "the batch published and marked",
    ),
    Boundary(
        "consumer_read", "after_consumer_read", "consumer", "consume",
        "nothing: messages read from the broker, no dedup row, no effect",
    ),
    Boundary(
        "consumer_commit", "after_consumer_dedup_commit", "consumer", "consume",
        "one event's dedup row and its business effect, together",
    ),
)  # fmt: skip

# Boundaries another experiment already crashes a worker at, and where.
COVERED_ELSEWHERE: dict[str, str] = {
    "after_checkpoint_commit": "I (successor resumes, no step redone)",
    "after_tool_response_before_tx2_commit": "E (every tool capability) and J (no promise)",
    "after_broker_ack_before_outbox_mark": "L (message repeats, effect once)",
}

BY_POINT = {b.point: b for b in BOUNDARIES}

# The same point on a second path: a dispatcher's own answer recorded without
# the run's lease (here a reconciler's same-key resend, after A died between
# its claim and its call: the query finds nothing), not a convergence by
# query. The point promises that answer committed (blind hunt 54 #08: a Go
# point moved before its commit; generated f836aac1: a point not reached).
RESEND_OUTCOME = Boundary(
    "resend_outcome", "after_dispatch_outcome_commit", "reconciler's same-key resend", "run",
    "a ledger-only outcome (here a same-key resend's answer: succeeded); the run not moved",
    before=("after_dispatch_claim_commit",), wait_s=1.6, ledger_after="succeeded",
)  # fmt: skip
#: Boundaries of the table crashed at once more, on another path to their point.
SECOND_PATHS: tuple[Boundary, ...] = (RESEND_OUTCOME,)

# A variant crashes at one run-side boundary and, where one is left, at one relay
# and one consumer boundary too: the relay and the consumer run after every run
# anyway, so riding along costs a process, not an environment (7 variants for 11
# boundaries). Each crash is confirmed and judged on its own.
VARIANTS: dict[str, tuple[Boundary, ...]] = {
    "lease_acquired": (BY_POINT["after_lease_acquired"], BY_POINT["after_outbox_batch_locked"]),
    "renew": (BY_POINT["after_renew_commit"], BY_POINT["after_outbox_mark_commit"]),
    "intent": (BY_POINT["after_outbound_intent_commit"], BY_POINT["after_consumer_read"]),
    "claim": (BY_POINT["after_dispatch_claim_commit"], BY_POINT["after_consumer_dedup_commit"]),
    "claims_expired": (BY_POINT["after_claims_expired_commit"],),
    "reconcile_query": (BY_POINT["after_reconcile_query"],),
    "dispatch_outcome": (BY_POINT["after_dispatch_outcome_commit"],),
    "resend_outcome": (RESEND_OUTCOME,),
}


SIGTERM_BETWEEN_STEPS = "sigterm_between_steps"
SIGTERM_AFTER_TOOL_STEP = "sigterm_after_tool_step"
SIGTERM_BEFORE_TOOL_STEP = "sigterm_before_tool_step"
SIGTERM_BEFORE_FINISH = "sigterm_before_finish"
SIGTERM_POINT = "after_checkpoint_commit"
# How many of the run's checkpoint commits A passes before it is held there
# and told to stop: after plan's (the tool step still ahead), after the tool
# step's result (notify and the extra steps ahead: a worker that looks at its
# stop only before a tool step goes on with every one of them), right before
# the tool step (lookup's commit) and right before the finish (the last extra
# step's commit): a worker that looks at its stop only before a plain step
# begins the tool call, or ends the run.
SIGTERM_PASSES = {
    SIGTERM_BETWEEN_STEPS: 1,
    SIGTERM_AFTER_TOOL_STEP: 4,
    SIGTERM_BEFORE_TOOL_STEP: 2,
    SIGTERM_BEFORE_FINISH: 7,
}
SIGTERM_EXTRA_STEPS = 2
# Where the step ahead is the tool step or the finish, A is let go only once
# the signal has been pending this long: a worker may look at a signal a
# moment late (Go's arrives on a channel another goroutine reads), and the
# step it began meanwhile would be "the step underway as the signal raced
# in", which may still run. Half a second later there is no race left.
SIGTERM_SETTLE_S = 0.5
SETTLED = (SIGTERM_BEFORE_TOOL_STEP, SIGTERM_BEFORE_FINISH)
# Work time per step: the signal handler of a worker whose main thread has just
# been let go runs while that step waits, so at most the one step underway
# when the signal came writes.
SIGTERM_STEP_DELAY_MS = 150
# How long A may take to stop once let go: the step underway and giving the
# lease back, on a loaded machine.
SIGTERM_EXIT_BOUND_S = 20.0


def _describe(group: tuple[Boundary, ...]) -> str:
    return "SIGKILL at " + "; then ".join(" then ".join((*b.before, b.point)) for b in group)


SPEC = ExperimentSpec(
    id="T",
    title="crash at every boundary",
    seed_section="Chinese seed §13.2 (crash points), §14 (SIGTERM); English seed §6, §9, §12",
    invariant="a worker killed between two transactions, or between a transaction and a "
    "remote call, leaves a state its successor, the relay, the consumer or the reconciler "
    "takes over: the run succeeds with one real resource, every event reaches the broker "
    "and its business effect happens exactly once",
    fault="SIGKILL (control protocol crash answer) at one run-side boundary per variant, "
    "and at one relay and one consumer boundary in some",
    rules=(2, 4, 5, 10),
    injection_point=BOUNDARIES[0].point,
    needs=(
        *needs.capabilities("workflow", "ledger", "outbox", "consumer_dedupe"),
        *(
            needs.point(p, v)
            for v, g in VARIANTS.items()
            for p in dict.fromkeys(p for b in g for p in (*b.before, b.point))
        ),
        needs.point(SIGTERM_POINT, *SIGTERM_PASSES),
    ),
    variants=(*VARIANTS, *SIGTERM_PASSES),
    variant_waits=(
        *((v, max(b.wait_s for b in g)) for v, g in VARIANTS.items()),
        *((v, SIGTERM_SETTLE_S) for v in SETTLED),
    ),
    variant_points=(
        *((v, ", ".join(b.point for b in g)) for v, g in VARIANTS.items()),
        *((v, SIGTERM_POINT) for v in SIGTERM_PASSES),
    ),
    variant_faults=(
        *((v, _describe(g)) for v, g in VARIANTS.items()),
        (
            SIGTERM_BETWEEN_STEPS,
            "SIGTERM to A while it is held right after its second checkpoint commits",
        ),
        (
            SIGTERM_AFTER_TOOL_STEP,
            "SIGTERM to A while it is held right after the tool step's result commits",
        ),
        (
            SIGTERM_BEFORE_TOOL_STEP,
            "SIGTERM to A while it is held right after lookup's checkpoint commits, the tool "
            "step next",
        ),
        (
            SIGTERM_BEFORE_FINISH,
            "SIGTERM to A while it is held right after the last step before the finish commits",
        ),
    ),
)


def run(ctx: ExperimentContext) -> None:
    if ctx.variant in SIGTERM_PASSES:
        _sigterm_between_steps(ctx, SIGTERM_PASSES[ctx.variant])
        return
    group = VARIANTS[ctx.variant or next(iter(VARIANTS))]
    first = group[0]
    run_id = new_run(ctx, tool=first.tool, input=dict(first.input))
    crashed: list[tuple[str, str, int]] = []  # (worker, point, exit code)
    promised = {b.point: b.ledger_after for b in group if b.ledger_after and b.stage == "run"}
    for i, point in enumerate(p for b in group for p in b.run_crashes):
        name = f"A{i + 1}"
        ctx.arm(name, point, Crash())
        crashed.append((name, point, finish(ctx, _run_worker(ctx, name, run_id))))
        if point in promised and crashed[-1][2] == -9:
            _committed_at_the_point(ctx, run_id, name, point, promised[point])
        wait_claimable(ctx, run_id, timeout_s=15)
    code = finish(ctx, _run_worker(ctx, "W", run_id), 30)
    ctx.command(f"successor W exit {code}")
    crashed += _crash_ops(ctx, group, "relay", "R1", {})
    # One ops process relays and then consumes (one process start less).
    successor = ctx.env.start_worker("R", "ops")
    ctx.ok(successor, "relay")
    crashed += _crash_ops(ctx, group, "consume", "K1", {"consumer": CONSUMER})
    ctx.ok(successor, "consume", consumer=CONSUMER)
    _confirm(ctx, group, run_id, crashed)
    _judge(ctx, run_id)


def _committed_at_the_point(
    ctx: ExperimentContext, run_id: str, name: str, point: str, status: str
) -> None:
    """What ``point`` promises is committed when its worker dies there (worker
    contract section 3): read from the database before any successor runs. A
    point reached before its transaction commits rolls the answer back with
    the crash (blind hunt 54 #08)."""
    hit = [h for h in ctx.env.control.hits() if h.worker == name and h.point == point]
    if not hit:
        return  # not reached: the fault check says so
    ledger = [str(o["status"]) for o in checkers.ledger(ctx, run_id)]
    ctx.invariant(
        f"the answer recorded at {point} is committed when its worker dies there",
        status in ledger,
        expected=f"an operation of the run {status} once {name} died at {point}",
        observed=f"ledger {ledger}",
    )


def _run_worker(ctx: ExperimentContext, name: str, run_id: str) -> WorkerProcess:
    return ctx.env.start_worker(name, "run", ["--run-id", run_id, "--once"])


def _crash_ops(
    ctx: ExperimentContext,
    group: tuple[Boundary, ...],
    stage: Stage,
    name: str,
    args: dict[str, Any],
) -> list[tuple[str, str, int]]:
    """When a boundary of ``group`` is at this ops stage: arm the crash, send the
    op, wait for the process to die (it never answers). A worker that answers
    instead never reached the point: the crash did not take effect (its fault
    check says so), it did not break a bound."""
    at_stage = [b for b in group if b.stage == stage]
    if not at_stage:
        return []
    b = at_stage[0]
    return [(name, b.point, crash_in_op(ctx, name, b.point, stage, args))]


def _confirm(
    ctx: ExperimentContext,
    group: tuple[Boundary, ...],
    run_id: str,
    crashed: list[tuple[str, str, int]],
) -> None:
    """Each crash happened, at its point, by SIGKILL: the control socket's record
    and the kernel's exit status, not the worker's word."""
    hits = ctx.env.control.hits()
    seen = []
    for worker, point, code in crashed:
        at = [h for h in hits if h.worker == worker and h.point == point]
        ours = [h for h in at if h.run_id in (None, run_id)]
        seen.append((worker, point, code, len(ours)))
    ctx.fault(
        f"killed at {', '.join(b.point for b in group)}",
        bool(seen) and all(code == -9 and n >= 1 for _, _, code, n in seen),
        expected=f"each of {[p for _, p, _ in crashed]} reached by its worker (for run "
        f"{run_id[:8]}) and that worker killed by SIGKILL (exit -9); committed there: "
        f"{'; '.join(f'{b.point}: {b.committed}' for b in group)}",
        observed=f"(worker, point, exit, hits) {seen}",
    )


def _judge(ctx: ExperimentContext, run_id: str) -> None:
    """After the successors ran, from the database, the tool's and the broker's
    logs: what may never happen (safety) and what the successors must get done
    when no timer of theirs fired (progress)."""
    row = checkers.run_row(ctx, run_id)
    ledger = checkers.ledger(ctx, run_id)
    resources = checkers.tool_resources(ctx, run_id=run_id)
    ids = {r["resource_id"] for r in resources}
    ctx.invariant(
        "at most one real resource, and the ledger never contradicts it",
        len(resources) <= 1
        and len(ledger) <= 1
        and all(o["status"] != "succeeded" or o["remote_id"] in ids for o in ledger),
        expected="the tool holds at most one resource for the run; a succeeded operation names it",
        observed=f"ledger {[(o['status'], o['remote_id']) for o in ledger]}; resources "
        f"{sorted(ids)}",
    )
    ctx.progress(
        "the successor finished the run with one real resource",
        row["status"] == "succeeded"
        and [o["status"] for o in ledger] == ["succeeded"]
        and len(resources) == 1
        and ledger[0]["remote_id"] == resources[0]["resource_id"],
        expected="run succeeded; its one operation succeeded with the id of the one "
        "resource the tool holds for the run",
        observed=f"run {row['status']} at epoch {row['epoch']}; ledger "
        f"{[(o['status'], o['remote_id']) for o in ledger]}; resources "
        f"{[r['resource_id'] for r in resources]}",
    )
    events = {str(e["event_id"]): e for e in checkers.outbox(ctx, run_id)}
    at_broker = {str(m["event_id"]) for m in checkers.tool_log(ctx)["messages"]}
    unpublished = sorted(k for k, e in events.items() if e["published_at"] is None)
    missing = sorted(set(events) - at_broker)
    ctx.progress(
        "every event of the run reached the broker",
        bool(events) and not unpublished and not missing,
        expected="each outbox row marked published and at the broker, after a relay ran",
        observed=f"{len(events)} events; unpublished {unpublished}; not at the broker {missing}",
    )
    effects = ctx.sql(
        f"{CONSUMER}'s business effects for the run's events",
        "SELECT event_id::text AS event_id, count(*) AS n FROM fencecheck_model.consumer_effects "
        "WHERE consumer_name = %s AND event_id::text = ANY(%s) GROUP BY event_id",
        [CONSUMER, list(events)],
    )
    count = {str(e["event_id"]): int(e["n"]) for e in effects}
    twice = {k: n for k, n in count.items() if n > 1}
    ctx.invariant(
        "each event's business effect at most once",
        not twice,
        expected=f"at most one {CONSUMER} effect per event of the run",
        observed=f"{len(events)} events; events with more than one effect: {twice}",
    )
    wrong = {k: count.get(k, 0) for k in sorted(events) if count.get(k, 0) != 1}
    ctx.progress(
        "each event's business effect exactly once",
        bool(events) and not wrong,
        expected=f"one {CONSUMER} effect per event of the run, after a consumer ran",
        observed=f"{len(events)} events; events with another count than 1: {wrong}",
    )


def table_gaps(contract_points: list[str]) -> list[str]:
    """Boundary points of the contract (docs/worker-contract.md §3) crashed
    neither here nor elsewhere, or both (empty when the table is whole)."""
    here = {b.point for b in BOUNDARIES}
    elsewhere = set(COVERED_ELSEWHERE)
    gaps = [f"{p}: nowhere" for p in contract_points if p not in here | elsewhere]
    gaps += [f"{p}: here and elsewhere" for p in sorted(here & elsewhere)]
    return gaps


def _sigterm_between_steps(ctx: ExperimentContext, passes: int) -> None:
    input_ = {"extra_steps": SIGTERM_EXTRA_STEPS, "step_delay_ms": SIGTERM_STEP_DELAY_MS}
    # One attempt: A's stop gives the run back in its last attempt, and B's
    # claim must stay within the budget (a release interrupts an attempt, it
    # does not end one: run.attempts_never_exceed_the_budget; hunt 70's reader).
    run_id = new_run(ctx, input=input_, max_attempts=1)
    ctx.arm("A", SIGTERM_POINT, Continue(), times=passes)
    ctx.arm("A", SIGTERM_POINT, Hold(), times=1)
    steps_ahead = workflow_steps(SIGTERM_EXTRA_STEPS)[passes + 1 :]
    a = _run_worker(ctx, "A", run_id)
    hit = ctx.reached("A", SIGTERM_POINT, held=True)
    at_signal = checkers.run_row(ctx, run_id, "the run when A is told to stop")
    sent_before = {r["seq"] for r in checkers.tool_requests(ctx, run_id=run_id)}
    alive = a.is_alive()
    a.send_signal(signal.SIGTERM)
    signalled_at = time.time()
    ctx.command(f"SIGTERM A (pid {a.pid}) while it is held after a checkpoint commit")
    if ctx.variant in SETTLED:
        time.sleep(SIGTERM_SETTLE_S)
    ctx.release("A", SIGTERM_POINT)
    code_a = finish_or_kill(ctx, a, SIGTERM_EXIT_BOUND_S)
    stopped_at = time.time()
    after_a = checkers.run_row(ctx, run_id, "the run once A has exited")
    ctx.fault(
        "A told to stop between two steps of the run",
        alive
        and hit.run_id in (None, run_id)
        and at_signal["owner"] is not None
        and at_signal["revision"] == passes + 1,
        expected=f"A alive, held after the run's checkpoint commit {passes + 1} (the steps "
        f"ahead: {', '.join(steps_ahead)}), when SIGTERM is sent",
        observed=f"A alive: {alive}; point hit for run {hit.run_id} at revision "
        f"{hit.revision}; run owner {at_signal['owner']}, status {at_signal['status']}",
    )
    epoch_a = at_signal["epoch"]
    by_a = [w for w in checkers.writes(ctx, run_id) if w["epoch"] == epoch_a]
    after = [w["revision"] for w in by_a if w["revision"] > at_signal["revision"]]
    requests = [
        r["seq"]
        for r in checkers.tool_requests(ctx, run_id=run_id)
        if r["epoch"] == epoch_a and r["seq"] not in sent_before
    ]
    ctx.invariant(
        "a worker told to stop begins no new step",
        len(after) <= 1 and not requests,
        expected=f"at most the step underway when the signal came ({steps_ahead[0]}) written "
        f"after revision {at_signal['revision']}, no tool request: every later step is work "
        "the signal cancels",
        observed=f"A's writes after the signal at revisions {after}; tool requests with A's "
        f"epoch after the signal {requests} (A exit {code_a})",
    )
    ctx.invariant(
        "a stopped worker leaves the run to a successor",
        after_a["status"] in ("queued", "running", "waiting_tool"),
        expected="the run neither ended nor paused by A's stop (released, or its lease left "
        "to run out)",
        observed=f"run status {after_a['status']}, owner {after_a['owner']}",
    )
    ctx.progress(
        "A stopped by itself when told to",
        isinstance(code_a, int),
        expected=f"A exits within {SIGTERM_EXIT_BOUND_S:.0f} s of being let go",
        observed=f"A exit {code_a}",
        since=signalled_at,
        until=stopped_at,
    )
    wait_claimable(ctx, run_id, timeout_s=15)
    b = _run_worker(ctx, "B", run_id)
    code_b = finish_or_take_over(ctx, b, run_id)
    steps = [w["current_step"] for w in checkers.writes(ctx, run_id)]
    expected_steps = workflow_steps(SIGTERM_EXTRA_STEPS)
    ctx.invariant(
        "no step redone",
        steps == expected_steps[: len(steps)],
        expected=f"current_step of each protected write, in revision order: the workflow's "
        f"sequence or a prefix of it ({', '.join(expected_steps)})",
        observed=", ".join(str(x) for x in steps),
    )
    ctx.progress_equal(
        "the successor finished the run",
        (checkers.run_row(ctx, run_id)["status"], len(steps)),
        ("succeeded", len(expected_steps)),
        what=f"(run status, protected writes) (B exit {code_b})",
    )
    checkers.one_resource_per_operation(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])
