"""Checks judged from evidence the harness gathers itself.

Sources, never a worker's word: the experiment database queried as superuser
(including the harness's own audit trail of every change to ``agent_runs``),
the mock tool's own request log, the control-socket hits, the kernel states
the harness confirmed. Worker histories are used only to explain, or to time
a wait; no verdict rests on them alone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import psycopg
from psycopg import sql

from harness.engine.experiment import ExperimentContext, Inconclusive
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for

# ----------------------------------------------------------------- database


def run_row(ctx: ExperimentContext, run_id: str, label: str = "") -> dict[str, Any]:
    rows = ctx.sql(
        label or f"state of run {run_id[:8]}",
        "SELECT run_id, tenant_id, task_id, status, revision, owner, epoch, lease_expires_at, "
        "lease_expires_at < clock_timestamp() AS lease_expired, checkpoint_schema_version, "
        "current_step, attempt_count FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [run_id],
    )
    if not rows:
        raise Inconclusive(f"run {run_id} does not exist in agent_runs")
    return rows[0]


def checkpoints(ctx: ExperimentContext, run_id: str) -> list[dict[str, Any]]:
    return ctx.sql(
        f"checkpoints of run {run_id[:8]}",
        "SELECT revision, epoch, owner, schema_version, event_id, state_json, created_at "
        "FROM fencecheck_model.agent_checkpoints WHERE run_id = %s ORDER BY revision",
        [run_id],
    )


def audit(ctx: ExperimentContext, run_id: str | None = None) -> list[dict[str, Any]]:
    """The harness's own trail of every INSERT/UPDATE of agent_runs."""
    where, params = ("WHERE run_id = %s", [run_id]) if run_id else ("", [])
    return ctx.sql(
        f"audit trail{' of run ' + run_id[:8] if run_id else ''}",
        "SELECT seq, at, txid, app, op, run_id, status, owner, epoch, revision, "
        "lease_expires_at, old_status, old_owner, old_epoch, old_revision, "
        f"old_lease_expires_at FROM fencecheck_audit.run_changes {where} ORDER BY seq",
        params,
    )


def writes(ctx: ExperimentContext, run_id: str) -> list[dict[str, Any]]:
    """The run's protected writes as the audit trigger saw them, in revision order:
    revision, epoch and owner of the checkpoint, its event_id, the transaction
    that inserted it, the outbox rows inserted with that event_id (and their
    transactions), the run's ``current_step`` as that transaction left it, and
    the session that wrote it."""
    return ctx.sql(
        f"protected writes of run {run_id[:8]} (audit trail)",
        "SELECT (c.new->>'revision')::bigint AS revision, (c.new->>'epoch')::bigint AS epoch, "
        "c.new->>'owner' AS owner, c.new->>'event_id' AS event_id, c.txid, c.app, "
        "(SELECT r.new->>'current_step' FROM fencecheck_audit.changes r WHERE r.txid = c.txid "
        " AND r.tbl = 'agent_runs' AND r.new->>'run_id' = c.new->>'run_id' "
        " ORDER BY r.seq DESC LIMIT 1) AS current_step, "
        "(SELECT array_agg(o.txid ORDER BY o.seq) FROM fencecheck_audit.changes o "
        " WHERE o.tbl = 'outbox' AND o.op = 'INSERT' AND o.new->>'event_id' = c.new->>'event_id')"
        " AS outbox_txids "
        "FROM fencecheck_audit.changes c WHERE c.tbl = 'agent_checkpoints' AND c.op = 'INSERT' "
        "AND c.new->>'run_id' = %s ORDER BY (c.new->>'revision')::bigint",
        [run_id],
    )


def with_outbox_in_same_tx(write: dict[str, Any]) -> bool:
    """One outbox row with the write's event_id, inserted by the write's transaction."""
    return list(write["outbox_txids"] or []) == [write["txid"]]


