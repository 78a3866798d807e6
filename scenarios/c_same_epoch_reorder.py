"""C: of two concurrent writes with the same expected revision, exactly one wins.

Both writes come from the same owner in the same epoch, so the epoch cannot
order them: only the revision CAS can. The first write is held at a barrier
while it holds the lease row lock; the harness sees the second blocked on that
lock, then releases the first.
"""

from __future__ import annotations

from harness.checking import checkers
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
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("W", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    epoch, base = lease["epoch"], lease["revision"]
    ctx.arm("W", "after_lease_row_locked", Hold())
    first = w.request_async(
        "save_checkpoint",
        {"run_id": run_id, "epoch": epoch, "expected_revision": base, "state": {"w": 1}},
        worker_async=True,
    )
    hit = ctx.reached("W", "after_lease_row_locked")
    second = w.request_async(
        "save_checkpoint",
        {"run_id": run_id, "epoch": epoch, "expected_revision": base, "state": {"w": 2}},
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
    wins = [r for r in replies if r.ok]
    ctx.equal("exactly one write wins", len(wins), 1, what="writes accepted")
    losers = [r.error for r in replies if not r.ok]
    ctx.invariant(
        "the loser is told it lost the CAS",
        losers == ["RevisionConflict"],
        expected="the other write rejected with RevisionConflict",
        observed=f"rejections: {losers}",
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
