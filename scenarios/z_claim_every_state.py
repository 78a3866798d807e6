"""Z: a claim takes a run from exactly the states the protocol lets it.

Rule 1: a lease is granted only when the run is free (queued, its
``next_attempt_at`` come) or its holder's lease expired by database time;
never a live lease, a run not yet due, one paused for a person, nor a
finished one. The tenant gets one run in each state, every one made by the
contract's own operations except where the harness must set a field
itself (a ``next_attempt_at`` an hour away, a pause for a person: planted
through the model, like M's checkpoints):

==================  ====================================================
state               how
==================  ====================================================
queued, due         ``create_run``
queued, not due     ``create_run``, ``next_attempt_at`` planted an hour on
running, live       claimed by H (lease 60 s)
running, expired    claimed by E (lease 300 ms), left to run out
waiting_tool, live  claimed by H, an intent registered
waiting_tool, exp.  claimed by E, an intent registered, left to run out
paused_human        claimed by H, the pause planted (status, no lease)
succeeded           claimed by H and completed
cancelled           ``cancel``
missing             a run id nobody made
==================  ====================================================

The claimable states are made twice. C then claims each run by its id: the
first set of claimable runs must be granted (epoch + 1, C the owner), every
other state refused with nothing changed. Then C claims without naming a
run until nothing is claimable, while the harness holds the row of one of
the second set locked: it must be skipped (SKIP LOCKED), never waited for;
the grants must be exactly the other claimable runs, the expired leases
before the queued run; then, the lock let go, the held one. Every refused
and every other run ends as it began (audit trail: nothing by C).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, plain
from harness.parts.control import Hold
from harness.parts.processes import OpReply, WorkerProcess
from scenarios.common import control_plane, crash_in_op, intent_registered, new_run, seen_within

SHORT_TTL_MS = 300
LONG_TTL_MS = 60_000
#: The lease of the run whose renewal the harness holds on its row: long
#: enough for the renewal to be seen waiting while it is live.
HELD_RENEWAL_TTL_MS = 1000
CLAIMABLE = ("queued, due", "running, expired", "waiting_tool, expired")

SPEC = ExperimentSpec(
    id="Z",
    title="claim from every state",
    seed_section="English seed §5.1 (acquire only when free or expired by database time); "
    "Chinese seed §5 (Claim: queued and due, or an expired lease; SKIP LOCKED)",
    invariant="a claim by run id is granted only for a queued run whose next_attempt_at has "
    "come or a running / waiting_tool run whose lease expired by database time, and changes "
    "nothing otherwise; a claim of any run takes exactly those, expired leases first, skips a "
    "row another session holds instead of waiting for it, and touches no other run; a "
    "dispatch cycle skips a prepared intent whose ledger row another session holds; a "
    "renewal held on the run's row until its lease ran out is refused",
    fault="one run in each state (queued due / not due, running and waiting_tool live and "
    "expired, paused for a person, succeeded, cancelled, missing); one claimable run's row "
    "held locked by the harness during the claims of any run, and one prepared intent's ledger "
    "row during a dispatch cycle",
    rules=(1,),
    layer="queue",
    lease_ttl_ms=LONG_TTL_MS,
    natural_wait_s=SHORT_TTL_MS / 1000,
    needs=(
        *needs.capabilities("workflow", "ledger"),
        needs.point("after_dispatch_claim_commit"),
    ),
)


@dataclass
class Made:
    state: str
    run_id: str


def run(ctx: ExperimentContext) -> None:
    ctl = control_plane(ctx)
    h = ctx.env.start_worker("H", "ops")
    e = ctx.env.start_worker("E", "ops", env={"FENCECHECK_LEASE_TTL_MS": str(SHORT_TTL_MS)})
    c = ctx.env.start_worker("C", "ops")
    first = {s: _make(ctx, s, ctl, h, e) for s in CLAIMABLE}
    # A second queued run, its row not held: the claims of any run must take
    # it only after both expired leases (a claim ordering queued runs first
    # passed while the only queued one was held). Made before them, so it is
    # the older by every other measure (due, made): a claim that orders by
    # those alone takes it first (blind hunt 36 #09).
    spare = _make(ctx, "queued, due", ctl, h, e)
    second = {s: _make(ctx, s, ctl, h, e) for s in CLAIMABLE}
    others = {
        s: _make(ctx, s, ctl, h, e)
        for s in (
            "queued, not due",
            "running, live",
            "waiting_tool, live",
            "paused_human",
            "succeeded",
            "cancelled",
        )
    }
    others["missing"] = str(uuid.uuid4())
    for state, run_id in [*first.items(), *second.items()]:
        if "expired" in state:
            checkers.wait_lease_expired(ctx, run_id)
    states = {r: _state(ctx, r, s) for group in (first, second, others) for s, r in group.items()}
    states[spare] = _state(ctx, spare, "queued, due")
    ctx.fault(
        "every run stood in its state before the claims",
        all(v["label"] == v["meant"] for v in states.values()),
        expected="each run in the state it was made for (read from the database)",
        observed="; ".join(f"{v['meant']}: {v['label']}" for v in states.values()),
    )
    mark = checkers.audit_mark(ctx)
    drifted: list[str] = []
    # Claims by run id: the first claimable set granted, every other state refused.
    for state, run_id in [*first.items(), *others.items()]:
        before = _state(ctx, run_id, state)
        if before["label"] != state:  # no longer the state it was made for: not judged
            drifted.append(f"{state}: {before['label']} when claimed")
            continue
        seq = checkers.audit_mark(ctx)
        reply = ctx.op(c, "claim", run_id=run_id)
        after = _state(ctx, run_id, state)
        changed = checkers.changes_by(ctx, ["C"], after_seq=seq)
        if state in CLAIMABLE:
            granted = (
                reply.ok
                and after["owner"] == reply.result.get("owner")
                and after["epoch"] == (before["epoch"] or 0) + 1
                and after["live"]
                and all(ch["run_id"] == run_id for ch in changed)
            )
            ctx.invariant(
                f"claim of a run {state} granted",
                granted,
                expected="granted: epoch + 1, C the owner, a live lease; no other run changed",
                observed=f"{'ok' if reply.ok else reply.error}; run {_brief(before)} -> "
                f"{_brief(after)}; changes {_changes(changed)}",
            )
        else:
            # NotClaimable, the contract's answer: a caller tells "not now"
            # from a failure by it (blind hunt 72 #01: a takeover that let a
            # cancelled run through to the grant, which the database's guard
            # then refused, answered a CheckViolation).
            ctx.invariant(
                f"claim of a run {state} refused",
                not reply.ok and reply.error == "NotClaimable" and not changed and after == before,
                expected="refused NotClaimable; no audited change by C; the run as it was",
                observed=f"{'ok' if reply.ok else reply.error}; run {_brief(before)} -> "
                f"{_brief(after)}; changes {_changes(changed)}",
            )
    # Claims of any run: the second set, expired leases first, the held row skipped.
    held_state = "queued, due"
    held = second[held_state]
    grants: list[str] = []
    waited: str | None = None
    with checkers.row_locked(ctx, "agent_runs", "run_id", held) as lock:
        for _ in range(len(second) + 2):
            pending = ctx.op_async(c, "claim", {})
            waited = lock.answered_or_waiting(pending, "C")
            if waited is not None:
                break  # leaving the block lets go of the lock: the claim goes on
            reply = pending.result(15.0)
            if not reply.ok:
                break
            grants.append(str(reply.result.get("run_id")))
    if waited is not None:
        reply = pending.result(15.0)
        if reply.ok:
            grants.append(str(reply.result.get("run_id")))
    after_lock = ctx.op(c, "claim")
    if after_lock.ok:
        grants.append(str(after_lock.result.get("run_id")))
    ctx.fault(
        "every run stood in its state when it was claimed",
        not drifted,
        expected="each run, read right before C's claim by its id, still in the state it was "
        "made for",
        observed="; ".join(drifted) or "all",
    )
    want = [second["running, expired"], second["waiting_tool, expired"]]
    name = {r: s for s, r in second.items()} | {spare: "queued, due (not held)"}
    ctx.invariant(
        "a claim of any run skips a row another session holds",
        waited is None,
        expected="every claim answered while the harness held a claimable run's row, none "
        "waiting on it",
        observed=waited or "none waited",
    )
    ctx.invariant(
        "a claim of any run takes exactly the claimable runs, expired leases first",
        sorted(grants[:2]) == sorted(want) and grants[2:] == [spare, held],
        expected=f"the two expired leases ({', '.join(sorted(want))}), then the queued run "
        f"{spare} whose row nobody holds, then once the lock is let go the queued run {held}, "
        "then nothing",
        observed=f"granted in turn: {[name.get(g, g) for g in grants]}",
    )
    untouched = [
        s
        for s, r in others.items()
        if s != "missing" and _state(ctx, r, s) != states[r] and not _by_others(ctx, r, mark)
    ]
    ctx.invariant(
        "every run that was not claimable ends as it began",
        not untouched,
        expected="queued-not-due, live, paused and finished runs as they were",
        observed=f"changed: {untouched}" if untouched else "all as they were",
    )
    for state in ("paused_human", "succeeded", "cancelled"):
        _no_write_without_a_lease(ctx, h, others[state], state)
    _dispatch_skips_a_held_intent(ctx)
    _reconcile_skips_a_held_claim(ctx)
    # Before the step that holds dispatchers at a point: a cycle that claims
    # and never sends fails here, and never reaches that point (generated
    # mutant d5b28d1a).
    _dispatch_claims_one(ctx)
    _reconcile_lists_every_expiry(ctx)
    _renewal_held_past_the_lease(ctx)
    checkers.lease_history_is_sound(ctx)


def _no_write_without_a_lease(
    ctx: ExperimentContext, h: WorkerProcess, run_id: str, state: str
) -> None:
    """A checkpoint that names the run's current epoch and revision, sent while
    nobody holds its lease (paused, finished: no owner, no expiry), is
    refused with nothing written. H held the paused and the succeeded run
    before; an owner check that lets NULL through (``<>`` where ``IS
    DISTINCT FROM`` is meant) commits a checkpoint on a run nobody holds."""
    before = _state(ctx, run_id, state)
    if before["label"] != state or before["owner"] is not None:
        ctx.not_judged(
            f"a checkpoint of a run {state} holding no lease is refused",
            expected=f"a run {state} with no owner",
            observed=f"not tried: {_brief(before)}",
        )
        return
    mark = checkers.audit_mark(ctx)
    reply = ctx.op(
        h,
        "save_checkpoint",
        run_id=run_id,
        epoch=before["epoch"],
        expected_revision=before["revision"],
        state={"z": "no lease"},
        event_id=ctx.uuid(),
    )
    after = _state(ctx, run_id, state)
    changed = checkers.changes_by(ctx, ["H"], after_seq=mark)
    ctx.invariant(
        f"a checkpoint of a run {state} holding no lease is refused",
        not reply.ok and not changed and after == before,
        expected=f"refused (no lease to write under, at the run's own epoch {before['epoch']} "
        f"and revision {before['revision']}); no audited change by H; the run as it was",
        observed=f"{'ok' if reply.ok else reply.error}; run {_brief(before)} -> {_brief(after)}; "
        f"changes {_changes(changed)}",
    )


def _dispatch_skips_a_held_intent(ctx: ExperimentContext) -> None:
    """A dispatcher's claim of any intent skips a ledger row another session
    holds (SKIP LOCKED), as a claim of any run does: in the other tenant, two
    live runs each with an intent prepared, the older one's row held by the
    harness; the dispatcher's cycle must answer without waiting on it."""
    tenant = ctx.env.other_tenant_id
    runs = [new_run(ctx, tool="plain", tenant_id=tenant) for _ in range(2)]
    ops = []
    for i, run in enumerate(runs):
        worker = ctx.env.start_worker(f"I{i}", "ops", tenant_id=tenant)
        ops.append(intent_registered(ctx, worker, run, tool="plain", step_id="z.intent"))
    judged = _cycle_beside_a_held_row(
        ctx,
        ctx.env.start_worker("D", "ops", tenant_id=tenant),
        "dispatch",
        runs,
        ops,
        "a dispatcher's claim of any intent skips a ledger row another session holds",
    )
    if judged is None:
        return
    # Skipped, not refused: the cycle goes on to the free intent (blind hunt
    # 64 #07: a claim FOR UPDATE NOWAIT answered an error at once, without
    # waiting, and claimed nothing).
    reply, statuses = judged
    ctx.invariant(
        "a dispatch cycle beside a held intent claims the free one",
        reply.ok and statuses[1] not in (None, "prepared"),
        expected=f"the cycle answered ok and claimed {ops[1]} (prepared, its row free), "
        f"passing {ops[0]}'s held row by",
        observed=f"reply {reply.result if reply.ok else reply.error}; the two operations now "
        f"{statuses}",
    )


