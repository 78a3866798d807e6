"""V: a permanent error pauses the run for a person, and only the person's
decision moves it: supplement (the effect is planned again, with the
supplied fields, under a new effect_version; the refused version is kept)
or terminate (the run fails, nothing more is sent). The variant ``purge`` is
the operator's other decision, retention (scenarios/retention.py).

The tool refuses the run's first create for good (422). Workers that try to
take the paused run before the decision must be refused; the decision is
taken through the control plane (operator role) and audited. For
supplement, another task of the tenant has done the same step meanwhile
(its create_label v1 succeeded): planning the effect again judges only this
run's earlier versions, never another run's. Once the supplemented run
holds versions 1 and 2, a later run of the tenant does the step: its first
intent is its own version 1.

Variant ``supplement_then_doubt``: the supplemented version 2 loses its
answer (a tool with neither query nor key), so the run is paused in doubt
with two operations, version 1 refused for good and version 2 unknown. The
pause must still come about (freezing version 2 is not refused because of
version 1), an operator's finding that names version 1, nothing in doubt,
must change nothing, and the finding on version 2 resumes the run.
"""

from __future__ import annotations

import json
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, Inconclusive, plain
from harness.parts.processes import OpReply, WorkerProcess
from scenarios import retention
from scenarios.common import (
    CANCELLED,
    control_plane,
    finish,
    finish_or_kill,
    intent_registered,
    new_run,
    op_and_changes,
    paused_list_is_the_databases,
    planted_secret,
    wait_claimable,
    writes_name_workflow_steps,
)

SUPPLEMENT_THEN_DOUBT = "supplement_then_doubt"
SUPPLEMENT_TWICE = "supplement_twice"
SUPPLEMENT_AFTER_BUDGET = "supplement_after_budget"

SPEC = ExperimentSpec(
    id="V",
    title="human decisions",
    seed_section="Chinese seed §3.1 (PAUSED_HUMAN), §10, §12 (operator audit); English seed §9.3",
    invariant="a refused effect pauses the run for a human; nobody claims it before the "
    "decision; supplement plans the effect again under effect_version 2 with the supplied "
    "fields (version 1 kept), one real resource; terminate fails the run and sends nothing; "
    "each decision audited; purge deletes exactly the old finished, relayed tasks of the "
    "operator's tenant, each archived whole first, skips a task another session holds, "
    "leaves every other row as it was; a run paused in doubt on version 2 with version 1 "
    "refused: a finding naming version 1 changes nothing, the one on version 2 resumes it",
    fault="the tool refuses the run's first create with 422 (definite, not retryable); "
    "purge: tasks finished and relayed, finished with the outbox pending, queued, and the "
    "other tenant's under the same task name, cancelled while its operation is dispatching "
    "(the dispatcher held after its claim), one task row held locked by the harness; "
    "supplement_then_doubt: the supplemented create's answer lost after the tool acted",
    rules=(4, 5),
    variants=(
        "supplement",
        "terminate",
        "purge",
        SUPPLEMENT_THEN_DOUBT,
        SUPPLEMENT_TWICE,
        SUPPLEMENT_AFTER_BUDGET,
    ),
    variant_faults=(
        (
            SUPPLEMENT_AFTER_BUDGET,
            "the tool answers the run's only attempt (max_attempts 1) with 429: paused for a "
            "person with version 1 back in prepared; a person supplements it",
        ),
        (
            SUPPLEMENT_TWICE,
            "the tool refuses the run's first two creates with 422: two supplements, each "
            "with a field of its own",
        ),
    ),
    # V judges decisions, not timing: runs only have to finish, and at the
    # matrix's 800 ms lease and 600 ms dispatch claim a busy machine lost them
    # (a lease lapsed, a claim expired into doubt) before the state was built.
    lease_ttl_ms=3000,
    heartbeat_ms=500,
    heartbeat_timeout_ms=1500,
    dispatch_ttl_ms=5000,
    needs=(
        *needs.capabilities("workflow", "ledger", "operator_actions"),
        needs.op(
            "decide",
            "supplement",
            "terminate",
            SUPPLEMENT_THEN_DOUBT,
            SUPPLEMENT_TWICE,
            SUPPLEMENT_AFTER_BUDGET,
        ),
        needs.op("resolve_indoubt", SUPPLEMENT_THEN_DOUBT),
        needs.capability("retention", "purge"),
        needs.capability("outbox", "purge"),
        needs.op("purge", "purge"),
        needs.point("after_dispatch_claim_commit", "purge"),
    ),
)