def changes_by(
    ctx: ExperimentContext, apps: list[str], *, after_seq: int = 0, since: float | None = None
) -> list[dict[str, Any]]:
    """Every audited change of a contract table made by sessions of ``apps``
    after audit position ``after_seq`` (and database time ``since``);
    ``renewal`` marks a change of agent_runs that only moved the lease expiry;
    ``took_ms`` is the time from its transaction's start to the change."""
    return ctx.sql(
        f"changes by {', '.join(apps)} (audit trail)",
        "SELECT seq, at, txid, app, tbl, op, coalesce(new, old)->>'run_id' AS run_id, "
        "round((extract(epoch FROM at - tx_start) * 1000)::numeric, 1)::float8 AS took_ms, "
        "(tbl = 'agent_runs' AND op = 'UPDATE' AND old - 'lease_expires_at' - 'updated_at' "
        " = new - 'lease_expires_at' - 'updated_at') AS renewal, "
        "left(statement, 120) AS statement FROM fencecheck_audit.changes "
        "WHERE app = ANY(%s) AND seq > %s AND at > coalesce(to_timestamp(%s), '-infinity') "
        "ORDER BY seq",
        [apps, after_seq, since],
    )


def audit_mark(ctx: ExperimentContext) -> int:
    """The audit trail's position now: :func:`changes_by` after it sees only what
    comes next."""
    rows = ctx.env.query("SELECT coalesce(max(seq), 0) AS seq FROM fencecheck_audit.changes")
    return int(rows[0]["seq"])


def ledger(ctx: ExperimentContext, run_id: str) -> list[dict[str, Any]]:
    return ctx.sql(
        f"tool ledger of run {run_id[:8]}",
        "SELECT operation_id, step_id, effect_version, tool_name, status, dispatch_owner, "
        "dispatch_until, remote_id, revision FROM fencecheck_model.tool_operations WHERE run_id = %s "
        "ORDER BY step_id, effect_version",
        [run_id],
    )


def outbox(ctx: ExperimentContext, run_id: str) -> list[dict[str, Any]]:
    return ctx.sql(
        f"outbox of run {run_id[:8]}",
        "SELECT id, event_id, event_type, published_at FROM fencecheck_model.outbox WHERE run_id = %s ORDER BY id",
        [run_id],
    )


def wait_lease_expired(ctx: ExperimentContext, run_id: str, timeout_s: float = 10.0) -> None:
    """Wait until the database's own clock is past the run's lease expiry."""
    try:
        wait_for(
            lambda: ctx.env.query(
                "SELECT lease_expires_at < clock_timestamp() AS expired FROM fencecheck_model.agent_runs "
                "WHERE run_id = %s",
                [run_id],
            )[0]["expired"],
            what=f"the lease of run {run_id[:8]} to expire by database time",
            timeout_s=timeout_s,
            interval_s=0.02,
            max_interval_s=0.05,
        )
    except TimeoutError as exc:
        raise Inconclusive(str(exc)) from exc
    ctx.command(f"waited until lease of run {run_id[:8]} expired by database time")


def backend_waiting_on_lock(ctx: ExperimentContext, app: str, timeout_s: float = 10.0) -> bool:
    """Wait until a backend of ``app`` is blocked on a lock; record what was seen."""

    def probe() -> list[dict[str, Any]] | None:
        rows = ctx.env.query(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 120) AS query "
            "FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s "
            "AND wait_event_type = 'Lock'",
            [app],
        )
        return rows or None

    try:
        wait_for(probe, what=f"a backend of {app} waiting on a lock", timeout_s=timeout_s)
    except TimeoutError:
        return False
    ctx.sql(
        f"backend of {app} blocked on a lock",
        "SELECT pid, state, wait_event_type, wait_event, left(query, 120) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
        [app],
    )
    return True