def _reconcile_lists_every_expiry(ctx: ExperimentContext) -> None:
    """One dispatcher session claims two intents at once (two async dispatch
    requests, both held right after their claims) and is killed: two expired
    claims of one owner at the same ledger revision. A reconcile reply lists
    every change its cycle made, as the audit trail has them (generated
    mutant 3123006a: an expiry that also expired the owner's other claim at
    that revision without listing it)."""
    tenant = ctx.env.other_tenant_id
    _, ops = _two_intents(ctx, tenant, "M", "z.listed")
    point = "after_dispatch_claim_commit"
    ctx.arm("D2", point, Hold(), times=2)
    d = ctx.env.start_worker("D2", "ops", tenant_id=tenant)
    for op in ops:
        ctx.op_async(d, "dispatch", {"operation_id": op}, worker_async=True)
    hits = [ctx.reached("D2", point), ctx.reached("D2", point)]
    ctx.kill(d)
    claims = ctx.sql(
        "the two claims once their dispatcher was killed",
        "SELECT operation_id, dispatch_owner, revision FROM fencecheck_model.tool_operations "
        "WHERE operation_id = ANY(%s) AND status = 'dispatching'",
        [ops],
    )
    expired = _claims_expired(ctx, ops, "D2's")
    name = "a reconcile reply lists every change its cycle made"
    if not ctx.probe_reached(
        "two claims of one dispatcher session, expired",
        len(hits) == 2
        and len(claims) == 2
        and len({(c["dispatch_owner"], c["revision"]) for c in claims}) == 1
        and expired,
        judges=name,
        expected="D2 held right after both claims, then SIGKILLed: both operations dispatching "
        "by one owner at one ledger revision, both claims expired by database time",
        observed=f"hits {[h.operation_id for h in hits]}; claims {plain(claims)}; both "
        f"expired: {expired}",
    ):
        return
    seq = ctx.audit_seq() or 0
    reply = ctx.op(ctx.env.start_worker("R2", "ops", tenant_id=tenant), "reconcile")
    if reply.error == "Unsupported":
        ctx.not_judged(name, expected="a reconcile cycle", observed="the system has none")
        return
    changed = sorted(
        {
            str(r["operation_id"])
            for r in ctx.sql(
                "the ledger rows the reconcile cycle changed (audit trail)",
                "SELECT DISTINCT new->>'operation_id' AS operation_id FROM fencecheck_audit.changes "
                "WHERE tbl = 'tool_operations' AND op = 'UPDATE' AND seq > %s "
                "AND new->>'operation_id' = ANY(%s) AND new->>'status' IS DISTINCT FROM "
                "old->>'status'",
                [seq, ops],
            )
        }
    )
    listed = sorted(
        {str(c.get("operation_id")) for c in (reply.result or {}).get("changes", [])} & set(ops)
    )
    ctx.invariant(
        name,
        reply.ok and listed == changed,
        expected=f"the reply's changes name every operation of {ops} whose status the cycle "
        "changed (audit trail)",
        observed=f"listed {listed}; changed {changed}; reply "
        f"{reply.result if reply.ok else reply.error}",
    )


