"""C: of two concurrent writes with the same expected revision, exactly one wins.

Both writes come from the same owner in the same epoch, so the epoch cannot
order them: only the revision CAS can. The first write is held at a barrier
while it holds the lease row lock; the harness sees the second blocked on that
lock, then releases the first.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Hold
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="C",
    title="same-epoch reorder",
    seed_section="English seed §6, §11 C",
    invariant="two concurrent writes with the same expected revision: exactly one succeeds, "
    "the revision advances once",
    fault="first write held at after_lease_row_locked while the second is sent",
    rules=(3,),
    injection_point="after_lease_row_locked",
    needs=(
        *needs.capabilities("checkpoints", "revision_check"),
        needs.point("after_lease_row_locked"),
    ),
    write_path="stepped",
    # Same owner, same epoch: expiry plays no part, and a lease that ran out
    # while the first write is held (a loaded machine) would refuse both.
    lease_ttl_ms=10_000,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("W", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    epoch, base = lease["epoch"], lease["revision"]
    ctx.arm("W", "after_lease_row_locked", Hold())
    event_ids = [ctx.uuid(), ctx.uuid()]
    first = ctx.op_async(
        w,
        "save_checkpoint",
        {
            "run_id": run_id,
            "epoch": epoch,
            "expected_revision": base,
            "state": {"w": 1},
            "event_id": event_ids[0],
        },
        worker_async=True,
    )
    hit = ctx.reached("W", "after_lease_row_locked")
    second = ctx.op_async(
        w,
        "save_checkpoint",
        {
            "run_id": run_id,
            "epoch": epoch,
            "expected_revision": base,
            "state": {"w": 2},
            "event_id": event_ids[1],
        },
        worker_async=True,
    )
    blocked = checkers.backend_waiting_on_lock(ctx, "W", timeout_s=2)
    ctx.fault(
        "second write sent while the first was held inside its transaction",
        second.sent_at > hit.received_at and not first.done(),
        expected="first write held at after_lease_row_locked when the second was sent",
        observed=f"barrier hit at {hit.received_at:.3f}, second sent at {second.sent_at:.3f}; "
        f"second blocked on the row lock: {blocked}",
    )
    ctx.release("W", "after_lease_row_locked")
    replies = [first.result(15), second.result(15)]
    told = [r.result.get("revision") if r.ok else r.error for r in replies]
    committed = {w["event_id"]: w for w in checkers.writes(ctx, run_id)}
    won = [e for e in event_ids if e in committed]
    ctx.equal(
        "exactly one write wins",
        len(won),
        1,
        what=f"of the two writes, committed (by event_id; the worker answered {told})",
    )
    lost = [e for e in event_ids if e not in committed]
    traces = ctx.sql(
        "outbox rows of the losing write",
        "SELECT event_id FROM fencecheck_model.outbox WHERE event_id::text = ANY(%s)",
        [lost],
    )
    ctx.invariant(
        "the loser left no trace",
        len(lost) == 1 and not traces,
        expected="the other write's event_id in neither agent_checkpoints nor outbox",
        observed=f"losing event ids {lost}; outbox rows of them {len(traces)}; the worker told"
        f" the loser: {[r.error for r in replies if not r.ok]}",
    )
    rows = [r for r in checkers.checkpoints(ctx, run_id) if r["revision"] > base]
    ctx.equal(
        "one checkpoint",
        [r["revision"] for r in rows],
        [base + 1],
        what="checkpoint revisions after the race",
    )
    ctx.equal(
        "revision advanced once",
        checkers.run_row(ctx, run_id)["revision"],
        base + 1,
        what="agent_runs.revision",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