def run(ctx: ExperimentContext) -> None:
    variant = ctx.variant or "supplement"
    if variant == "purge":
        retention.run(ctx)
        return
    if variant == SUPPLEMENT_AFTER_BUDGET:
        _supplement_after_budget(ctx)
        return
    if variant == SUPPLEMENT_TWICE:
        _supplement_twice(ctx)
        return
    doubt = variant == SUPPLEMENT_THEN_DOUBT
    if doubt:
        variant = "supplement"
    # The neighbour's row comes first in the table: a lookup of the run by
    # anything less than its id finds the neighbour.
    other = new_run(ctx, tool="plain") if variant == "supplement" else None
    # V[supplement]'s run has one attempt: the 422 spends it, so the person's
    # supplement must give it one more, whatever paused it (blind hunt 66 #02:
    # a decision that gave the extra attempt only to a run paused for its
    # spent budget let the next grant take the run past max_attempts).
    one_attempt = variant == "supplement" and not doubt
    run_id = new_run(ctx, tool="plain", max_attempts=1 if one_attempt else None)
    ctx.env.tool.client().set_fault("plain", "reject_final", count=1, run_id=run_id)
    ctx.command(f"tool: the next create of 'plain' for run {run_id[:8]} answers 422 (for good)")
    first = ctx.env.start_worker("W1", "run", ["--run-id", run_id, "--once"])
    neighbour = None
    if other is not None:
        neighbour = (other, ctx.env.start_worker("N", "run", ["--run-id", other, "--once"]))
    code_first = finish(ctx, first)
    if neighbour is not None:
        code_n = finish(ctx, neighbour[1])
        done = checkers.ledger(ctx, neighbour[0])
        ctx.fault(
            "another run of the tenant did the same step",
            [(o["step_id"], o["effect_version"], o["status"]) for o in done]
            == [("create_label", 1, "succeeded")],
            expected="the neighbour's create_label v1 succeeded",
            observed=f"{plain([(o['step_id'], o['effect_version'], o['status']) for o in done])}"
            f" (N exit {code_n})",
        )
    refused = checkers.tool_requests(ctx, run_id=run_id)
    paused = checkers.run_row(ctx, run_id, "the run after the refusal")
    ctx.fault(
        "the tool refused the first create",
        [r["outcome"] for r in refused] == ["rejected_final"],
        expected="one create, logged rejected_final by the tool",
        observed=f"{[r['outcome'] for r in refused]} (W1 exit {code_first})",
    )
    ctx.progress_equal(
        "refusal pauses for a human", paused["status"], "paused_human", what="run status"
    )
    early = ctx.env.start_worker("W2", "run", ["--run-id", run_id, "--once"])
    code_early = finish(ctx, early)
    ctl = control_plane(ctx)
    # What an operator decides on: the run paused for a person is listed.
    paused_list_is_the_databases(ctx, ctl)
    # A sensitive field among them: a supplement is sealed at rest like the
    # run's input it joins (the global effect.sensitive_field_stored_sealed).
    # And a correction of a field the request already carries (the run's
    # amount is 10): a supplied field replaces the run's own value of it.
    # And a structured field, an object of one key: it reaches the tool as it
    # was given (a reader that takes any one-key object for a sealed value
    # must not open it).
    supplement = {
        "address": "corrected by support",
        "amount": 12,
        "card_number": planted_secret(ctx),
        "delivery": {"note": "leave at the door"},
    }
    decide_args: dict[str, Any] = {
        "run_id": run_id,
        "decision": variant,
        "supplement": supplement if variant == "supplement" else None,
        "reason": "customer called support",
        "ticket": "CS-7",
    }
    bystander = _bystander_intent(ctx) if variant == "terminate" else None
    if variant == "supplement":
        _supplement_that_is_no_object_refused(ctx, ctl, run_id)
    if variant == "terminate":
        reply = _two_operators_decide_together(ctx, ctl, decide_args)
    else:
        reply = ctx.op(ctl, "decide", **decide_args)
    if not reply.ok and paused["status"] != "paused_human":
        raise Inconclusive(f"decide refused ({reply.error}) on a run that never paused: see above")
    # A run paused for a human takes the person's decision (contract: decide).
    ctx.invariant(
        "the decision on the paused run is taken",
        reply.ok,
        expected=f"decide {variant} accepted on the run paused for a human",
        observed=f"reply {'ok' if reply.ok else f'{reply.error}: {reply.message}'}",
    )
    if not reply.ok:
        return
    decision = reply.result
    if doubt:
        ctx.env.tool.client().set_fault("plain", "drop_after_act", count=1, run_id=run_id)
        ctx.command(f"tool: the next create of 'plain' for run {run_id[:8]} loses its answer")
    last = ctx.env.start_worker("W3", "run", ["--run-id", run_id, "--once"])
    # A worker that cannot freeze version 2 loops; what it left is judged.
    code_last = finish_or_kill(ctx, last, 20) if doubt else finish(ctx, last)
    if doubt and code_last == CANCELLED:
        # Its renewal timed out (a busy machine) and it cancelled itself, as it
        # must; a deployment starts another, and so does V, once the lease ran out.
        ctx.command(f"W3 exited with code {code_last}; W3b takes over")
        wait_claimable(ctx, run_id)
        successor = ctx.env.start_worker("W3b", "run", ["--run-id", run_id, "--once"])
        code_last = finish_or_kill(ctx, successor, 20)
    resolved = False
    if doubt:
        code_last, resolved = _resolve_the_second_version(ctx, ctl, run_id, code_last)
    trail = checkers.audit(ctx, run_id)
    decided = next(
        (
            r["seq"]
            for r in trail
            if r["old_status"] == "paused_human" and r["status"] != "paused_human"
        ),
        None,
    )
    paused_at = next((r["seq"] for r in trail if r["status"] == "paused_human"), None)
    grabbed = [
        r["seq"]
        for r in trail
        if r["old_epoch"] is not None
        and r["epoch"] > r["old_epoch"]
        and paused_at is not None
        and r["seq"] > paused_at
        and (decided is None or r["seq"] < decided)
    ]
    ctx.invariant(
        "nobody claims the paused run before the decision",
        decided is not None and not grabbed,
        expected="no grant between the pause and the operator's decision",
        observed=f"decision at audit seq {decided}; grants before it {grabbed or 'none'} "
        f"(W2 exit {code_early})",
    )
    ops = checkers.ledger(ctx, run_id)
    row = checkers.run_row(ctx, run_id, "the run after the decision")
    resources = checkers.tool_resources(ctx, run_id=run_id)
    if variant == "supplement":
        versions = [(o["effect_version"], o["status"]) for o in ops]
        ctx.invariant(
            "the refused version kept, the effect planned again as version 2",
            versions[:1] == [(1, "failed_final")]
            and [v for v, _ in versions[1:]] in ([], [2])
            and all(st != "failed_final" for _, st in versions[1:]),
            expected="ledger (effect_version, status): (1, failed_final) kept, then at most a "
            "version 2 (not refused: the tool accepts the supplemented request)",
            observed=plain(versions),
        )
        supplied = ("address", "amount", "delivery")
        made = [(r["operation_id"], {k: r["request"].get(k) for k in supplied}) for r in resources]
        second = ops[1]["operation_id"] if len(ops) > 1 else None
        ctx.invariant(
            "one real resource, made from the supplemented request",
            len(resources) <= 1
            and all(r["request"].get(k) == supplement[k] for r in resources for k in supplied)
            and all(r["operation_id"] == second for r in resources),
            expected="the tool created at most one resource, for version 2, with the supplied "
            "address, the corrected amount 12 (the run's own amount was 10) and the delivery "
            "object as given",
            observed=plain(made),
        )
        ctx.progress_equal(
            "the run finished with version 2 done",
            (row["status"], versions, len(resources)),
            ("succeeded", [(1, "failed_final"), (2, "succeeded")], 1),
            what=f"(status, ledger, resources) (W3 exit {code_last})",
        )
        if not doubt:
            _a_later_run_counts_its_own_versions(ctx, [v for v, _ in versions])
    else:
        ctx.equal("terminated", row["status"], "failed", what=f"status (W3 exit {code_last})")
        ctx.equal(
            "nothing sent after the decision",
            len(checkers.tool_requests(ctx, run_id=run_id)),
            1,
            what="creates the tool received",
        )
        if bystander is not None:
            _bystander_untouched(ctx, *bystander)
    actions = ctx.sql(
        "operator decisions on the run",
        "SELECT action, operator, ticket, before->>'status' AS before, after->>'status' AS after"
        " FROM fencecheck_model.operator_actions WHERE run_id = %s ORDER BY id",
        [run_id],
    )
    after = "queued" if variant == "supplement" else "failed"
    operator = ctx.env.login_role(ctx.env.tenant_id, "operator")
    ctx.equal(
        "the decision is audited",
        [(a["action"], a["operator"], a["ticket"], a["before"], a["after"]) for a in actions],
        [(variant, operator, "CS-7", "paused_human", after)]
        + (
            [("resolve:executed", operator, "CS-8", "paused_indoubt", "queued")] if resolved else []
        ),
        what=f"operator_actions (decision reply {decision})",
    )
    if ctx.system.capabilities.offers_op("operator_actions"):
        # The op's list is the table's, oldest first (contract section 5; blind
        # hunt 66 #07: a Go query ordered newest first; V[supplement_then_doubt]
        # has two decisions on the run).
        listed = ctx.op(control_plane(ctx), "operator_actions", run_id=run_id)
        ctx.equal(
            "operator_actions lists the run's decisions oldest first",
            [a.get("action") for a in listed.result.get("actions", [])] if listed.ok else None,
            [a["action"] for a in actions],
            what="the actions the op lists, against operator_actions by id",
        )
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _supplement_twice(ctx: ExperimentContext) -> None:
    """Supplements accumulate (contract section 5, decide): the tool refuses
    version 1 and then the supplemented version 2 for good; a second person
    supplies another field and corrects one of the first person's two again;
    version 3's request carries both supplements, the later value of the
    field both give (a merge with its operands swapped kept the earlier one:
    blind hunt 17 #01) and the first person's other field (a supplement that
    replaced the earlier ones lost it: blind hunt 18 #09), and the run
    finishes with one resource, made by version 3."""
    run_id = new_run(ctx, tool="plain")
    ctx.env.tool.client().set_fault("plain", "reject_final", count=2, run_id=run_id)
    ctx.command(f"tool: the next two creates of 'plain' for run {run_id[:8]} answer 422")
    ctl = control_plane(ctx)
    given = (
        {"address": "corrected by support", "floor": "3"},
        {"phone": "+1 555 0100", "address": "corrected again"},
    )
    merged = {k: v for sup in given for k, v in sup.items()}  # a later value wins
    replies, pauses = [], []
    for n, supplement in enumerate(given, start=1):
        code = finish(ctx, ctx.env.start_worker(f"W{n}", "run", ["--run-id", run_id, "--once"]))
        paused = checkers.run_row(ctx, run_id, f"the run after refusal {n}")
        pauses.append((paused["status"], code))
        if paused["status"] != "paused_human":
            break
        replies.append(
            ctx.op(
                ctl,
                "decide",
                run_id=run_id,
                decision="supplement",
                supplement=supplement,
                reason=f"customer called support ({n})",
                ticket=f"CS-{10 + n}",
            )
        )
    ledger = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    if not ctx.probe_reached(
        "two refusals, each paused for a person and supplemented",
        [st for st, _ in pauses] == ["paused_human", "paused_human"]
        and all(r.ok for r in replies)
        and ledger == [(1, "failed_final"), (2, "failed_final")],
        judges="the third version carries both supplements",
        expected="paused_human after each of the two refusals, both supplements taken, "
        "versions 1 and 2 failed_final",
        observed=f"(status, exit) after each refusal {pauses}; decisions "
        f"{[r.ok for r in replies]}; ledger {ledger}",
    ):
        return
    code = finish(ctx, ctx.env.start_worker("W3", "run", ["--run-id", run_id, "--once"]))
    ops = checkers.ledger(ctx, run_id)
    third = next((o for o in ops if o["effect_version"] == 3), None)
    made = [
        r for r in checkers.tool_resources(ctx, run_id=run_id)
        if third is not None and r["operation_id"] == third["operation_id"]
    ]  # fmt: skip
    request = made[0]["request"] if made else {}
    ctx.invariant(
        "the third version carries both supplements",
        all(request.get(k) == v for k, v in merged.items()) if made else True,
        expected=f"version 3's request, as the tool made its resource from it, holds "
        f"{given[0]} and {given[1]}, the later address winning: {merged}",
        observed=f"{ {k: request.get(k) for k in merged} if made else 'no resource' }",
    )
    ctx.progress_equal(
        "the run finishes with version 3",
        (checkers.run_row(ctx, run_id)["status"], [(o["effect_version"], o["status"]) for o in ops],
         len(made)),
        ("succeeded", [(1, "failed_final"), (2, "failed_final"), (3, "succeeded")], 1),
        what=f"(run status, ledger, resources of version 3) (W3 exit {code})",
    )  # fmt: skip
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _supplement_after_budget(ctx: ExperimentContext) -> None:
    """A run paused for a person because its attempt budget ran out (its one
    attempt answered 429: version 1 back in prepared, never acted on) is
    supplemented. What the tool then makes must carry the supplied fields:
    version 1 was planned without them, and sending it would carry out the
    request the person corrected (contract section 5, decide: a supplement
    plans the effect again, as the next version)."""
    # Another live run of the tenant holds an intent older than this run's,
    # never dispatched: retiring the supplemented run's version 1 must touch
    # that run's own row only (blind hunt 71 #07: a Go retire that claimed the
    # tenant's oldest prepared intent retired the bystander's).
    bystander = new_run(ctx, tool="plain")
    other = intent_registered(
        ctx, ctx.env.start_worker("B", "ops"), bystander, tool="plain", step_id="v.bystander"
    )
    run_id = new_run(ctx, tool="plain", max_attempts=1)
    ctx.env.tool.client().set_fault("plain", "reject_429", count=1, run_id=run_id)
    ctx.command(f"tool: the next create of 'plain' for run {run_id[:8]} answers 429")
    code = finish(ctx, ctx.env.start_worker("W1", "run", ["--run-id", run_id, "--once"]))
    paused = checkers.run_row(ctx, run_id, "the run after its only attempt")["status"]
    ledger = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    if not ctx.probe_reached(
        "paused for a person at its budget, version 1 prepared",
        paused == "paused_human" and ledger == [(1, "prepared")],
        judges="what the tool makes after the supplement carries the supplied fields",
        expected="paused_human, ledger [(1, 'prepared')]",
        observed=f"{paused}, ledger {ledger} (W1 exit {code})",
    ):
        return
    supplement = {"address": "corrected by support"}
    reply = ctx.op(
        control_plane(ctx), "decide", run_id=run_id, decision="supplement",
        supplement=supplement, reason="customer called support", ticket="CS-21",
    )  # fmt: skip
    code = finish(ctx, ctx.env.start_worker("W2", "run", ["--run-id", run_id, "--once"]))
    made = checkers.tool_resources(ctx, run_id=run_id)
    ctx.invariant(
        "what the tool made after a supplement carries the supplied fields",
        all(r["request"].get("address") == supplement["address"] for r in made),
        expected=f"every resource of the run made from a request with {supplement}",
        observed=f"{[(r['operation_id'][-3:], r['request'].get('address')) for r in made]} "
        f"(decide {'ok' if reply.ok else reply.error})",
    )
    ctx.progress_equal(
        "the supplemented run finishes with one resource",
        (checkers.run_row(ctx, run_id)["status"], len(made)),
        ("succeeded", 1),
        what=f"(run status, resources) (W2 exit {code})",
    )
    theirs = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, bystander)]
    ctx.invariant(
        "retiring the replaced version touches no other run's intent",
        theirs == [(other, "prepared")],
        expected=f"the bystander run's older intent {other} still prepared, never sent",
        observed=f"{theirs}",
    )
    if ctx.system.capabilities.offers_op("retry_run"):
        # The task retried once the supplemented run ended: the retry starts
        # from the run's input, the person's supplement in it (the global
        # run.created_with_its_initial_values judges the insert; blind hunt
        # 67 #02: a Python retry_run dropped the supplement).
        task_id = checkers.run_row(ctx, run_id, "the supplemented run")["task_id"]
        retried = ctx.op(control_plane(ctx), "retry_run", task_id=task_id)
        ctx.command(f"retry of the supplemented run's task: {retried.result or retried.error}")
    writes_name_workflow_steps(ctx, [run_id])
    checkers.lease_history_is_sound(ctx, [run_id])


