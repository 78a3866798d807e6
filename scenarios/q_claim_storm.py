"""Q: many workers claim many runs at once with SKIP LOCKED, while some of them
are frozen past their leases: no run is ever held by two owners in one epoch,
epochs per run only grow, and every run finishes with one effect per step.
"""

from __future__ import annotations

import random

from harness import checkers
from harness.experiment import ExperimentContext, ExperimentSpec
from harness.processes import WorkerProcess
from harness.waiting import wait_for
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="Q",
    title="claim storm",
    seed_section="Chinese seed §5 (SKIP LOCKED claim); English seed §5.1, §11",
    invariant="no run held by two owners in one epoch; epochs strictly increase per run; every "
    "run finishes, each tool operation with one real resource",
    fault="6 workers claim 24 runs concurrently; 2 workers are SIGSTOPped past their lease",
    rules=(1, 4),
    lease_ttl_ms=600,
    natural_wait_s=0.6,
    timeout_s=90,
)

RUNS = 24
WORKERS = 6


def _wait_holding(ctx: ExperimentContext, w: WorkerProcess) -> list[str]:
    """Wait until ``w`` holds a lease; 'run_id|owner' of what it holds."""

    def probe() -> list[str] | None:
        rows = ctx.env.query(
            "SELECT run_id::text AS run_id, owner FROM agent_runs WHERE owner LIKE %s "
            "AND status IN ('running', 'waiting_tool')",
            [f"{w.worker_id}%"],
        )
        return [f"{r['run_id']}|{r['owner']}" for r in rows] or None

    return wait_for(probe, what=f"{w.worker_id} to hold a lease", timeout_s=10)


def run(ctx: ExperimentContext) -> None:
    rng = random.Random(ctx.seed)
    run_ids = [new_run(ctx, tool=rng.choice(["idem", "queryable"])) for _ in range(RUNS)]
    workers: list[WorkerProcess] = [ctx.env.start_worker(f"w{i}", "run") for i in range(WORKERS)]
    frozen = rng.sample(workers, 2)
    held: list[str] = []
    for w in frozen:
        held += _wait_holding(ctx, w)
        ctx.pause(w)
    # The fault: frozen until every lease they held has expired by database time.
    wait_for(
        lambda: (
            not ctx.env.query(
                "SELECT 1 FROM agent_runs WHERE run_id = ANY(%s::uuid[]) AND owner = ANY(%s) "
                "AND lease_expires_at > clock_timestamp()",
                [[h.split("|")[0] for h in held], [h.split("|")[1] for h in held]],
            )
        ),
        what="the frozen workers' leases to expire",
        timeout_s=15,
    )
    for w in frozen:
        ctx.resume(w)
    try:
        wait_for(
            lambda: (
                not ctx.env.query(
                    "SELECT 1 FROM agent_runs WHERE run_id = ANY(%s::uuid[]) AND status NOT IN "
                    "('succeeded', 'failed', 'cancelled', 'paused_indoubt', 'paused_human')",
                    [run_ids],
                )
            ),
            what=f"all {RUNS} runs to reach a final or paused state",
            timeout_s=60,
        )
    except TimeoutError as exc:
        ctx.command(str(exc))
    for w in workers:
        ctx.command(f"SIGTERM {w.worker_id}: exited with code {w.stop(grace_s=5)}")
    rows = ctx.sql(
        "final status of every run",
        "SELECT run_id, status, epoch, owner FROM agent_runs WHERE run_id = ANY(%s::uuid[])",
        [run_ids],
    )
    trail = checkers.audit(ctx)
    owners = {r["owner"].split("/")[0] for r in trail if r["owner"]}
    takeovers = [
        r
        for r in trail
        if r["op"] == "UPDATE"
        and r["old_epoch"] is not None
        and r["epoch"] > r["old_epoch"]
        and r["old_owner"] is not None
    ]
    ctx.fault(
        "concurrent claims with takeovers",
        len(owners) >= 3 and len(takeovers) >= 1 and len(ctx.signals) >= 2,
        expected="at least 3 workers claimed runs and a frozen worker's lease was taken over",
        observed=f"owners {sorted(owners)}; takeovers of a held lease {len(takeovers)}; "
        f"signals {len(ctx.signals)}",
    )
    done = [r for r in rows if r["status"] == "succeeded"]
    ctx.equal("every run finished", len(done), RUNS, what="runs succeeded")
    checkers.lease_history_is_sound(ctx, run_ids)
    per_op: dict[str, int] = {}
    for r in checkers.tool_resources(ctx):
        per_op[r["operation_id"]] = per_op.get(r["operation_id"], 0) + 1
    dupes = {k: v for k, v in per_op.items() if v > 1}
    ctx.invariant(
        "one resource per operation",
        not dupes,
        expected="no duplicate resources",
        observed=f"{len(per_op)} operations; duplicates {dupes}",
    )
