"""D: a takeover waits for the transaction of the owner that already validated.

A locks the lease row and validates its lease inside a protected write, then
stops at a barrier. The lease expires by database time while A sits there.
B's targeted takeover must block on the row lock (the harness sees it waiting
in pg_stat_activity) and may only take over after A's transaction ends: the
"valid at check, expired at commit" window is allowed because takeover and
commit are serialised by the row lock.

Variant ``expires_while_waiting``: B's takeover comes while A's lease is
still live, and the lease runs out while B waits on A's row lock. The
decision is B's to make once it has the lock, by the time then (the English
seed §5.1: the waiting update re-evaluates its condition after the lock is
released): B must take the run over, not refuse it on what it read before
it waited.

Variant ``write_waits_past_expiry``: A's protected write (the fast path, one
statement) waits on its run's row lock, which the harness holds, until A's
lease has expired by database time; then the harness lets go. A validates
its lease only once it has the lock, so by the time then: the write must be
refused as lease lost and change nothing (a write that validated by its
transaction's start time, before it waited, commits under an expired lease).
``stepped_write_waits_past_expiry`` does the same on the stepped path, whose
transaction begins before its lease check waits: a check by the
transaction's start time (``now()``) passes there too.
"""

from __future__ import annotations

import time
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, LoggedOp
from harness.parts.control import Hold
from harness.parts.processes import WorkerProcess
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="D",
    title="race after validation",
    seed_section="English seed §6, §11 D",
    invariant="B's takeover waits for A's transaction to end, then takes the next epoch and "
    "sees A's committed write",
    fault="A holds the lease row lock, paused at a barrier past its lease expiry",
    rules=(1, 2),
    injection_point="after_lease_row_locked",
    needs=(needs.capability("checkpoints"), needs.point("after_lease_row_locked")),
    lease_ttl_ms=600,
    natural_wait_s=0.6,
    write_path="stepped",
    variants=(
        "expired_first",
        "expires_while_waiting",
        "write_waits_past_expiry",
        "stepped_write_waits_past_expiry",
    ),
    variant_write_paths=(
        ("write_waits_past_expiry", "fast"),
        ("stepped_write_waits_past_expiry", "stepped"),
    ),
    variant_points=(
        ("write_waits_past_expiry", "none (the harness holds the row lock)"),
        ("stepped_write_waits_past_expiry", "none (the harness holds the row lock)"),
    ),
    variant_faults=(
        (
            "write_waits_past_expiry",
            "the harness holds the run's row lock while A's write waits on it, until A's lease "
            "has expired by database time",
        ),
        (
            "stepped_write_waits_past_expiry",
            "the same on the stepped path: A's transaction begins, then its lease check waits "
            "on the row lock the harness holds until A's lease has expired by database time",
        ),
        (
            "expires_while_waiting",
            "A holds the lease row lock at a barrier; B's takeover comes while A's lease is "
            "live and waits; the lease expires by database time while B waits",
        ),
    ),
)