def _a_later_run_counts_its_own_versions(ctx: ExperimentContext, seen: list[int]) -> None:
    """Once another run of the tenant holds versions 1 and 2 of the step, a
    new run's first intent of that step is still its version 1: a version is
    the run's own count (the global effect.versions_of_a_step_count_from_one
    judges every run the same way)."""
    later = new_run(ctx, tool="plain")
    code = finish(ctx, ctx.env.start_worker("L", "run", ["--run-id", later, "--once"]))
    mine = [(o["step_id"], o["effect_version"]) for o in checkers.ledger(ctx, later)]
    ctx.invariant(
        "a later run's first intent of the step is its version 1",
        mine[:1] in ([], [("create_label", 1)]),
        expected=f"the later run's ledger starts at (create_label, 1), whatever another run "
        f"of the tenant holds (its versions {seen})",
        observed=f"{plain(mine)} (L exit {code})",
    )


def _supplement_that_is_no_object_refused(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str
) -> None:
    """A supplement is an object of fields (contract: decide); a list is refused
    and writes nothing, the run still paused for a person (generated 517c2039:
    the object test dropped, the list merged into the run's input). Also a
    list of pairs, which Python's ``dict()`` makes an object of (blind hunt
    65's reader: the Python worker took it as a supplement)."""
    seen: list[str] = []
    for supplement in (["address", "corrected"], [["address", "corrected"]]):
        reply, changes = op_and_changes(
            ctx,
            ctl,
            "decide",
            run_id=run_id,
            decision="supplement",
            supplement=supplement,
            reason="refusal probe: a supplement that is no object",
            ticket="CS-6",
        )
        seen.append(
            f"{json.dumps(supplement)}: reply {'ok' if reply.ok else reply.error}, changes "
            f"{[(r['seq'], r['tbl'], r['op']) for r in changes]}"
        )
        if reply.ok or changes:
            break
    ctx.invariant(
        "a supplement that is no object is refused",
        not reply.ok and not changes,
        expected="decide supplement with a list (of strings, of pairs) refused, nothing written",
        observed="; ".join(seen),
    )