def _renewal_held_past_the_lease(ctx: ExperimentContext) -> None:
    """A renewal sent while its lease is live, held on the run's row (the
    harness's lock, which changes nothing) until the lease has run out by
    database time, must be refused once it gets the row: it judges the expiry
    while it holds the row, not before it waited (found beside blind hunt 20:
    the reference's renew was one UPDATE whose expiry test, evaluated before
    the wait, stood after a lock that changed nothing, and revived the lease)."""
    name = "a renewal held on the row past the lease's end is refused"
    caps = ctx.system.capabilities
    if not caps.offers_op("renew") or caps.renewal == "per_process":
        ctx.not_judged(
            name, expected="a renewal on request", observed="the system renews no single lease"
        )
        return
    run_id = new_run(ctx)
    holder = ctx.env.start_worker(
        "L", "ops", env={"FENCECHECK_LEASE_TTL_MS": str(HELD_RENEWAL_TTL_MS)}
    )
    lease = ctx.ok(holder, "claim", run_id=run_id)
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id) as lock:
        pending = ctx.op_async(holder, "renew", {"run_id": run_id, "epoch": lease["epoch"]})
        waited = lock.answered_or_waiting(pending, "L")
        live = checkers.run_row(ctx, run_id, "the lease while L's renewal waits")
        if waited is not None and not live["lease_expired"]:
            checkers.wait_lease_expired(ctx, run_id)
        expired = checkers.run_row(ctx, run_id, "the lease before the harness lets go")
    reply = pending.result(15.0)
    after = checkers.run_row(ctx, run_id, "the lease once L's renewal was answered")
    if not ctx.probe_reached(
        "a renewal sent while the lease was live, held on the run's row until it ran out",
        waited is not None and not live["lease_expired"] and bool(expired["lease_expired"]),
        judges=name,
        expected="L's renew waiting on the row the harness held while the lease was live; the "
        "lease expired by database time before the harness let go",
        observed=f"L {waited or 'answered before waiting'}; expired while waiting: "
        f"{live['lease_expired']}; expired when let go: {expired['lease_expired']}",
    ):
        return
    ctx.invariant(
        name,
        not reply.ok and after["epoch"] == lease["epoch"] and bool(after["lease_expired"]),
        expected="refused (the lease expired); the lease still expired at the same epoch",
        observed=f"renew {'ok ' + str(reply.result) if reply.ok else reply.error}; lease "
        f"epoch {after['epoch']}, owner {after['owner']}, expired {after['lease_expired']}",
    )


