"""Small steps several scenarios share. Each is a few lines a reader can check."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from harness.checking import checkers
from harness.checking.checkers import writes
from harness.checking.history import load_history, select
from harness.engine.experiment import ExperimentContext, plain
from harness.parts.control import Crash
from harness.parts.processes import ExitTimeout, OpReply, WorkerProcess
from harness.waiting import WaitTimeout, wait_for

T = TypeVar("T")


def control_plane(ctx: ExperimentContext, tenant_id: str | None = None) -> WorkerProcess:
    """An ``ops`` process logged in as the tenant's operator role: the control
    plane that creates, cancels and retries runs, delivers callbacks and takes
    operator decisions (the worker role may do none of these)."""
    name = "ctl" if tenant_id is None else f"ctl-{tenant_id[:4]}"
    existing = ctx.env.workers.get(name)
    if existing is not None and existing.is_alive():
        return existing
    return ctx.env.start_worker(name, "ops", tenant_id=tenant_id, role="operator")


def paused_list_is_the_databases(ctx: ExperimentContext, ctl: WorkerProcess) -> None:
    """``list_paused`` (optional) names the tenant's runs paused in doubt or for a
    person exactly as the database has them, each with its own operations:
    what an operator decides on. A system without it is not judged."""
    reply = ctx.op(ctl, "list_paused")
    name = "list_paused names the paused runs and their operations as the database has them"
    if not reply.ok:
        ctx.not_judged(name, expected="an answer to list_paused", observed=f"{reply.error}")
        return
    tenant = ctl.tenant_id or ctx.env.tenant_id
    rows = ctx.sql(
        "the tenant's paused runs and their operations",
        "SELECT r.run_id::text AS run_id, r.status, coalesce(array_agg(o.operation_id "
        "ORDER BY o.operation_id) FILTER (WHERE o.operation_id IS NOT NULL), '{}') AS ops "
        "FROM fencecheck_model.agent_runs r LEFT JOIN fencecheck_model.tool_operations o "
        "ON o.run_id = r.run_id WHERE r.tenant_id = %s "
        "AND r.status IN ('paused_indoubt', 'paused_human') GROUP BY r.run_id, r.status",
        [tenant],
    )
    wanted = sorted((r["run_id"], r["status"], tuple(r["ops"])) for r in rows)
    listed: list[tuple[str, str, tuple[str, ...]]] = []
    for run in reply.result.get("runs") or []:
        if not isinstance(run, dict):
            listed.append((plain(run), "", ()))
            continue
        ops = run.get("operations")
        ids = tuple(
            sorted(str(o.get("operation_id")) for o in ops if isinstance(o, dict))
            if isinstance(ops, list)
            else ()
        )
        # Operations are optional in the reply: judged where the system lists them.
        want_ops = next((w[2] for w in wanted if w[0] == str(run.get("run_id"))), ())
        listed.append(
            (str(run.get("run_id")), str(run.get("status")), want_ops if ops is None else ids)
        )
    ctx.equal(name, sorted(listed), wanted, what="(run_id, status, operation ids)")


def planted_secret(ctx: ExperimentContext) -> str:
    """A sensitive value in the planted shape (``ct_`` and 24 hex digits, which
    the global invariants look for), masked in the archives. A secret, not a
    choice of the schedule: never derived from the seed."""
    value = f"ct_{secrets.token_hex(12)}"
    ctx.env.secrets.add(value)
    return value


def new_run(
    ctx: ExperimentContext,
    *,
    tool: str = "idem",
    input: dict[str, Any] | None = None,
    tenant_id: str | None = None,
    max_attempts: int | None = None,
    task_id: str | None = None,
) -> str:
    """Create a task with one run through the worker's control plane; return
    run_id. ``task_id``: the task's name (default: a new one)."""
    ctl = control_plane(ctx, tenant_id)
    task_id = task_id or f"task-{ctx.spec.id.lower()}-{ctx.uuid()[:8]}"
    # Every run carries a sensitive field (contract: sealed at rest, sent to the
    # tool, never logged); the harness masks its value wherever it shows up.
    # A secret, not a choice of the schedule: never derived from the seed.
    token, nested, listed, whole = (planted_secret(ctx) for _ in range(4))
    # And three more, one nested in an object, one in a list, one inside an
    # object that is itself a sensitive field's value (sealed whole): sealed
    # wherever they appear (the global effect.sensitive_field_stored_sealed).
    args: dict[str, Any] = {
        "task_id": task_id,
        "input": {
            "tool": tool,
            "customer_token": token,
            "billing": {"payment_token": nested},
            "contacts": [{"customer_email": listed}],
            "card_number": {"pan": whole, "expiry": "12/29"},
            # Not ASCII, with control characters JSON escapes short (\b, \f,
            # \t) and one it escapes as \u001f, and part of every request: a
            # digest or hash the worker computes must be of the canonical form
            # (UTF-8, never \u-escaped where a short escape exists), the one
            # the tool and the harness compute (contract section 2; blind hunt
            # 42 #06: a Go encoder that wrote \b as \u0008).
            "order_id": f"{ORDER_PREFIX}{task_id[-8:]}",
            **(input or {}),
        },
    }
    if tenant_id is not None:
        args["tenant_id"] = tenant_id
    if max_attempts is not None:
        args["max_attempts"] = max_attempts
    # A fresh task of the session's own tenant, arguments as ops.schema.json
    # has them: no refusal of these is timing (a worker that turns down its own
    # tenant named explicitly, say, refuses what the contract says it does).
    refusals = ("BadRequest", "TaskExists", "InsufficientPrivilege")
    result = ctx.ok(ctl, "create_run", definite=refusals, **args)
    return ctx.note_run(str(result["run_id"]))


