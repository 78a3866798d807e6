"""A: two sequential checkpoints by the same owner in the same epoch both succeed.

Baseline: the protected-write path must not reject the legitimate owner, and
each write must advance the revision by exactly one, with its checkpoint row
and outbox row committed together. A ``read_checkpoint`` after each write
answers that write (its state, and its revision when the reply gives one).

Then two writes of one holder in a row, pipelined: the harness holds the
run's row while the holder sends a write at the run's revision N and, before
it is answered, one at N + 1. Let go, both must commit, N + 1 then N + 2:
the second's expected revision is the run's once the first has committed,
whichever way each write waited (one statement, or the row locked first).

Last, A is stopped and started again under its worker id (a supervisor's
restart): the new process's claim, intent and release are appended to the
history file the first one wrote, which must still begin with those lines;
its intent's ``after_outbound_intent_commit`` is answered with a 200 ms
``delay``, which it must sleep before it answers.
"""

from __future__ import annotations

import time
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Delay
from harness.parts.processes import OpReply, WorkerProcess
from scenarios.common import new_run, seen_within

#: The control protocol's delay answer the restarted A is given once (ms).
DELAY_MS = 200

SPEC = ExperimentSpec(
    id="A",
    title="continuous checkpoints",
    seed_section="English seed §11 A; §6",
    invariant="two sequential writes in one epoch both succeed; revision +1 each, consecutive; "
    "each checkpoint and its outbox event commit together; a read after each write answers "
    "it; two pipelined writes (N, then N + 1) both commit; a worker started again appends to "
    "its history",
    fault="two sequential protected writes by the same owner in the same epoch",
    rules=(2, 3),
    injection_point="after_checkpoint_commit",
    needs=needs.capabilities("checkpoints", "revision_check", "outbox"),
    # No expiry plays a part: the pipelined writes wait on the harness's lock
    # as long as a loaded machine makes it, under a lease that outlasts that.
    lease_ttl_ms=10_000,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    epoch, base = lease["epoch"], lease["revision"]
    # The harness names each write's event_id, so the evidence below can find
    # exactly these two writes, whatever the worker answers.
    event_ids = [ctx.uuid(), ctx.uuid()]
    replies, reads = [], []
    for i in range(2):
        replies.append(
            ctx.op(
                w,
                "save_checkpoint",
                run_id=run_id,
                epoch=epoch,
                expected_revision=base + i,
                state={"step": f"a{i + 1}"},
                event_id=event_ids[i],
            )
        )
        # A read after each write (it writes nothing) must answer that write.
        reads.append(ctx.op(w, "read_checkpoint", run_id=run_id))
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
    _reads_answer_the_latest_write(ctx, reads, mine, base)
    _own_live_lease_not_granted_again(ctx, w, run_id)
    pipelined = _pipelined_writes(ctx)
    _read_answers_its_own_run(ctx, w, pipelined, run_id)
    again = _started_again(ctx, w)
    checkers.lease_history_is_sound(ctx, [run_id, pipelined, again])


def _started_again(ctx: ExperimentContext, w: WorkerProcess) -> str:
    """A stopped and started again under its worker id, as a supervisor
    restarts a process: the new process claims and releases a run of its own,
    appending to the history file A's first process wrote (blind hunt 70
    #07: a Go history opened with O_TRUNC erased the earlier process's
    account; the global ``worker.history_is_appended_to`` judges it)."""
    code = w.stop(grace_s=5.0)
    ctx.command(f"A stopped (exit {code}) and started again under the same worker id")
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(a, "claim", run_id=run_id)
    caps = ctx.system.capabilities
    if caps.offers_op("register_intent") and caps.hosts("after_outbound_intent_commit"):
        _delay_is_slept(ctx, a, run_id, lease)
    ctx.ok(a, "release", run_id=run_id, epoch=lease["epoch"])
    ctx.fault(
        "A started again on the history its first process wrote",
        a.history_before is not None,
        expected="the history file holds the first process's lines when the second starts",
        observed=f"{a.history_before[0] if a.history_before else 0} bytes before the restart",
    )
    return run_id


def _read_answers_its_own_run(
    ctx: ExperimentContext, w: WorkerProcess, run_id: str, other: str
) -> None:
    """A read of ``run_id`` while ``other``, a run of the same tenant made
    before it, has checkpoints at the same revisions: the reply is the run's
    own checkpoint at its revision (blind hunt 47 #02: a read that joined the
    checkpoints on the revision alone answered the other run's)."""
    revision = checkers.run_row(ctx, run_id, "the run read")["revision"]
    own = {c["revision"]: c["state_json"] for c in checkers.checkpoints(ctx, run_id)}
    theirs = {c["revision"] for c in checkers.checkpoints(ctx, other)}
    name = "read_checkpoint answers the run's own checkpoint"
    if not ctx.probe_reached(
        "another run of the tenant has a checkpoint at the read run's revision",
        revision in own and revision in theirs,
        judges=name,
        expected=f"checkpoints of both runs at revision {revision}",
        observed=f"the read run's revisions {sorted(own)}, the other's {sorted(theirs)}",
    ):
        return
    read = ctx.op(w, "read_checkpoint", run_id=run_id)
    state = (read.result or {}).get("state") if read.ok else None
    ctx.invariant(
        name,
        read.ok and state == own.get(revision),
        expected=f"the state of the run's own checkpoint at revision {revision}: "
        f"{own.get(revision)}",
        observed=f"{state if read.ok else f'{read.error}: {read.message}'}",
    )


def _own_live_lease_not_granted_again(
    ctx: ExperimentContext, w: WorkerProcess, run_id: str
) -> None:
    """The holder asks for the run it holds again (an earlier claim's answer
    lost, say): a lease is granted only when free or expired (rule 1), to its
    holder too; a new epoch over a live lease fences the holder's own work
    (blind hunt 27 #05). The global lease.granted_only_when_free_or_expired
    judges it from the audit trail as well."""
    before = checkers.run_row(ctx, run_id, "the run before the holder's second claim")
    reply = ctx.op(w, "claim", run_id=run_id)
    after = checkers.run_row(ctx, run_id, "the run after the holder's second claim")
    # Refused NotClaimable (contract: claim), not by whatever the database's
    # own guard says once the worker let the grant through (blind hunt 72
    # #06: a Go takeover that matched its own live lease; its guard refused).
    ctx.invariant(
        "the holder's second claim of its live lease grants nothing",
        (after["epoch"], after["owner"]) == (before["epoch"], before["owner"])
        and not reply.ok
        and reply.error == "NotClaimable",
        expected=f"refused NotClaimable, epoch {before['epoch']} and owner as before (the "
        "lease is live)",
        observed=f"claim {'ok ' + str(reply.result) if reply.ok else reply.error}; epoch "
        f"{before['epoch']} -> {after['epoch']}, owner {before['owner']} -> {after['owner']}",
    )


def _reads_answer_the_latest_write(
    ctx: ExperimentContext,
    reads: list[OpReply],
    mine: list[dict[str, Any] | None],
    base: int,
) -> None:
    """read_checkpoint after each write answers that write's state (and its
    revision, when the reply gives one: the contract makes it optional). The
    reply is the only witness of the worker's read (it writes nothing); the
    revisions differ from read to read, so a field answered in another's place
    shows."""
    got = [
        (r.result.get("revision"), {k: (r.result.get("state") or {}).get(k) for k in ("step",)})
        if r.ok
        else (r.error, None)
        for r in reads
    ]
    want = [
        (m["revision"] if m else base + i + 1, {"step": f"a{i + 1}"}) for i, m in enumerate(mine)
    ]
    ctx.invariant(
        "read_checkpoint answers the latest checkpoint",
        all(
            r.ok and g[1] == w[1] and (r.result.get("revision") is None or g[0] == w[0])
            for r, g, w in zip(reads, got, want, strict=True)
        ),
        expected=f"(revision, state) after each write: {want} (revision optional in the reply)",
        observed=f"{got}",
    )


def _pipelined_writes(ctx: ExperimentContext) -> str:
    run_id = new_run(ctx)
    p = ctx.env.start_worker("P", "ops")
    lease = ctx.ok(p, "claim", run_id=run_id)
    base = lease["revision"]
    event_ids = [ctx.uuid(), ctx.uuid()]

    def write(n: int) -> Any:
        return ctx.op_async(
            p,
            "save_checkpoint",
            {
                "run_id": run_id,
                "epoch": lease["epoch"],
                "expected_revision": base + n,
                "state": {"pipelined": n},
                "event_id": event_ids[n],
            },
            worker_async=True,
        )

    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        first = write(0)
        one = lock.wait_for_sessions("P", 1)
        second = write(1)

        def second_waits_or_answers() -> str | None:
            # A second write refused at once never waits on the row: waiting
            # for it there would only let the lease run out.
            if second.done():
                return "the second answered while the first was held"
            return lock.wait_for_sessions("P", 2, timeout_s=0)

        both = seen_within(
            second_waits_or_answers,
            what="P's second write to wait on the run's row or to answer",
            timeout_s=10,
        )
    replies = [first.result(15), second.result(15)]
    after = checkers.run_row(ctx, run_id, "the lease once both writes answered")
    name = "pipelined writes both commit, in order"
    expected = (
        f"a session of P waiting on the row (the write at revision {base}), then a second "
        f"(the write at {base + 1}), while the harness held it; the lease live once both answered"
    )
    observed = (
        f"{one or 'the first never waited'}; {both or 'the second never waited'}; "
        f"lease expired: {after['lease_expired']}"
    )
    # The state is the second write sent while the first waits on the row: a
    # second that never waits there (refused at once, say, or kept back by
    # the worker itself) is judged by what it committed like any other.
    if not ctx.probe_reached(
        "a second write of one holder sent while its first waited on the run's row",
        one is not None and not after["lease_expired"],
        judges=name,
        expected=expected,
        observed=observed,
    ):
        return run_id
    committed = {str(w["event_id"]): w["revision"] for w in checkers.writes(ctx, run_id)}
    told = [r.result.get("revision") if r.ok else f"{r.error}: {r.message}" for r in replies]
    ctx.equal(
        name,
        [committed.get(e) for e in event_ids],
        [base + 1, base + 2],
        what=f"revisions committed by the writes at {base} and {base + 1} (the worker "
        f"answered {told}; the lease outlasts the wait)",
    )
    return run_id


def _delay_is_slept(
    ctx: ExperimentContext, a: WorkerProcess, run_id: str, lease: dict[str, Any]
) -> None:
    """The control protocol's ``delay`` answer at ``after_outbound_intent_commit``
    of a ``register_intent``: the worker sleeps that long before it goes on,
    so its reply comes no sooner than that after the harness answered (blind
    hunt 70 #08: a Go worker took the milliseconds for nanoseconds and went on
    at once; a lower bound, which no busy machine can break)."""
    ctx.arm("A", "after_outbound_intent_commit", Delay(DELAY_MS))
    reply = ctx.op(
        a, "register_intent", run_id=run_id, epoch=lease["epoch"],
        expected_revision=lease["revision"], step_id="a.delayed", effect_version=1,
        tool="idem", request={"kind": "return_label"},
    )  # fmt: skip
    answered_at = time.time()
    hit = ctx.reached("A", "after_outbound_intent_commit")
    waited_ms = (answered_at - hit.received_at) * 1000
    ctx.invariant(
        "a delay answer is slept",
        reply.ok and waited_ms >= DELAY_MS,
        expected=f"register_intent answered ok no sooner than {DELAY_MS} ms after the harness "
        "answered its point with that delay",
        observed=f"reply {'ok' if reply.ok else reply.error}, {waited_ms:.1f} ms after the answer",
    )