class RowLock:
    """A model row the harness holds locked (``SELECT ... FOR UPDATE`` in a
    transaction of its own, as superuser) while the block runs."""

    def __init__(self, ctx: ExperimentContext, what: str) -> None:
        self.ctx = ctx
        self.what = what

    def wait_for_waiters(self, apps: Sequence[str], timeout_s: float = 10.0) -> str | None:
        """Wait until a session of each of ``apps`` waits on a lock; what the
        harness saw (None when they did not, within ``timeout_s``)."""

        try:
            return wait_for(
                lambda: self._waiting(apps),
                what=f"{list(apps)} to wait on {self.what}",
                timeout_s=timeout_s,
            )
        except TimeoutError:
            return None

    def answered_or_waiting(self, pending: Any, app: str, timeout_s: float = 10.0) -> str | None:
        """Wait until ``pending`` (an ``op_async`` request) is answered, or the
        session of ``app`` waits on a lock: what the harness saw it waiting
        on, or None when it answered (the caller reads the answer)."""

        def settled() -> str | None:
            if pending.done():
                return "answered"
            return self._waiting([app])

        try:
            seen = wait_for(
                settled, what=f"{app}'s request to be answered or to wait", timeout_s=timeout_s
            )
        except TimeoutError:
            return f"{app}'s request neither answered nor waiting on a lock in {timeout_s:.0f} s"
        return None if seen == "answered" else seen

    def wait_for_sessions(self, app: str, count: int, timeout_s: float = 10.0) -> str | None:
        """Wait until ``count`` sessions of ``app`` wait on a lock (requests
        queued behind one another); what the harness saw, or None."""

        def probe() -> str | None:
            rows = self.ctx.env.query(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND application_name = %s",
                [app],
            )
            n = int(rows[0]["n"])
            return f"{n} sessions of {app} waiting on {self.what}" if n >= count else None

        try:
            return wait_for(probe, what=f"{count} sessions of {app} to wait", timeout_s=timeout_s)
        except TimeoutError:
            return None

    def waited_s(self, app: str) -> float:
        """How long the longest waiting statement of ``app`` on a lock has
        run, by the server's clock (its ``query_start``): the time since the
        statement began, not since the harness saw it wait. 0 when none waits."""
        rows = self.ctx.env.query(
            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)"
            "::float8 AS s FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND application_name = %s",
            [app],
        )
        return max(0.0, float(rows[0]["s"])) if rows else 0.0

    def _waiting(self, apps: Sequence[str]) -> str | None:
        rows = self.ctx.env.query(
            "SELECT application_name AS app FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND application_name = ANY(%s)",
            [list(apps)],
        )
        waiting = sorted({str(r["app"]) for r in rows})
        return f"{waiting} waiting on {self.what}" if set(waiting) == set(apps) else None


@contextlib.contextmanager
def row_locked(
    ctx: ExperimentContext, relation: str, column: str, value: object
) -> Iterator[RowLock]:
    """Hold ``fencecheck_model.<relation>``'s row ``column = value`` locked by
    the harness while the block runs (a barrier the database enforces: every
    statement that locks or updates the row waits until the block ends)."""
    what = f"{relation} row {column} = {value} (held by the harness)"
    with psycopg.connect(
        ctx.env.db.admin_dsn, connect_timeout=5, application_name="fencecheck-harness-lock"
    ) as conn:
        statement = sql.SQL("SELECT 1 FROM fencecheck_model.{} WHERE {} = %s FOR UPDATE").format(
            sql.Identifier(relation), sql.Identifier(column)
        )
        found = conn.execute(statement, [value]).fetchall()
        ctx.command(f"harness locks {what}: {len(found)} row(s)")
        if not found:
            raise Inconclusive(f"the harness found no {relation} row {column} = {value} to lock")
        try:
            yield RowLock(ctx, what)
        finally:
            conn.rollback()
            ctx.command(f"harness lets go of {what}")


def row_lock_held(ctx: ExperimentContext, relation: str, column: str, value: object) -> bool:
    """Whether another session holds ``fencecheck_model.<relation>``'s row
    ``column = value`` locked now: the harness's ``FOR UPDATE NOWAIT`` is
    refused (any row lock conflicts with it); when it is granted, it is let go
    at once."""
    statement = sql.SQL("SELECT 1 FROM fencecheck_model.{} WHERE {} = %s FOR UPDATE NOWAIT").format(
        sql.Identifier(relation), sql.Identifier(column)
    )
    with psycopg.connect(
        ctx.env.db.admin_dsn, connect_timeout=5, application_name="fencecheck-harness-probe"
    ) as conn:
        try:
            conn.execute(statement, [value]).fetchall()
        except psycopg.errors.LockNotAvailable:
            conn.rollback()
            ctx.command(f"harness probes {relation} row {column} = {value}: locked by another")
            return True
        conn.rollback()
    ctx.command(f"harness probes {relation} row {column} = {value}: nobody holds it")
    return False