def run(ctx: ExperimentContext) -> None:
    if ctx.variant == "expires_while_waiting":
        _expires_while_waiting(ctx)
        return
    if ctx.variant in ("write_waits_past_expiry", "stepped_write_waits_past_expiry"):
        _write_waits_past_expiry(ctx)
        return
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    b = ctx.env.start_worker("B", "ops")
    c = ctx.env.start_worker("C", "ops")
    epoch_a, base, write = _a_writes_held_at_its_row_lock(ctx, a, run_id)
    hit = ctx.reached("A", "after_lease_row_locked")
    checkers.wait_lease_expired(ctx, run_id)
    # An untargeted claim (SKIP LOCKED) must pass A's locked row by at once,
    # never queue behind A's transaction nor grant the run under it.
    other = ctx.op_async(c, "claim", {}, worker_async=True)
    c_blocked = checkers.backend_waiting_on_lock(ctx, "C", timeout_s=1.0)
    c_reply = other.result(1.0) if other.done() else None
    ctx.invariant(
        "an untargeted claim skips the row A holds",
        not c_blocked and c_reply is not None and not c_reply.ok,
        expected="C's claim answers at once without the run (NotClaimable), not blocked on a lock",
        observed=f"C blocked on a lock: {c_blocked}; C's answer while A held: "
        + (f"{c_reply.result if c_reply.ok else c_reply.error}" if c_reply else "none"),
    )
    takeover = ctx.op_async(b, "claim", {"run_id": run_id}, worker_async=True)
    ctx.fault(
        "A held inside its transaction past expiry while B tried to take over",
        not write.done() and takeover.sent_at > hit.received_at,
        expected="A at its barrier, lease expired by database time, B's takeover sent",
        observed=f"A held since {hit.received_at:.3f}; B's claim sent {takeover.sent_at:.3f}",
    )
    blocked = checkers.backend_waiting_on_lock(ctx, "B", timeout_s=5)
    ctx.invariant(
        "B's takeover waits for A's transaction",
        blocked and not takeover.done(),
        expected="B blocked on the row lock while A's transaction is open",
        observed=f"B waiting on a lock: {blocked}; B answered while A held: {takeover.done()}"
        + (
            f" ({takeover.result(1).result or takeover.result(1).error})" if takeover.done() else ""
        ),
    )
    ctx.release("A", "after_lease_row_locked")
    a_reply = write.result(15)
    b_reply = takeover.result(15)
    # Whether A's write, validated before expiry, may still commit after it is
    # an implementation's choice (the English seed allows it; re-checking the
    # expiry in the write itself is stricter and also safe). What must hold is
    # the serial order: B takes over only after A's transaction ended, and
    # sees whatever it committed.
    ctx.invariant(
        "A's write either committed or was rejected as lease lost",
        a_reply.ok or a_reply.error == "LeaseLost",
        expected="ok, or LeaseLost",
        observed="committed" if a_reply.ok else f"rejected: {a_reply.error}",
    )
    seen = base + 1 if a_reply.ok else base
    ctx.invariant(
        "B takes over after A's transaction, with the next epoch",
        b_reply.ok
        and b_reply.result.get("epoch") == epoch_a + 1
        and b_reply.result.get("revision") == seen,
        expected=f"B gets epoch {epoch_a + 1} and sees revision {seen}",
        observed=f"B: {b_reply.result if b_reply.ok else b_reply.error}",
    )
    trail = checkers.audit(ctx, run_id)
    a_write = next((r for r in trail if r["revision"] == base + 1 and r["app"] == "A"), None)
    b_claim = next((r for r in trail if r["epoch"] == epoch_a + 1), None)
    ctx.invariant(
        "commit order: A's transaction before B's takeover",
        b_claim is not None
        and (a_write is None) == (not a_reply.ok)
        and (a_write is None or a_write["seq"] < b_claim["seq"]),
        expected="A's write (if any) audited before B's epoch change",
        observed=f"A write seq {a_write and a_write['seq']}, B claim seq "
        f"{b_claim and b_claim['seq']}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _a_writes_held_at_its_row_lock(
    ctx: ExperimentContext, a: WorkerProcess, run_id: str
) -> tuple[Any, Any, LoggedOp]:
    """A claims the run and sends a checkpoint that the barrier holds right
    after it locked the run row: A's epoch, the revision it saw, the write."""
    lease = ctx.ok(a, "claim", run_id=run_id)
    epoch_a, base = lease["epoch"], lease["revision"]  # null where a system has none
    ctx.arm("A", "after_lease_row_locked", Hold())
    write = ctx.op_async(
        a,
        "save_checkpoint",
        {"run_id": run_id, "epoch": epoch_a, "expected_revision": base, "state": {"by": "A"}},
        worker_async=True,
    )
    return epoch_a, base, write


