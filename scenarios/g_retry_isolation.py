"""G: a late callback from an old run cannot advance the new run of the same task.

Run 1 calls the tool and is then cancelled; the task is retried as run 2 (a
new run_id) and run 2 makes progress of its own. The tool's callback for
run 1's operation arrives only now. It must not touch run 2.

The callback reaches the worker through its ``deliver_callback`` op (the
contract has no HTTP callback endpoint), so the worker's answer is used only
as proof that the delivery was received (the fault); whether it was accepted
or refused is not judged: what is judged is the database (the new run, its
ledger, the task's active run) and the global invariants.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Hold
from scenarios.common import control_plane, finish, new_run

SPEC = ExperimentSpec(
    id="G",
    title="retry isolation",
    seed_section="English seed §2 (run_id), §9.3 (late responses), §11 G",
    invariant="a retry gets a new run_id; a late callback from the old run changes nothing of "
    "the new run",
    fault="the old run's tool callback is delivered after the retry made progress",
    rules=(5, 7),
    injection_point="after_tool_response_before_tx2_commit",
)


def run(ctx: ExperimentContext) -> None:
    old_run = new_run(ctx, tool="plain")
    ctl = control_plane(ctx)
    ctx.arm("A", "after_tool_response_before_tx2_commit", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", old_run, "--once"])
    ctx.reached("A", "after_tool_response_before_tx2_commit")
    ctx.ok(ctl, "cancel", run_id=old_run)
    ctx.release("A", "after_tool_response_before_tx2_commit")
    finish(ctx, a)
    old_request = next(iter(checkers.tool_requests(ctx, run_id=old_run)), None)
    task_id = checkers.run_row(ctx, old_run)["task_id"]
    retry = ctx.ok(ctl, "retry_run", task_id=task_id)
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
    before = checkers.run_row(ctx, new_run_id, "new run before the late callback")
    ledger_before = checkers.ledger(ctx, new_run_id)
    ctx.fault(
        "the old run really called the tool",
        old_request is not None,
        expected="the tool's log holds the old run's request",
        observed=f"old run request: {old_request and old_request['operation_id']}",
    )
    if old_request is None:
        return
    callback = ctx.op(
        ctl,
        "deliver_callback",
        run_id=old_run,
        operation_id=old_request["operation_id"],
        payload={
            "operation_id": old_request["operation_id"],
            "run_id": old_run,
            "epoch": old_request["epoch"],
            "resource_id": old_request["resource_id"],
            "tool": old_request["tool"],
        },
    )
    ctx.fault(
        "the late callback reached the control plane",
        callback.ok or callback.error not in (None, "Unsupported"),
        expected="the control plane answered the delivery (accepted or refused)",
        observed=f"reply ok={callback.ok} {callback.result or callback.error}",
    )
    after = checkers.run_row(ctx, new_run_id, "new run after the late callback")
    ctx.equal(
        "new run untouched",
        (after["status"], after["revision"], after["epoch"], after["owner"]),
        (before["status"], rev, before["epoch"], before["owner"]),
        what="new run (status, revision, epoch, owner)",
    )
    ctx.equal(
        "new run's ledger untouched",
        checkers.ledger(ctx, new_run_id),
        ledger_before,
        what="tool_operations of the new run",
    )
    ctx.equal(
        "task points at the new run",
        ctx.sql("task", "SELECT active_run_id FROM agent_tasks WHERE task_id = %s", [task_id])[0][
            "active_run_id"
        ].__str__(),
        new_run_id,
        what="agent_tasks.active_run_id",
    )
    checkers.lease_history_is_sound(ctx, [old_run, new_run_id])