def _dispatch_claims_one(ctx: ExperimentContext) -> None:
    """A dispatch cycle without an operation id claims one prepared intent and
    sends it, whatever else is prepared (contract section 5, ``dispatch``; blind
    hunt 15 #10: a claim without its LIMIT took every prepared intent of the
    tenant at once, sent none, and left them all to expire into doubt)."""
    tenant = ctx.env.other_tenant_id
    _two_intents(ctx, tenant, "P", "z.one")
    name = "a dispatch cycle claims one prepared intent"

    def prepared() -> list[str]:
        return [
            str(r["operation_id"])
            for r in ctx.sql(
                "the tenant's prepared intents of live runs",
                "SELECT o.operation_id FROM fencecheck_model.tool_operations o "
                "JOIN fencecheck_model.agent_runs r ON r.run_id = o.run_id "
                "WHERE o.tenant_id = %s AND o.status = 'prepared' "
                "AND r.status IN ('running', 'waiting_tool')",
                [tenant],
            )
        ]

    before = prepared()
    sent_before = len(checkers.tool_requests(ctx))
    reply = ctx.op(ctx.env.start_worker("D3", "ops", tenant_id=tenant), "dispatch")
    if reply.error == "Unsupported":
        ctx.not_judged(name, expected="a dispatch cycle", observed="the system has none")
        return
    after = prepared()
    sent = len(checkers.tool_requests(ctx)) - sent_before
    ctx.invariant(
        name,
        reply.ok and len(before) >= 2 and len(before) - len(after) == 1 and sent == 1,
        expected=f"of the {len(before)} prepared intents, the cycle claimed one and the tool "
        "received one request; the rest still prepared",
        observed=f"prepared {len(before)} before, {len(after)} after; requests sent {sent}; "
        f"reply {reply.result if reply.ok else reply.error}",
    )