# The start of every order_id new_run plants: only the built-in workflow copies
# it from a run's input into a tool request (the harness's own intents name
# no such order), so it tells the workflow's requests from the harness's.
ORDER_PREFIX = "commande-zoë\b\f\t\x1f-"


def workflow_steps(extra_steps: int = 0) -> list[str]:
    """The ``current_step`` of each protected write of the built-in workflow, in
    order, for a run that goes through without a fault (worker contract §7):
    start and plan, lookup, the tool step's intent and result, notify, the
    extra work steps, finish."""
    work = [f"work_{i + 1}" for i in range(extra_steps)]
    return ["plan", "plan", "lookup", "create_label", "create_label", "notify", *work, "finish"]


def writes_name_workflow_steps(
    ctx: ExperimentContext, run_ids: list[str], extra_steps: int = 0
) -> None:
    """Every protected write of these built-in-workflow runs sets
    ``current_step`` to the workflow step it belongs to (worker contract §6),
    on the faulty paths too: a requeue, a pause or a freeze belongs to the
    tool step, never to a reason or an outcome. And a run that succeeded went
    through every step, in the workflow's order (the first write of each
    step; a step done again after a takeover or a pause comes later): a
    worker that adopted a result another process recorded and skipped the
    next step finished a run whose work was never done (blind hunt 23 #10:
    Go state advanced before a tool_result write that was refused)."""
    order = list(dict.fromkeys(workflow_steps(extra_steps)))
    by_run = {r: writes(ctx, r) for r in run_ids}
    seen = [(r[:8], w["revision"], w["current_step"]) for r, ws in by_run.items() for w in ws]
    odd = [s for s in seen if s[2] not in order]
    ctx.invariant(
        "every protected write names its workflow step",
        not odd,
        expected=f"current_step of every protected write in {sorted(order)}",
        observed=f"{len(seen)} writes; others: {odd or 'none'}",
    )
    succeeded = [r for r in run_ids if checkers.run_row(ctx, r)["status"] == "succeeded"]
    firsts = {r: list(dict.fromkeys(w["current_step"] for w in by_run[r])) for r in succeeded}
    skipped = {r[:8]: f for r, f in firsts.items() if f != order}
    ctx.invariant(
        "a run that succeeded went through every workflow step in order",
        not skipped,
        expected=f"the first protected write of each step in the order {order}, for each of "
        f"{len(succeeded)} succeeded run(s)",
        observed=f"steps in order of their first write: {skipped}" if skipped else "as expected",
    )
    _tool_request_carries_the_steps(ctx, run_ids)


