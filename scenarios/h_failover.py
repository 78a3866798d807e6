"""H: after a failover the outcome matches the durability contract the worker declared.

Ownership is judged on the primary only. Under asynchronous replication a
promoted standby may lack epochs the old primary acknowledged; the worker must
say so (declare the async contract) rather than claim the synchronous one.
Under synchronous replication no acknowledged epoch may be lost. And when a
synchronous commit's wait is cancelled, PostgreSQL reports success with only
a warning although the standby never got it: the worker must treat that as
outcome unknown, never as durable. When the waiting backend is terminated
instead (``sync_terminated_wait``: pg_terminate_backend, SQLSTATE 57P01),
the transaction has committed locally and the connection is gone: the worker
must not answer that the write failed (it did not; its outcome is unknown to
it until it reads back), nor that it is durable. No failover there: the
primary the worker wrote is the one judged.

What rests on the worker's word, and why: the declared contract (op
``durability``) and the answer to the write whose wait was cancelled are not
evidence of anything else, they are the subject of rule 11 itself ("the
system must say so rather than claim the sync guarantee"). The harness judges
them against what it observed: the replication mode from
pg_stat_replication, and the write's loss on the promoted standby.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from harness.checking import checkers
from harness.checking.history import load_history, select
from harness.contract import needs
from harness.engine.experiment import (
    Exemption,
    ExperimentContext,
    ExperimentSpec,
    Inconclusive,
    LoggedOp,
)
from harness.parts.control import Hold
from harness.parts.postgres import PostgresCluster, failover
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for
from scenarios.common import new_run, seen_within

#: sync_terminated_wait with W's role at synchronous_commit = remote_apply,
#: which waits for the standby as 'on' does (blind hunt 27 #12: a read-back
#: that counted only 'on' as waiting answered the terminated commit durable).
REMOTE_APPLY_TERMINATED = "sync_terminated_wait_remote_apply"
#: sync_terminated_wait on W's main thread after that thread read back a lost
#: commit while the primary had no synchronous standby (blind hunt 44 #05: a
#: writer that asked "do commits wait for a standby?" once answered the
#: terminated wait durable), W's role committing at remote_write.
TERMINATED_AFTER_ASYNC_READ_BACK = "sync_terminated_after_async_read_back"
#: A `run` worker's COMMIT waits for the synchronous standby (its link cut)
#: while the worker's heartbeat, its renewals waiting on the run's row the
#: write still holds, gives up and cancels the execution (blind hunt 56 #06:
#: the Go writer answered a COMMIT that failed under the cancelled context as
#: a cancellation, a refusal, and never read it back).
WAIT_OUTLIVES_RENEWALS = "sync_wait_outlives_renewals"

SPEC = ExperimentSpec(
    id="H",
    title="failover",
    seed_section="English seed §10, §11 H; docs/protocol.md (sync wait cancel)",
    invariant="async: acknowledged epochs may be lost and the worker declares exactly that; "
    "sync: no acknowledged epoch is lost; a cancelled sync wait is never reported as durable",
    fault="promote the standby (old primary fenced first) under async, under sync, and after "
    "cancelling a sync commit's wait",
    needs=(
        *needs.capabilities("checkpoints", "ledger"),
        needs.point("before_commit", TERMINATED_AFTER_ASYNC_READ_BACK, WAIT_OUTLIVES_RENEWALS),
        needs.point("before_renew", WAIT_OUTLIVES_RENEWALS),
    ),
    rules=(11,),
    replication="async",
    variants=(
        "async",
        "sync",
        "sync_cancelled_wait",
        "sync_terminated_wait",
        REMOTE_APPLY_TERMINATED,
        TERMINATED_AFTER_ASYNC_READ_BACK,
        WAIT_OUTLIVES_RENEWALS,
    ),
    variant_faults=(
        (
            "sync_terminated_wait",
            "terminate W's backend (pg_terminate_backend) while its COMMIT waits for the "
            "synchronous standby, whose link is cut; no failover",
        ),
        (
            REMOTE_APPLY_TERMINATED,
            "the same with W's login role committing at synchronous_commit = remote_apply",
        ),
        (
            TERMINATED_AFTER_ASYNC_READ_BACK,
            "the answers to W's write dropped while the primary has no synchronous standby "
            "(W reads its commit back), then synchronous replication on and the same as "
            "sync_terminated_wait, both on W's main thread",
        ),
        (
            WAIT_OUTLIVES_RENEWALS,
            "a `run` worker held before the COMMIT of its first protected write while the "
            "synchronous standby's link is cut, then let go: the COMMIT waits for the standby "
            "until the worker's heartbeat has given up a renewal; no failover",
        ),
    ),
    natural_wait_s=0.0,
    # The read-back's lost answer comes from a hold before the COMMIT.
    variant_write_paths=(
        (TERMINATED_AFTER_ASYNC_READ_BACK, "stepped"),
        (WAIT_OUTLIVES_RENEWALS, "stepped"),
    ),
    exemptions=(
        Exemption(
            "worker.accounts_match_the_evidence",
            "async failover loses acknowledged writes by design (the declared contract): the "
            "worker's ok for the epoch-2 claim, checkpoint and intent is true of the old "
            "primary, which the promoted standby never received",
            variants=("async",),
        ),
        Exemption(
            "effect.sent_only_under_a_dispatch_claim",
            "async failover loses acknowledged writes by design: the intent and the dispatch "
            "claim the tool's request was sent under exist on the fenced old primary only",
            variants=("async",),
        ),
    ),
)


def _state(
    ctx: ExperimentContext, server: PostgresCluster, run_id: str, label: str
) -> dict[str, Any]:
    db = ctx.env.db.name
    q = "SELECT epoch, revision, owner, status FROM fencecheck_model.agent_runs WHERE run_id = %s"
    run = server.query(q, [run_id], dbname=db)
    ledger = server.query(
        "SELECT operation_id, status FROM fencecheck_model.tool_operations WHERE run_id = %s ORDER BY 1",
        [run_id],
        dbname=db,
    )
    tool_epochs = [r["epoch"] for r in checkers.tool_requests(ctx, run_id=run_id)]
    state = {
        "server": server.name,
        "run": run[0] if run else None,
        "ledger": ledger,
        "tool_high_water_epoch": max(tool_epochs) if tool_epochs else None,
    }
    ctx.queries.append(_query_record(label, q, [state]))
    return state


def _query_record(label: str, query: str, rows: list[dict[str, Any]]) -> Any:
    import time

    from harness.engine.experiment import QueryRecord

    return QueryRecord(time.time(), label, query, rows)


def _wait_replayed(primary: PostgresCluster) -> None:
    wait_for(
        lambda: (
            all(r["replay_lag_bytes"] == 0 for r in primary.replication_status())
            and bool(primary.replication_status())
        ),
        what="the standby to replay everything the primary wrote",
        timeout_s=15,
    )


def _wait_link_down(primary: PostgresCluster) -> None:
    wait_for(
        lambda: not primary.replication_status(),
        what="the primary to see the replication link down",
        timeout_s=15,
    )


def _committed_locally_not_told_failed(
    ctx: ExperimentContext, primary: PostgresCluster, w: WorkerProcess, run_id: str, rev: int
) -> None:
    """The write whose standby wait was cancelled committed on the primary
    (the WARNING says so): W's history may call it ``info`` (unknown), never
    ``fail``, which says it did not happen (generated a05e9d1e: the warning
    not raised as an unknown outcome, the write's answer became an error the
    history recorded ``fail``). Judged before the failover loses it."""
    row = primary.query(
        "SELECT revision FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [run_id],
        dbname=ctx.env.db.name,
    )
    told = [
        e.type
        for e in select(load_history([w.events_path]), op="save_checkpoint", run_id=run_id)
        if e.revision == rev and e.type != "invoke"
    ]
    name = "a write committed on the primary, its durability unknown, is not recorded failed"
    if not (row and int(row[0]["revision"]) == rev + 1 and told):
        ctx.not_judged(
            name,
            expected=f"the run at revision {rev + 1} on the primary; W's history of the write",
            observed=f"run {row}; W's history of it {told}",
        )
        return
    ctx.invariant(
        name,
        told[-1] != "fail",
        expected=f"W's history of the write at revision {rev} info (or ok, judged above)",
        observed=f"W's history: {told}; the primary has revision {row[0]['revision']}",
    )


def _wait_outlives_renewals(ctx: ExperimentContext, primary: PostgresCluster, run_id: str) -> None:
    """W's first protected write goes into the local WAL and waits for the
    standby, holding the run's row, so W's renewals wait too and its heartbeat
    gives one up and cancels the execution while the COMMIT is on the wire
    (its renewals parked until the COMMIT waits). The write committed on this
    primary: W may record it ``ok`` or ``info``
    (read back, or unknown), never ``fail``."""
    ctx.arm("W", "before_commit", Hold())
    # The heartbeat parked meanwhile: a renewal given up before the COMMIT
    # went out would cancel a write that never reached the server.
    ctx.arm("W", "before_renew", Hold())
    w = ctx.env.start_worker("W", "run", ["--run-id", run_id, "--once"])
    hit = ctx.reached("W", "before_commit")
    ctx.cut("replication")
    _wait_link_down(primary)
    ctx.release("W", "before_commit")
    waiting = seen_within(
        lambda: _sync_waiters(ctx, primary) or None,
        what="W's COMMIT to wait for the synchronous standby",
        timeout_s=10,
    )
    ctx.reached("W", "before_renew", held=True)
    ctx.release("W", "before_renew")

    def renewal_given_up() -> list[str] | None:
        events = select(load_history([w.events_path]), op="renew", run_id=run_id)
        return [f"{e.type} {e.error}" for e in events if e.type in ("fail", "info")] or None

    gave_up = seen_within(renewal_given_up, what="W's heartbeat to give a renewal up", timeout_s=15)
    still_waiting = _sync_waiters(ctx, primary)
    ctx.heal("replication")
    code = w.wait(20)
    ctx.command(f"W exited with code {code}")
    # A commit is visible to other sessions only once its wait has ended.
    seen_within(
        lambda: not _sync_waiters(ctx, primary) or None,
        what="no backend of W still waiting for the standby once the link healed",
        timeout_s=10,
    )
    ctx.fault(
        "W's COMMIT waited for the standby until its heartbeat gave a renewal up",
        waiting is not None and gave_up is not None,
        expected="W's backend waiting on SyncRep; a renewal W's history records failed or "
        "unknown meanwhile",
        observed=f"waiting: {waiting}; renewals given up: {gave_up}; still waiting then: "
        f"{still_waiting}",
    )
    revision = int(hit.revision or 0)
    row = primary.query(
        "SELECT revision FROM fencecheck_model.agent_checkpoints WHERE run_id = %s "
        "AND revision = %s",
        [run_id, revision],
        dbname=ctx.env.db.name,
    )
    events = select(load_history([w.events_path]), run_id=run_id)
    held = {
        e.event_id
        for e in events
        if e.type == "invoke" and e.event_id and e.revision == revision - 1
    }
    told = [f"{e.op} {e.type}" for e in events if e.event_id in held and e.type != "invoke"]
    name = "a write committed while its execution was cancelled is not recorded failed"
    if not (row and told):
        ctx.not_judged(
            name,
            expected=f"W's checkpoint at revision {revision} on the primary; W's history of it",
            observed=f"checkpoint rows {row}; W's history of it {told}",
        )
        return
    ctx.invariant(
        name,
        not told[-1].endswith(" fail"),
        expected=f"W's history of the write at revision {revision - 1}: ok or info",
        observed=f"W's history: {told} (exit {code}); the primary holds the checkpoint",
    )


def _sync_waiters(ctx: ExperimentContext, primary: PostgresCluster) -> list[dict[str, Any]]:
    return primary.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'W' AND wait_event = 'SyncRep'",
        dbname=ctx.env.db.name,
    )


def _reconnected(ctx: ExperimentContext, primary: PostgresCluster, w: WorkerProcess) -> None:
    """W's connections end (pg_terminate_backend) and W is asked until it
    answers again, on a new connection: whatever W keeps of its connection
    (the WARNING notices a COMMIT gets) must follow the new one before the
    wait for the standby is cancelled (blind hunt 27 #03: a writer that kept
    the first connection's log answered the cancelled wait as durable)."""
    who = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'W'"
    )
    old = {r["pid"] for r in primary.query(who, dbname=ctx.env.db.name)}
    primary.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'W'",
        dbname=ctx.env.db.name,
    )
    ctx.command(f"pg_terminate_backend of W's backends {sorted(old)}: W must reconnect")
    answered = seen_within(
        lambda: ctx.op(w, "durability").ok or None,
        what="W to answer on a new connection",
        timeout_s=10,
    )
    new = {r["pid"] for r in primary.query(who, dbname=ctx.env.db.name)}
    ctx.fault(
        "W reconnected before its wait for the standby",
        bool(answered) and bool(old) and bool(new) and not new & old,
        expected="W answered again, from backends other than the terminated ones",
        observed=f"answered: {bool(answered)}; backends before {sorted(old)}, after {sorted(new)}",
    )


