"""N: the database itself refuses a worker of one tenant any read, claim or write
of another tenant's run, and refuses the worker role a write around the
protected-write path.

Two witnesses: the worker of tenant 1 trying through its own code, and the
harness connecting as the worker role itself with tenant 1 set, so the check
does not depend on the worker filtering by tenant.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="N",
    title="tenant isolation",
    seed_section="Chinese seed §12; English seed §12 (roles)",
    invariant="cross-tenant read, claim and write are refused by the database; the worker "
    "role cannot update protected columns directly",
    fault="a worker and a raw worker-role session of tenant 1 aim at tenant 2's run",
    rules=(12,),
)


def run(ctx: ExperimentContext) -> None:
    t1, t2 = ctx.env.tenant_id, ctx.env.other_tenant_id
    mine = new_run(ctx, tenant_id=t1)
    theirs = new_run(ctx, tenant_id=t2)
    owner2 = ctx.env.start_worker("T2", "ops", tenant_id=t2)
    lease2 = ctx.ok(owner2, "claim", run_id=theirs)
    ctx.ok(
        owner2,
        "save_checkpoint",
        run_id=theirs,
        epoch=lease2["epoch"],
        expected_revision=lease2["revision"],
        state={"secret": "tenant 2"},
    )
    before = checkers.run_row(ctx, theirs, "tenant 2's run before the attempts")
    w1 = ctx.env.start_worker("T1", "ops", tenant_id=t1)
    attempts = {
        "read": ctx.op(w1, "read_checkpoint", run_id=theirs),
        "claim": ctx.op(w1, "claim", run_id=theirs),
        "write": ctx.op(
            w1,
            "save_checkpoint",
            run_id=theirs,
            epoch=lease2["epoch"],
            expected_revision=before["revision"],
            state={"by": "tenant 1"},
        ),
    }
    for name, reply in attempts.items():
        ctx.invariant(
            f"worker's cross-tenant {name} refused",
            not reply.ok,
            expected="refused",
            observed="accepted" if reply.ok else str(reply.error),
        )
    raw = {
        "read": checkers.as_worker_role(
            ctx, t1, "SELECT run_id, status FROM agent_runs WHERE run_id = %s", [theirs]
        ),
        "checkpoint read": checkers.as_worker_role(
            ctx, t1, "SELECT revision FROM agent_checkpoints WHERE run_id = %s", [theirs]
        ),
        "direct update": checkers.as_worker_role(
            ctx, t1, "UPDATE agent_runs SET status = 'cancelled' WHERE run_id = %s", [theirs]
        ),
        "own protected column": checkers.as_worker_role(
            ctx, t1, "UPDATE agent_runs SET epoch = epoch + 100 WHERE run_id = %s", [mine]
        ),
    }
    own = checkers.as_worker_role(
        ctx, t1, "SELECT run_id FROM agent_runs WHERE run_id = %s", [mine]
    )
    ctx.fault(
        "the worker role works for its own tenant",
        own[0] == "ok" and isinstance(own[1], list) and len(own[1]) == 1,
        expected="tenant 1 sees its own run",
        observed=f"{own}",
    )
    for name, (status, detail) in raw.items():
        refused = status != "ok" or detail == [] or detail == "0 row(s) affected"
        ctx.invariant(
            f"database refuses {name}",
            refused,
            expected="no rows, or permission denied",
            observed=f"{status}: {detail}",
        )
    after = checkers.run_row(ctx, theirs, "tenant 2's run after the attempts")
    ctx.equal(
        "tenant 2's run untouched",
        (after["status"], after["revision"], after["epoch"], after["owner"]),
        (before["status"], before["revision"], before["epoch"], before["owner"]),
        what="(status, revision, epoch, owner)",
    )