def _tool_request_carries_the_steps(ctx: ExperimentContext, run_ids: list[str]) -> None:
    """The tool step's request is built from what the steps before it found
    (worker contract §7: ``plan_ok`` and ``refundable`` true, with the run's
    ``order_id``): a workflow whose step kept its finding out of the state it
    passed on still reaches the tool, asking for what nobody checked
    (generated mutant 0906251d: the lookup's finding written at the plan)."""
    made = [r for run in run_ids for r in checkers.tool_resources(ctx, run_id=run)]
    requests = [r["request"] for r in made if isinstance(r.get("request"), dict)]
    ours = [q for q in requests if str(q.get("order_id", "")).startswith(ORDER_PREFIX)]
    short = [
        {k: q.get(k) for k in ("plan_ok", "refundable")}
        for q in ours
        if q.get("plan_ok") is not True or q.get("refundable") is not True
    ]
    ctx.invariant(
        "the tool step asks with what the steps before it found",
        not short,
        expected="every request the tool made a resource from for these runs' workflow "
        "carries plan_ok: true and refundable: true",
        observed=f"{len(ours)} request(s) of the workflow; without the findings: {short or 'none'}",
    )


def resumed_once_converged(
    ctx: ExperimentContext, run_id: str, reply: OpReply, remote: str | None, by: str
) -> None:
    """Safety, not timing: the convergence of the last operation in doubt of a
    run paused in doubt puts the run back in the queue in the same
    transaction (a run paused with nothing in doubt is one nobody resumes).
    ``by``: what converged it (a reconciler's cycle, an operator)."""
    row = checkers.run_row(ctx, run_id, f"the run after {by}")
    ops_after = [(o["status"], o["remote_id"]) for o in checkers.ledger(ctx, run_id)]
    ctx.invariant(
        "a run with nothing left in doubt is not left paused in doubt",
        reply.ok and ops_after == [("succeeded", remote)] and row["status"] == "queued",
        expected=f"{by} accepted, ledger succeeded with {remote}, run queued at once",
        observed=f"reply ok={reply.ok} ({reply.error or ''}); ledger {ops_after}; "
        f"run status {row['status']}",
    )


PAUSED = {"paused_human": "paused for a person", "paused_indoubt": "paused in doubt"}


def cancel_ends_a_paused_run(ctx: ExperimentContext, ctl: WorkerProcess, run_id: str) -> bool:
    """The control plane's ``cancel`` of a paused run (contract: any live or
    paused status -> cancelled) ends it: a paused run nobody may cancel is a
    task nobody can withdraw. Judged only when the run is paused (the caller's
    own checks say why it is not); True when the cancel was taken."""
    before = checkers.run_row(ctx, run_id, "the paused run before its cancel")
    status = str(before["status"])
    if status not in PAUSED:
        ctx.not_judged(
            "a cancel ends a paused run",
            expected="a cancel of a run paused for a person or in doubt",
            observed=f"not tried: the run is {status}",
        )
        return False
    ops_before = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
    reply = ctx.op(ctl, "cancel", run_id=run_id, reason="customer withdrew")
    after = checkers.run_row(ctx, run_id, "the run after its cancel")
    ctx.invariant(
        f"a cancel ends a run {PAUSED[status]}",
        reply.ok and (after["status"], after["owner"]) == ("cancelled", None),
        expected=f"cancel of the {status} run accepted; the run cancelled, no owner",
        observed=f"reply {'ok' if reply.ok else f'{reply.error}: {reply.message}'}; run "
        f"{after['status']}, owner {after['owner']}",
    )
    if reply.ok:
        # Its prepared operations are cancelled with it, paused or not (blind
        # hunt 49 #06: skipped for a paused run).
        ops_after = {o["operation_id"]: o["status"] for o in checkers.ledger(ctx, run_id)}
        prepared = [k for k, v in ops_before.items() if v == "prepared"]
        ctx.invariant(
            f"a cancel of a run {PAUSED[status]} cancels its prepared operations",
            all(ops_after.get(k) == "cancelled" for k in prepared),
            expected=f"{prepared or 'no operation'} prepared before the cancel, cancelled after",
            observed=f"ledger {ops_after} (before the cancel {ops_before})",
        )
    if reply.ok and after["status"] == "cancelled":
        _cancel_of_an_ended_run_changes_nothing(ctx, ctl, run_id)
    return reply.ok


