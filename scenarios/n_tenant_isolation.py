"""N: tenant isolation, judged from the catalog, not from a list of tables.

A session's tenant is its login role's binding (worker contract v2). The
harness reads the catalog as superuser and probes every table with a tenant
column and every function, sequence and view the worker role can reach,
then tries, as a raw session of tenant 1's worker login role, every way a
session could move itself to another tenant, and, as raw sessions of its
worker and operator roles, the writes the protocol forbids (contract
section 7, rule 6), judged by the audit trail whatever refuses them.
Witnesses: the worker of
tenant 1 trying through its own code, the raw worker-role session (what
the database itself allows, whatever the worker filters), and the catalog.
"""

from __future__ import annotations

import uuid
from contextlib import closing
from typing import Any

import psycopg

from harness.checking import checkers, forbidden_writes, grants
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import control_plane, new_run

SPEC = ExperimentSpec(
    id="N",
    title="tenant isolation",
    seed_section="Chinese seed §12; English seed §12 (roles)",
    invariant="every table with a tenant column has RLS enabled and forced, and refuses "
    "cross-tenant read and write; the worker role executes only the worker API (no "
    "control-plane function), moves no sequence; a raw session of the worker or operator "
    "role commits none of the writes the protocol forbids, whatever SQL it sends; no session "
    "can change its own tenant binding",
    fault="a worker, a raw worker-role session and the worker role's catalog grants, all of "
    "tenant 1, aimed at tenant 2's rows and at the binding itself",
    needs=needs.capabilities(
        "tenants:rls", "checkpoints", "outbox", "consumer_dedupe", "contract_schema"
    ),
    rules=(12,),
    # N judges privileges, not timing: a lease long enough, and renewals
    # patient enough, that its live fixture stays live through the probes on
    # a loaded machine (at 800/300 ms it expired under load and N ended
    # unknown); the expired fixture waits the lease out.
    lease_ttl_ms=2000,
    heartbeat_timeout_ms=1000,
    natural_wait_s=2.0,
)


def run(ctx: ExperimentContext) -> None:
    t1, t2 = ctx.env.tenant_id, ctx.env.other_tenant_id
    mine = new_run(ctx, tenant_id=t1)
    theirs = _tenant_two_rows(ctx, t2)
    before = checkers.run_row(ctx, theirs, "tenant 2's run before the attempts")
    _through_the_worker(ctx, t1, theirs, before)
    _consumer_applies_its_own_tenant(ctx, t1, t2)
    role = ctx.env.login_role(t1, "worker")
    _tables(ctx, role, t1, t2)
    _reach(ctx, role, ctx.env.login_role(t1, "operator"))
    _binding_is_fixed(ctx, t1, t2)
    _forbidden_writes(ctx, t1)
    _no_control_plane(ctx, t1, mine)
    _cancel_names_a_run_it_cannot_see(ctx, t1, theirs)
    _create_run_for_another_tenant(ctx, t1, t2)
    own = checkers.as_worker_role(
        ctx, t1, "UPDATE agent_runs SET epoch = epoch + 100 WHERE run_id = %s", [mine]
    )
    ctx.invariant(
        "database refuses a direct write of the worker's own protected column",
        own[0] != "ok" or own[1] == "0 row(s) affected",
        expected="permission denied",
        observed=f"{own}",
    )
    after = checkers.run_row(ctx, theirs, "tenant 2's run after the attempts")
    ctx.equal(
        "tenant 2's run untouched",
        (after["status"], after["revision"], after["epoch"], after["owner"]),
        (before["status"], before["revision"], before["epoch"], before["owner"]),
        what="(status, revision, epoch, owner)",
    )


