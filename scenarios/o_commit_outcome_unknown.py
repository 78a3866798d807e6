"""O: the link to PostgreSQL fails during COMMIT; the worker decides by reading back
the same event_id, and ends with the write exactly once.

Two cases the worker cannot tell apart from its side: the COMMIT never
reached the server (request lost), or it committed and the answer was lost
(response lost). Either way: no duplicate event, no lost write.

Variant ``half_found``: the request is lost, and meanwhile an outbox row with
the write's event_id appears without its checkpoint (planted by the harness
as a restore or a reused id would leave it). The read-back then finds one of
the two rows: that is no commit. The worker must not answer ok, and says
CommitInconsistent ("one without the other means freeze and alert"; a `run`
worker also freezes the run, an `ops` write only answers).

Variant ``checkpoint_half_found``: the other half, a checkpoint row with the
write's event_id and no outbox row: the event would be lost, so again no
commit.

Variant ``run_half_found``: the same in ``run`` mode, on the workflow's
second write: the worker must freeze the run in doubt with an
``agent.commit_inconsistent`` event and write nothing on top of that write.

Variant ``run_intent_answer_lost``: in ``run`` mode, the answer to the
COMMIT of the tool step's intent is lost after the server committed it: the
worker reads it back and goes on from the ledger to finish the run.

Variant ``commit_refused``: the COMMIT itself answers a definite error (a
deferred constraint trigger the harness adds refuses the write's checkpoint
row at commit, advancing a sequence first as the evidence it fired): the
worker must not answer ok, nothing of the write is
there, and its next write goes through.

Variant ``lost_thrice``: one ``ops`` process loses the COMMIT of three
writes in a row (request lost each time); each is read back and decided on
its own, whatever the process met before.

Variants ``fast_response_lost`` and ``fast_answer_reset``: the same response
lost on the fast path (the production path: one statement in autocommit, no
point before its commit). The harness holds the run's row lock, so W's write
waits inside the server; answers are dropped (or the connection is reset when
the answer comes), the lock let go, and the server commits with its answer
lost. After the read-back, W's next write (on the same thread) must go
through: a session whose statement's outcome was unknown is discarded, not
used again (generated ddaf9f61 kept it). A worker whose only path sends its
COMMIT after the statement answers never sends it here: nothing commits,
and W must not answer ok.
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness.checking import checkers
from harness.checking.history import load_history
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Hit, Hold
from harness.parts.processes import OpReply, WorkerProcess
from scenarios.common import finish, new_run, seen_within

HALF_FOUND = "half_found"
CHECKPOINT_HALF_FOUND = "checkpoint_half_found"
RUN_HALF_FOUND = "run_half_found"
LOST_THRICE = "lost_thrice"
FAST_RESPONSE_LOST = "fast_response_lost"
FAST_ANSWER_RESET = "fast_answer_reset"
FAST = (FAST_RESPONSE_LOST, FAST_ANSWER_RESET)
RUN_INTENT_ANSWER_LOST = "run_intent_answer_lost"
COMMIT_REFUSED = "commit_refused"
# run_half_found: W's lease, far longer than the case (its renewals are parked).
RUN_HALF_FOUND_LEASE_MS = 60_000

SPEC = ExperimentSpec(
    id="O",
    title="commit outcome unknown",
    seed_section="Chinese seed §6.1; English seed §7 (SQL timeout / connection lost)",
    invariant="read-back by event_id decides: the write ends up committed exactly once, with "
    "one checkpoint and one outbox event carrying that event_id; a read-back that finds only "
    "one of the two is no commit (never ok: CommitInconsistent)",
    fault="worker->postgres link cut (request lost) or answers dropped (response lost) at "
    "COMMIT; half_found: the request lost and an outbox row with the write's event_id planted "
    "without its checkpoint before the heal (checkpoint_half_found: a checkpoint without its "
    "outbox row)",
    rules=(9,),
    injection_point="before_commit",
    needs=(
        *needs.capabilities("checkpoints", "outbox"),
        needs.point("before_commit"),
        needs.capability("contract_schema", CHECKPOINT_HALF_FOUND),
        needs.capability("workflow", RUN_HALF_FOUND, RUN_INTENT_ANSWER_LOST),
        needs.point("before_renew", RUN_HALF_FOUND, RUN_INTENT_ANSWER_LOST),
    ),
    variants=(
        "request_lost",
        "response_lost",
        HALF_FOUND,
        CHECKPOINT_HALF_FOUND,
        RUN_HALF_FOUND,
        LOST_THRICE,
        RUN_INTENT_ANSWER_LOST,
        COMMIT_REFUSED,
        *FAST,
    ),
    variant_waits=(("response_lost", 0.4), (FAST_RESPONSE_LOST, 0.4)),
    variant_write_paths=tuple((v, "fast") for v in FAST),
    variant_points=tuple((v, "none (the harness holds the row lock)") for v in FAST),
    variant_faults=(
        (
            COMMIT_REFUSED,
            "no link fault: a deferred constraint trigger the harness adds refuses the write's "
            "checkpoint row at COMMIT (a definite error), advancing a sequence as it fires",
        ),
        (
            RUN_INTENT_ANSWER_LOST,
            "a run worker's link answers dropped at the COMMIT of its tool step's intent, after "
            "the server committed it, then healed",
        ),
        (
            LOST_THRICE,
            "worker->postgres link cut (request lost) at COMMIT, three writes in a row by one "
            "ops process, healed after each",
        ),
        (
            FAST_RESPONSE_LOST,
            "the fast path's one statement waits on the run's row lock the harness holds; "
            "worker->postgres answers dropped, the lock let go: the server commits, the "
            "answer lost",
        ),
        (
            FAST_ANSWER_RESET,
            "the same, the connection reset (TCP RST) when the server's answer comes: the "
            "server commits, the client meets a reset",
        ),
    ),
    write_path="stepped",
    # The race is about a COMMIT's outcome, not expiry: the read-back after
    # the heal must meet a live lease, also when a loaded machine makes the
    # cut, the sessions' end (up to 10 s) and the heal last long. 5 s was
    # not enough once: the sessions took 4.5 s to end beside a loaded
    # campaign, the lease ran out before the read-back, and the worker's
    # correct LeaseLost failed "committed exactly once". Nothing waits on
    # this lease, so a long one costs no time.
    lease_ttl_ms=20_000,
)


def run(ctx: ExperimentContext) -> None:
    variant = ctx.variant or "request_lost"
    if variant == RUN_HALF_FOUND:
        _run_half_found(ctx)
        return
    if variant == RUN_INTENT_ANSWER_LOST:
        _run_intent_answer_lost(ctx)
        return
    run_id = new_run(ctx)
    w = ctx.env.start_worker("W", "ops")
    claim_sent = time.time()
    lease = ctx.ok(w, "claim", run_id=run_id)
    # One write committed first: the tenant then holds an event already, so a
    # read-back that matches more than the write's own event_id shows.
    base = ctx.ok(w, "save_checkpoint", run_id=run_id, epoch=lease["epoch"],
                  expected_revision=lease["revision"], state={"step": "before"})["revision"]  # fmt: skip
    if variant == COMMIT_REFUSED:
        _commit_refused(ctx, w, run_id, lease["epoch"], base)
        return
    if variant in FAST:
        # On W's main thread: the session that lost the answer is the one its
        # next request would use, unless W discarded it (a session another
        # thread held, idle when the link closed it, may answer its loss at its
        # first use: W could not know; this one W saw break).
        if _lost_commit(ctx, variant, w, run_id, lease["epoch"], base, claim_sent,
                        worker_async=False):  # fmt: skip
            now = checkers.run_row(ctx, run_id, "the run after the lost answer")["revision"]
            _next_write_goes_through(ctx, w, run_id, lease["epoch"], int(now))
        return
    if variant != LOST_THRICE:
        _lost_commit(ctx, variant, w, run_id, lease["epoch"], base, claim_sent)
        return
    # The same process loses three COMMITs in a row, each read back on its own
    # (blind hunt 44 #02: a budget of read-backs spent per process, not per write,
    # answered the third unknown at once), on the thread that keeps its state
    # between requests. The lease renewed before each.
    for _ in range(3):
        claim_sent = time.time()
        # The first use of a session the last cut closed may answer its loss.
        if not ctx.op(w, "renew", run_id=run_id, epoch=lease["epoch"]).ok:
            ctx.ok(w, "renew", run_id=run_id, epoch=lease["epoch"])
        if not _lost_commit(
            ctx, "request_lost", w, run_id, lease["epoch"], base, claim_sent, worker_async=False
        ):
            return
        base += 1


def _commit_refused(
    ctx: ExperimentContext, w: WorkerProcess, run_id: str, epoch: int, base: int
) -> None:
    """W's write whose COMMIT fails with a definite error: a constraint trigger
    the harness adds, deferred to the commit, refuses its checkpoint row by
    event_id (the server's own refusal, as a deferred constraint or a
    serialization failure at commit would give). Generated e714485b: a
    stepped write that swallowed a COMMIT error which was not an unknown
    outcome answered the write committed."""
    event_id = ctx.uuid()
    marker = f"refused at commit by the harness: {event_id}"
    # A sequence's advance outlives the refused transaction: the evidence
    # that the trigger fired at that COMMIT (a server log this host may not
    # read, in a container, is not needed).
    ctx.env.query("CREATE SEQUENCE public.fencecheck_refusals")
    ctx.env.query(
        "CREATE FUNCTION public.fencecheck_refuse_at_commit() RETURNS trigger "
        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$BEGIN IF NEW.event_id::text = '"
        + event_id
        + "' THEN "
        "PERFORM nextval('public.fencecheck_refusals'); "
        "RAISE EXCEPTION '" + marker + "'; END IF; RETURN NULL; END$$"
    )
    ctx.env.query(
        "CREATE CONSTRAINT TRIGGER fencecheck_refuse_at_commit AFTER INSERT "
        "ON public.agent_checkpoints DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "EXECUTE FUNCTION public.fencecheck_refuse_at_commit()"
    )
    ctx.command(f"a constraint trigger deferred to the commit refuses event {event_id}")

    def save(step: str, **extra: Any) -> OpReply:
        return ctx.op(w, "save_checkpoint", run_id=run_id, epoch=epoch,
                      expected_revision=base, state={"step": step}, **extra)  # fmt: skip

    reply = save("refused at commit", event_id=event_id)
    ctx.env.query("DROP TRIGGER fencecheck_refuse_at_commit ON public.agent_checkpoints")
    ctx.env.query("DROP FUNCTION public.fencecheck_refuse_at_commit()")
    fired = bool(ctx.env.query("SELECT is_called FROM public.fencecheck_refusals")[0]["is_called"])
    ctx.env.query("DROP SEQUENCE public.fencecheck_refusals")
    ctx.command("the trigger and its sequence dropped")
    ctx.fault(
        "the server refused the write at its COMMIT",
        fired,
        expected=f"the trigger fired for event {event_id} (its sequence advanced, which the "
        "refused transaction's rollback does not undo)",
        observed=f"fired: {fired}",
    )
    there = [c for c in checkers.checkpoints(ctx, run_id) if str(c["event_id"]) == event_id]
    events = _events_since(ctx, run_id, base)
    ctx.invariant(
        "a write refused at its COMMIT is not answered ok and is not there",
        not reply.ok and not there and event_id not in events,
        expected=f"an error reply; no checkpoint and no outbox event {event_id}",
        observed=f"reply {reply.result if reply.ok else reply.error}; checkpoints with it "
        f"{len(there)}; events since the claim {events}",
    )
    after = save("after the refusal")
    ctx.progress(
        "the next write goes through",
        after.ok,
        expected=f"save_checkpoint at revision {base} accepted",
        observed=f"{after.result if after.ok else f'{after.error}: {after.message}'}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _lost_commit(
    ctx: ExperimentContext,
    variant: str,
    w: WorkerProcess,
    run_id: str,
    epoch: int,
    base: int,
    claim_sent: float,
    worker_async: bool = True,
) -> bool:
    """W's next write (revision ``base`` + 1) loses its COMMIT as ``variant``
    says, and is judged; whether it was decided by a read-back (the next
    write may follow). Without ``worker_async`` W handles it on its main
    thread, with whatever that thread kept from its earlier requests."""
    event_id = ctx.uuid()
    args = {
        "run_id": run_id,
        "epoch": epoch,
        "expected_revision": base,
        "state": {"step": "committing"},
        "event_id": event_id,
    }
    link = ctx.env.links["worker_pg"]
    waited: str | None = "held at before_commit"
    if variant in FAST:
        # No point before the fast path's commit: the run's row lock, held by
        # the harness, keeps the one statement waiting inside the server.
        with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
            pending = ctx.op_async(w, "save_checkpoint", args, worker_async=worker_async)
            seen = lock.answered_or_waiting(pending.pending, "W")
            # None: answered; "neither answered nor waiting": never seen waiting.
            waiting = seen is not None and "neither" not in seen and not pending.done()
            waited = seen if waiting else None
            sessions = _sessions_of(ctx, "W")
            if variant == FAST_ANSWER_RESET:
                fault = link.reset(direction="downstream")
            else:
                fault = link.drop_responses(close_after_ms=400)
            ctx.command(f"toxiproxy: {fault.detail}")
    else:
        ctx.arm("W", "before_commit", Hold())
        pending = ctx.op_async(w, "save_checkpoint", args, worker_async=worker_async)
        ctx.reached("W", "before_commit", held=True)  # not the first write's passage
        sessions = _sessions_of(ctx, "W")
        fault = (
            link.cut() if variant != "response_lost" else link.drop_responses(close_after_ms=400)
        )
        ctx.command(f"toxiproxy: {fault.detail}")
        ctx.release("W", "before_commit")
    released_at = time.time()
    committed_at_fault = False
    if variant in FAST:
        # The statement, let go before its session was closed, has committed
        # by the time the session ends, or never will (a worker whose only path
        # holds its COMMIT until the statement answers): no 10 s wait for it.
        _sessions_ended(ctx, sessions)
        committed_at_fault = bool(
            ctx.env.query("SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id])
        )
    elif variant == "response_lost":
        committed_at_fault = bool(
            seen_within(
                lambda: ctx.env.query(
                    "SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id]
                ),
                what="the COMMIT to reach the server while answers are dropped",
                timeout_s=10,
            )
        )
    # Heal only once W's sessions from before the fault are gone on the server
    # (toxiproxy closed them): a cut COMMIT cannot travel on them any more, and
    # a dropped answer to a COMMIT stays lost.
    sessions_ended = _sessions_ended(ctx, sessions)
    committed_while_cut = bool(
        ctx.env.query("SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id])
    )
    if variant == HALF_FOUND:
        _plant_event(ctx, run_id, event_id)
    if variant == CHECKPOINT_HALF_FOUND:
        _plant_checkpoint(ctx, run_id, event_id, base + 1)
    ctx.heal("worker_pg")
    healed_at = time.time()
    _lease_outlives_the_heal(ctx, claim_sent)
    reply = pending.result(30)
    events = ctx.sql(
        "outbox rows of the write",
        "SELECT event_id FROM fencecheck_model.outbox WHERE run_id = %s AND event_id = %s",
        [run_id, event_id],
    )
    if variant in (HALF_FOUND, CHECKPOINT_HALF_FOUND):
        _judge_half_found(ctx, run_id, base, event_id, fault.kind, sessions_ended,
                          committed_while_cut, reply)  # fmt: skip
        return False
    if variant == "request_lost":
        ctx.fault(
            "the COMMIT never reached the server",
            fault.kind == "cut" and sessions_ended,
            expected="link cut while the transaction waited before COMMIT, and W's sessions"
            " from before the cut gone on the server before the link healed",
            observed=f"{fault.detail}; sessions ended: {sessions_ended}",
        )
        ctx.invariant(
            "nothing committed before the COMMIT was sent",
            not committed_while_cut,
            expected="no event row while the link was cut (the write waited at before_commit)",
            observed=f"event row present while cut: {committed_while_cut}",
        )
    elif variant in FAST and not committed_at_fault:
        # A worker whose write path sends its COMMIT only after the statement
        # answers (one path, an explicit transaction) never sent it: the same
        # case as request_lost, reached another way.
        ctx.fault(
            "W's write waited in the server when its link began to lose answers",
            waited is not None and sessions_ended,
            expected="W's write waiting on the run's row lock when answers began to be lost "
            "(dropped, or the connection reset at the answer), and "
            "W's sessions from before the fault gone before the heal",
            observed=f"W waiting: {waited or 'no, it had answered'}; nothing committed (its "
            f"path holds the COMMIT back); sessions ended: {sessions_ended}",
        )
        mine = [w for w in checkers.writes(ctx, run_id) if w["event_id"] == event_id]
        ctx.invariant(
            "a write answered ok is there",
            not reply.ok or len(mine) == 1,
            expected="an ok answer only for a write found committed",
            observed=f"W answered {reply.result if reply.ok else reply.error}; checkpoints with "
            f"its event_id {len(mine)}",
        )
        _judge_at_most_once(ctx, run_id, base, event_id, mine, events)
        return True
    else:
        ctx.fault(
            "the server committed while the answer was dropped",
            committed_at_fault and sessions_ended and waited is not None,
            expected="W's write waiting in the server when answers were dropped (at "
            "before_commit, or on the run's row lock on the fast path), the event row visible "
            "on the server before the link healed, and W's sessions from before the fault gone "
            "(its answer lost)",
            observed=f"W waiting: {waited or 'no, it had answered'}; committed while dropped: "
            f"{committed_at_fault}; sessions ended: {sessions_ended}",
        )
    mine = [w for w in checkers.writes(ctx, run_id) if w["event_id"] == event_id]
    if not _read_back_met_the_heal(ctx, reply, pending.answered_at, released_at, healed_at):
        _judge_at_most_once(ctx, run_id, base, event_id, mine, events)
        return False
    ctx.invariant(
        "the write committed exactly once",
        len(mine) == 1
        and mine[0]["revision"] == base + 1
        and checkers.with_outbox_in_same_tx(mine[0])
        and len(events) == 1,
        expected=f"one checkpoint (revision {base + 1}) and one outbox event with event_id "
        f"{event_id[:8]}.., inserted by one transaction",
        observed=f"checkpoints {[(w['revision'], w['txid']) for w in mine]}; outbox "
        f"inserts in {[w['outbox_txids'] for w in mine]}; the worker answered "
        f"{reply.result if reply.ok else reply.error}",
    )
    # What the worker answers is what its read-back found: once both rows
    # committed together, "inconsistent" is a false finding (safety), and not
    # deciding at all after the heal is progress not made (a read-back that
    # timed out on a loaded machine is excused by the stalls measured).
    together = len(mine) == 1 and checkers.with_outbox_in_same_tx(mine[0]) and len(events) == 1
    answered = reply.result if reply.ok else f"{reply.error}: {reply.message}"
    if together:
        ctx.invariant(
            "the read-back reports what committed",
            reply.error != "CommitInconsistent",
            expected="no CommitInconsistent answer: checkpoint and outbox row committed in "
            "one transaction",
            observed=f"the worker answered {answered}",
        )
        ctx.progress(
            "the worker decided by reading back",
            reply.ok and (reply.result or {}).get("revision") == base + 1,
            expected=f"save_checkpoint answered ok with revision {base + 1} once the link healed",
            observed=f"the worker answered {answered}",
        )
    rows = [c for c in checkers.checkpoints(ctx, run_id) if c["revision"] > base]
    ctx.equal(
        "one checkpoint, no duplicate",
        [(c["revision"], str(c["event_id"])) for c in rows],
        [(base + 1, event_id)],
        what="checkpoints after the write",
    )
    since = _events_since(ctx, run_id, base)
    ctx.equal(
        "no event under a new id",
        since,
        [event_id],
        what="outbox events of the run since the claim",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
    return True


def _next_write_goes_through(
    ctx: ExperimentContext, w: WorkerProcess, run_id: str, epoch: int, base: int
) -> None:
    """W's next write after the lost answer commits: the session whose
    statement's outcome was unknown was discarded (toxiproxy closed it), and
    the write runs on a new one. A worker that keeps the broken session meets
    its closed connection here."""
    reply = ctx.op(w, "save_checkpoint", run_id=run_id, epoch=epoch,
                   expected_revision=base, state={"step": "after"})  # fmt: skip
    ctx.progress(
        "W's next write goes through",
        reply.ok and (reply.result or {}).get("revision") == base + 1,
        expected=f"save_checkpoint at revision {base} answered ok with revision {base + 1}",
        observed=f"{reply.result if reply.ok else f'{reply.error}: {reply.message}'}",
    )


def _events_since(ctx: ExperimentContext, run_id: str, base: int) -> list[str]:
    """The run's outbox events but those of checkpoints up to revision ``base``."""
    earlier = {
        str(c["event_id"]) for c in checkers.checkpoints(ctx, run_id) if c["revision"] <= base
    }
    return [
        str(e["event_id"])
        for e in checkers.outbox(ctx, run_id)
        if str(e["event_id"]) not in earlier
    ]