def _cancel_of_an_ended_run_changes_nothing(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str
) -> None:
    """A second cancel of the run it already ended (a customer who clicks
    twice) tells nobody anything new: taken or refused, it writes no run
    change and no outbox event (blind hunt 15 #03: an agent.cancelled event
    for every cancel of an ended run)."""
    reply, changes = op_and_changes(ctx, ctl, "cancel", run_id=run_id, reason="clicked twice")
    written = [
        (c["tbl"], c["op"])
        for c in changes
        if c["tbl"] in ("agent_runs", "outbox", "agent_checkpoints", "tool_operations")
    ]
    ctx.invariant(
        "a cancel of an ended run writes nothing",
        not written,
        expected="the second cancel of the cancelled run changes no run, checkpoint, ledger or "
        "outbox row (its answer may be ok or a refusal)",
        observed=f"reply {'ok' if reply.ok else reply.error}; rows written {written}",
    )


def seen_within(probe: Callable[[], T | None], *, what: str, timeout_s: float) -> T | None:
    """``wait_for`` for a fault check: the probe's first truthy answer, or None
    when it never came (so the check records "did not take effect" with its
    evidence instead of ending the experiment as a harness error)."""
    try:
        return wait_for(probe, what=what, timeout_s=timeout_s)
    except WaitTimeout:
        return None


def renewals_refused_since(
    worker: WorkerProcess, run_id: str, since: float, *, timeout_s: float
) -> list[Any] | None:
    """The renewals of ``run_id`` that ``worker``'s own history records refused
    or unconfirmed (``fail`` or ``info``) at or after ``since``, once there is
    one within ``timeout_s``; None when none came (a fault check's evidence,
    so the wait does not end the experiment)."""
    return seen_within(
        lambda: [
            e
            for e in select(load_history([worker.events_path]), op="renew", run_id=run_id)
            if e.type in ("fail", "info") and e.time >= since
        ],
        what=f"{worker.worker_id}'s history to record a refused renewal of {run_id}",
        timeout_s=timeout_s,
    )


def crash_in_op(
    ctx: ExperimentContext,
    name: str,
    point: str,
    op: str,
    args: dict[str, Any],
    tenant_id: str | None = None,
) -> int:
    """Start ``name`` as an ops process with a crash armed at ``point``, send it
    ``op`` and wait for it to die there (it never answers); its exit code. One
    that answers instead never reached the point: it is stopped and its code
    (not -9) lets the caller's fault check say the crash did not take effect.
    One that does neither in 15 s breaks the bound (ExitTimeout names it)."""
    ctx.arm(name, point, Crash())
    worker = ctx.env.start_worker(name, "ops", tenant_id=tenant_id)
    pending = ctx.op_async(worker, op, args)
    ended = seen_within(
        lambda: not worker.is_alive() or pending.done(),
        what=f"{name} to die at {point} or answer {op}",
        timeout_s=15,
    )
    if ended and worker.is_alive():
        ctx.command(f"{name} answered {op} without reaching {point}")
        worker.stop(grace_s=1.0)
        return worker.returncode or 0
    code = worker.wait(1 if ended else 0.1)
    ctx.command(f"{name} ({op}) exited with code {code}")
    return code