def _terminated_in_the_wait(
    ctx: ExperimentContext, primary: PostgresCluster, pid: int, pending: LoggedOp
) -> None:
    """W's backend, waiting for the standby after its commit went into the
    local WAL, is terminated: the write committed on this primary, and W's
    session ends without an answer. W may read back and answer ok (not
    durable), or answer CommitOutcomeUnknown; a definite refusal is false."""
    primary.query("SELECT pg_terminate_backend(%s)", [pid], dbname=ctx.env.db.name)
    ctx.command(f"pg_terminate_backend({pid}): W's backend ends while it waits for the standby")
    reply = pending.result(15)
    run_id = str(pending.args["run_id"])
    committed = ctx.sql(
        "the terminated write's checkpoint on the primary",
        "SELECT revision FROM fencecheck_model.agent_checkpoints WHERE run_id = %s "
        "AND revision = %s",
        [run_id, int(pending.args["expected_revision"]) + 1],
    )
    ctx.fault(
        "the terminated write had committed locally",
        bool(committed),
        expected="the checkpoint W's backend committed before its wait, on the primary",
        observed=f"checkpoint rows at the next revision: {len(committed)}",
    )
    durable = bool(reply.ok and reply.result.get("durable", True))
    ctx.invariant(
        "a write whose backend was terminated in its sync wait is neither refused nor durable",
        (reply.ok and not durable) or reply.error == "CommitOutcomeUnknown",
        expected="ok with durable=false (read back), or CommitOutcomeUnknown; never a refusal "
        "(the write committed locally) and never durable (the standby never got it)",
        observed=f"reply ok={reply.ok} {reply.result or reply.error}",
    )
    ctx.heal("replication")


