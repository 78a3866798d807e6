"""A: two sequential checkpoints by the same owner in the same epoch both succeed.

Baseline: the protected-write path must not reject the legitimate owner, and
each write must advance the revision by exactly one, with its checkpoint row
and outbox row committed together.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.contract import needs
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
    needs=needs.capabilities("checkpoints", "revision_check", "outbox"),
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    epoch, base = lease["epoch"], lease["revision"]
    # The harness names each write's event_id, so the evidence below can find
    # exactly these two writes, whatever the worker answers.
    event_ids = [ctx.uuid(), ctx.uuid()]
    replies = [
        ctx.op(
            w,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch,
            expected_revision=base + i,
            state={"step": f"a{i + 1}"},
            event_id=event_ids[i],
        )
        for i in range(2)
    ]
    held = checkers.run_row(ctx, run_id, "lease after both writes")
    ctx.fault(
        "both writes in one epoch by the lease holder",
        held["epoch"] == epoch and held["owner"] == lease["owner"] and not held["lease_expired"],
        expected=f"A still holds epoch {epoch}, unexpired, after both writes",
        observed=f"epoch {held['epoch']}, owner {held['owner']}, expired {held['lease_expired']}",
    )
    ours = {w["event_id"]: w for w in checkers.writes(ctx, run_id)}
    mine = [ours.get(e) for e in event_ids]
    told = ", ".join("ok" if r.ok else str(r.error) for r in replies)
    ctx.equal(
        "both writes committed, revision +1 each, in that epoch",
        [(m["revision"], m["epoch"], m["owner"]) if m else None for m in mine],
        [(base + 1, epoch, lease["owner"]), (base + 2, epoch, lease["owner"])],
        what=f"(revision, epoch, owner) of the two writes' checkpoints (worker said: {told})",
    )
    ctx.equal(
        "run revision",
        checkers.run_row(ctx, run_id)["revision"],
        base + 2,
        what="agent_runs.revision",
    )
    apart = [
        e
        for e, m in zip(event_ids, mine, strict=True)
        if not m or not checkers.with_outbox_in_same_tx(m)
    ]
    ctx.invariant(
        "checkpoint and outbox event committed together",
        not apart,
        expected="each of the 2 writes: a checkpoint and exactly one outbox event with its "
        "event_id, inserted by the same transaction (audit trail)",
        observed=f"writes without their outbox event in the same transaction: {apart}"
        if apart
        else "2 of 2 writes: checkpoint and outbox event in one transaction",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
