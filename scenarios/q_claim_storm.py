"""Q: many workers claim many runs at once with SKIP LOCKED, while some of them
are frozen past their leases: no run is ever held by two owners in one epoch,
epochs per run only grow, and every run finishes with one effect per step.
"""

from __future__ import annotations

from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Hold
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for
from scenarios.common import finish, new_run

SPEC = ExperimentSpec(
    id="Q",
    title="claim storm",
    seed_section="Chinese seed §5 (SKIP LOCKED claim); English seed §5.1, §11",
    invariant="no run held by two owners in one epoch; epochs strictly increase per run; every "
    "run finishes, each tool operation with one real resource; a run --once worker among them "
    "executes one run and exits",
    fault="6 workers claim 24 runs concurrently; 2 of them are SIGSTOPped holding a lease "
    "(frozen at after_lease_acquired) until others take their runs over",
    rules=(1, 4),
    lease_ttl_ms=600,
    natural_wait_s=0.6,
    layer="queue",
    needs=(needs.capability("workflow"), needs.point("after_lease_acquired")),
    timeout_s=90,
)

RUNS = 24
WORKERS = 6
#: Contract section 2: database sessions of a long-lived worker between runs.
IDLE_SESSIONS_MAX = 4
#: A worker started with ``run --once`` beside the others, and how long it has
#: to exit once every run is final (its one run is long done by then).
ONCE = "once"
ONCE_EXIT_S = 15.0


def run(ctx: ExperimentContext) -> None:
    rng = ctx.rng
    run_ids = [new_run(ctx, tool=rng.choice(["idem", "queryable"])) for _ in range(RUNS)]
    # Two workers, chosen by the seed, stop at a barrier right after their
    # first claim; the harness freezes them there (SIGSTOP) holding that lease,
    # opens the barrier and keeps them frozen until another worker took over.
    names = [f"w{i}" for i in range(WORKERS)]
    frozen_names = rng.sample(names, 2)
    for name in frozen_names:
        ctx.arm(name, "after_lease_acquired", Hold())
    # Started first, so that runs are still queued when it looks: it must
    # execute one and exit (idle, it exits too: nothing is left to claim).
    once = ctx.env.start_worker(ONCE, "run", ["--once", "--exit-when-idle"])
    workers: list[WorkerProcess] = [ctx.env.start_worker(n, "run") for n in names]
    frozen = [w for w in workers if w.worker_id in frozen_names]
    held: list[tuple[str, int]] = []
    for w in frozen:
        hit = ctx.reached(w.worker_id, "after_lease_acquired", timeout_s=20)
        ctx.pause(w)
        ctx.release(w.worker_id, "after_lease_acquired")
        if hit.run_id is not None and hit.epoch is not None:
            held.append((hit.run_id, hit.epoch))
    stopped = [s.state == "stopped" for s in ctx.signals]
    taken_over = True
    try:
        wait_for(
            lambda: all(
                ctx.env.query(
                    "SELECT 1 FROM fencecheck_model.agent_runs WHERE run_id = %s AND epoch > %s",
                    [run, epoch],
                )
                for run, epoch in held
            ),
            what="the frozen workers' runs to be taken over",
            timeout_s=20,
        )
    except TimeoutError as exc:
        taken_over = False
        ctx.command(str(exc))
    for w in frozen:
        ctx.resume(w)
    try:
        wait_for(
            lambda: (
                not ctx.env.query(
                    "SELECT 1 FROM fencecheck_model.agent_runs WHERE run_id::text = ANY(%s::text[]) AND status NOT IN "
                    "('succeeded', 'failed', 'cancelled', 'paused_indoubt', 'paused_human')",
                    [run_ids],
                )
            ),
            what=f"all {RUNS} runs to reach a final or paused state",
            timeout_s=60,
        )
    except TimeoutError as exc:
        ctx.command(str(exc))
    sessions = ctx.sql(
        "each worker's database sessions once every run was final",
        "SELECT application_name AS worker, count(*) AS sessions FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = ANY(%s) GROUP BY 1",
        [names],
    )
    for w in workers:
        ctx.command(f"SIGTERM {w.worker_id}: exited with code {w.stop(grace_s=5)}")
    rows = ctx.sql(
        "final status of every run",
        "SELECT run_id, status, epoch, owner FROM fencecheck_model.agent_runs WHERE run_id::text = ANY(%s::text[])",
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
        "two workers frozen while holding a lease, among concurrent claimers",
        len(held) == 2 and stopped[:2] == [True, True] and len(owners) >= 3,
        expected="2 workers stopped in the kernel right after a claim; at least 3 claimers",
        observed=f"held while frozen {held}; kernel states {stopped}; owners {sorted(owners)}",
    )
    ctx.progress(
        "the frozen workers' runs were taken over",
        taken_over and len(takeovers) >= len(held),
        expected="each frozen run claimed again at a higher epoch by another worker",
        observed=f"taken over: {taken_over}; takeovers of an expired lease {len(takeovers)}",
    )
    done = [r for r in rows if r["status"] == "succeeded"]
    ctx.progress_equal(
        "every run finished",
        len(done),
        RUNS,
        what=f"runs succeeded (the others: {sorted(r['status'] for r in rows if r not in done)})",
    )
    _sessions_do_not_pile_up(ctx, sessions, trail)
    checkers.lease_history_is_sound(ctx, run_ids)
    checkers.one_resource_per_operation(ctx)
    _once_executes_one_run(ctx, once, trail)