def _read_back_without_a_sync_standby(
    ctx: ExperimentContext, primary: PostgresCluster, w: WorkerProcess, run_id: str, epoch: int,
    rev: int,
) -> int:  # fmt: skip
    """A write of W's main thread whose answer is lost after the server
    committed it, while no standby is synchronous: W reads it back and
    answers it committed (held before its COMMIT on the stepped path while
    the answers are dropped from then on). The run's revision after it."""
    event_id = ctx.uuid()
    sessions = [
        r["pid"]
        for r in primary.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'W'",
            dbname=ctx.env.db.name,
        )
    ]
    ctx.arm("W", "before_commit", Hold())
    pending = ctx.op_async(
        w,
        "save_checkpoint",
        {"run_id": run_id, "epoch": epoch, "expected_revision": rev,
         "state": {"step": "read back"}, "event_id": event_id},
        worker_async=False,
    )  # fmt: skip
    ctx.reached("W", "before_commit", held=True)
    fault = ctx.env.links["worker_pg"].drop_responses(close_after_ms=400)
    ctx.command(f"toxiproxy: {fault.detail}")
    ctx.release("W", "before_commit")
    committed = seen_within(
        lambda: primary.query(
            "SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s",
            [event_id],
            dbname=ctx.env.db.name,
        ),
        what="W's COMMIT to reach the server while its answers are dropped",
        timeout_s=10,
    )
    # Healed only once the write's answer is lost for good: W's sessions from
    # before the fault gone on the server (toxiproxy closes them 400 ms in).
    seen_within(
        lambda: not primary.query(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [sessions],
            dbname=ctx.env.db.name,
        ) or None,
        what="W's sessions from before the fault to end on the server",
        timeout_s=10,
    )  # fmt: skip
    ctx.heal("worker_pg")
    reply = pending.result(30)
    ctx.fault(
        "W read back a commit whose answer was lost, with no synchronous standby",
        bool(committed) and reply.ok and int(reply.result.get("revision", -1)) == rev + 1,
        expected=f"W's write (event {event_id}) committed while its answers were dropped, and "
        f"answered ok at revision {rev + 1} once the link healed",
        observed=f"committed: {bool(committed)}; reply "
        f"{reply.result if reply.ok else f'{reply.error}: {reply.message}'}",
    )
    return rev + 1


