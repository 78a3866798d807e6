"""P: a worker cut off from PostgreSQL must cancel its execution and start no new
side effect, and a successor must take over.

A has claimed a tool effect for dispatch and waits at a barrier just before
calling the tool. Its link to PostgreSQL (its own proxy) is cut. Its
heartbeat thread can no longer renew; once the renewal is unconfirmed the
execution must be cancelled, so when the barrier opens A must not call the
tool. B, on a healthy link, takes over after the lease expires.

Then the same rule for an `ops` session: O claims another run and starts
its heartbeat while the harness holds the run's row locked, so O's renewal
waits past its timeout (unconfirmed). The lease is still live by the
database's clock when the harness lets go and asks O to write under it: the
heartbeat has cancelled the session's work under that lease, so nothing may
be written (blind bug hunt round 6, #01: the cancellation was looked up
under a key it was never stored under).
"""

from __future__ import annotations

import time
from typing import Any

from harness.checking import checkers
from harness.checking.history import read_history
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, plain
from harness.parts.control import Hold
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for
from scenarios.common import finish, finish_or_kill, new_run, seen_within, wait_claimable

SPEC = ExperimentSpec(
    id="P",
    title="renewal partition",
    seed_section="English seed §5.2, §7 (heartbeat); Chinese seed §5",
    invariant="after the cut, A's execution is cancelled and A sends no new request to the "
    "tool; B takes over with the next epoch and finishes the run; an ops session whose "
    "renewal went unconfirmed writes nothing more under that lease, and that renewal never "
    "commits past its bound; a renewal held past the lease's expiry never commits",
    fault="A's link to PostgreSQL cut (toxiproxy) while A is about to call the tool; an ops "
    "session's renewal held on the run's row lock past its timeout, and another's until its "
    "lease expired",
    rules=(8, 1),
    layer="queue",
    injection_point="after_dispatch_claim_commit",
    needs=(
        *needs.capabilities("workflow", "ledger"),
        needs.point("after_dispatch_claim_commit"),
        needs.point("after_tool_response_before_tx2_commit"),
        needs.point("before_renew"),
    ),
    # The cut, its successor; an ops lease running out; R2's room after its
    # renewal broke; HS's heartbeat held past its renewal timeout.
    natural_wait_s=0.8 + 0.3 + 0.8 + 0.3 + 1.3,
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
    held = _run_renewal_unconfirmed_before_its_write(ctx)
    broke = _run_renewal_unconfirmed_before_its_write(ctx, "R2", broken=True)
    unsent = _renewal_held_before_it_is_sent(ctx)
    caps = ctx.system.capabilities
    if not (caps.offers_op("heartbeat") and caps.checkpoints):
        # A system whose sessions renew no lease of their own (or write no
        # checkpoint) has no ops-session case: said, not judged.
        ctx.not_judged(
            "an ops session writes nothing under a lease whose renewal went unconfirmed",
            expected="judged where the system offers the heartbeat op and checkpoints",
            observed="the system's mapping offers no heartbeat op or no checkpoints",
        )
        checkers.lease_history_is_sound(ctx, [run_id, held, broke, unsent])
        return
    other = _ops_session_renewal_unconfirmed(ctx)
    expired = _renewal_held_past_expiry(ctx)
    checkers.lease_history_is_sound(ctx, [run_id, held, broke, unsent, other, expired])


# The ops session's heartbeat interval and renewal timeout: short next to the
# lease, so that it is still live when the harness writes.
OPS_INTERVAL_MS = 50
OPS_TIMEOUT_MS = 80
# O's own lease: the experiment's 800 ms ran out under a load of 16 between
# O's claim and the harness's letting go (the state not reached, unknown);
# nothing in O's case depends on the lease being short.
O_LEASE_TTL_MS = 3000
# How far past its bound a committed renewal may lie: a bound kept by the
# server (a statement timeout) cancels the wait at the bound, so this only
# absorbs timestamp rounding; the harness holds the row 100 ms past it.
RENEWAL_BOUND_TOLERANCE_MS = 50


def _renewals_end_within_their_bound(
    ctx: ExperimentContext, app: str, run_id: str, bound_ms: int
) -> None:
    """Every renewal of ``run_id`` that ``app`` committed ended within its bound
    of its transaction's start (contract section 2: a renewal that has not
    ended by then counts as refused, and its work is cancelled; committing it
    later extends a lease nobody works under, which a successor then waits
    out). Blind hunt 20 #06 (the heartbeat's connection without its statement
    timeout) let a renewal held on the row commit once the harness let go."""
    late = [
        c
        for c in checkers.changes_by(ctx, [app])
        if c["renewal"]
        and c["run_id"] == run_id
        and c["took_ms"] > bound_ms + RENEWAL_BOUND_TOLERANCE_MS
    ]
    ctx.invariant(
        f"{app}'s renewals end within their bound",
        not late,
        expected=f"every renewal {app} committed took at most its bound, {bound_ms} ms (+"
        f"{RENEWAL_BOUND_TOLERANCE_MS} ms), from its transaction's start; the one held on the "
        "row past it never commits",
        observed=f"renewals past the bound {[(r['seq'], r['took_ms']) for r in late]}"
        if late
        else "none",
    )


# R's heartbeat: an interval longer than its renewal timeout, and a lease
# that outlives the harness's hold of the row (timeout + 0.1 s) by far.
R_HEARTBEAT_MS = 400
R_TIMEOUT_MS = 200
R_LEASE_TTL_MS = 2000
# How long after its renewal's timeout the harness lets R's renewal through:
# room for the heartbeat to act on the timeout, less than a second timeout.
RELEASE_AFTER_TIMEOUT_S = 0.1


def _run_renewal_unconfirmed_before_its_write(
    ctx: ExperimentContext, app: str = "R", *, broken: bool = False
) -> str:
    """The `run` twin of the ops case: R holds the tool's answer before the
    step's write (its barrier) while the harness holds the run's row, so R's
    heartbeat renewal waits past its timeout, unconfirmed. The harness lets go
    while the lease is still live by the database's clock, then lets R go on:
    its execution was cancelled, so the step's write (and anything after it)
    must not come, though the lease would still take it.

    ``broken``: the waiting renewal's session is ended instead
    (pg_terminate_backend: an error, not a timeout) and the row let go at
    once, so a worker that asks again on a fresh connection before it
    cancels gets a confirmed renewal and goes on (blind hunt 35 #06: one
    unconfirmed renewal retried "since one lost answer is no lost lease")."""
    run_id = new_run(ctx, tool="idem")
    point = "after_tool_response_before_tx2_commit"
    ctx.arm(app, point, Hold())
    # R renews less often than its renewal may take, as deployments do (the
    # reference's defaults: every 2 s, each renewal bounded by 1 s): a renewal
    # bounded by the interval instead of its timeout shows only then.
    r = _run_worker(ctx, app, run_id, R_HEARTBEAT_MS, R_TIMEOUT_MS, R_LEASE_TTL_MS)
    ctx.reached(app, point)
    timeout_s = R_TIMEOUT_MS / 1000
    ended: list[int] = []
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        waiting = lock.wait_for_waiters([app])
        # Counted from the renewal's start (the server's clock), not from when
        # the harness saw it wait: let go past its timeout, with room to act
        # on it, and before a second timeout would have run out (a worker
        # that asks again on another connection before it cancels then gets
        # its answer and goes on).
        began = lock.waited_s(app) if waiting is not None else 0.0
        waited_at = time.time() - began
        if broken and waiting is not None:
            ended = _end_waiting_sessions(ctx, app)
        else:
            time.sleep(max(0.0, timeout_s + RELEASE_AFTER_TIMEOUT_S - began))
        held_s = time.time() - waited_at
    if broken:  # room to act on the error; a retry meanwhile finds the row free
        time.sleep(timeout_s + RELEASE_AFTER_TIMEOUT_S)
    live = _lease_now(ctx, run_id, f"{app}'s lease after the harness let go")
    mark = checkers.audit_mark(ctx)
    released_at = time.time()
    ctx.release(app, point)
    code = finish_or_kill(ctx, r, 20)
    if broken:
        name = "a run worker writes nothing after its renewal's connection broke"
        probe = f"{app}'s renewal ended by the server while it waited, its lease still live after"
        reached = waiting is not None and bool(ended) and bool(live["live"])
        how = f"; its session {ended or 'not'} ended (pg_terminate_backend) after {held_s:.3f} s"
        expected = (
            f"a session of {app}'s waiting on the run's row (its renewal) ended by the "
            "harness, the row let go at once; the lease live by database time after"
        )
    else:
        name = "a run worker writes nothing after its renewal went unconfirmed"
        probe = (
            f"{app}'s renewal waited on the run's row past its timeout, its lease still live after"
        )
        reached = waiting is not None and held_s > timeout_s and bool(live["live"])
        how = f" for {held_s:.3f} s from its statement's start"
        expected = (
            f"a session of {app}'s waiting on the run's row (its renewal, timeout "
            f"{R_TIMEOUT_MS} ms) while the harness held it; the lease live by "
            "database time when the harness let go"
        )
    if not ctx.probe_reached(
        probe,
        reached,
        judges=name,
        expected=expected,
        observed=f"{waiting or f'no session of {app} waited'}{how}; lease {plain(live)}",
    ):
        return run_id
    changed = [r for r in checkers.changes_by(ctx, [app], after_seq=mark) if not r["renewal"]]
    # Progress, not safety: the heartbeat thread must have had a CPU to act on
    # the timeout before the step went on (starvation in the window excuses).
    ctx.progress(
        name,
        not changed,
        expected=f"no change by {app} once the harness let its barrier go (rule 8: an "
        "unconfirmed renewal, timed out or failed, cancels the execution; nothing more under "
        "that lease)",
        observed=f"changes by {app} {[(c['seq'], c['tbl'], c['op']) for c in changed]}; "
        f"{app} exit {code} (10 = cancelled)",
        since=waited_at + (0.0 if broken else timeout_s),
        until=released_at + 1.0,
    )
    _renewals_end_within_their_bound(ctx, app, run_id, R_TIMEOUT_MS)
    return run_id


# HS's heartbeat: a renewal timeout it has room to meet on a loaded machine,
# held before it is sent for longer than that, well inside a long lease.
HS_HEARTBEAT_MS = 1500
HS_TIMEOUT_MS = 1000
HS_LEASE_TTL_MS = 8000
HS_HELD_PAST_TIMEOUT_S = 0.3


def _renewal_held_before_it_is_sent(ctx: ExperimentContext) -> str:
    """HS's heartbeat is held at before_renew (about to send a renewal) for
    longer than its renewal timeout while its workflow waits at its barrier
    and its lease is live by the database's clock. Let go, the renewal must
    be sent and confirmed and the work go on: a renewal's timeout bounds the
    renewal, counted from its sending; a heartbeat that started the clock
    before the point cancels work it never failed to renew (blind hunt 37
    #10, the Go heartbeat). Progress, judged with the stalls in the window."""
    run_id = new_run(ctx, tool="idem")
    point = "after_tool_response_before_tx2_commit"
    ctx.arm("HS", point, Hold())
    ctx.arm("HS", "before_renew", Hold())
    hs = _run_worker(ctx, "HS", run_id, HS_HEARTBEAT_MS, HS_TIMEOUT_MS, HS_LEASE_TTL_MS)
    ctx.reached("HS", point)
    ctx.reached("HS", "before_renew")
    held_at = time.time()
    time.sleep(HS_TIMEOUT_MS / 1000 + HS_HELD_PAST_TIMEOUT_S)
    live = _lease_now(ctx, run_id, "HS's lease before its held renewal is let go")
    mark = checkers.audit_mark(ctx)
    released_at = time.time()
    held_s = released_at - held_at
    ctx.release("HS", "before_renew")
    renewed = seen_within(
        lambda: any(r["renewal"] for r in checkers.changes_by(ctx, ["HS"], after_seq=mark)),
        what="HS's held renewal to commit once let go",
        timeout_s=HS_TIMEOUT_MS / 1000 + 1.0,
    )
    ctx.release("HS", point)
    code = finish_or_kill(ctx, hs, 20)
    name = "a heartbeat held before it sends a renewal still sends it, and the work goes on"
    if not ctx.probe_reached(
        "HS's heartbeat held at before_renew past its renewal timeout, its lease live",
        held_s > HS_TIMEOUT_MS / 1000 and bool(live["live"]),
        judges=name,
        expected=f"HS held at before_renew for more than its {HS_TIMEOUT_MS} ms renewal "
        "timeout, its workflow at its barrier, the lease live by database time when let go",
        observed=f"held {held_s:.3f} s; lease {plain(live)}",
    ):
        return run_id
    row = checkers.run_row(ctx, run_id, "HS's run after it was let go")
    ctx.progress(
        name,
        bool(renewed) and row["status"] == "succeeded" and code == 0,
        expected="a renewal by HS committed after the point was let go, and HS then finished "
        "the run (a renewal's timeout counts from its sending, not from the tick)",
        observed=f"renewal after the release: {'yes' if renewed else 'none'}; run "
        f"{row['status']}; HS exit {code} (10 = cancelled)",
        since=released_at,
    )
    return run_id


def _lease_now(ctx: ExperimentContext, run_id: str, label: str) -> dict[str, Any]:
    """Whether the run's lease is live by the database's clock now, with its
    owner and epoch."""
    return ctx.sql(
        label,
        "SELECT lease_expires_at > clock_timestamp() AS live, owner, epoch FROM "
        "fencecheck_model.agent_runs WHERE run_id = %s",
        [run_id],
    )[0]


def _run_worker(
    ctx: ExperimentContext, app: str, run_id: str, heartbeat_ms: int, timeout_ms: int, ttl_ms: int
) -> WorkerProcess:
    """A ``run --once`` worker on ``run_id`` with its own heartbeat interval,
    renewal timeout and lease."""
    return ctx.env.start_worker(
        app,
        "run",
        ["--run-id", run_id, "--once"],
        env={
            "FENCECHECK_HEARTBEAT_MS": str(heartbeat_ms),
            "FENCECHECK_HEARTBEAT_TIMEOUT_MS": str(timeout_ms),
            "FENCECHECK_LEASE_TTL_MS": str(ttl_ms),
        },
    )


def _end_waiting_sessions(ctx: ExperimentContext, app: str) -> list[int]:
    """End (pg_terminate_backend) every session of ``app`` waiting on a lock:
    its statement fails with a broken connection. The pids ended."""
    rows = ctx.sql(
        f"end {app}'s sessions waiting on a lock",
        # Chosen first (a materialised CTE), ended after: the planner never
        # runs the terminate on a row the filter would have left out.
        "WITH waiting AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND application_name = %s) SELECT pid, pg_terminate_backend(pid) AS ended FROM waiting",
        [app],
    )
    return sorted(int(r["pid"]) for r in rows if r["ended"])


def _ops_session_renewal_unconfirmed(ctx: ExperimentContext) -> str:
    """O's heartbeat renewal waits on the run's row, which the harness holds,
    past its timeout; then O is asked to write under the still live lease:
    a checkpoint, an intent and the completion, each of which must be refused."""
    run_id = new_run(ctx)
    o = ctx.env.start_worker("O", "ops", env={"FENCECHECK_LEASE_TTL_MS": str(O_LEASE_TTL_MS)})
    lease = ctx.ok(o, "claim", run_id=run_id)
    timeout_s = OPS_TIMEOUT_MS / 1000
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        ctx.ok(o, "heartbeat", run_id=run_id, epoch=lease["epoch"], action="start",
               interval_ms=OPS_INTERVAL_MS, timeout_ms=OPS_TIMEOUT_MS)  # fmt: skip
        waiting = lock.wait_for_waiters(["O"])
        waited_at = time.time()
        # Past the renewal's timeout, with room for the heartbeat to act on it.
        time.sleep(timeout_s + 0.1)
    live = _lease_now(ctx, run_id, "O's lease after the harness let go")
    mark = checkers.audit_mark(ctx)
    asked_at = time.time()
    # Every write under the lease, each at the revision the lease was granted
    # at (a refused one changes nothing, so the next still matches it).
    identity = {"run_id": run_id, "epoch": lease["epoch"], "expected_revision": lease["revision"]}
    replies = [
        ctx.op(o, "save_checkpoint", **identity, state={"by": "O"}),
        ctx.op(
            o,
            "register_intent",
            **identity,
            step_id="p.after_unconfirmed",
            effect_version=1,
            tool="idem",
            request={"kind": "return_label"},
        ),
        ctx.op(o, "complete", **identity, result={"by": "O"}),
    ]
    answered_at = time.time()
    ctx.fault(
        "O's renewal waited on the run's row past its timeout, its lease still live after",
        waiting is not None and bool(live["live"]) and live["epoch"] == lease["epoch"],
        expected=f"a session of O's waiting on the run's row (the renewal, timeout "
        f"{OPS_TIMEOUT_MS} ms) while the harness held it; the lease (epoch {lease['epoch']}) "
        "live by database time when the harness let go",
        observed=f"{waiting or 'no session of O waited'}; lease {plain(live)}",
    )
    changed = [r for r in checkers.changes_by(ctx, ["O"], after_seq=mark) if not r["renewal"]]
    ctx.progress(
        "an ops session writes nothing under a lease whose renewal went unconfirmed",
        not changed,
        expected="no change by O after its renewal timed out (the heartbeat cancels the "
        "session's work under that lease, contract section 5, heartbeat)",
        observed=f"changes by O {[(r['seq'], r['tbl'], r['op']) for r in changed]}; replies "
        + "; ".join(
            f"{r.op} " + (f"ok {plain(r.result)}" if r.ok else f"{r.error}") for r in replies
        ),
        since=waited_at + timeout_s,
        until=max(asked_at, answered_at),
    )
    _renewals_end_within_their_bound(ctx, "O", run_id, OPS_TIMEOUT_MS)
    return run_id


#: How close to its expiry Q's outright renew is sent (see _renewal_held_past_expiry).
LATE_RENEW_MS = 250


def _ms_left(ctx: ExperimentContext, run_id: str) -> float:
    """Milliseconds the run's lease has left by the database's clock."""
    rows = ctx.env.query(
        "SELECT EXTRACT(EPOCH FROM lease_expires_at - clock_timestamp()) * 1000 AS ms "
        "FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [run_id],
    )
    return float(rows[0]["ms"]) if rows and rows[0]["ms"] is not None else 0.0


def _renewal_held_past_expiry(ctx: ExperimentContext) -> str:
    """Q's heartbeat renewal waits on the run's row, which the harness holds
    until Q's lease has expired by database time. A renewal bounded by its
    timeout on the server is cancelled long before; one that is not, and whose
    expiry check ran before its wait (an UPDATE's WHERE is not evaluated again
    when the row was only locked), commits over the expired lease once the
    harness lets go, which rule 1 forbids whatever the timing."""
    run_id = new_run(ctx)
    q = ctx.env.start_worker("Q", "ops")
    lease = ctx.ok(q, "claim", run_id=run_id)

    def lease_expired() -> bool:
        rows = ctx.env.query(
            "SELECT lease_expires_at < clock_timestamp() AS expired FROM "
            "fencecheck_model.agent_runs WHERE run_id = %s",
            [run_id],
        )
        return bool(rows and rows[0]["expired"])

    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        mark = checkers.audit_mark(ctx)
        ctx.ok(q, "heartbeat", run_id=run_id, epoch=lease["epoch"], action="start",
               interval_ms=OPS_INTERVAL_MS, timeout_ms=OPS_TIMEOUT_MS)  # fmt: skip
        waiting = lock.wait_for_waiters(["Q"])
        # And a renewal asked for outright, sent in the lease's last moments
        # (so that the expiry it would set lies well past the release): it
        # waits until the harness lets go, and must then find the lease
        # expired (blind hunt 63 #08: a Go guard that judged a renewal by its
        # statement's start let such a renewal revive the lease).
        seen_within(
            lambda: _ms_left(ctx, run_id) <= LATE_RENEW_MS or None,
            what=f"Q's lease to have {LATE_RENEW_MS} ms or less left",
            timeout_s=30.0,
        )
        outright = ctx.op_async(q, "renew", {"run_id": run_id, "epoch": lease["epoch"]},
                                worker_async=True)  # fmt: skip
        sent_left = _ms_left(ctx, run_id)
        expired = seen_within(
            lease_expired, what="Q's lease to expire by database time", timeout_s=30.0
        )
        ctx.command(f"Q's outright renew sent with about {sent_left:.0f} ms of its lease left")
        at_release = ctx.sql(
            "Q's lease as the harness lets go",
            "SELECT lease_expires_at, clock_timestamp() AS now, epoch, owner FROM "
            "fencecheck_model.agent_runs WHERE run_id = %s",
            [run_id],
        )[0]
    # A renewal still waiting on the server goes on now: until Q has no
    # statement running, within a bound.
    seen_within(
        lambda: (
            not ctx.env.query(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'Q' AND state = 'active'"
            )
        ),
        what="Q to have no statement running once the harness let go",
        timeout_s=10.0,
    )
    stopped = ctx.op(q, "heartbeat", run_id=run_id, epoch=lease["epoch"], action="stop")
    renewed = outright.result(15)
    name = "a renewal never commits over an expired lease"
    expected = (
        "a session of Q's waiting on the run's row (its renewal) while the harness held it, "
        "and the lease expired by database time before the harness let go"
    )
    observed = f"{waiting or 'no session of Q waited'}; lease at the release {plain(at_release)}"
    if not ctx.probe_reached(
        "Q's renewal waited on the run's row until its lease had expired by database time",
        waiting is not None and bool(expired),
        judges=name,
        expected=expected,
        observed=observed,
    ):
        return run_id
    if stopped.ok and "cancelled" in stopped.result:
        ctx.invariant(
            "a heartbeat whose renewal went unconfirmed reports its work cancelled when stopped",
            stopped.result["cancelled"] is True,
            expected="cancelled true: Q's renewal waited on the run's row past its "
            f"{OPS_TIMEOUT_MS} ms timeout (contract section 5, heartbeat: the first unconfirmed "
            "renewal cancels the session's work under the lease)",
            observed=f"stop answered {plain(stopped.result)}",
        )
    changed = [
        r for r in checkers.changes_by(ctx, ["Q"], after_seq=mark) if r["tbl"] == "agent_runs"
    ]
    ctx.invariant(
        name,
        not changed and not renewed.ok,
        expected="no change of the run by Q after the harness took the row: every renewal in "
        "that time waited until the lease had expired (rule 1: an expired lease is not renewed); "
        "the renew Q was asked for outright refused",
        observed=f"changes by Q {[(r['seq'], r['at'], r['op'], r['renewal']) for r in changed]}; "
        f"renew {'ok ' + plain(renewed.result) if renewed.ok else f'{renewed.error}: {renewed.message}'}",
    )
    return run_id