def _two_intents(
    ctx: ExperimentContext, tenant: str, prefix: str, step: str
) -> tuple[list[str], list[str]]:
    """Two runs of ``tenant``, each with one plain-tool intent registered by an
    ops process of its own (its lease kept): the runs and their operations."""
    runs = [new_run(ctx, tool="plain", tenant_id=tenant) for _ in range(2)]
    ops = [
        intent_registered(
            ctx, ctx.env.start_worker(f"{prefix}{i}", "ops", tenant_id=tenant), run,
            tool="plain", step_id=step,
        )
        for i, run in enumerate(runs)
    ]  # fmt: skip
    return runs, ops


def _claims_expired(ctx: ExperimentContext, ops: list[str], whose: str) -> bool:
    """Whether every operation of ``ops`` is dispatching under a claim expired
    by database time, within 10 s."""
    return bool(
        seen_within(
            lambda: ctx.env.query(
                "SELECT count(*) = %s AS every FROM fencecheck_model.tool_operations WHERE "
                "operation_id = ANY(%s) AND status = 'dispatching' "
                "AND dispatch_until < clock_timestamp()",
                [len(ops), ops],
            )[0]["every"],
            what=f"{whose} dispatch claims to expire by database time",
            timeout_s=10,
        )
    )


def _cycle_beside_a_held_row(
    ctx: ExperimentContext,
    worker: WorkerProcess,
    cycle: str,
    runs: list[str],
    ops: list[str],
    name: str,
) -> tuple[OpReply, list[str | None]] | None:
    """Judge ``name``: a ``cycle`` (dispatch, reconcile) of ``worker`` answers
    while the harness holds the ledger row of ``ops[0]``, none of its sessions
    waiting on it. The reply and the operations' statuses after it (None when
    the system has no such cycle)."""
    with checkers.row_locked(ctx, "tool_operations", "operation_id", ops[0]) as lock:
        pending = ctx.op_async(worker, cycle, {})
        waited = lock.answered_or_waiting(pending, worker.worker_id)
    reply = pending.result(15.0)
    if reply.error == "Unsupported":
        ctx.not_judged(name, expected=f"a {cycle} cycle", observed="the system has none")
        return None
    statuses = [
        next((o["status"] for o in checkers.ledger(ctx, run) if o["operation_id"] == op), None)
        for run, op in zip(runs, ops, strict=True)
    ]
    ctx.invariant(
        name,
        waited is None,
        expected=f"the {cycle} cycle answered while the harness held {ops[0]}'s ledger row, "
        "none of its sessions waiting on it",
        observed=(waited or "answered without waiting")
        + f"; reply {reply.result if reply.ok else reply.error}; the two operations now "
        f"{statuses}",
    )
    return reply, statuses


