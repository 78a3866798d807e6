"""P: a worker cut off from PostgreSQL must cancel its execution and start no new
side effect, and a successor must take over.

A has claimed a tool effect for dispatch and waits at a barrier just before
calling the tool. Its link to PostgreSQL (its own proxy) is cut. Its
heartbeat thread can no longer renew; once the renewal is unconfirmed the
execution must be cancelled, so when the barrier opens A must not call the
tool. B, on a healthy link, takes over after the lease expires.
"""

from __future__ import annotations

import time

from harness.checking import checkers
from harness.checking.history import read_history
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Hold
from harness.waiting import wait_for
from scenarios.common import finish, finish_or_kill, new_run, wait_claimable

SPEC = ExperimentSpec(
    id="P",
    title="renewal partition",
    seed_section="English seed §5.2, §7 (heartbeat); Chinese seed §5",
    invariant="after the cut, A's execution is cancelled and A sends no new request to the "
    "tool; B takes over with the next epoch and finishes the run",
    fault="A's link to PostgreSQL cut (toxiproxy) while A is about to call the tool",
    rules=(8, 1),
    layer="queue",
    injection_point="after_dispatch_claim_commit",
    needs=(
        *needs.capabilities("workflow", "ledger"),
        needs.point("after_dispatch_claim_commit"),
    ),
    natural_wait_s=0.8 + 0.3,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx, tool="idem")
    ctx.env.add_pg_link("pg_A")
    ctx.env.add_pg_link("pg_B")
    ctx.arm("A", "after_dispatch_claim_commit", Hold())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"], pg_link="pg_A")
    hit = ctx.reached("A", "after_dispatch_claim_commit")
    epoch_a = checkers.run_row(ctx, run_id)["epoch"]
    asked_at = time.time()
    cut_at = ctx.cut("pg_A").started_at  # from here on nothing of A's reaches the server
    alive = a.is_alive()
    # Time the wait on A's own account of its failed renewal, bounded by the
    # lease; the verdict below rests on the tool's log and the audit trail.
    deadline = ctx.env.lease_ttl_ms / 1000 + 2
    try:
        wait_for(
            lambda: any(
                e.op in ("renew", "heartbeat") and e.type in ("fail", "info") and e.time >= asked_at
                for e in read_history([a.events_path]).events
            ),
            what="A's heartbeat to report an unconfirmed renewal",
            timeout_s=deadline,
        )
    except TimeoutError:
        ctx.command("A reported no failed renewal; releasing anyway after the lease time")
    ctx.release("A", "after_dispatch_claim_commit")
    code_a = finish_or_kill(ctx, a, 20)
    # A renewal A sent just before the cut may still land after it (the server
    # had the bytes): only its own call timeout bounds that, so a renewal later
    # than that, or any other change, shows the link was not cut.
    in_flight_s = ctx.env.heartbeat_timeout_ms / 1000
    renewed_after_cut = [
        r
        for r in checkers.changes_by(ctx, ["A"], since=cut_at)
        if not (r["renewal"] and r["at"].timestamp() <= cut_at + in_flight_s)
    ]
    ctx.fault(
        "A was partitioned from PostgreSQL while alive at its barrier",
        alive and not renewed_after_cut and hit.epoch in (None, epoch_a),
        expected="A alive at the barrier when its link was cut; no change by A after the cut",
        observed=f"alive={alive}; changes by A after the cut: {len(renewed_after_cut)}",
    )
    late = [
        r
        for r in checkers.tool_requests(ctx, run_id=run_id)
        if r["epoch"] == epoch_a and r["received_at"] > cut_at
    ]
    ctx.equal(
        "no side effect after the cut",
        len(late),
        0,
        what="tool requests with A's epoch received after the cut",
    )
    ctx.heal("pg_A")
    wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"], pg_link="pg_B")
    code_b = finish(ctx, b)
    row = checkers.run_row(ctx, run_id)
    ctx.progress(
        "successor took over and finished",
        row["status"] == "succeeded" and row["epoch"] is not None and row["epoch"] > epoch_a,
        expected=f"run succeeded at an epoch above {epoch_a}",
        observed=f"status {row['status']}, epoch {row['epoch']}, B exit {code_b}",
    )
    # A's exit code (10: execution cancelled) is its own account; what shows the
    # execution really stopped is that nothing of A's reached the database or the
    # tool after the cut, also once its link was healed and B had finished.
    # A renewal is no side effect; anything else of A's after the cut is.
    after_cut = [r for r in checkers.changes_by(ctx, ["A"], since=cut_at) if not r["renewal"]]
    late = [
        r
        for r in checkers.tool_requests(ctx, run_id=run_id)
        if r["epoch"] == epoch_a and r["received_at"] > cut_at
    ]
    ctx.invariant(
        "A's execution stopped at the cut",
        not after_cut and not late,
        expected="no change by A in any contract table (a lease renewal aside) and no tool "
        "request with A's epoch after the cut, until the end (link healed, B finished)",
        observed=f"changes by A after the cut {[(r['seq'], r['tbl'], r['op']) for r in after_cut]};"
        f" tool requests {[r['seq'] for r in late]}; A exit {code_a} (10 = cancelled)",
    )
    checkers.one_resource_per_operation(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])