def _local_commits_are_not_sync(ctx: ExperimentContext) -> None:
    """With standby names set, a session whose ``synchronous_commit`` is
    ``local`` commits without waiting for the standby: a worker that reads
    its mode as ``sync`` promises what the server does not do (blind bug hunt
    round 4, #08: any level but ``off`` taken for sync). One whose level is
    ``remote_write`` waits for the standby to have the commit written: that
    is sync, and a worker reading it as async refuses to start where
    ``--require-durability sync`` is met (round 11); so does ``remote_apply``
    (round 70, #05: a Go level list without it). The worker's login role
    gets each level for one probe's session only, reset at once."""
    for level, mode in (("local", "async"), ("remote_write", "sync"), ("remote_apply", "sync")):
        seen, declared = _declared_at_level(ctx, level)
        ctx.fault(
            f"the probe's role commits with synchronous_commit {level}",
            any(f"synchronous_commit={level}" in str(r["setting"]) for r in seen),
            expected=f"synchronous_commit={level} for the worker's login role in this database",
            observed=f"{[r['setting'] for r in seen]}",
        )
        ctx.invariant(
            f"a session that commits with synchronous_commit {level} is declared {mode}",
            declared.get("mode") == mode,
            expected=f"mode {mode}: the standby is named and streams, and this session's commits "
            + ("do not wait for it" if mode == "async" else "wait for it (written or applied)"),
            observed=f"declared {declared}",
        )