def _cancel_names_a_run_it_cannot_see(ctx: ExperimentContext, t1: str, theirs: str) -> None:
    """Tenant 1's control plane cancelling tenant 2's run, or a run nobody made,
    is refused (RunNotFound: it cannot see the run), never answered ok with
    nothing done (generated eebcc22f: a cancel that went on without the run's
    row answered as if it had cancelled something)."""
    ctl = control_plane(ctx, t1)
    for what, run_id in (("tenant 2's run", theirs), ("a run nobody made", str(uuid.uuid4()))):
        reply = ctx.op(ctl, "cancel", run_id=run_id, reason="n probe")
        ctx.invariant(
            f"a cancel naming {what} is refused",
            not reply.ok,
            expected="an error reply (the tenant's control plane cannot see that run)",
            observed=f"{reply.error}: {reply.message}" if not reply.ok else f"ok {reply.result}",
        )


def _create_run_for_another_tenant(ctx: ExperimentContext, t1: str, t2: str) -> None:
    """Tenant 1's control plane asked to create a run naming tenant 2: its
    session is bound to tenant 1 (contract section 7), so the request is
    refused and no task or run of that name exists in any tenant (a session
    that ignored the tenant it was given would make the run its own)."""
    ctl = control_plane(ctx, t1)
    task_id = f"task-n-other-tenant-{ctx.uuid()[:8]}"
    reply = ctx.op(
        ctl,
        "create_run",
        task_id=task_id,
        input={"tool": "idem", "order_id": "n-other-tenant"},
        tenant_id=t2,
    )
    made = ctx.sql(
        "runs of the task tenant 1's control plane was asked to make for tenant 2",
        "SELECT run_id, tenant_id FROM fencecheck_model.agent_runs WHERE task_id = %s",
        [task_id],
    )
    ctx.invariant(
        "a create_run naming another tenant is refused and makes nothing",
        not reply.ok and not made,
        expected="refused (the session is bound to tenant 1), no run of the task anywhere",
        observed=f"reply {'ok' if reply.ok else reply.error}; runs {made}",
    )


def _tenant_two_rows(ctx: ExperimentContext, t2: str) -> str:
    """Tenant 2 gets a row in every protocol table, so every read probe has
    something to refuse: a run with a checkpoint, an intent, outbox rows
    published to the broker and consumed."""
    theirs = new_run(ctx, tenant_id=t2)
    owner2 = ctx.env.start_worker("T2", "ops", tenant_id=t2)
    lease2 = ctx.ok(owner2, "claim", run_id=theirs)
    saved = ctx.ok(
        owner2,
        "save_checkpoint",
        run_id=theirs,
        epoch=lease2["epoch"],
        expected_revision=lease2["revision"],
        state={"secret": "tenant 2"},
    )
    ctx.ok(
        owner2,
        "register_intent",
        run_id=theirs,
        epoch=lease2["epoch"],
        expected_revision=saved["revision"],
        step_id="n.label",
        effect_version=1,
        tool="idem",
        request={"kind": "return_label"},
    )
    ctx.ok(owner2, "relay", limit=100)
    ctx.ok(owner2, "consume", consumer="n-consumer")
    return theirs