# How long a worker whose COMMIT's answer was lost keeps reading back before
# it answers CommitOutcomeUnknown (contract section 5; the reference workers:
# 5 s in Python, 10 s in Go). One that gives up sooner while the link is cut
# fails; one that gives up later, still before the heal, met no healed link.
READ_BACK_FLOOR_S = 3.0


def _read_back_met_the_heal(
    ctx: ExperimentContext,
    reply: OpReply,
    answered_at: float | None,
    released_at: float,
    healed_at: float,
) -> bool:
    """Whether W's read-back had a healed link to read back on. A worker that
    answered CommitOutcomeUnknown before the heal, after reading back for at
    least READ_BACK_FLOOR_S, did what the protocol asks (it cannot know): the
    case O tests, a read-back that decides, was not reached (unknown; seen
    under load, when W's sessions took seconds to end and the heal came 7 s
    after the claim). Sooner than the floor is a read-back given up (fail)."""
    gave_up = (
        not reply.ok
        and reply.error == "CommitOutcomeUnknown"
        and answered_at is not None
        and answered_at < healed_at
    )
    if not gave_up:
        return ctx.fault(
            "W's read-back met the healed link",
            True,
            expected="W still deciding when the link healed",
            observed=f"W answered {'ok' if reply.ok else reply.error} "
            + (
                f"{answered_at - healed_at:.2f} s after the heal"
                if answered_at is not None
                else "(time not known)"
            ),
        )
    assert answered_at is not None
    tried = answered_at - released_at
    observed = (
        f"W answered CommitOutcomeUnknown {tried:.2f} s after its COMMIT was let go into the "
        f"cut, {healed_at - answered_at:.2f} s before the heal"
    )
    if tried < READ_BACK_FLOOR_S:
        ctx.invariant(
            f"W read back for at least {READ_BACK_FLOOR_S:.0f} s before answering unknown",
            False,
            expected=f"CommitOutcomeUnknown only after {READ_BACK_FLOOR_S:.0f} s of read-back "
            "(contract section 5)",
            observed=observed,
        )
        return False
    ctx.fault(
        "W's read-back met the healed link",
        False,
        expected="W still deciding when the link healed",
        observed=f"{observed}: its read-back ran out while the link was cut",
    )
    return False