def _reconcile_skips_a_held_claim(ctx: ExperimentContext) -> None:
    """A reconciler's sweep of expired dispatch claims skips a ledger row another
    session holds, as a dispatcher's claim does: in the other tenant, two
    intents whose dispatchers died right after their claims, both claims
    expired by database time, the older one's row held by the harness; the
    reconcile cycle must answer without waiting on it (generated mutant
    cd21bfc9: the sweep without SKIP LOCKED waits for the holder)."""
    tenant = ctx.env.other_tenant_id
    runs, ops = _two_intents(ctx, tenant, "J", "z.claimed")
    codes = [
        crash_in_op(ctx, f"K{i}", "after_dispatch_claim_commit", "dispatch",
                    {"operation_id": op}, tenant_id=tenant)
        for i, op in enumerate(ops)
    ]  # fmt: skip
    expired = _claims_expired(ctx, ops, "the")
    name = "a reconciler's sweep of expired claims skips a ledger row another session holds"
    if not ctx.probe_reached(
        "two dispatch claims expired, their dispatchers dead",
        codes == [-9, -9] and expired,
        judges=name,
        expected="K0 and K1 killed right after their dispatch claims (exit -9), both "
        "operations dispatching with their claims expired by database time",
        observed=f"exits {codes}; both expired: {expired}",
    ):
        return
    _cycle_beside_a_held_row(
        ctx, ctx.env.start_worker("R", "ops", tenant_id=tenant), "reconcile", runs, ops, name
    )