def wait_claimable(ctx: ExperimentContext, run_id: str, timeout_s: float = 10.0) -> None:
    """Wait until the run's lease and any dispatch claim on it have expired by
    database time, so a successor's takeover does not depend on timing."""

    def ready() -> bool:
        rows = ctx.env.query(
            "SELECT (r.lease_expires_at IS NULL OR r.lease_expires_at < clock_timestamp()) "
            "AND NOT EXISTS (SELECT 1 FROM fencecheck_model.tool_operations o WHERE o.run_id = r.run_id "
            "AND o.status = 'dispatching' AND o.dispatch_until >= clock_timestamp()) AS ready "
            "FROM fencecheck_model.agent_runs r WHERE r.run_id = %s",
            [run_id],
        )
        return bool(rows and rows[0]["ready"])

    wait_for(
        ready,
        what=f"run {run_id[:8]}'s lease and dispatch claim to expire",
        timeout_s=timeout_s,
        interval_s=0.02,
        max_interval_s=0.05,
    )
    ctx.command(f"waited until run {run_id[:8]} was claimable by database time")


@contextlib.contextmanager
def renewal_stopped(ctx: ExperimentContext, holder: WorkerProcess) -> Iterator[None]:
    """While the block runs, nothing renews ``holder``'s leases, by the renewal
    model the system declares: ``per_lease`` and ``none`` renew only when
    asked (nothing to stop); ``per_process`` renews every lease of the process
    from its own heartbeat, so the whole process is frozen (SIGSTOP, confirmed
    in the kernel) and let go again (SIGCONT) when the block ends. An
    experiment that waits for a lease to run out waits inside this block,
    never on a lease that is renewed behind its back."""
    if ctx.system.capabilities.renewal != "per_process":
        yield
        return
    ctx.pause(holder)
    try:
        yield
    finally:
        ctx.resume(holder)


def finish(ctx: ExperimentContext, worker: WorkerProcess, timeout_s: float = 20.0) -> int:
    """Wait for a ``run``-mode worker to exit by itself; its exit code."""
    code = worker.wait(timeout_s)
    ctx.command(f"{worker.worker_id} exited with code {code}")
    return code


#: A ``run`` worker's exit after a lost or unconfirmed renewal (contract §1).
CANCELLED = 10


def finish_or_take_over(
    ctx: ExperimentContext, worker: WorkerProcess, run_id: str, *, successors: int = 2
) -> int:
    """Wait for a ``run``-mode worker working ``run_id`` with ``--once``; if it
    cancelled itself (its renewal timed out on a busy machine, as the protocol
    says it must), let the lease run out and start a successor, as a
    deployment does, up to ``successors`` times. The last exit code. A worker
    that cancels itself for no reason still leaves the run unfinished, and
    the caller's progress check says so."""
    code = finish(ctx, worker)
    for n in range(1, successors + 1):
        if code != CANCELLED:
            break
        name = f"{worker.worker_id}s{n}"
        ctx.command(f"{worker.worker_id} cancelled itself (exit {code}); {name} takes over")
        wait_claimable(ctx, run_id)
        code = finish(ctx, ctx.env.start_worker(name, "run", ["--run-id", run_id, "--once"]))
    return code


def finish_or_kill(ctx: ExperimentContext, worker: WorkerProcess, timeout_s: float) -> int | str:
    """A ``run``-mode worker's exit code; one still running after ``timeout_s``
    is killed, and that is said (its exit code's place in the evidence names
    it): a worker hung after its execution was cancelled (a cut link, a
    black hole) is not itself a protocol violation, and the experiment still
    judges everything else it saw."""
    try:
        return finish(ctx, worker, timeout_s)
    except ExitTimeout:
        ctx.kill(worker)
        return f"still running after {timeout_s:.0f}s, killed"