def as_worker_role(
    ctx: ExperimentContext, tenant_id: str, statement: str, params: list[Any] | None = None
) -> tuple[str, list[dict[str, Any]] | str]:
    """Run one statement as the experiment's worker login role of ``tenant_id``,
    directly on the database (not through any worker code): what the database
    itself allows a session bound to that tenant."""
    role = ctx.env.login_role(tenant_id, "worker")
    dsn = ctx.env.db.dsn(role, application_name="fencecheck-harness-as-worker")
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement.encode(), params)
            rows = (
                [dict(zip([c.name for c in cur.description], r, strict=True)) for r in cur]
                if cur.description
                else []
            )
            outcome: tuple[str, list[dict[str, Any]] | str] = ("ok", rows)
            if cur.description is None:
                outcome = ("ok", f"{cur.rowcount} row(s) affected")
    except psycopg.Error as exc:
        outcome = (f"refused ({exc.sqlstate} {type(exc).__name__})", str(exc).splitlines()[0])
    ctx.queries.append(query_record(f"as {role} (tenant {tenant_id[:8]})", statement, outcome))
    return outcome


def query_record(label: str, statement: str, outcome: tuple[str, Any]) -> Any:
    """A probe run outside ``ctx.sql`` as an archive query record."""
    from harness.engine.experiment import QueryRecord

    rows = outcome[1] if isinstance(outcome[1], list) else [{"result": outcome[1]}]
    return QueryRecord(time.time(), f"{label}: {outcome[0]}", statement, rows)


# --------------------------------------------------------------- mock tool


def tool_log(ctx: ExperimentContext) -> dict[str, Any]:
    exported: dict[str, Any] = ctx.env.tool.client().export()
    return exported


def tool_requests(
    ctx: ExperimentContext, *, operation_id: str | None = None, run_id: str | None = None
) -> list[dict[str, Any]]:
    return [
        r
        for r in tool_log(ctx)["requests"]
        if (operation_id is None or r.get("operation_id") == operation_id)
        and (run_id is None or r.get("run_id") == run_id)
    ]


def tool_resources(ctx: ExperimentContext, *, run_id: str | None = None) -> list[dict[str, Any]]:
    return [r for r in tool_log(ctx)["resources"] if run_id is None or r.get("run_id") == run_id]


def one_resource_per_operation(ctx: ExperimentContext, run_id: str | None = None) -> None:
    """The tool's own resource table shows no operation acted on twice."""
    per_op: dict[str, int] = {}
    for r in tool_resources(ctx, run_id=run_id):
        per_op[r["operation_id"]] = per_op.get(r["operation_id"], 0) + 1
    dupes = {k: v for k, v in per_op.items() if v > 1}
    ctx.invariant(
        "one real resource per operation",
        not dupes,
        expected="no operation created twice at the tool",
        observed=f"{len(per_op)} operation(s); duplicates {dupes}",
    )


# ---------------------------------------------------- protocol-wide checks