def _expires_while_waiting(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    b = ctx.env.start_worker("B", "ops")
    epoch_a, base, write = _a_writes_held_at_its_row_lock(ctx, a, run_id)
    ctx.reached("A", "after_lease_row_locked")
    live = checkers.run_row(ctx, run_id, "the run as B's takeover is sent")
    takeover = ctx.op_async(b, "claim", {"run_id": run_id}, worker_async=True)
    blocked = checkers.backend_waiting_on_lock(ctx, "B", timeout_s=5)
    checkers.wait_lease_expired(ctx, run_id)
    still = not takeover.done()
    # The harness's doing: B's claim sent under a live lease A's held transaction
    # had validated, and A held until that lease expired. Whether B waited is
    # B's: a takeover that did not wait decided on what it read before.
    ctx.fault(
        "B's takeover came while A's lease was live, and A held past its expiry",
        not live["lease_expired"],
        expected="A's lease unexpired by database time when B's claim was sent, then A held "
        "at its barrier until the lease had expired",
        observed=f"lease expired when sent: {live['lease_expired']}; B waiting on a lock: "
        f"{blocked}; B still waiting at the expiry: {still}",
    )
    let_go = time.time()
    ctx.release("A", "after_lease_row_locked")
    a_reply = write.result(15)
    b_reply = takeover.result(15)
    answered = time.time()
    seen = base + 1 if a_reply.ok else base
    _granted_for_its_duration(ctx, run_id, epoch_a + 1, let_go, answered)
    ctx.progress(
        "B took the run over once it had the lock, by the time then",
        b_reply.ok and b_reply.result.get("epoch") == epoch_a + 1,
        expected=f"B granted epoch {epoch_a + 1} (the lease expired while it waited), seeing "
        f"revision {seen}",
        observed=f"B: {b_reply.result if b_reply.ok else b_reply.error}; A's write "
        f"{'committed' if a_reply.ok else a_reply.error}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


# How much of its lease a grant may lose between computing its expiry and the
# audit trigger of the same statement: only the CPU; a lease counted from
# before the row lock was granted (the transaction's or the statement's start)
# loses the whole wait, here most of A's lease.
GRANT_SLACK_MS = 150


def _granted_for_its_duration(
    ctx: ExperimentContext, run_id: str, epoch: int, since: float, until: float
) -> None:
    """B's takeover waited on A's row lock for most of a lease duration: its
    lease must still last the lease duration from the grant, counted once
    the lock was granted (contract section 1: expiry = database time of the
    grant + TTL), not from when B's transaction or statement began."""
    rows = ctx.sql(
        "B's grant as the audit trigger saw it",
        "SELECT at, lease_expires_at, extract(epoch FROM lease_expires_at - at) * 1000 AS ms"
        " FROM fencecheck_audit.run_changes WHERE run_id = %s AND epoch = %s AND app = 'B'"
        " ORDER BY seq LIMIT 1",
        [run_id, epoch],
    )
    if not rows:
        return  # no grant to B: the progress check above says so
    ttl = ctx.env.lease_ttl_ms
    granted = float(rows[0]["ms"])
    ctx.progress(
        "a takeover that waited on the row lock is granted the whole lease duration",
        granted >= ttl - GRANT_SLACK_MS,
        expected=f"B's lease ends at least {ttl - GRANT_SLACK_MS} ms after its grant's audit time "
        f"(lease duration {ttl} ms, {GRANT_SLACK_MS} ms for the CPU between the two)",
        observed=f"granted for {granted:.1f} ms (expiry {rows[0]['lease_expires_at']}, audited "
        f"{rows[0]['at']})",
        since=since,
        until=until,
    )


def _write_waits_past_expiry(ctx: ExperimentContext) -> None:
    """A checkpoint, then a tool intent (another transition: the reference's
    fast path takes it through another function than a checkpoint), each
    waiting on its run's row lock until its lease has expired."""
    a = ctx.env.start_worker("A", "ops")
    runs = [_one_write_waits_past_expiry(ctx, a, "save_checkpoint", {"state": {"by": "A"}})]
    if ctx.system.capabilities.offers_op("register_intent"):
        intent = {
            "step_id": "d.held",
            "effect_version": 1,
            "tool": "idem",
            "request": {"kind": "return_label"},
        }
        runs.append(_one_write_waits_past_expiry(ctx, a, "register_intent", intent))
    else:
        ctx.not_judged(
            "a register_intent that got the lock after its lease expired is refused",
            expected="judged where the system offers register_intent",
            observed="the system's mapping offers no register_intent",
        )
    checkers.lease_history_is_sound(ctx, runs)


def _one_write_waits_past_expiry(
    ctx: ExperimentContext, a: WorkerProcess, op: str, args: dict[str, Any]
) -> str:
    run_id = new_run(ctx)
    lease = ctx.ok(a, "claim", run_id=run_id)
    epoch_a, base = lease["epoch"], lease["revision"]
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        write = ctx.op_async(
            a,
            op,
            {"run_id": run_id, "epoch": epoch_a, "expected_revision": base, **args},
            worker_async=True,
        )
        waiting = lock.answered_or_waiting(write.pending, "A")
        live = checkers.run_row(ctx, run_id, f"the run while A's {op} waits")
        checkers.wait_lease_expired(ctx, run_id)
        still = not write.done()
    ctx.fault(
        f"A's {op} waited on the run's row lock from before its lease expired until after",
        waiting is not None and not live["lease_expired"] and still,
        expected="A's session waiting on a lock while its lease was live, still waiting when "
        "the lease had expired by database time",
        observed=f"{waiting or 'A answered before waiting'}; lease expired when seen waiting: "
        f"{live['lease_expired']}; still waiting at the expiry: {still}",
    )
    reply = write.result(15)
    after = checkers.run_row(ctx, run_id, f"the run after A's {op}")
    ledger = checkers.ledger(ctx, run_id)
    name = "a write" if op == "save_checkpoint" else f"a {op}"
    ctx.invariant(
        f"{name} that got the lock after its lease expired is refused",
        not reply.ok and after["revision"] == base and not ledger,
        expected=f"A's {op} refused (lease lost), the run still at revision {base}, nothing "
        "in its ledger",
        observed=f"A: {'committed' if reply.ok else reply.error}; revision {after['revision']}; "
        f"ledger rows {len(ledger)}",
    )
    return run_id