def intent_registered(
    ctx: ExperimentContext,
    worker: WorkerProcess,
    run_id: str,
    *,
    tool: str,
    step_id: str,
    conflict_probe: bool = False,
) -> str:
    """Claim the run with ``worker`` (an ``ops`` process) and register one tool
    intent (effect_version 1) under that lease; the operation_id. With
    ``conflict_probe`` the same step is then registered again with another
    request body, which must be refused and write nothing."""
    lease = ctx.ok(worker, "claim", run_id=run_id)
    # A sensitive field in the request: stored sealed (contract section 9).
    request = {"kind": "return_label", "customer_token": planted_secret(ctx)}
    intent = ctx.ok(
        worker,
        "register_intent",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        step_id=step_id,
        effect_version=1,
        tool=tool,
        request=request,
    )
    if conflict_probe:
        _another_body_refused(
            ctx, worker, run_id, lease["epoch"], intent, tool, step_id, request
        )  # fmt: skip
    return str(intent["operation_id"])


def next_version_judged_by_its_own_step(
    ctx: ExperimentContext, worker: WorkerProcess, run_id: str, *, tool: str, busy_step: str
) -> None:
    """Only a step's own earlier versions decide whether its next version may be
    registered (contract section 5, register_intent): on a run whose step
    ``busy_step`` has an intent that may still happen, held by ``worker``
    (an ``ops`` process), another step's version 1 refused for good (422:
    failed_final, the tool never acted) lets that step's version 2 in."""
    name = "a step's next version is judged by that step's versions only"
    row = checkers.run_row(ctx, run_id, "the run before another step's intents")
    step = f"{busy_step}.next"
    args: dict[str, Any] = {"run_id": run_id, "epoch": row["epoch"], "tool": tool, "step_id": step}
    first = ctx.ok(
        worker,
        "register_intent",
        expected_revision=row["revision"],
        effect_version=1,
        request={"kind": "return_label"},
        **args,
    )
    ctx.env.tool.client().set_fault(tool, "reject_final", count=1, run_id=run_id)
    ctx.op(worker, "dispatch", operation_id=first["operation_id"])
    ledger = {str(o["operation_id"]): o for o in checkers.ledger(ctx, run_id)}
    busy = [o["status"] for o in ledger.values() if o["step_id"] == busy_step]
    refused = ledger.get(str(first["operation_id"]), {}).get("status")
    if not ctx.probe_reached(
        f"{step}'s version 1 refused for good beside {busy_step}'s intent",
        refused == "failed_final" and any(st not in ("cancelled", "failed_final") for st in busy),
        judges=name,
        expected=f"{step} v1 failed_final (the tool's 422), {busy_step} v1 still able to happen",
        observed=f"{step} v1 {refused}; {busy_step} {busy}",
    ):
        return
    reply, after = _register_version_2(ctx, worker, args, first["revision"], step)
    if not reply.ok and _lease_gone(ctx, run_id, row["epoch"]):
        # A lease that ran out meanwhile (a busy machine) refuses any write:
        # the protocol allows it, and the question was not asked.
        ctx.not_judged(
            name,
            expected=f"register_intent of {step} v2 under the live lease of epoch {row['epoch']}",
            observed=f"reply {reply.error}, the lease of epoch {row['epoch']} gone by database "
            f"time when read after it; {step}: {after}",
        )
        return
    ctx.invariant(
        name,
        reply.ok and after == [(1, "failed_final"), (2, "prepared")],
        expected=f"register_intent of {step} v2 taken: ({step}: v1 failed_final, v2 prepared), "
        f"whatever {busy_step} may still do",
        observed=f"reply {'ok' if reply.ok else reply.error}; {step}: {after}",
    )
    if reply.ok:
        _same_version_again(ctx, worker, args, reply.result, step)