def lease_history_is_sound(ctx: ExperimentContext, run_ids: list[str] | None = None) -> None:
    """Rule 1, judged from the harness's audit trail, for every run touched:

    * the epoch never decreases, and changes only by +1;
    * a change of epoch (a takeover) happens only when the previous lease was
      free or expired by database time;
    * no epoch is ever held by two owners.
    """
    rows = audit(ctx)
    if run_ids is not None:
        rows = [r for r in rows if str(r["run_id"]) in run_ids]
    problems: list[str] = []
    owners: dict[tuple[str, int], set[str]] = {}
    for r in rows:
        if r["owner"] is not None and r["epoch"] is not None:
            owners.setdefault((str(r["run_id"]), int(r["epoch"])), set()).add(r["owner"])
        if r["op"] != "UPDATE":
            continue
        live = (
            r["old_owner"] is not None
            and r["old_lease_expires_at"] is not None
            and r["old_lease_expires_at"] > r["at"]
        )
        # Without a fencing token there is no epoch to hold or to grow: a grant
        # is a new holder, and only its timing is judged.
        fenced = r["old_epoch"] is not None and r["epoch"] is not None
        granted = (
            r["epoch"] > r["old_epoch"]
            if fenced
            else r["owner"] is not None and r["owner"] != r["old_owner"]
        )
        if fenced and r["epoch"] < r["old_epoch"]:
            problems.append(f"seq {r['seq']}: epoch went back {r['old_epoch']}->{r['epoch']}")
        if fenced and granted and r["epoch"] != r["old_epoch"] + 1:
            problems.append(f"seq {r['seq']}: epoch jumped {r['old_epoch']}->{r['epoch']}")
        if granted and live:
            what = f"epoch {r['epoch']}" if fenced else "the run"
            problems.append(
                f"seq {r['seq']}: {r['owner']} took {what} while {r['old_owner']}'s lease ran "
                f"until {r['old_lease_expires_at']}"
            )
    shared = {f"{k[0][:8]}@{k[1]}": sorted(v) for k, v in owners.items() if len(v) > 1}
    if shared:
        problems.append(f"epochs held by more than one owner: {shared}")
    ctx.invariant(
        "lease history sound (rule 1)",
        not problems,
        expected="epochs only grow by 1, only over a free or expired lease, one owner per epoch",
        observed="; ".join(problems) or f"{len(rows)} audited change(s), all sound",
    )


def recorded_results_are_the_tools(ctx: ExperimentContext, run_id: str) -> None:
    """Rule 4: every operation of the run the ledger records ``succeeded`` names,
    as its ``remote_id``, a resource the tool's own log holds for that
    operation_id and tool, made from the request the ledger registered (the
    same body digest). A resource made from another body under our key, or no
    resource at all, is no success of ours."""
    rows = ctx.sql(
        f"succeeded operations of run {run_id[:8]} with their registered digest",
        "SELECT operation_id, tool_name, remote_id, request_digest FROM fencecheck_model.tool_operations "
        "WHERE run_id = %s AND status = 'succeeded' ORDER BY operation_id",
        [run_id],
    )
    made = {
        (r.get("tool"), r.get("operation_id"), r.get("resource_id")): r
        for r in tool_log(ctx)["resources"]
    }
    bad = []
    for row in rows:
        resource = made.get((row["tool_name"], row["operation_id"], row["remote_id"]))
        if resource is None:
            bad.append(
                f"{row['operation_id']}: remote_id {row['remote_id']!r} is no resource of it"
            )
        elif resource.get("body_digest") != row["request_digest"]:
            bad.append(
                f"{row['operation_id']}: {row['remote_id']} was made from another body "
                f"(digest {str(resource.get('body_digest'))[:12]}, ours "
                f"{str(row['request_digest'])[:12]})"
            )
    ctx.invariant(
        "every recorded success is the tool's resource of our request",
        not bad,
        expected="each succeeded ledger row's remote_id is a resource the tool made for that "
        "operation from the registered request (same digest)",
        observed="; ".join(bad) or f"{len(rows)} succeeded operation(s), each the tool's own",
    )


def consumer_effects(ctx: ExperimentContext, consumer: str) -> dict[str, int]:
    """How many business effects ``consumer`` wrote, per event id."""
    rows = ctx.sql(
        f"business effects of consumer {consumer} per event",
        "SELECT event_id, count(*) AS effects FROM fencecheck_model.consumer_effects "
        "WHERE consumer_name = %s GROUP BY event_id",
        [consumer],
    )
    return {str(r["event_id"]): int(r["effects"]) for r in rows}