def _two_operators_decide_together(
    ctx: ExperimentContext, ctl: WorkerProcess, args: dict[str, Any]
) -> OpReply:
    """Two operators send the same decision at once (the harness holds the run's
    row until both wait on it): a decision holds the run while it decides, so
    exactly one is taken and the other, finding the run no longer paused, is
    refused; one audit row (judged below), one move. The reply that was taken."""
    other = ctx.env.start_worker("ctl2", "ops", role="operator")
    with checkers.row_locked(ctx, "agent_runs", "run_id", args["run_id"]) as lock:
        first = ctx.op_async(ctl, "decide", args)
        second = ctx.op_async(other, "decide", args)
        waiting = lock.wait_for_waiters(["ctl", "ctl2"])
    replies = [first.result(15.0), second.result(15.0)]
    # The fault is the harness's hold; whether the decisions waited on it is
    # the implementation's answer (blind hunt 57 #07: decisions that skipped
    # the locked run and answered RunNotFound had turned a fail into unknown).
    ctx.fault(
        "both decisions were sent while the harness held the run's row",
        True,  # row_locked found and locked the row, or the experiment ended inconclusive
        expected="the run's row locked by the harness's own session while both were sent",
        observed="held by the harness from before the first was sent until both were waited for",
    )
    ctx.progress(
        "both operators' decisions waited on the run together",
        waiting is not None,
        expected="a session of each control plane waiting on the run's row while the harness "
        "held it",
        observed=waiting or "not both waited",
    )
    taken = [r for r in replies if r.ok]
    ctx.invariant(
        "exactly one of two simultaneous decisions is taken",
        len(taken) == 1,
        expected=f"one decide {args['decision']} accepted, the other refused (the run is no "
        "longer paused for a person once the first is taken)",
        observed="; ".join(
            f"{w}: {'ok ' + plain(r.result) if r.ok else f'{r.error}: {r.message}'}"
            for w, r in zip(("ctl", "ctl2"), replies, strict=True)
        ),
    )
    return taken[0] if taken else replies[0]