def _register_version_2(
    ctx: ExperimentContext, worker: WorkerProcess, args: dict[str, Any], revision: int, step: str
) -> tuple[OpReply, list[tuple[Any, Any]]]:
    """register_intent of ``step``'s version 2 (another request than version
    1's); the reply, and the step's (version, status) pairs after it."""
    reply = ctx.op(
        worker,
        "register_intent",
        expected_revision=revision,
        effect_version=2,
        request={"kind": "store_credit"},
        **args,
    )
    after = [
        (o["effect_version"], o["status"])
        for o in checkers.ledger(ctx, args["run_id"])
        if o["step_id"] == step
    ]
    return reply, after


def _same_version_again(
    ctx: ExperimentContext,
    worker: WorkerProcess,
    args: dict[str, Any],
    registered: dict[str, Any],
    step: str,
) -> None:
    """Version 2 registered again with the same tool and body (a worker that
    lost the answer to its commit asks again): the contract answers the stored
    intent and writes nothing (section 5, register_intent). Its own version
    must not count as an earlier one that may still happen."""
    name = "a version registered again with the same body answers the stored intent"
    again, after = _register_version_2(ctx, worker, args, registered["revision"], step)
    if not again.ok and _lease_gone(ctx, args["run_id"], args["epoch"]):
        ctx.not_judged(
            name,
            expected=f"register_intent of {step} v2 again under the live lease of epoch "
            f"{args['epoch']}",
            observed=f"reply {again.error}, the lease gone by database time; {step}: {after}",
        )
        return
    same = again.ok and str(again.result.get("operation_id")) == str(registered["operation_id"])
    ctx.invariant(
        name,
        same and after == [(1, "failed_final"), (2, "prepared")],
        expected=f"ok with {step} v2's operation_id {registered['operation_id']}, the ledger "
        f"unchanged ({step}: v1 failed_final, v2 prepared)",
        observed=f"reply {'ok ' + str(again.result.get('operation_id')) if again.ok else again.error}"
        f"; {step}: {after}",
    )


def _lease_gone(ctx: ExperimentContext, run_id: str, epoch: int) -> bool:
    """The run's lease of ``epoch`` has expired or moved on, by the database's clock."""
    rows = ctx.sql(
        f"run {run_id[:8]}'s lease after a refusal",
        "SELECT epoch, lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp() AS gone"
        " FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [run_id],
    )
    return not rows or rows[0]["epoch"] != epoch or bool(rows[0]["gone"])


def op_and_changes(
    ctx: ExperimentContext, worker: WorkerProcess, op: str, **args: Any
) -> tuple[OpReply, list[dict[str, Any]]]:
    """Send ``op`` and return its reply with every audited change the worker's
    session made meanwhile: what a refusal probe judges ("refused, nothing
    written"). The session is known by the worker id (its application_name),
    not by the process's name."""
    mark = checkers.audit_mark(ctx)
    reply = ctx.op(worker, op, **args)
    return reply, checkers.changes_by(ctx, [worker.worker_id], after_seq=mark)