def every_event_applied_once(ctx: ExperimentContext, consumer: str) -> None:
    """Rule 10, judged on every event, not one: each distinct event the broker
    holds was handed out by it (its own delivery log) and has exactly one
    business effect of ``consumer``. An event never handed out was skipped by
    the consumer's reads; one handed out without an effect was dropped; one
    with two was applied twice."""
    log = tool_log(ctx)
    held = list(dict.fromkeys(str(m["event_id"]) for m in log["messages"]))
    delivered = {str(e) for d in log.get("deliveries", []) for e in d.get("event_ids", [])}
    effects = consumer_effects(ctx, consumer)
    twice = [f"{e[:8]}: {n} effects" for e, n in effects.items() if n > 1]
    undelivered = [f"{e[:8]}: applied, never handed out" for e in effects if e not in delivered]
    # Safety: never twice, never without a delivery. Progress: every event the
    # broker holds handed out and applied (a consumer whose read timed out on a
    # loaded machine leaves some to its next pass).
    ctx.invariant(
        "no event at the broker applied twice or without a delivery",
        not twice and not undelivered,
        expected=f"at most one {consumer} effect per event, each for an event the broker "
        "handed out",
        observed="; ".join(twice + undelivered) or "none applied twice or undelivered",
    )
    # Safety too: an event handed out and never applied, which a later read
    # already started past (the consumer moved its position beyond every copy
    # of it), is lost for good, whatever the timing: nothing reads it again.
    last_seq: dict[str, int] = {}
    for m in log["messages"]:
        last_seq[str(m["event_id"])] = max(last_seq.get(str(m["event_id"]), 0), int(m["seq"]))
    reads = list(log.get("deliveries", []))
    passed_over = []
    for e in held:
        if effects.get(e, 0) or e not in delivered:
            continue
        first = next(
            i for i, d in enumerate(reads) if e in {str(x) for x in d.get("event_ids", [])}
        )
        past = [d for d in reads[first + 1 :] if int(d.get("after_seq", -1)) >= last_seq[e]]
        if past:
            passed_over.append(
                f"{e[:8]}: seq {last_seq[e]}, a later read began after {past[0]['after_seq']}"
            )
    ctx.invariant(
        "no event handed out is passed over without its effect",
        not passed_over,
        expected=f"no event the broker handed out to {consumer} left without an effect while a "
        "later read already began past it",
        observed=("; ".join(passed_over) or "none passed over")
        + "; reads (after seq: seqs handed out) "
        + ", ".join(f"{d.get('after_seq')}: {d.get('seqs')}" for d in reads),
    )
    wrong = [
        f"{e[:8]}: {'never handed out' if e not in delivered else f'{effects.get(e, 0)} effect(s)'}"
        for e in held
        if e not in delivered or effects.get(e, 0) != 1
    ]
    ctx.progress(
        "every event at the broker applied exactly once",
        bool(held) and not wrong,
        expected=f"each distinct event at the broker handed out to {consumer} and applied once",
        observed="; ".join(wrong)
        or f"{len(held)} event(s), each delivered and applied once"
        + (" (the broker holds none)" if not held else ""),
    )


def calls_outliving(
    ctx: ExperimentContext, worker: WorkerProcess, port: int, bound_ms: int, margin_s: float = 1.0
) -> list[str]:
    """The TCP connections ``worker``'s process holds to local ``port`` (a
    proxy of the run) that are still established ``margin_s`` later, the
    margin longer than ``bound_ms``: calls waiting past the bound the worker
    was given, as the kernel shows them (evidence, not the worker's word)."""

    def open_to_port() -> set[tuple[str, int]]:
        try:
            conns = psutil.Process(worker.pid).net_connections(kind="tcp")
        except psutil.Error:
            return set()
        return {
            (c.laddr.ip, c.laddr.port)
            for c in conns
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        }

    wait_s = max(margin_s, bound_ms / 1000 + 0.2)
    first = open_to_port()
    if not first:
        return []
    time.sleep(wait_s)
    still = first & open_to_port()
    found = [f"{ip}:{lport} -> :{port}" for ip, lport in sorted(still)]
    ctx.command(
        f"{worker.worker_id}'s connections to port {port}: {sorted(first)}; still open "
        f"{wait_s:.1f} s later (its bound {bound_ms} ms): {found or 'none'}"
    )
    return found
