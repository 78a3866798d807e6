"""G: a tool's callback converges only an operation in flight of the task's
active, live run; in every other state it changes nothing, and it never
advances a newer run.

The callback is the tool's own (``POST /admin/callbacks``: built from its
record of the resource, logged) and is relayed by the harness to the control
plane's ``deliver_callback`` (the contract has no HTTP callback endpoint) at a
moment the variant chose:

* ``superseded``: run 1 called the tool and was cancelled; the task was
  retried as run 2, which made progress. Run 1's callback must not touch run 2.
* ``other_runs_operation``: the same, but the callback names run 2 (the
  task's active, live run) with run 1's operation, still in flight: a
  callback converges only an operation of the run it names, so nothing moves.
* ``terminal``: the run was cancelled while its operation was ``unknown``; the
  callback must not move the cancelled run's ledger.
* ``paused_in_doubt``: the run was paused in doubt (its operation
  ``unknown``, a tool with neither query nor key): a paused run is no live
  run, so the callback changes nothing (a person or the reconciler decides;
  a callback that converged the operation would leave the run paused with
  nothing in doubt, which nobody resumes).
* ``retried_paused_in_doubt``: the same paused run, then its task retried (a
  paused run is no live one, so ``retry_run`` takes it). The callback names
  the old run: nothing changes. Then a person converges the old run's
  operation to the tool's resource, its last doubt: the old run, superseded,
  must never be queued again (two live runs of one task, both able to act at
  the tool); the contract ends it ``cancelled``. The new run is untouched.
* ``live_prepared``: the run is live, its operation registered and never sent:
  the tool holds no resource, so no genuine callback exists; a forged one
  (a resource id the tool never made) must change nothing.
* ``live_dispatching``: the tool acted, the dispatcher holds its answer before
  recording it; the callback converges the operation, only to the tool's
  resource (refusing it is a progress failure: it is the only news of the
  effect); the dispatcher then finishes.
* ``live_unknown``: the dispatcher died after the tool acted and the claim
  became ``unknown``; the callback converges it, only to the tool's
  resource; a successor finishes without resending.
* ``live_succeeded``: the result is recorded, the run still live: a repeated
  callback changes nothing.

And one variant without a callback: ``retry_race``: two control planes retry
the same cancelled run at the same moment (the harness holds the task's row
lock until both are waiting on the database, then lets go): exactly one
retry makes a new run; the other is refused, since the task's run is live
again; the task never has two live runs; another cancelled task of the
tenant, made first, gets no run and keeps its own.

The worker's answer to the delivery only proves it arrived; what is judged is
the database (the operation, the run, any newer run) and the tool's log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Crash, Hold
from harness.parts.processes import WorkerProcess
from mock_tool.errors import ToolRejected
from scenarios.common import (
    control_plane,
    finish,
    intent_registered,
    neither_failed_on_the_other,
    new_run,
    next_version_judged_by_its_own_step,
    op_and_changes,
    paused_list_is_the_databases,
    seen_within,
    wait_claimable,
    writes_name_workflow_steps,
)

TOOL = "plain"  # no query, no idempotency: the callback is the only news of the effect
#: A callback delivered while the dispatcher's own answer is being recorded.
CALLBACK_BESIDE_RECORDER = "callback_beside_recorder"
RECORDER_ANSWER_LATE_MS = 1500
LIVE = ("queued", "running", "waiting_tool")  # the run statuses a callback may converge under

SPEC = ExperimentSpec(
    id="G",
    title="retry isolation",
    seed_section="English seed §2 (run_id), §9.3 (late responses), §11 G",
    invariant="a retry gets a new run_id; a callback converges only an operation in flight "
    "(dispatching, unknown) of the task's active, live run, and only to the tool's resource; "
    "in any other state, and for an old run, it changes nothing",
    fault="the tool's callback is delivered while the run is superseded / terminal / live, "
    "its operation prepared / dispatching / unknown / succeeded, or naming the live run with "
    "another run's operation",
    rules=(5, 7),
    injection_point="after_tool_response_before_tx2_commit",
    needs=(
        *needs.capabilities("workflow", "ledger"),
        needs.point(
            "after_tool_response_before_tx2_commit",
            "superseded",
            "other_runs_operation",
            "terminal",
            "paused_in_doubt",
            "retried_paused_in_doubt",
            "live_unknown",
            "live_dispatching",
            "live_dispatching_stepped",
        ),
        needs.point("after_outbound_intent_commit", "live_prepared"),
        needs.op("converge_operation", "retried_paused_in_doubt"),
    ),
    variants=(
        "superseded",
        "other_runs_operation",
        "terminal",
        "paused_in_doubt",
        "retried_paused_in_doubt",
        "live_prepared",
        "live_dispatching",
        "live_dispatching_stepped",
        "live_unknown",
        "live_succeeded",
        "retry_race",
        CALLBACK_BESIDE_RECORDER,
    ),
    # The held worker's refused result write on the stepped path, a
    # transaction of several statements: its session must be usable after
    # (blind hunt 38 #02: a rollback skipped for a transaction in error left
    # it aborted, and the worker's next read failed).
    variant_write_paths=(("live_dispatching_stepped", "stepped"),),
    variant_faults=(
        (
            CALLBACK_BESIDE_RECORDER,
            "the tool acts on an ops dispatcher's create at once and answers it late; the "
            "harness holds the run's row while the tool's callback is delivered and until the "
            "dispatcher's answer came back, then lets go",
        ),
        (
            "retry_race",
            "two retry_run of one cancelled run sent at once, both waiting on the task's row "
            "lock the harness holds, then released together",
        ),
    ),
    variant_points=(
        ("terminal", "after_tool_response_before_tx2_commit (crash)"),
        ("paused_in_doubt", "after_tool_response_before_tx2_commit (crash)"),
        ("retried_paused_in_doubt", "after_tool_response_before_tx2_commit (crash)"),
        ("live_prepared", "after_outbound_intent_commit"),
        ("live_unknown", "after_tool_response_before_tx2_commit (crash)"),
        ("live_succeeded", "none (ops: the result recorded)"),
    ),
    variant_waits=(
        ("terminal", 0.8),
        ("paused_in_doubt", 0.8),
        ("retried_paused_in_doubt", 0.8),
        ("live_unknown", 0.8),
    ),
)


@dataclass
class Moment:
    """The state a variant set up for the callback, and what must follow it."""

    run_id: str
    op_id: str
    payload: dict[str, Any]
    may_converge: bool  # an operation in flight of the active, live run
    # What the variant does after the delivery (release the held dispatcher, a
    # successor...), then judges; it gets the ledger row after the callback.
    then: Callable[[dict[str, Any]], None]


def run(ctx: ExperimentContext) -> None:
    if ctx.variant == "retry_race":
        _retry_race(ctx)
        return
    if ctx.variant == CALLBACK_BESIDE_RECORDER:
        _callback_beside_recorder(ctx)
        return
    moment = SETUPS[ctx.variant or "superseded"](ctx)
    # A bystander: another run's operation, registered and never sent. A
    # delivery that converges more than the operation it names (a WHERE
    # clause lost) shows only where a second operation exists.
    by_run = new_run(ctx, tool=TOOL)
    by_worker = ctx.env.start_worker("Y", "ops")
    by_op = intent_registered(ctx, by_worker, by_run, tool=TOOL,
                              step_id="g.bystander", conflict_probe=True)  # fmt: skip
    if ctx.variant in (None, "superseded"):
        next_version_judged_by_its_own_step(
            ctx, by_worker, by_run, tool=TOOL, busy_step="g.bystander"
        )
    by_before = _operation(ctx, by_op)
    ctl = control_plane(ctx)
    op_before = _operation(ctx, moment.op_id)
    run_before = checkers.run_row(ctx, moment.run_id, "the callback's run before it")
    if moment.may_converge:
        _notice_without_resource_refused(ctx, ctl, moment)
        op_before = _operation(ctx, moment.op_id)
    mark = checkers.audit_mark(ctx)
    delivered_at = time.time()
    reply = ctx.op(
        ctl,
        "deliver_callback",
        run_id=moment.run_id,
        operation_id=moment.op_id,
        payload=moment.payload,
    )
    ctx.fault(
        "the callback reached the control plane",
        reply.ok or reply.error not in (None, "Unsupported"),
        expected="the control plane answered the delivery (accepted or refused)",
        observed=f"reply ok={reply.ok} {reply.result or reply.error}",
    )
    op_after = _operation(ctx, moment.op_id)
    resource = _resource(ctx, moment.op_id)
    moved = _key(op_after) != _key(op_before)
    if moment.may_converge:
        converged = (op_after["status"], op_after["remote_id"]) == ("succeeded", resource)
        ctx.invariant(
            "the callback converged only to the tool's resource",
            not moved or converged,
            expected=f"the operation unchanged, or succeeded with the tool's resource {resource}",
            observed=f"{_key(op_before)} -> {_key(op_after)}",
        )
        # Refusing a genuine callback breaks no safety rule, but it is the only
        # news of the effect from a tool without query or key: the contract
        # accepts it here, in one statement, whatever the timing.
        ctx.progress(
            "a genuine callback for an operation in flight of the active, live run converged it",
            converged and reply.ok and (reply.result or {}).get("accepted") is True,
            expected=f"accepted: true; the operation succeeded with the tool's resource {resource}",
            observed=f"reply ok={reply.ok} {reply.result or reply.error}; "
            f"{_key(op_before)} -> {_key(op_after)}",
            since=delivered_at,
        )
    else:
        ctx.equal(
            "the callback changed nothing of the operation",
            _key(op_after),
            _key(op_before),
            what="(status, remote_id, revision) of the operation",
        )
    run_after = checkers.run_row(ctx, moment.run_id, "the callback's run after it")
    ctx.equal(
        "the callback did not move the run",
        _run_key(run_after),
        _run_key(run_before),
        what="(status, revision, epoch, owner)",
    )
    touched = ctx.sql(
        "what the control plane's delivery changed (audit trail)",
        "SELECT seq, tbl, op, coalesce(new, old)->>'operation_id' AS operation_id "
        "FROM fencecheck_audit.changes WHERE app = 'ctl' AND seq > %s ORDER BY seq",
        [mark],
    )
    ctx.invariant(
        "the callback wrote nothing but its operation's ledger row",
        all(r["tbl"] == "tool_operations" and r["operation_id"] == moment.op_id for r in touched),
        expected=f"audited changes by the delivery only on tool_operations row {moment.op_id}",
        observed=f"{[(r['seq'], r['tbl'], r['op'], r['operation_id']) for r in touched]}",
    )
    ctx.equal(
        "the callback changed no other operation",
        _key(_operation(ctx, by_op)),
        _key(by_before),
        what=f"(status, remote_id, revision) of the bystander operation {by_op}",
    )
    moment.then(op_after)
    checkers.recorded_results_are_the_tools(ctx, moment.run_id)
    checkers.lease_history_is_sound(ctx)


def _callback_beside_recorder(ctx: ExperimentContext) -> None:
    """The tool's genuine callback and an ``ops`` dispatcher's own answer for
    one operation are settled at once: the harness holds the run's row while
    the callback is delivered and until the dispatcher's late answer came
    back, then lets go. Whichever wins, the operation ends with the tool's
    resource and neither the callback nor the dispatcher fails on the other
    (blind hunt 57 #08: a Go callback that locked the run before the
    operation deadlocked with the dispatcher's record, which locks the
    operation and then the run it may resume)."""
    run_id = new_run(ctx, tool=TOOL)
    holder = ctx.env.start_worker("H", "ops")
    op_id = intent_registered(ctx, holder, run_id, tool=TOOL, step_id="g.label")
    ctl = control_plane(ctx)
    d = ctx.env.start_worker("D", "ops", env={"FENCECHECK_TOOL_TIMEOUT_MS": "20000"})
    ctx.env.tool.client().set_fault(TOOL, "answer_late", ms=RECORDER_ANSWER_LATE_MS, run_id=run_id)
    ctx.command(f"tool: D's create acts at once and is answered {RECORDER_ANSWER_LATE_MS} ms late")
    dispatched = ctx.op_async(d, "dispatch", {"operation_id": op_id})
    seen_within(
        lambda: checkers.tool_requests(ctx, run_id=run_id) or None,
        what="the tool to act on D's create",
        timeout_s=10,
    )
    payload = _genuine(ctx, op_id)
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        held_at = time.time()
        delivered = ctx.op_async(
            ctl, "deliver_callback", {"run_id": run_id, "operation_id": op_id, "payload": payload}
        )
        # The callback settles, or waits (on the run, locked before the
        # operation); then the dispatcher's late answer settles or waits too.
        lock.answered_or_waiting(delivered, "ctl")
        lock.answered_or_waiting(dispatched, "D", timeout_s=RECORDER_ANSWER_LATE_MS / 1000 + 10)
        let_go_at = time.time()
    callback, record = delivered.result(15), dispatched.result(25)
    answered = [
        float(r.get("answered_at") or 0) for r in checkers.tool_requests(ctx, run_id=run_id)
    ]
    ctx.fault(
        "the dispatcher's answer came back while the harness held the run's row",
        len(answered) == 1 and held_at < answered[0] < let_go_at,
        expected="the tool's one late answer to D left while the harness held the run's row, "
        "the callback already sent",
        observed=f"held {held_at:.3f} .. {let_go_at:.3f}; answers left at "
        f"{[round(a, 3) for a in answered]}",
    )
    neither_failed_on_the_other(
        ctx,
        "the callback and the dispatcher's answer both settle, neither failing on the other",
        {"callback": callback, "dispatch": record},
        "the callback accepted or refused, the dispatch answered ok or refused for "
        "its claim (a deadlock between the two is a lock order they do not share)",
    )
    op = _operation(ctx, op_id)
    resource = _resource(ctx, op_id)
    ctx.progress(
        "the operation converged to the tool's resource",
        (op["status"], op["remote_id"]) == ("succeeded", resource),
        expected=f"succeeded with the tool's resource {resource}",
        observed=f"{_key(op)}; callback {'ok ' + str(callback.result) if callback.ok else callback.error}"
        f"; dispatch {'ok ' + str(record.result) if record.ok else record.error}",
    )
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _notice_without_resource_refused(
    ctx: ExperimentContext, ctl: WorkerProcess, moment: Moment
) -> None:
    """A callback for the same operation that names no resource (a tool's
    progress or failure notice) converges nothing: the operation converges
    only to the resource a callback names (contract section 5), and a
    success without one is no fact about the tool. An empty ``resource_id``
    names none either, nor a blank one (blind hunt 66's reader: the Python
    SQL took "" for a resource, the Go worker refused it; 68's: the Go worker
    took "  ")."""
    notice = {k: v for k, v in moment.payload.items() if k not in ("resource_id", "remote_id")}
    before = _operation(ctx, moment.op_id)
    replies = []
    for payload in (notice, {**notice, "resource_id": ""}, {**notice, "resource_id": "  "}):
        reply = ctx.op(
            ctl, "deliver_callback", run_id=moment.run_id, operation_id=moment.op_id,
            payload=payload,
        )  # fmt: skip
        replies.append(f"ok={reply.ok} {reply.result or reply.error}")
    after = _operation(ctx, moment.op_id)
    ctx.equal(
        "a callback naming no resource converged nothing",
        (after["status"], after["remote_id"]),
        (before["status"], before["remote_id"]),
        what=f"(status, remote_id) of the operation (without resource_id, then with it empty, "
        f"then blank: "
        f"{'; '.join(replies)})",
    )


def _no_retry_of_a_live_run(ctx: ExperimentContext, ctl: WorkerProcess, run_id: str) -> None:
    """``retry_run`` of a task whose active run is live (here waiting on the
    tool, its worker holding the answer) is refused and writes nothing: a
    retry beside it would make two live runs of one task, both able to act
    at the tool (contract section 5: only a paused or terminal run's task)."""
    row = checkers.run_row(ctx, run_id, "the run before a retry of its task")
    name = "a retry of a task whose run is live is refused and writes nothing"
    if row["status"] != "waiting_tool":
        ctx.not_judged(
            name, expected="the task's run waiting_tool", observed=f"run {row['status']}"
        )
        return
    reply, changes = op_and_changes(ctx, ctl, "retry_run", task_id=str(row["task_id"]))
    ctx.invariant(
        name,
        not reply.ok and not changes,
        expected="retry_run refused, no audited change, while the run is waiting_tool",
        observed=f"reply {'ok ' + str(reply.result) if reply.ok else reply.error}; "
        f"{len(changes)} change(s)",
    )


# -------------------------------------------------------------- the moments


def _superseded(ctx: ExperimentContext, *, name_the_new_run: bool = False) -> Moment:
    """Run 1 called the tool and was cancelled; its task was retried as run 2,
    which made progress. The callback is run 1's operation, naming run 1, or
    (``name_the_new_run``) naming run 2, the task's active, live run."""
    old_run, a = _held(ctx, "after_tool_response_before_tx2_commit")
    ctl = control_plane(ctx)
    _no_retry_of_a_live_run(ctx, ctl, old_run)
    ctx.ok(ctl, "cancel", run_id=old_run)
    # Naming the new run: A dies holding the tool's answer, so the operation
    # stays in flight (a released A records the result, cancelled or not).
    ctx.release("A", "after_tool_response_before_tx2_commit", Crash() if name_the_new_run else None)
    finish(ctx, a)
    cancelled = checkers.run_row(ctx, old_run, "the old run, before the retry")
    # Read cancelled from the database: a retry refused as still live is no timing.
    definite = ("RunNotRetryable",) if cancelled["status"] == "cancelled" else ()
    task_id = str(cancelled["task_id"])
    retry = ctx.ok(ctl, "retry_run", task_id=task_id, definite=definite)
    new_run_id = ctx.note_run(str(retry["run_id"]))
    ctx.invariant(
        "retry is a new run",
        new_run_id != old_run,
        expected=f"a run_id other than {old_run}",
        observed=f"retry run_id {new_run_id}",
    )
    b = ctx.env.start_worker("B", "ops")
    lease = ctx.ok(b, "claim", run_id=new_run_id)
    rev = ctx.ok(
        b,
        "save_checkpoint",
        run_id=new_run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        state={"step": "new run"},
    )["revision"]
    if name_the_new_run:
        # An operation of its own: what a refused callback naming this run
        # keeps as evidence goes to the operation it names, never to this one.
        rev = ctx.ok(
            b,
            "register_intent",
            run_id=new_run_id,
            epoch=lease["epoch"],
            expected_revision=rev,
            step_id="g.new_run",
            effect_version=1,
            tool=TOOL,
            request={"kind": "return_label"},
        )["revision"]
    op_id = _only_operation(ctx, old_run)
    before = checkers.run_row(ctx, new_run_id, "new run before the late callback")
    ledger_before = checkers.ledger(ctx, new_run_id)
    _in_state(
        ctx,
        old_run,
        op_id,
        "the old run cancelled and superseded",
        (None, ("cancelled",)),
        new_run_id,
    )

    def then(op_after: dict[str, Any]) -> None:
        del op_after
        after = checkers.run_row(ctx, new_run_id, "new run after the late callback")
        ctx.equal(
            "new run untouched",
            _run_key(after),
            (before["status"], rev, before["epoch"], before["owner"]),
            what="new run (status, revision, epoch, owner)",
        )
        ctx.equal(
            "new run's ledger untouched",
            checkers.ledger(ctx, new_run_id),
            ledger_before,
            what="tool_operations of the new run",
        )
        ctx.equal("task points at the new run", _active_run(ctx, task_id), new_run_id)

    if not name_the_new_run:
        return Moment(old_run, op_id, _genuine(ctx, op_id), False, then)
    # Only the run it names can refuse it: the operation is in flight and the
    # named run is its task's active, live run, the two things a callback may
    # converge under; the operation is merely another run's.
    in_flight = _operation(ctx, op_id)["status"]
    ctx.fault(
        "the old run's operation is in flight when the new run's name comes with it",
        in_flight in ("dispatching", "unknown"),
        expected="run 1's operation dispatching or unknown (the tool acted; no result recorded)",
        observed=f"run 1's operation {in_flight}",
    )
    return Moment(new_run_id, op_id, _genuine(ctx, op_id), False, then)


def _unknown_after_crash(ctx: ExperimentContext) -> tuple[str, str]:
    """A run whose dispatcher died after the tool acted, the claim turned
    unknown by the reconciler; the run still live with an expired lease."""
    run_id = new_run(ctx, tool=TOOL)
    ctx.arm("A", "after_tool_response_before_tx2_commit", Crash())
    finish(ctx, ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"]))
    wait_claimable(ctx, run_id)
    ctx.ok(control_plane(ctx), "reconcile")
    return run_id, _only_operation(ctx, run_id)


def _terminal(ctx: ExperimentContext) -> Moment:
    run_id, op_id = _unknown_after_crash(ctx)
    ctx.ok(control_plane(ctx), "cancel", run_id=run_id)
    _in_state(
        ctx, run_id, op_id, "the run cancelled, its operation unknown", ("unknown", ("cancelled",))
    )
    return Moment(run_id, op_id, _genuine(ctx, op_id), False, _nothing_more)


def _paused_in_doubt(ctx: ExperimentContext) -> Moment:
    run_id, op_id = _unknown_after_crash(ctx)
    # The successor finds the operation unknown, with no query and no key to
    # resend under: it pauses the run in doubt (blind bug hunt round 6, #07: a
    # callback accepted then converged it, and nothing resumed the run).
    code = finish(ctx, ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"]))
    ctx.command(f"successor B exit {code}")
    _in_state(
        ctx, run_id, op_id, "the run paused in doubt, its operation unknown",
        ("unknown", ("paused_indoubt",)),
    )  # fmt: skip
    return Moment(run_id, op_id, _genuine(ctx, op_id), False, _nothing_more)


def _retried_paused_in_doubt(ctx: ExperimentContext) -> Moment:
    """The run paused in doubt, then its task retried; the callback names
    the old run. Afterwards its last doubt settles by a person's convergence
    to the tool's resource: the old run must not become live again (the
    reference queued it: two live runs of one task)."""
    paused = _paused_in_doubt(ctx)
    ctl = control_plane(ctx)
    task_id = str(checkers.run_row(ctx, paused.run_id)["task_id"])
    new_run_id = ctx.note_run(str(ctx.ok(ctl, "retry_run", task_id=task_id)["run_id"]))
    _in_state(
        ctx, paused.run_id, paused.op_id, "the run paused in doubt, superseded by a retry",
        ("unknown", ("paused_indoubt",)), new_run_id,
    )  # fmt: skip
    # Superseded, it is still paused in doubt, and only a person settles it:
    # list_paused names it (blind hunt 67 #06: a Go list of the tasks' active
    # runs only left it out, paused for good).
    paused_list_is_the_databases(ctx, ctl)
    new_before = checkers.run_row(ctx, new_run_id, "the retry before the convergence")

    def then(op_after: dict[str, Any]) -> None:
        del op_after
        resource = _resource(ctx, paused.op_id)
        reply = ctx.op(
            ctl,
            "converge_operation",
            operation_id=paused.op_id,
            outcome="succeeded",
            remote_id=resource,
            reason="resource found in the tool's console",
            ticket="OPS-77",
        )
        settled = _operation(ctx, paused.op_id)
        # A person's fact about an unknown operation is taken whatever became
        # of its run (contract section 5, converge_operation): refusing it
        # because a retry superseded the run loses the only news of the effect.
        ctx.invariant(
            "a person's convergence of a superseded run's operation is taken",
            (settled["status"], settled["remote_id"]) == ("succeeded", resource),
            expected=f"the operation succeeded with the tool's resource {resource}",
            observed=f"{_key(settled)} (reply ok={reply.ok} {reply.result or reply.error})",
        )
        old = checkers.run_row(ctx, paused.run_id, "the superseded run after the convergence")
        ctx.invariant(
            "a superseded run is never queued again: its settled doubt ends it",
            old["status"] == "cancelled",
            expected="the old run cancelled (it is no longer its task's active run)",
            observed=f"old run {old['status']} ({old.get('terminal_reason')}); the task's active "
            f"run {_active_run(ctx, task_id)[:8]}",
        )
        ctx.equal(
            "the retry untouched by the old run's convergence",
            _run_key(checkers.run_row(ctx, new_run_id, "the retry after the convergence")),
            _run_key(new_before),
            what="the new run (status, revision, epoch, owner)",
        )
        ctx.equal("task points at the new run", _active_run(ctx, task_id), new_run_id)

    return Moment(paused.run_id, paused.op_id, paused.payload, False, then)


def _live_unknown(ctx: ExperimentContext) -> Moment:
    run_id, op_id = _unknown_after_crash(ctx)
    _in_state(ctx, run_id, op_id, "the run live, its operation unknown", ("unknown", LIVE))
    if ctx.system.capabilities.offers_op("resolve_indoubt"):
        _finding_on_a_live_run_refused(ctx, run_id, op_id)

    def then(op_after: dict[str, Any]) -> None:
        code = finish(ctx, ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"]))
        _not_resent(ctx, op_id)
        if op_after["status"] == "succeeded":
            ctx.progress_equal(
                "the successor finished from the callback's result",
                checkers.run_row(ctx, run_id)["status"],
                "succeeded",
                what=f"run status (B exit {code})",
            )

    return Moment(run_id, op_id, _genuine(ctx, op_id), True, then)


def _finding_on_a_live_run_refused(ctx: ExperimentContext, run_id: str, op_id: str) -> None:
    """A person's finding on an operation in doubt of a live run is refused and
    writes nothing: only a run paused in doubt takes one, while a live run's
    holder may still query, resend or be answered by a callback (generated
    c867349e: the finding's test of the run's status dropped)."""
    reply, changes = op_and_changes(
        ctx,
        control_plane(ctx),
        "resolve_indoubt",
        run_id=run_id,
        operation_id=op_id,
        decision="not_executed",
        reason="refusal probe: the run is live",
        ticket="OPS-48",
    )
    ctx.invariant(
        "a finding on a live run's operation in doubt is refused",
        not reply.ok and not changes,
        expected=f"resolve_indoubt of the live run {run_id[:8]} refused, nothing written",
        observed=f"reply {'ok' if reply.ok else reply.error}; changes "
        f"{[(r['seq'], r['tbl'], r['op']) for r in changes]}",
    )


def _held(ctx: ExperimentContext, point: str) -> tuple[str, WorkerProcess]:
    """A new run whose ``run``-mode worker A is held at ``point``."""
    run_id = new_run(ctx, tool=TOOL)
    ctx.arm("A", point, Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    ctx.reached("A", point)
    return run_id, a


def _live_dispatching(ctx: ExperimentContext) -> Moment:
    point = "after_tool_response_before_tx2_commit"
    run_id, a = _held(ctx, point)
    op_id = _only_operation(ctx, run_id)
    _in_state(ctx, run_id, op_id, "the run live, the answer not recorded", ("dispatching", LIVE))
    return Moment(
        run_id, op_id, _genuine(ctx, op_id), True, _release_and_finish(ctx, a, point, run_id)
    )


def _live_prepared(ctx: ExperimentContext) -> Moment:
    point = "after_outbound_intent_commit"
    run_id, a = _held(ctx, point)
    op_id = _only_operation(ctx, run_id)
    _in_state(ctx, run_id, op_id, "the run live, its operation never sent", ("prepared", LIVE))
    try:
        ctx.env.tool.client().callback_now(TOOL, op_id)
        genuine = True
    except ToolRejected:
        genuine = False
    ctx.fault(
        "the tool has no callback to give",
        not genuine,
        expected="the tool holds no resource of the operation (POST /admin/callbacks: 404)",
        observed="it issued one" if genuine else "404: no resource, no genuine callback",
    )
    epoch = checkers.run_row(ctx, run_id)["epoch"]
    forged = {
        "operation_id": op_id,
        "run_id": run_id,
        "epoch": epoch,
        "resource_id": f"res-forged-{ctx.uuid()[:12]}",
        "tool": TOOL,
        "attempt": 1,
    }
    return Moment(run_id, op_id, forged, False, _release_and_finish(ctx, a, point, run_id))


def _live_succeeded(ctx: ExperimentContext) -> Moment:
    run_id = new_run(ctx, tool=TOOL)
    w = ctx.env.start_worker("W", "ops")
    op_id = intent_registered(ctx, w, run_id, tool=TOOL, step_id="g.label")
    ctx.ok(w, "dispatch", operation_id=op_id)
    _in_state(ctx, run_id, op_id, "the run live, its result recorded", ("succeeded", LIVE))
    return Moment(run_id, op_id, _genuine(ctx, op_id), False, _nothing_more)


SETUPS: dict[str, Callable[[ExperimentContext], Moment]] = {
    "superseded": _superseded,
    "other_runs_operation": lambda ctx: _superseded(ctx, name_the_new_run=True),
    "terminal": _terminal,
    "paused_in_doubt": _paused_in_doubt,
    "retried_paused_in_doubt": _retried_paused_in_doubt,
    "live_prepared": _live_prepared,
    "live_dispatching": _live_dispatching,
    "live_dispatching_stepped": _live_dispatching,
    "live_unknown": _live_unknown,
    "live_succeeded": _live_succeeded,
}


# ------------------------------------------------------------------ helpers


def _genuine(ctx: ExperimentContext, op_id: str) -> dict[str, Any]:
    """The tool's own callback of the operation's resource, issued now (logged)."""
    payload = ctx.env.tool.client().callback_now(TOOL, op_id)
    ctx.command(f"tool: issued the callback of {op_id} for the harness to relay: {payload}")
    return payload


def _in_state(
    ctx: ExperimentContext,
    run_id: str,
    op_id: str,
    what: str,
    statuses: tuple[str | None, tuple[str, ...]],
    active: str | None = None,
) -> None:
    """Fault check: the operation and the run have the ``statuses`` (the
    operation's, None for any; the run's, one of) the variant set up, and the
    task's active run is ``active`` (the run itself by default), as the
    database shows them before the callback."""
    op = _operation(ctx, op_id)
    row = checkers.run_row(ctx, run_id, f"the run when the callback comes: {what}")
    task_run = _active_run(ctx, str(row["task_id"]))
    want_op, want_run = statuses
    ctx.fault(
        what,
        (want_op is None or op["status"] == want_op)
        and row["status"] in want_run
        and task_run == (active or run_id),
        expected=f"operation {want_op or 'in any status'}, run {'/'.join(want_run)}, the task's "
        "active "
        f"run {(active or run_id)[:8]}",
        observed=f"operation {op['status']}, run {row['status']}, active run {task_run[:8]}",
    )


def _release_and_finish(
    ctx: ExperimentContext, worker: WorkerProcess, point: str, run_id: str
) -> Callable[[dict[str, Any]], None]:
    """Let the worker held at ``point`` go on after the callback: it sends (or
    records, or adopts what the callback recorded) what it has, nothing twice,
    and finishes the run (progress: the state the callback left is one the
    workflow continues from)."""

    def then(op_after: dict[str, Any]) -> None:
        del op_after
        ctx.release(worker.worker_id, point)
        code = finish(ctx, worker)
        _not_resent(ctx, _only_operation(ctx, run_id))
        ctx.progress_equal(
            "the held worker finished the run",
            checkers.run_row(ctx, run_id)["status"],
            "succeeded",
            what=f"run status ({worker.worker_id} exit {code})",
        )
        writes_name_workflow_steps(ctx, [run_id])

    return then


def _nothing_more(op_after: dict[str, Any]) -> None:
    del op_after  # judged above: the callback changed nothing


def _not_resent(ctx: ExperimentContext, op_id: str) -> None:
    requests = checkers.tool_requests(ctx, operation_id=op_id)
    ctx.invariant(
        "the tool heard of the operation at most once",
        len(requests) <= 1,
        expected="at most one create for the operation (a tool without query or idempotency)",
        observed=f"{[(r['seq'], r['outcome']) for r in requests]}",
    )


def _only_operation(ctx: ExperimentContext, run_id: str) -> str:
    ops = checkers.ledger(ctx, run_id)
    return str(ops[0]["operation_id"]) if ops else ""


def _operation(ctx: ExperimentContext, op_id: str) -> dict[str, Any]:
    rows = ctx.sql(
        f"operation {op_id}",
        "SELECT operation_id, status, remote_id, revision FROM fencecheck_model.tool_operations "
        "WHERE operation_id = %s",
        [op_id],
    )
    return rows[0] if rows else {"status": None, "remote_id": None, "revision": None}


def _resource(ctx: ExperimentContext, op_id: str) -> str | None:
    made = [r for r in checkers.tool_resources(ctx) if r["operation_id"] == op_id]
    return str(made[0]["resource_id"]) if made else None


def _active_run(ctx: ExperimentContext, task_id: str) -> str:
    rows = ctx.sql(
        "task",
        "SELECT active_run_id FROM fencecheck_model.agent_tasks WHERE task_id = %s",
        [task_id],
    )
    return str(rows[0]["active_run_id"]) if rows else ""


def _key(op: dict[str, Any]) -> tuple[Any, ...]:
    return (op["status"], op["remote_id"], op["revision"])


def _run_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["status"], row["revision"], row["epoch"], row["owner"])


def _retry_race(ctx: ExperimentContext) -> None:
    """Two retries of one cancelled run, in flight together; another cancelled
    task of the tenant, made first, stands by and must not be touched."""
    ctl = control_plane(ctx)
    bystander = new_run(ctx)
    ctx.ok(ctl, "cancel", run_id=bystander)
    by_task = str(checkers.run_row(ctx, bystander, "the bystander")["task_id"])
    old_run = new_run(ctx)
    ctx.ok(ctl, "cancel", run_id=old_run)
    row = checkers.run_row(ctx, old_run, "the cancelled run, before the retries")
    task_id = str(row["task_id"])
    other = ctx.env.start_worker("ctl2", "ops", role="operator")
    with checkers.row_locked(ctx, "agent_tasks", "task_id", task_id) as lock:
        first = ctx.op_async(ctl, "retry_run", {"task_id": task_id})
        second = ctx.op_async(other, "retry_run", {"task_id": task_id})
        waiting = lock.wait_for_waiters(["ctl", "ctl2"])
    replies = [first.result(15.0), second.result(15.0)]
    made = [str(r.result["run_id"]) for r in replies if r.ok]
    for run_id in made:
        ctx.note_run(run_id)
    # The fault is the harness's doing; whether the retries waited on its hold
    # is the implementation's answer, judged as progress (one that answered at
    # once without waiting must not turn a fail into unknown).
    ctx.fault(
        "both retries were sent while the harness held the task's row",
        row["status"] == "cancelled",
        expected="the old run cancelled; the task's row held by the harness while both were sent",
        observed=f"old run {row['status']}",
    )
    ctx.progress(
        "both retries waited on the task together",
        waiting is not None,
        expected="both control planes' retries waiting on a lock while the harness held the "
        "task's row",
        observed=f"waiting: {waiting or 'not both'}",
    )
    runs = ctx.sql(
        "the task's runs after the retries",
        "SELECT run_id, status FROM fencecheck_model.agent_runs WHERE task_id = %s "
        "ORDER BY created_at",
        [task_id],
    )
    live = [str(r["run_id"]) for r in runs if r["status"] in LIVE]
    ctx.invariant(
        "exactly one retry made a new run",
        len(made) == 1 and live == made,
        expected="one retry answered with a new run, the other refused; that run the task's "
        "only live one",
        observed=f"answers {[(r.ok, r.error) for r in replies]}; new runs {made}; live runs {live}",
    )
    if made:
        ctx.equal("task points at the new run", _active_run(ctx, task_id), made[0])
    by_runs = ctx.sql(
        "the bystander task's runs after the retries",
        "SELECT run_id FROM fencecheck_model.agent_runs WHERE task_id = %s",
        [by_task],
    )
    ctx.equal(
        "the bystander task untouched",
        ([str(r["run_id"]) for r in by_runs], _active_run(ctx, by_task)),
        ([bystander], bystander),
        what="(its runs, its active run)",
    )
    _create_run_of_an_existing_task(ctx, ctl, {task_id: made[0] if made else None, by_task: None})
    checkers.lease_history_is_sound(ctx)


def _create_run_of_an_existing_task(
    ctx: ExperimentContext, ctl: WorkerProcess, tasks: dict[str, str | None]
) -> None:
    """create_run makes a new task: one that exists is refused (TaskExists)
    whatever its run's state, live or cancelled, and gains no run; a retry is
    the only way to a task's next run. ``tasks``: task id -> its live run."""
    before = {t: _runs_of(ctx, t) for t in tasks}
    replies = {t: ctx.op(ctl, "create_run", task_id=t, input={"tool": "idem"}) for t in tasks}
    after = {t: _runs_of(ctx, t) for t in tasks}
    ctx.invariant(
        "create_run of an existing task is refused and adds no run",
        all(not r.ok and r.error == "TaskExists" for r in replies.values()) and after == before,
        expected="TaskExists for the task whose retried run is live and for the cancelled one; "
        "their runs as before",
        observed="; ".join(
            f"{t} (live run {tasks[t]}): {'ok ' + str(r.result) if r.ok else r.error}, "
            f"runs {len(before[t])} -> {len(after[t])}"
            for t, r in replies.items()
        ),
    )


def _runs_of(ctx: ExperimentContext, task_id: str) -> list[tuple[str, str]]:
    rows = ctx.sql(
        f"the runs of task {task_id}",
        "SELECT run_id, status FROM fencecheck_model.agent_runs WHERE task_id = %s "
        "ORDER BY created_at, run_id",
        [task_id],
    )
    return [(str(r["run_id"]), str(r["status"])) for r in rows]