def _role_commits_at(ctx: ExperimentContext, level: str) -> None:
    """Every later session of the experiment's worker role commits with
    ``synchronous_commit`` ``level`` (a role setting, as a deployment would)."""
    role = ctx.env.login_role(ctx.env.tenant_id, "worker")
    ctx.env.primary.execute(
        sql.SQL("ALTER ROLE {} IN DATABASE {} SET synchronous_commit = {}").format(
            sql.Identifier(role), sql.Identifier(ctx.env.db.name), sql.Literal(level)
        )
    )
    ctx.command(f"ALTER ROLE {role} IN DATABASE ... SET synchronous_commit = '{level}'")


def _declared_at_level(
    ctx: ExperimentContext, level: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The role's settings and what a fresh ``ops`` worker's ``durability``
    declares while its login role commits with ``synchronous_commit`` ``level``."""
    role = ctx.env.login_role(ctx.env.tenant_id, "worker")
    target = sql.SQL("ALTER ROLE {} IN DATABASE {} ").format(
        sql.Identifier(role), sql.Identifier(ctx.env.db.name)
    )
    ctx.env.primary.execute(
        target + sql.SQL("SET synchronous_commit = {}").format(sql.Literal(level))
    )
    ctx.command(f"ALTER ROLE {role} IN DATABASE ... SET synchronous_commit = '{level}'")
    try:
        probe = ctx.env.start_worker(f"WL{level[0]}", "ops")
        seen = ctx.sql(
            f"the probe's session settings ({level})",
            "SELECT unnest(s.setconfig) AS setting FROM pg_db_role_setting s "
            "JOIN pg_roles r ON r.oid = s.setrole "
            "WHERE r.rolname = %s",
            [role],
        )
        declared = ctx.ok(probe, "durability")
    finally:
        ctx.env.primary.execute(target + sql.SQL("RESET synchronous_commit"))
        ctx.command(f"ALTER ROLE {role} IN DATABASE ... RESET synchronous_commit")
    probe.stop()
    return seen, declared


def run(ctx: ExperimentContext) -> None:
    variant = ctx.variant or "async"
    env = ctx.env
    primary, standby = env.primary, env.standby
    if standby is None:
        raise Inconclusive("no standby was started for this experiment")
    run_id = new_run(ctx, tool="idem")
    if variant == WAIT_OUTLIVES_RENEWALS:
        _wait_outlives_renewals(ctx, primary, run_id)
        return
    if variant == REMOTE_APPLY_TERMINATED:
        _role_commits_at(ctx, "remote_apply")
        variant = "sync_terminated_wait"
    after_async = variant == TERMINATED_AFTER_ASYNC_READ_BACK
    if after_async:
        # And at remote_write, which waits for the standby too (blind hunt 70
        # #03: a read-back that counted remote_write as not waiting answered
        # the terminated wait durable); REMOTE_APPLY_TERMINATED has remote_apply.
        _role_commits_at(ctx, "remote_write")
        primary.set_sync_standby(None)
        ctx.command("ALTER SYSTEM SET synchronous_standby_names = '': commits wait for nobody")
    # after_async: a lease that outlasts both faults and the switch to sync on
    # a busy machine (a write refused for its lease tests nothing here).
    w = env.start_worker(
        "W", "ops", env={"FENCECHECK_LEASE_TTL_MS": "30000"} if after_async else None
    )
    declared = ctx.ok(w, "durability")
    mode = "async" if variant == "async" else "sync"
    if variant == "sync":
        _local_commits_are_not_sync(ctx)
    lease = ctx.ok(w, "claim", run_id=run_id)
    rev = ctx.ok(
        w,
        "save_checkpoint",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        state={"step": "replicated"},
    )["revision"]
    _wait_replayed(primary)
    replication_before = primary.replication_status()
    reply_durable: bool | None = None
    if variant == "async":
        ctx.cut("replication")
        _wait_link_down(primary)
    if variant in ("async", "sync"):
        ctx.ok(w, "release", run_id=run_id, epoch=lease["epoch"])
        second = ctx.ok(w, "claim", run_id=run_id)
        rev = ctx.ok(
            w,
            "save_checkpoint",
            run_id=run_id,
            epoch=second["epoch"],
            expected_revision=second["revision"],
            state={"step": "acknowledged"},
        )["revision"]
        intent = ctx.ok(
            w,
            "register_intent",
            run_id=run_id,
            epoch=second["epoch"],
            expected_revision=rev,
            step_id="h.notify",
            effect_version=1,
            tool="idem",
            request={"to": "customer"},
        )
        ctx.ok(w, "dispatch", operation_id=intent["operation_id"])
    else:
        if variant == "sync_cancelled_wait":
            _reconnected(ctx, primary, w)
        if after_async:
            rev = _read_back_without_a_sync_standby(ctx, primary, w, run_id, lease["epoch"], rev)
            primary.set_sync_standby("replica")
            ctx.command("synchronous replication on again (the standby named, sync_state sync)")
            # The same process asked again: the mode is read from the server
            # each time, not kept from the first answer (blind hunt 65 #06: a
            # Go durability op that cached its first reading said async here).
            again = ctx.ok(w, "durability")
            ctx.invariant(
                "one process's durability follows the server's settings",
                declared.get("mode") == "async" and again.get("mode") == "sync",
                expected="W's durability async while no standby is named, sync once it is "
                "named again and streams in sync",
                observed=f"before {declared.get('mode')}, after {again.get('mode')}",
            )
        ctx.cut("replication")
        _wait_link_down(primary)
        pending = ctx.op_async(
            w,
            "save_checkpoint",
            {
                "run_id": run_id,
                "epoch": lease["epoch"],
                "expected_revision": rev,
                "state": {"step": "waits for the standby"},
            },
            # The cancelled wait on W's own session, the one that reconnected
            # (an async request would get a new session and writer of its own).
            worker_async=variant != "sync_cancelled_wait" and not after_async,
        )
        waiting = seen_within(
            lambda: _sync_waiters(ctx, primary) or None,
            what="W's COMMIT to wait for the synchronous standby",
            timeout_s=10,
        )
        ctx.fault(
            "COMMIT waited for the standby",
            waiting is not None,
            expected="W's backend waiting on SyncRep",
            observed=f"waiting: {waiting}",
        )
        if waiting is None:
            return  # nothing to cancel; the verdict is unknown already
        if variant == "sync_terminated_wait" or after_async:
            _terminated_in_the_wait(ctx, primary, waiting[0]["pid"], pending)
            return
        primary.query("SELECT pg_cancel_backend(%s)", [waiting[0]["pid"]], dbname=env.db.name)
        ctx.command(f"pg_cancel_backend({waiting[0]['pid']}): cancel W's wait for the standby")
        reply = pending.result(15)
        reply_durable = bool(reply.ok and reply.result.get("durable", True))
        ctx.invariant(
            "cancelled sync wait not reported as durable",
            not reply_durable,
            expected="CommitOutcomeUnknown, or ok with durable=false",
            observed=f"reply ok={reply.ok} {reply.result or reply.error}",
        )
        _committed_locally_not_told_failed(ctx, primary, w, run_id, rev)
    before = _state(ctx, primary, run_id, "old primary just before failover")
    record = failover(primary, standby)
    ctx.command(
        f"failover: fenced {record.old_primary} in {record.fence_seconds:.3f}s, "
        f"promoted {record.new_primary} in {record.promote_seconds:.3f}s"
    )
    env.primary = standby  # every later query, the runner's evidence too, goes to it
    after = _state(ctx, standby, run_id, "new primary after failover")
    epoch_before = before["run"]["epoch"] if before["run"] else None
    epoch_after = after["run"]["epoch"] if after["run"] else None
    lost = epoch_before != epoch_after or (
        before["run"] and after["run"] and before["run"]["revision"] != after["run"]["revision"]
    )
    ctx.extra["failover"] = {
        "replication_mode": mode,
        "declared_contract": declared,
        "before": before,
        "after": after,
        "record": {k: v for k, v in record.__dict__.items()},
        "replication_before": replication_before,
        "acknowledged_write_lost": bool(lost),
        "reported_durable": reply_durable,
    }
    ctx.equal(
        "declared contract matches the deployment",
        declared.get("mode"),
        mode,
        what="replication mode the worker declared",
    )
    if variant == "async":
        ctx.fault(
            "async standby lagged at failover",
            bool(lost),
            expected="the acknowledged epoch missing on the promoted standby",
            observed=f"epoch before {epoch_before}, after {epoch_after}",
        )
        ctx.invariant(
            "loss is within the declared contract",
            declared.get("mode") == "async",
            expected="the worker declared that async failover can lose acknowledged epochs",
            observed=f"declared {declared}",
        )
    elif variant == "sync":
        ctx.fault(
            "standby was synchronous",
            any(r["sync_state"] == "sync" for r in replication_before),
            expected="sync_state = sync before the writes",
            observed=f"{[(r['application_name'], r['sync_state']) for r in replication_before]}",
        )
        ctx.equal(
            "no acknowledged epoch lost",
            (epoch_after, after["ledger"]),
            (epoch_before, before["ledger"]),
            what="(epoch, ledger) after vs before",
        )
    else:
        ctx.fault(
            "the cancelled write was lost by the failover",
            bool(lost),
            expected="the standby never received the write whose wait was cancelled",
            observed=f"revision before {before['run'] and before['run']['revision']}, "
            f"after {after['run'] and after['run']['revision']}",
        )