def _bystander_intent(ctx: ExperimentContext) -> tuple[str, str]:
    """Another live run of the tenant with an intent prepared (an ``ops``
    process holds its lease): a terminate cancels its own run's prepared
    operations, never this one (generated mutant: the cancel without its
    run's filter). The run and its operation."""
    other = new_run(ctx, tool="plain")
    op = intent_registered(ctx, ctx.env.start_worker("X", "ops"), other, tool="plain",
                           step_id="create_label")  # fmt: skip
    return other, op


def _bystander_untouched(ctx: ExperimentContext, run_id: str, op_id: str) -> None:
    ops = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    ctx.equal(
        "a terminate cancels no other run's prepared intent",
        ops,
        [(op_id, "prepared")],
        what=f"the ledger of another live run ({run_id[:8]}, its intent registered before the "
        "decision)",
    )


def _resolve_the_second_version(
    ctx: ExperimentContext, ctl: WorkerProcess, run_id: str, code_w3: int | str
) -> tuple[int | str, bool]:
    """The run paused in doubt on version 2, version 1 refused for good: a
    finding on version 1 changes nothing, the one on version 2 resumes the
    run, and a worker finishes it. Returns the last worker's exit and whether
    the finding on version 2 was taken."""
    ops = checkers.ledger(ctx, run_id)
    row = checkers.run_row(ctx, run_id, "the run after version 2's answer was lost")
    versions = [(o["effect_version"], o["status"]) for o in ops]
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.fault(
        "version 2's answer was lost after the tool acted",
        [r["outcome"] for r in sent] == ["rejected_final", "created_then_dropped"],
        expected="creates logged rejected_final, then created_then_dropped",
        observed=f"{[r['outcome'] for r in sent]} (W3 exit {code_w3})",
    )
    # Progress: W3 froze the run on version 2 (a worker that cannot, because
    # version 1 is final, loops until it is killed and leaves it running).
    ctx.progress_equal(
        "the run paused in doubt on version 2",
        (row["status"], versions),
        ("paused_indoubt", [(1, "failed_final"), (2, "unknown")]),
        what=f"(run status, ledger) (W3 exit {code_w3})",
    )
    if row["status"] != "paused_indoubt" or len(ops) != 2:
        return code_w3, False
    v1, v2 = (str(o["operation_id"]) for o in ops)
    probe, changed = op_and_changes(
        ctx,
        ctl,
        "resolve_indoubt",
        run_id=run_id,
        operation_id=v1,
        decision="executed",
        remote_id="res-named-by-mistake",
        reason="refusal probe: the version that is not in doubt",
    )
    after = [(o["effect_version"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    ctx.invariant(
        "a finding on an operation not in doubt changes nothing",
        not probe.ok and not changed and after == versions,
        expected=f"resolve_indoubt naming version 1 ({versions[0][1]}) refused: no audited "
        "change by the operator's session, the ledger as before",
        observed=f"reply {'ok' if probe.ok else probe.error}; audited changes "
        f"{[(c['tbl'], c['op']) for c in changed] or 'none'}; ledger {plain(after)}",
    )
    if probe.ok or changed:
        return code_w3, False  # the state moved under the probe: judged above
    remote = sent[1].get("resource_id") if len(sent) == 2 else None
    finding = ctx.op(
        ctl,
        "resolve_indoubt",
        run_id=run_id,
        operation_id=v2,
        decision="executed",
        remote_id=remote,
        reason="resource found in the tool's console",
        ticket="CS-8",
    )
    ctx.invariant(
        "the finding on the operation in doubt is taken",
        finding.ok,
        expected="resolve_indoubt of version 2 (unknown, its run paused in doubt) accepted",
        observed=f"reply {'ok' if finding.ok else f'{finding.error}: {finding.message}'}",
    )
    if not finding.ok:
        return code_w3, False
    return finish(ctx, ctx.env.start_worker("W4", "run", ["--run-id", run_id, "--once"])), True