def _once_executes_one_run(
    ctx: ExperimentContext, once: WorkerProcess, trail: list[dict[str, Any]]
) -> None:
    """A ``run --once`` worker among the claimers executes one run and exits
    (contract section 1; blind bug hunt round 25, #03: a worker that went on
    claiming after its run, where every other experiment names the run with
    ``--run-id``). Read from the audit trail: the runs whose lease passed to
    it from another owner. Its exit is bounded like any worker's."""
    claimed = sorted(
        {
            str(r["run_id"])
            for r in trail
            if r["op"] == "UPDATE"
            and (r["owner"] or "").split("/")[0] == ONCE
            and (r["old_owner"] or "").split("/")[0] != ONCE
        }
    )
    ctx.invariant(
        "a --once worker executes one run",
        len(claimed) <= 1,
        expected=f"{ONCE} (run --once --exit-when-idle) claimed at most one run",
        observed=f"claimed {len(claimed)} run(s) {[r[:8] for r in claimed]}",
    )
    finish(ctx, once, timeout_s=ONCE_EXIT_S)


def _sessions_do_not_pile_up(
    ctx: ExperimentContext, sessions: list[dict[str, Any]], trail: list[dict[str, Any]]
) -> None:
    """Contract section 2 (bounds the worker owns): a long-lived worker's
    database sessions do not grow with the runs it has executed. Counted once
    every run was final, so each worker sits between runs: one that kept a
    session of each finished execution (its heartbeat's, a read-back's) holds
    more than the bound after the runs Q gives it."""
    held = {str(r["worker"]): int(r["sessions"]) for r in sessions}
    claims: dict[str, int] = {}
    for r in trail:
        if r["owner"] and r["op"] == "UPDATE" and r["epoch"] != r["old_epoch"]:
            name = str(r["owner"]).split("/")[0]
            claims[name] = claims.get(name, 0) + 1
    over = {w: n for w, n in held.items() if n > IDLE_SESSIONS_MAX}
    ctx.invariant(
        "no worker's database sessions pile up with the runs it executed",
        not over,
        expected=f"at most {IDLE_SESSIONS_MAX} sessions of each worker between runs",
        observed=f"sessions {dict(sorted(held.items()))}; claims made "
        f"{dict(sorted(claims.items()))}",
    )