def _judge_at_most_once(
    ctx: ExperimentContext,
    run_id: str,
    base: int,
    event_id: str,
    mine: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    """What holds whatever W decided: the write is in at most once, whole, and
    no event of the run came under another id."""
    ctx.invariant(
        "the write committed at most once",
        len(mine) <= 1
        and len(events) == len(mine)
        and all(w["revision"] == base + 1 and checkers.with_outbox_in_same_tx(w) for w in mine),
        expected=f"no checkpoint of event {event_id[:8]}.., or one (revision {base + 1}) with "
        "its outbox row in one transaction",
        observed=f"checkpoints {[(w['revision'], w['txid']) for w in mine]}; outbox rows "
        f"{len(events)}",
    )
    since = _events_since(ctx, run_id, base)
    ctx.invariant(
        "no event under a new id",
        set(since) <= {event_id},
        expected=f"no outbox event of the run since the claim but {event_id[:8]}..",
        observed=f"outbox events of the run since the claim: {since}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _run_half_found(ctx: ExperimentContext) -> None:
    """half_found in ``run`` mode: the workflow's second write (its first after
    ``start``) loses its COMMIT, and its event appears without its checkpoint.
    The worker must freeze the run in doubt with the evidence in an
    ``agent.commit_inconsistent`` event (rule 9) while its lease is its own,
    never leave it running with the inconsistency unrecorded."""
    run_id = new_run(ctx)
    w, hit = _run_held_before_commit(ctx, run_id, 2)
    event_id = _pending_event_id(w, run_id)
    base = int(checkers.run_row(ctx, run_id, "the run while W's write waits")["revision"])
    sessions = _sessions_of(ctx, "W")
    ctx.cut("worker_pg")
    ctx.release("W", "before_commit")
    sessions_ended = _sessions_ended(ctx, sessions)
    committed_while_cut = bool(
        event_id
        and ctx.env.query("SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id])
    )
    if event_id is not None:
        _plant_event(ctx, run_id, event_id)
    ctx.heal("worker_pg")
    healed = time.time()
    seen_within(
        lambda: (
            not w.is_alive()
            or ctx.env.query(
                "SELECT status <> 'running' AS moved FROM fencecheck_model.agent_runs "
                "WHERE run_id = %s",
                [run_id],
            )[0]["moved"]
        ),
        what="W to settle its write once the link healed (exit, or the run out of running)",
        timeout_s=20,
    )
    ctx.release("W", "before_renew")
    code = finish(ctx, w)
    mine = [c for c in checkers.checkpoints(ctx, run_id) if str(c["event_id"]) == event_id]
    planted = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == event_id]
    ctx.fault(
        "W's COMMIT never reached the server, and its event appeared without it",
        event_id is not None and sessions_ended and not committed_while_cut and not mine
        and len(planted) == 1,
        expected="W held before the COMMIT of its second write (its event_id in its history's "
        "invoke record), the link cut, W's sessions gone before the heal; then one outbox row "
        "with that event_id and no checkpoint of it",
        observed=f"event_id {event_id}; sessions ended: {sessions_ended}; committed while cut: "
        f"{committed_while_cut}; checkpoints with the id {len(mine)}; outbox rows {len(planted)}",
    )  # fmt: skip
    row = checkers.run_row(ctx, run_id, "the run once W exited")
    alerts = [
        e for e in checkers.outbox(ctx, run_id) if e["event_type"] == "agent.commit_inconsistent"
    ]
    # Redone under a new event_id, or gone on to the next step as if committed:
    # the only write above the held one's base is the freeze with its alert.
    alert_ids = {str(e["event_id"]) for e in alerts}
    later = [
        (wr["revision"], str(wr["event_id"]))
        for wr in checkers.writes(ctx, run_id)
        if wr["revision"] > base
    ]
    ctx.invariant(
        "nothing written on top of a write that did not commit",
        all(e in alert_ids for _, e in later),
        expected=f"no checkpoint above revision {base} (the run's while W's write waited) but "
        "the freeze (its outbox event "
        "agent.commit_inconsistent): not the write again under a new event_id, not a next step",
        observed=f"checkpoints above it {later}; commit_inconsistent events {sorted(alert_ids)}",
    )
    ctx.progress(
        "the run is frozen in doubt with the evidence",
        row["status"] == "paused_indoubt" and len(alerts) == 1,
        expected="W froze the run (paused_indoubt) with one agent.commit_inconsistent event, "
        "its lease still its own (exit 11)",
        observed=f"run {row['status']} at epoch {row['epoch']} (W's {hit.epoch}), W exit {code}; "
        f"commit_inconsistent events {len(alerts)}",
        since=healed,
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _run_held_before_commit(
    ctx: ExperimentContext, run_id: str, nth: int
) -> tuple[WorkerProcess, Hit]:
    """A ``run`` worker W of ``run_id`` held before the COMMIT of its ``nth``
    write (1: ``start``), its lease 60 s and its renewals parked at
    ``before_renew``; W and the held point's hit."""
    ctx.arm("W", "before_commit", Hold())
    # A lease that outlasts the whole case, and renewals parked while the link
    # is cut: a renewal refused by the cut link rightly cancels the worker
    # (exit 10), and the case would then probe nothing. Parked from the first
    # one: a renewal already under way when a write holds the run's row
    # waits on that row and never comes back to the point (seen beside six
    # CPU hogs: the point not reached in 15 s).
    ctx.arm("W", "before_renew", Hold())
    w = ctx.env.start_worker(
        "W",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_LEASE_TTL_MS": str(RUN_HALF_FOUND_LEASE_MS)},
    )
    for _ in range(nth - 1):  # let the writes before it through, the next one held
        ctx.reached("W", "before_commit")
        ctx.arm("W", "before_commit", Hold())
        ctx.release("W", "before_commit")
    hit = ctx.reached("W", "before_commit", held=True)
    ctx.reached("W", "before_renew", held=True)
    return w, hit


def _run_intent_answer_lost(ctx: ExperimentContext) -> None:
    """In ``run`` mode, the answer to the COMMIT of the tool step's intent (the
    workflow's fourth write: start, plan, lookup, intent) is lost after the
    server committed it. W reads it back, finds it, and goes on from the
    ledger to finish the run, on a connection of its own again (blind hunt
    44 #06: the Go tool step kept the connection it took before its loop,
    which the read-back had replaced, and W exited 1 on a closed one)."""
    run_id = new_run(ctx)
    w, _hit = _run_held_before_commit(ctx, run_id, 4)
    event_id = _pending_event_id(w, run_id)
    sessions = _sessions_of(ctx, "W")
    fault = ctx.env.links["worker_pg"].drop_responses(close_after_ms=400)
    ctx.command(f"toxiproxy: {fault.detail}")
    ctx.release("W", "before_commit")
    committed = bool(
        event_id
        and seen_within(
            lambda: ctx.env.query(
                "SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id]
            ),
            what="W's COMMIT to reach the server while answers are dropped",
            timeout_s=10,
        )
    )
    sessions_ended = _sessions_ended(ctx, sessions)
    ctx.heal("worker_pg")
    healed = time.time()
    intents = ctx.env.query(
        "SELECT operation_id FROM fencecheck_model.tool_operations WHERE run_id = %s", [run_id]
    )
    ctx.fault(
        "the intent committed while its answer was dropped",
        committed and sessions_ended and len(intents) == 1,
        expected="W's fourth write (the tool step's intent) committed on the server, one "
        "operation in the ledger, W's sessions from before the fault gone before the heal",
        observed=f"event {event_id} committed: {committed}; sessions ended: {sessions_ended}; "
        f"operations {len(intents)}",
    )
    seen_within(
        lambda: (
            not w.is_alive()
            or ctx.env.query(
                "SELECT status NOT IN ('running', 'waiting_tool') AS moved "
                "FROM fencecheck_model.agent_runs WHERE run_id = %s",
                [run_id],
            )[0]["moved"]
        ),
        what="W to finish the run once the link healed (exit, or the run done)",
        timeout_s=20,
    )
    ctx.release("W", "before_renew")
    code = finish(ctx, w)
    mine = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == event_id]
    ctx.invariant(
        "the intent's write is in once",
        len(mine) == 1,
        expected=f"one outbox event {event_id}",
        observed=f"{len(mine)}",
    )
    row = checkers.run_row(ctx, run_id, "the run once W exited")
    ctx.progress_equal(
        "W went on from the intent it read back and finished the run",
        (row["status"], code),
        ("succeeded", 0),
        what="(run status, W exit)",
        since=healed,
    )
    checkers.lease_history_is_sound(ctx, [run_id])


# What the read-back after the heal may take before a lease that outlived
# the heal by this much could run out under it.
READ_BACK_S = 3.0


def _lease_outlives_the_heal(ctx: ExperimentContext, claim_sent: float) -> None:
    """The premise of the read-back: W's lease, which runs at least the
    experiment's TTL from the moment its claim was sent, still had
    READ_BACK_S to go when the link healed, by the harness's own clock (what
    the worker does after the heal cannot change it). Else the harness's own
    waits used the lease up, and a LeaseLost answer is correct: the run
    tested nothing."""
    healed = time.time()
    left = claim_sent + ctx.env.lease_ttl_ms / 1000 - healed
    ctx.fault(
        "W's lease outlived the heal",
        left >= READ_BACK_S,
        expected=f"at least {READ_BACK_S:.0f} s of W's lease left when the link healed",
        observed=f"{left:.2f} s left ({healed - claim_sent:.2f} s after the claim was sent)",
    )


def _sessions_of(ctx: ExperimentContext, worker: str) -> list[int]:
    """The server pids of the worker's sessions."""
    return [
        r["pid"]
        for r in ctx.env.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            [worker],
        )
    ]


def _sessions_ended(ctx: ExperimentContext, sessions: list[int]) -> bool:
    """Whether those sessions ended on the server (toxiproxy closed them) within
    10 s: a cut COMMIT cannot travel on them any more, a dropped answer stays lost."""
    return bool(
        seen_within(
            lambda: (
                not ctx.env.query("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [sessions])
            ),
            what="the worker's sessions from before the fault to end on the server",
            timeout_s=10,
        )
    )


def _pending_event_id(w: WorkerProcess, run_id: str) -> str | None:
    """The event_id of W's write in flight: its history's last invoke of the run
    with one (the worker's account picks which row to plant; every verdict is
    judged from the database)."""
    records = [
        e for e in load_history([w.events_path])
        if e.type == "invoke" and e.run_id == run_id and e.event_id
    ]  # fmt: skip
    return str(records[-1].event_id) if records else None


def _plant_event(ctx: ExperimentContext, run_id: str, event_id: str) -> None:
    """An outbox row with the write's event_id and no checkpoint: a copy of the
    run's earlier event (the first write's) under that id, through the model."""
    ctx.sql(
        "plant an outbox row with the write's event_id, without its checkpoint",
        "INSERT INTO fencecheck_model.outbox (event_id, tenant_id, run_id, event_type, payload) "
        "SELECT %s, tenant_id, run_id, event_type, payload FROM fencecheck_model.outbox "
        "WHERE run_id = %s ORDER BY id DESC LIMIT 1 RETURNING event_id",
        [event_id, run_id],
    )


def _plant_checkpoint(ctx: ExperimentContext, run_id: str, event_id: str, revision: int) -> None:
    """A checkpoint row with the write's event_id and revision and no outbox
    row, the run at that revision (what a restore that lost the outbox row
    leaves): a copy of the run's checkpoint before it under them, through the
    model (columns the database fills itself, a surrogate key, left to it)."""
    columns = [
        r["column_name"]
        for r in ctx.sql(
            "checkpoint columns the planted row copies",
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "'fencecheck_model' AND table_name = 'agent_checkpoints' AND is_generated = 'NEVER' "
            "AND (column_default IS NULL AND is_identity = 'NO' OR column_name = ANY(%s)) "
            "ORDER BY ordinal_position",
            [["run_id", "revision", "event_id"]],
        )
    ]
    listed = ", ".join(f'"{c}"' for c in columns)
    selected = ", ".join(f'p."{c}"' for c in columns)
    ctx.sql(
        "plant a checkpoint with the write's event_id, without its outbox row",
        f"WITH c AS (INSERT INTO fencecheck_model.agent_checkpoints ({listed}) "
        f"SELECT {selected} "
        "FROM fencecheck_model.agent_checkpoints c, jsonb_populate_record(c, %s::jsonb) p "
        "WHERE c.run_id = %s AND c.revision = %s RETURNING revision) "
        "UPDATE fencecheck_model.agent_runs SET revision = (SELECT revision FROM c) "
        "WHERE run_id = %s RETURNING revision",
        [
            json.dumps({"revision": revision, "event_id": event_id, "owner": "restored"}),
            run_id,
            revision - 1,
            run_id,
        ],
    )


def _judge_half_found(
    ctx: ExperimentContext,
    run_id: str,
    base: int,
    event_id: str,
    cut: str,
    sessions_ended: bool,
    committed_while_cut: bool,
    reply: OpReply,
) -> None:
    mine = [w for w in checkers.writes(ctx, run_id) if str(w["event_id"]) == event_id]
    events = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == event_id]
    # Which half the harness planted, which must be missing.
    planted, missing = (events, mine) if ctx.variant == HALF_FOUND else (mine, events)
    ctx.fault(
        "the COMMIT never reached the server, and one half of the write appeared without it",
        cut == "cut" and sessions_ended and not committed_while_cut and not missing
        and len(planted) == 1,
        expected="link cut before COMMIT, W's sessions gone before the heal; then "
        + ("one outbox row with the write's event_id and no checkpoint of it"
           if ctx.variant == HALF_FOUND
           else "one checkpoint with the write's event_id and no outbox row of it"),
        observed=f"{cut}; sessions ended: {sessions_ended}; committed while cut: "
        f"{committed_while_cut}; checkpoints with the id {len(mine)}; outbox rows {len(events)}",
    )  # fmt: skip
    answered = reply.result if reply.ok else f"{reply.error}: {reply.message}"
    ctx.invariant(
        "one row without the other is no commit",
        not reply.ok,
        expected=f"save_checkpoint not answered ok: of revision {base + 1} only "
        + (
            "an outbox row with its event_id exists, no checkpoint"
            if ctx.variant == HALF_FOUND
            else "a checkpoint with its event_id exists, no outbox row"
        ),
        observed=f"the worker answered {answered}",
    )
    ctx.progress(
        "the worker said the commit is inconsistent",
        reply.error == "CommitInconsistent",
        expected="save_checkpoint answered CommitInconsistent once the link healed",
        observed=f"the worker answered {answered}",
    )
    checkers.lease_history_is_sound(ctx, [run_id])
