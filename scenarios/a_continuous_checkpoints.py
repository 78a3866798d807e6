"""A: two sequential checkpoints by the same owner in the same epoch both succeed.

Baseline: the protected-write path must not reject the legitimate owner, and
each write must advance the revision by exactly one, with its checkpoint row
and outbox row committed together.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="A",
    title="continuous checkpoints",
    seed_section="English seed §11 A; §6",
    invariant="two sequential writes in one epoch both succeed; revision +1 each, consecutive; "
    "each checkpoint and its outbox event commit together",
    fault="two sequential protected writes by the same owner in the same epoch",
    rules=(2, 3),
    injection_point="after_checkpoint_commit",
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    epoch, base = lease["epoch"], lease["revision"]
    first = ctx.op(
        w,
        "save_checkpoint",
        run_id=run_id,
        epoch=epoch,
        expected_revision=base,
        state={"step": "a1"},
    )
    second = ctx.op(
        w,
        "save_checkpoint",
        run_id=run_id,
        epoch=epoch,
        expected_revision=base + 1,
        state={"step": "a2"},
    )
    rows = checkers.checkpoints(ctx, run_id)
    ours = [r for r in rows if r["revision"] > base]
    held = checkers.run_row(ctx, run_id, "lease after both writes")
    ctx.fault(
        "both writes in one epoch by the lease holder",
        held["epoch"] == epoch and held["owner"] == lease["owner"] and not held["lease_expired"],
        expected=f"A still holds epoch {epoch}, unexpired, after both writes",
        observed=f"epoch {held['epoch']}, owner {held['owner']}, expired {held['lease_expired']}",
    )
    ctx.equal(
        "both checkpoints at that epoch",
        [r["epoch"] for r in ours],
        [epoch, epoch],
        what="epochs of the two checkpoints",
    )
    ctx.invariant(
        "both writes accepted",
        first.ok and second.ok,
        expected="both save_checkpoint calls ok",
        observed=f"first: {first.ok or first.error}, second: {second.ok or second.error}",
    )
    ctx.equal(
        "revisions consecutive",
        [r["revision"] for r in ours],
        [base + 1, base + 2],
        what="checkpoint revisions",
    )
    ctx.equal(
        "run revision",
        checkers.run_row(ctx, run_id)["revision"],
        base + 2,
        what="agent_runs.revision",
    )
    events = {str(e["event_id"]) for e in checkers.outbox(ctx, run_id)}
    missing = [r["revision"] for r in ours if str(r["event_id"]) not in events]
    ctx.invariant(
        "checkpoint and outbox event committed together",
        not missing,
        expected="every checkpoint's event_id present in the outbox",
        observed=f"checkpoints without outbox event: {missing}" if missing else "all present",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