def _through_the_worker(
    ctx: ExperimentContext, t1: str, theirs: str, before: dict[str, Any]
) -> None:
    w1 = ctx.env.start_worker("T1", "ops", tenant_id=t1)
    attempts = {
        "read": ctx.op(w1, "read_checkpoint", run_id=theirs),
        "claim": ctx.op(w1, "claim", run_id=theirs),
        "write": ctx.op(
            w1,
            "save_checkpoint",
            run_id=theirs,
            epoch=before["epoch"],
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


def _consumer_applies_its_own_tenant(ctx: ExperimentContext, t1: str, t2: str) -> None:
    """The broker is the deployment's, shared by tenants: tenant 2's events are
    there (published above). Tenant 1's consumer reads them too and must apply
    none: an event is applied only by a consumer of its own tenant."""
    theirs = {
        str(r["event_id"])
        for r in ctx.sql(
            "tenant 2's outbox events",
            "SELECT event_id FROM fencecheck_model.outbox WHERE tenant_id = %s",
            [t2],
        )
    }
    at_broker = {str(m["event_id"]) for m in checkers.tool_log(ctx)["messages"]} & theirs
    consumer = ctx.env.start_worker("K1", "ops", tenant_id=t1)
    ctx.ok(consumer, "consume", consumer="n-consumer-1")
    applied = ctx.sql(
        "tenant 1's consumer's effects",
        "SELECT event_id FROM fencecheck_model.consumer_effects WHERE consumer_name = %s",
        ["n-consumer-1"],
    )
    wrong = sorted(str(r["event_id"])[:8] for r in applied if str(r["event_id"]) in theirs)
    ctx.fault(
        "tenant 2's events were at the broker when tenant 1's consumer read it",
        bool(at_broker),
        expected="tenant 2's published events among the broker's messages",
        observed=f"{len(at_broker)} of tenant 2's {len(theirs)} event(s) at the broker",
    )
    ctx.invariant(
        "a consumer applies no other tenant's event",
        not wrong,
        expected=f"no effect of tenant 1's consumer for tenant 2's events (tenant {t1[:8]})",
        observed=f"applied for tenant 2: {wrong}" if wrong else "none",
    )


def _refused(outcome: tuple[str, Any]) -> bool:
    """Permission denied, a policy violation, or nothing matched."""
    status, detail = outcome
    if status == "ok":
        return bool(detail == [] or detail == "0 row(s) affected" or detail == [{"n": 0}])
    return "42501" in status


def _tables(ctx: ExperimentContext, role: str, t1: str, t2: str) -> None:
    tables = grants.tenant_tables(ctx)
    ctx.fault(
        "the catalog lists the protocol's tenant tables",
        {"public.agent_runs", "public.agent_checkpoints", "public.tool_operations"}
        <= {t["name"] for t in tables},
        expected="at least agent_runs, agent_checkpoints, tool_operations",
        observed=", ".join(t["name"] for t in tables),
    )
    for t in tables:
        name = t["name"]
        ctx.invariant(
            f"{name}: row level security enabled and forced",
            bool(t["rls"] and t["forced"]),
            expected="relrowsecurity and relforcerowsecurity",
            observed=f"rls={t['rls']} forced={t['forced']}",
        )
        present = ctx.sql(
            f"tenant 2's rows in {name}",
            f"SELECT count(*) AS n FROM {name} WHERE tenant_id = %s",
            [t2],
        )[0]["n"]
        probes = {
            "read": (f"SELECT count(*) AS n FROM {name} WHERE tenant_id = %s", [t2]),
            "update": (f"UPDATE {name} SET tenant_id = tenant_id WHERE tenant_id = %s", [t2]),
            "delete": (f"DELETE FROM {name} WHERE tenant_id = %s", [t2]),
            "insert": (f"INSERT INTO {name} (tenant_id) VALUES (%s)", [t2]),
        }
        outcomes = {k: _rolled_back(ctx, role, t1, sql, p) for k, (sql, p) in probes.items()}
        ctx.invariant(
            f"{name}: cross-tenant read and write refused",
            all(_refused(o) for o in outcomes.values()),
            expected=f"tenant 1's worker role reads, changes and adds none of tenant 2's "
            f"{present} row(s)",
            observed="; ".join(f"{k}: {o[0]} {o[1]}" for k, o in outcomes.items()),
        )


def _rolled_back(
    ctx: ExperimentContext, role: str, tenant: str, statement: str, params: list[Any]
) -> tuple[str, Any]:
    """One statement as ``role`` in a transaction that is always rolled back."""
    dsn = ctx.env.db.dsn(role, application_name="fencecheck-harness-as-worker")
    outcome: tuple[str, Any]
    try:
        with closing(psycopg.connect(dsn, connect_timeout=5)) as conn:
            cur = conn.execute(statement.encode(), params)
            if cur.description:
                names = [c.name for c in cur.description]
                outcome = ("ok", [dict(zip(names, r, strict=True)) for r in cur])
            else:
                outcome = ("ok", f"{cur.rowcount} row(s) affected")
            conn.rollback()
    except psycopg.Error as exc:
        outcome = (f"refused ({exc.sqlstate} {type(exc).__name__})", str(exc).splitlines()[0])
    ctx.queries.append(
        checkers.query_record(f"as {role} (tenant {tenant[:8]}), rolled back", statement, outcome)
    )
    return outcome


def _reach(ctx: ExperimentContext, worker: str, operator: str) -> None:
    reach = set(grants.reachable_functions(ctx, worker))
    ctx.invariant(
        "the worker role executes only the worker API",
        reach <= grants.WORKER_API,
        expected="a subset of the contract's worker API",
        observed=f"outside it: {sorted(reach - grants.WORKER_API) or 'nothing'}; "
        f"reachable: {len(reach)}",
    )
    ctx.invariant(
        "the worker role executes no control-plane function",
        not reach & grants.CONTROL_PLANE,
        expected="none of " + ", ".join(sorted(grants.CONTROL_PLANE)),
        observed=f"{sorted(reach & grants.CONTROL_PLANE) or 'none'}",
    )
    op_reach = set(grants.reachable_functions(ctx, operator))
    ctx.invariant(
        "the operator role executes only the control-plane API",
        op_reach <= grants.OPERATOR_API,
        expected="a subset of the contract's operator API",
        observed=f"outside it: {sorted(op_reach - grants.OPERATOR_API) or 'nothing'}; "
        f"reachable: {len(op_reach)}",
    )
    seqs = grants.reachable_sequences(ctx, worker)
    ctx.invariant(
        "the worker role moves no sequence",
        not seqs,
        expected="no sequence readable or settable (identity columns need none)",
        observed=f"{[s['name'] for s in seqs] or 'none'}",
    )
    views = grants.reachable_views(ctx, worker)
    ctx.invariant(
        "every view the worker role reads is tenant-scoped by its tables' policies",
        all(v["invoker"] for v in views),
        expected="security_invoker views only (an empty list is the expectation: the "
        "reference schema has no view)",
        observed=f"{views or 'no view reachable'}",
    )
    for kind, role in (("worker", worker), ("operator", operator)):
        # A write right is allowed only where the forbidden-write probes look
        # (contract section 7): whether they are all refused is judged in
        # _forbidden_writes, whatever mechanism refuses them.
        writable = set(grants.writable_tables(ctx, role))
        allowed = grants.WRITABLE[kind] | forbidden_writes.GUARDED
        ctx.invariant(
            f"the {kind} role writes no table outside the probed protocol tables",
            writable <= allowed,
            expected=f"at most {sorted(allowed)}",
            observed=f"{sorted(writable) or 'nothing'}",
        )
        ctx.invariant(
            f"the {kind} role can create objects in no schema",
            not grants.creatable_schemas(ctx, role),
            expected="no CREATE on any schema (no function can be planted)",
            observed=f"{grants.creatable_schemas(ctx, role) or 'none'}",
        )


def _binding_is_fixed(ctx: ExperimentContext, t1: str, t2: str) -> None:
    """Every way a session might move itself to tenant 2, each followed by what
    the session then sees; all in one session, each in a rolled-back transaction."""
    role = ctx.env.login_role(t1, "worker")
    other = ctx.env.login_role(t2, "worker")
    attempts = {
        "set_config": "SELECT set_config('app.tenant_id', %(t2)s, false)",
        "SET": "SET app.tenant_id = %(t2_lit)s",
        "SET ROLE operator group": "SET ROLE fencecheck_operator",
        "SET ROLE tenant 2's role": f"SET ROLE {other}",
        "SET SESSION AUTHORIZATION": f"SET SESSION AUTHORIZATION {other}",
        "update binding": "UPDATE public.tenant_bindings SET tenant_id = %(t2)s"
        " WHERE role_name = session_user",
        "insert binding": "INSERT INTO public.tenant_bindings (role_name, tenant_id)"
        " VALUES (session_user, %(t2)s) ON CONFLICT (role_name) DO UPDATE"
        " SET tenant_id = excluded.tenant_id",
        "delete and rebind": "WITH d AS (DELETE FROM public.tenant_bindings"
        " WHERE role_name = session_user) INSERT INTO public.tenant_bindings"
        " (role_name, tenant_id) VALUES (session_user, %(t2)s)",
    }
    check = (
        "SELECT fencecheck.session_tenant()::text AS tenant,"
        " (SELECT count(*) FROM public.agent_runs WHERE tenant_id = %(t2)s) AS theirs"
    )
    params = {"t2": t2, "t2_lit": f"'{t2}'"}
    dsn = ctx.env.db.dsn(role, application_name="fencecheck-harness-as-worker")
    seen: dict[str, str] = {}
    moved: list[str] = []
    with closing(psycopg.connect(dsn, connect_timeout=5, autocommit=True)) as conn:
        for name, statement in attempts.items():
            text = statement % {"t2": "%(t2)s", "t2_lit": params["t2_lit"]}
            try:
                with conn.transaction():
                    conn.execute(text.encode(), params)
                    row = conn.execute(check.encode(), params).fetchone()
                    assert row is not None
                    seen[name] = f"accepted; then tenant {row[0]}, tenant 2 runs seen {row[1]}"
                    if row[0] != t1 or row[1]:
                        moved.append(name)
                    raise _Rollback()
            except _Rollback:
                pass
            except psycopg.Error as exc:
                seen[name] = f"refused ({exc.sqlstate})"
            conn.execute("RESET ALL")
    ctx.queries.append(
        checkers.query_record(
            f"as {role}: attempts to change its own tenant", check, ("ok", [seen])
        )
    )
    ctx.invariant(
        "a worker session cannot change its own tenant",
        not moved,
        expected="after every attempt the session is still tenant 1 and sees none of "
        "tenant 2's runs",
        observed=f"moved by: {moved or 'nothing'}; "
        + "; ".join(f"{k}: {v}" for k, v in seen.items()),
    )
    binding = ctx.sql(
        "the binding afterwards",
        "SELECT tenant_id::text AS tenant FROM public.tenant_bindings WHERE role_name = %s",
        [role],
    )
    ctx.equal("the binding itself unchanged", binding, [{"tenant": t1}], what="tenant_bindings")


def _forbidden_writes(ctx: ExperimentContext, t1: str) -> None:
    """Writes the protocol forbids, as raw SQL committed by sessions of tenant
    1's worker and operator roles, at runs of tenant 1 (contract section 7,
    rule 6): none may leave a change in the audit trail, whatever refuses it.
    Each probe's target is read just before it is sent: a probe that met its
    run in another state than meant (a live lease lapsed under load) proves
    nothing, unless an earlier probe already made a write."""
    fx = _probe_fixture(ctx, t1)
    chosen = forbidden_writes.probes(ctx, fx)
    sent: list[forbidden_writes.Attempt] = []  # in order, both roles
    for kind in ("worker", "operator"):
        role = ctx.env.login_role(t1, kind)
        mine = [p for p in chosen if kind == "worker" or not p.control_plane]
        attempts = forbidden_writes.attempt_all(ctx, fx, role, kind, mine)
        sent += attempts
        made = [a for a in attempts if a.changes or a.outcome == "committed"]
        ctx.invariant(
            f"a {kind}-role session makes no write the protocol forbids",
            not made,
            expected=f"all {len(attempts)} forbidden writes refused, none in the audit trail",
            observed="; ".join(f"{a.probe}: {a.outcome}, {a.changes} change(s)" for a in made)
            or f"all {len(attempts)} refused: "
            + "; ".join(f"{a.probe}: {a.outcome.split(':')[0]}" for a in attempts),
        )
        missed = [a.probe for a in attempts if not a.aimed]
        ctx.fault(
            f"every {kind}-role probe met its run as meant",
            forbidden_writes.aimed(sent),
            expected="before each probe: the live lease held by its holder and unexpired, "
            "the expired one expired and untaken, the queued run queued (or an earlier "
            "probe already made a write)",
            observed=f"target not as meant for: {missed or 'none'}",
        )
    ctx.ok(
        ctx.env.workers["P"],
        "heartbeat",
        run_id=fx.live.run_id,
        epoch=fx.live.epoch,
        action="stop",
        interval_ms=ctx.env.heartbeat_ms,
        timeout_ms=ctx.env.heartbeat_timeout_ms,
    )


def _probe_fixture(ctx: ExperimentContext, t1: str) -> forbidden_writes.Fixture:
    """Three runs of tenant 1: one whose lease the holder keeps live with its
    heartbeat, one whose holder's lease ran out, one queued; the first two
    with a checkpoint and event, the live one with an intent."""
    holder = ctx.env.start_worker("P", "ops", tenant_id=t1)
    expired_run, live_run = new_run(ctx, tenant_id=t1), new_run(ctx, tenant_id=t1)
    queued = new_run(ctx, tenant_id=t1)
    leases: dict[str, forbidden_writes.Lease] = {}
    for run_id in (expired_run, live_run):
        lease = ctx.ok(holder, "claim", run_id=run_id)
        if run_id == live_run:
            ctx.ok(
                holder,
                "heartbeat",
                run_id=run_id,
                epoch=lease["epoch"],
                action="start",
                interval_ms=ctx.env.heartbeat_ms,
                timeout_ms=ctx.env.heartbeat_timeout_ms,
            )
        rev = ctx.ok(
            holder,
            "save_checkpoint",
            run_id=run_id,
            epoch=lease["epoch"],
            expected_revision=lease["revision"],
            state={"probe": "fixture"},
        )["revision"]
        if run_id == live_run:
            rev = ctx.ok(
                holder,
                "register_intent",
                run_id=run_id,
                epoch=lease["epoch"],
                expected_revision=rev,
                step_id="n.probe",
                effect_version=1,
                tool="idem",
                request={"kind": "probe"},
            )["revision"]
        row = checkers.run_row(ctx, run_id, "probe fixture before the probes")
        leases[run_id] = forbidden_writes.Lease(run_id, row["owner"], row["epoch"], row["revision"])
    checkers.wait_lease_expired(ctx, expired_run)
    return forbidden_writes.Fixture(leases[live_run], leases[expired_run], queued)


class _Rollback(Exception):
    """Leave a probe's transaction without keeping anything."""


def _no_control_plane(ctx: ExperimentContext, t1: str, mine: str) -> None:
    """The worker role, through its own code and raw, cannot cancel even its own
    tenant's run; the control plane of that tenant can (the probe can fail)."""
    w1 = ctx.env.workers["T1"]
    reply = ctx.op(w1, "cancel", run_id=mine)
    raw = checkers.as_worker_role(
        ctx, t1, "SELECT run_status FROM fencecheck.operator_cancel(%s, 'n probe', NULL)", [mine]
    )
    status = checkers.run_row(ctx, mine, "tenant 1's run after the worker's cancel attempts")
    ctx.invariant(
        "the worker role cannot cancel a run",
        not reply.ok and raw[0] != "ok" and status["status"] == "queued",
        expected="refused through the worker and raw; the run still queued",
        observed=f"worker: {reply.error or 'accepted'}; raw: {raw[0]}; run {status['status']}",
    )
    ctl = control_plane(ctx, t1)
    done = ctx.op(ctl, "cancel", run_id=mine)
    ctx.fault(
        "the control plane of tenant 1 can cancel it",
        done.ok and checkers.run_row(ctx, mine)["status"] == "cancelled",
        expected="cancelled by the operator role",
        observed=f"{done.result if done.ok else done.error}",
    )