def _make(
    ctx: ExperimentContext, state: str, ctl: WorkerProcess, h: WorkerProcess, e: WorkerProcess
) -> str:
    """A run of the tenant in ``state`` (see the module's table)."""
    run_id = new_run(ctx)
    holder = e if "expired" in state else h
    if state == "paused_human":  # a worker's pause for a person, as the worker would write it
        ctx.ok(h, "claim", run_id=run_id)
        _plant(ctx, run_id, "status = 'paused_human', owner = NULL, lease_expires_at = NULL")
    elif state.startswith(("running", "waiting_tool", "succeeded")):
        lease = ctx.ok(holder, "claim", run_id=run_id)
        if state.startswith("waiting_tool"):
            ctx.ok(
                holder,
                "register_intent",
                run_id=run_id,
                epoch=lease["epoch"],
                expected_revision=lease["revision"],
                step_id="z.label",
                effect_version=1,
                tool="idem",
                request={"kind": "return_label", "order_id": "order-z"},
            )
        elif state == "succeeded":
            ctx.ok(
                holder,
                "complete",
                run_id=run_id,
                epoch=lease["epoch"],
                expected_revision=lease["revision"],
                result={"by": "z"},
            )
    elif state == "cancelled":
        ctx.ok(ctl, "cancel", run_id=run_id)
    elif state == "queued, not due":
        _plant(ctx, run_id, "next_attempt_at = clock_timestamp() + interval '1 hour'")
    return run_id


def _plant(ctx: ExperimentContext, run_id: str, assignment: str) -> None:
    ctx.sql(
        f"plant {assignment}",
        f"UPDATE fencecheck_model.agent_runs SET {assignment} WHERE run_id = %s RETURNING run_id",
        [run_id],
    )


def _state(ctx: ExperimentContext, run_id: str, meant: str) -> dict[str, Any]:
    rows = ctx.env.query(
        "SELECT status, owner, epoch, revision, lease_expires_at > clock_timestamp() AS live, "
        "next_attempt_at > clock_timestamp() AS later FROM fencecheck_model.agent_runs "
        "WHERE run_id::text = %s",
        [run_id],
    )
    if not rows:
        return {"label": "missing", "meant": meant, "epoch": None, "owner": None, "live": None}
    r = dict(rows[0])
    status = str(r["status"])
    if status == "queued":
        label = "queued, not due" if r["later"] else "queued, due"
    elif status in ("running", "waiting_tool"):
        label = f"{status}, {'live' if r['live'] else 'expired'}"
    else:
        label = status
    return {**r, "label": label, "meant": meant}


def _brief(state: dict[str, Any]) -> str:
    return f"({state['label']}, epoch {state['epoch']}, owner {state['owner']})"


def _changes(changed: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(ch["seq"], ch["tbl"], ch["op"], ch["run_id"]) for ch in changed]


def _by_others(ctx: ExperimentContext, run_id: str, mark: int) -> bool:
    """Whether a session other than C changed the run since ``mark`` (its own
    holder's lease running out is no change; a renewal by H would be)."""
    rows = ctx.env.query(
        "SELECT 1 FROM fencecheck_audit.changes WHERE seq > %s AND app <> 'C' "
        "AND coalesce(new, old)->>'run_id' = %s LIMIT 1",
        [mark, run_id],
    )
    return bool(rows)
