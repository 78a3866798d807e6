"""K: a lease that expired with nobody taking over still rejects its old holder.

High-water fencing alone would accept A here, since no newer epoch exists:
only the expiry check in renew and in the protected write can reject it.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import new_run, renewal_stopped

SPEC = ExperimentSpec(
    id="K",
    title="expired fence, no takeover yet",
    seed_section="Chinese seed §5 (renew must check expiry), §13.2 (过期 fence); English §6",
    invariant="A's renew, checkpoint CAS and completion are rejected by the expiry check "
    "itself: epoch and owner unchanged, revision unchanged, no checkpoint written, the run "
    "not finished",
    fault="A stops heartbeating; its lease expires by database time; nobody claims",
    rules=(1, 2),
    layer="queue",
    lease_ttl_ms=500,
    natural_wait_s=0.5,  # Each write path the worker declares (contract section 2): the stepped one
    # validates the lease in a statement of its own (lock_lease in the reference).
    variants=("fast", "stepped"),
    variant_write_paths=(("stepped", "stepped"),),
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    # A's writes also come from a session that has not noticed anything (A's
    # own may refuse client-side once its renewal was refused): only the
    # database's expiry check can refuse them. Started now: a process start
    # under load must not decide what expired when.
    a2 = ctx.env.start_worker("A2", "ops")
    lease = ctx.ok(a, "claim", run_id=run_id)
    epoch, rev = lease["epoch"], lease["revision"]
    # A stops renewing the way the system renews (a process heartbeat is
    # frozen with its process); its lease runs out by the database's clock.
    with renewal_stopped(ctx, a):
        checkers.wait_lease_expired(ctx, run_id)
        expired = checkers.run_row(ctx, run_id, "run after expiry, before A's attempts")
    ctx.fault(
        "lease expired and nobody took over",
        bool(expired["lease_expired"])
        and expired["epoch"] == epoch
        and expired["owner"] is not None,
        expected=f"lease expired by database time, still epoch {epoch} held by A",
        observed=f"expired={expired['lease_expired']}, epoch {expired['epoch']}, "
        f"owner {expired['owner']}",
    )
    caps = ctx.system.capabilities
    renew = ctx.op(a, "renew", run_id=run_id, epoch=epoch) if caps.offers_op("renew") else None
    save = (
        ctx.op(
            a2,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch,
            owner=lease["owner"],
            expected_revision=rev,
            state={"step": "after expiry"},
        )
        if caps.checkpoints
        else None
    )
    # The lease as A's renewal and write left it (and A's process, resumed,
    # whatever its own heartbeat did), before its completion can end the run.
    renewed = checkers.run_row(ctx, run_id, "run after A's renewal and write")
    ctx.equal(
        "lease not revived",
        (renewed["epoch"], bool(renewed["lease_expired"])),
        (epoch, True),
        what="(epoch, lease expired)",
    )
    complete = ctx.op(
        a2,
        "complete",
        run_id=run_id,
        epoch=epoch,
        owner=lease["owner"],
        expected_revision=rev,
        result={"by": "A"},
    )
    row = checkers.run_row(ctx, run_id, "run after A's attempts")
    for name, reply in (
        ("renew", renew),
        ("checkpoint CAS", save),
        ("completion", complete),
    ):
        if reply is not None:
            ctx.invariant(
                f"{name} rejected",
                not reply.ok,
                expected="LeaseLost",
                observed="accepted" if reply.ok else reply.error or "",
            )
    ctx.equal("run not finished by the expired holder", row["status"], expired["status"])
    if caps.revision_check:
        ctx.equal("revision unchanged", row["revision"], rev, what="agent_runs.revision")
    ctx.equal(
        "no checkpoint written",
        [c["revision"] for c in checkers.checkpoints(ctx, run_id) if c["revision"] > rev],
        [],
        what="checkpoints after the expiry",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