def _another_body_refused(
    ctx: ExperimentContext,
    worker: WorkerProcess,
    run_id: str,
    epoch: int,
    intent: dict[str, Any],
    tool: str,
    step_id: str,
    request: dict[str, Any],
) -> None:
    """The operation_id names the step and its version, not the request: one
    registered again with another body is another intent under a taken id
    (contract section 5, register_intent), refused, never the first's. And the
    changed request as the step's next version: refused too while version 1
    may still happen (registered, never proven without effect), or two versions
    of one step could both reach the tool (English seed §9.3)."""
    probes = (
        (1, "an operation_id registered again with another request is refused",
         f"register_intent of {intent['operation_id']} with another request body"),
        (2, "a step's next effect version is refused while the earlier one may happen",
         f"register_intent of effect_version 2 of step {step_id} while version 1 "
         f"({intent['operation_id']}) is registered and not failed_final or cancelled"),
        # Every earlier version counts, not only the one before: no version 2
        # stands between, and version 1 may still happen.
        (3, "a later effect version is refused while any earlier one may happen",
         f"register_intent of effect_version 3 of step {step_id} (no version 2) while "
         f"version 1 ({intent['operation_id']}) is registered and not failed_final or "
         "cancelled"),
    )  # fmt: skip
    cases = [
        (version, name, asked, tool, {"kind": "store_credit"}) for version, name, asked in probes
    ]
    # And the same request body sent to another tool: the intent is where it
    # goes as much as what it says (blind hunt 66 #01: a Python conflict test
    # that compared run and digest only took it for the stored intent).
    other_tool = "plain" if tool != "plain" else "idem"
    cases.append((
        1, "an operation_id registered again for another tool is refused",
        f"register_intent of {intent['operation_id']} with the same request for tool "
        f"{other_tool} (registered for {tool})",
        other_tool, request,
    ))  # fmt: skip
    for version, name, asked, to, request in cases:
        reply, changes = op_and_changes(
            ctx,
            worker,
            "register_intent",
            run_id=run_id,
            epoch=epoch,
            expected_revision=intent["revision"],
            step_id=step_id,
            effect_version=version,
            tool=to,
            request=request,
        )
        changed = [r for r in changes if not r["renewal"]]
        ctx.invariant(
            name,
            not reply.ok and not changed,
            expected=f"{asked}: refused (IntentConflict) and nothing written",
            observed=f"reply {'ok ' + plain(reply.result) if reply.ok else reply.error}; "
            f"changes {[(r['seq'], r['tbl'], r['op']) for r in changed]}",
        )


def neither_failed_on_the_other(
    ctx: ExperimentContext, name: str, replies: dict[str, OpReply], expected: str
) -> None:
    """Progress check: two actors that met on the same rows both answered
    (ok, or refused with the contract's class); neither failed with a
    database error, as a deadlock between them does (their locks taken in
    orders the other does not share)."""
    failed = [
        f"{who}: {reply.error} {reply.message}"
        for who, reply in replies.items()
        if reply.error in ("DatabaseError", "OperationalError") or "deadlock" in str(reply.message)
    ]
    ctx.progress(name, not failed, expected=expected, observed=f"failed: {failed or 'none'}")


def finding_without_a_resource_refused(
    ctx: ExperimentContext, ledger_of: str, op: str, /, **args: Any
) -> None:
    """A person's finding that the tool acted (``resolve_indoubt`` executed,
    ``converge_operation`` succeeded) names the resource it made: one whose
    ``remote_id`` is blank or missing is refused and changes nothing of the
    run's ledger (blind hunt 71's reader: both references took a blank one,
    the Python convergence a missing one too, for an operation succeeded
    naming no resource). ``ledger_of``: the run whose ledger must not change."""
    before = checkers.ledger(ctx, ledger_of)
    told = []
    for remote_id in ("  ", None):
        reply = ctx.op(control_plane(ctx), op, **args, remote_id=remote_id,
                       reason="refusal probe: no resource named", ticket="OPS-71")  # fmt: skip
        told.append(f"remote_id {remote_id!r}: {'ok' if reply.ok else reply.error}")
        if reply.ok:
            break
    after = checkers.ledger(ctx, ledger_of)
    ctx.invariant(
        f"a {op} that names no resource is refused",
        all(": ok" not in t for t in told) and after == before,
        expected=f"{op} with remote_id '  ' and with none each refused, the run's ledger as it was",
        observed=f"{'; '.join(told)}; ledger "
        f"{[(o['status'], o['remote_id']) for o in before]} -> "
        f"{[(o['status'], o['remote_id']) for o in after]}",
    )
