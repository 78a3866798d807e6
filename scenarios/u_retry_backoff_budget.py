"""U: transient refusals are retried with growing, jittered backoff, and the
attempt budget ends in a pause for a person, never in a loop.

The tool answers every create with 429 (proof it did not act, "retry
later"). Three runs of the same tenant are worked by one ``run``-mode worker.
The harness reads every requeue of each row from its audit trail (as
superuser): each requeue stores ``next_attempt_at``; nothing may claim
the run before it; the delay grows from attempt to attempt; the runs'
delays differ (jitter); after ``max_attempts`` attempts the run is paused
for a human and the tool hears no more of it. Delays are measured values,
compared with a stated tolerance (``DELAY_TOLERANCE_MS``), never by their
last digit.

Then a person retries the first run's task (its budget spent) once the tool
accepts again: the retry is a new run with the contract's initial values (a
fresh attempt budget, never the spent one: a retried run that started with
the old attempt count would pause for a human at its first requeue, or
never be worked), which a worker finishes; the old run is left as it was.
Then a run given two attempts is refused once and requeued: its last
attempt, which the tool accepts, must finish it (the budget ends a run only
at a requeue past it, never at another write of its last attempt). Last, a
run whose first holder dies right after its claim is taken over within the
same attempt (a newer epoch, the same attempt count) and its successor is
refused: that requeue's delay must be the declared one for its attempt.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, plain
from harness.parts.control import Crash
from harness.parts.processes import WorkerProcess
from harness.waiting import WaitTimeout, wait_for
from scenarios.common import (
    cancel_ends_a_paused_run,
    control_plane,
    finish,
    finish_or_take_over,
    new_run,
    seen_within,
    wait_claimable,
    writes_name_workflow_steps,
)

SPEC = ExperimentSpec(
    id="U",
    title="retry backoff and budget",
    seed_section="Chinese seed §3.1, §10 (retries, attempt budget); English seed §7",
    invariant="a requeued run is not claimed before its next_attempt_at; the delay grows "
    "with every attempt (measured delays, 1 ms tolerance) and differs between runs (jitter: "
    "three runs' delays not all within 0.5 ms at every attempt); after max_attempts the run is "
    "paused for a human and no further request reaches the tool",
    fault="the tool refuses every create with 429 (retry later); then a retry of a run whose "
    "attempt budget is spent; then a run taken over within its first attempt (its first "
    "holder SIGKILLed at after_lease_acquired) whose successor is refused with 429",
    needs=(*needs.capabilities("workflow", "ledger"), needs.point("after_lease_acquired")),
    rules=(4, 5),
    natural_wait_s=0.9,
    # The requeue and its attempt budget on each write path the worker declares.
    variants=("fast", "stepped"),
    variant_write_paths=(("stepped", "stepped"),),
)

ATTEMPTS = 3
# A delay is measured from the database: the requeue's next_attempt_at minus
# the updated_at the same transaction wrote (the audit trail's new row). Two
# clock readings of one transaction lie microseconds apart, so a delay carries
# that much noise: a worker whose jitter is the same for every run showed
# 170.999 ms and 170.998 ms. Delays count as different (or as grown) only
# beyond this stated tolerance, which is far below any jitter or growth the
# contract asks for.
DELAY_TOLERANCE_MS = 1.0
# Jitter is judged on RUNS runs: a worker whose jitter is the same for every
# run gives every run the same delay at every attempt. A correct one can too,
# by chance: the reference's equal jitter, drawn in whole milliseconds, made
# two runs' delays 1 ms apart at both attempts (104/105, 338/337 ms), once in
# a CI run. With three runs, all three coinciding at both attempts has a
# chance of 1/100^2 * 1/200^2 (2.5e-9) for it. Delays count as the same
# within JITTER_SAME_MS: above the microseconds two clock readings of one
# transaction differ by, below the 1 ms a millisecond-drawn jitter moves.
RUNS = 3
JITTER_SAME_MS = 0.5
#: Workers started after the first one exits while the budget is unfinished.
SUCCESSORS = 4


def run(ctx: ExperimentContext) -> None:
    ctl = control_plane(ctx)
    runs = [_plain_run(ctx, "task-u", ATTEMPTS) for _ in range(RUNS - 1)]
    runs.append(_retried_run(ctx, ctl, "task-u", ATTEMPTS))
    for r in runs:
        ctx.note_run(r)
    ctx.env.tool.client().set_fault("plain", "reject_429", count=0)
    ctx.command("tool: every create of 'plain' answers 429 until cleared")
    since = time.time()
    workers = [ctx.env.start_worker("W", "run")]

    def keep_one_working() -> None:
        # A worker whose renewal timed out cancels itself (exit 10), as the
        # protocol says, and a deployment starts another; so does U (a
        # loaded machine left both runs unworked otherwise). Bounded, so a
        # worker that dies at once still leaves the budget unfinished.
        last = workers[-1]
        if last.is_alive() or len(workers) > SUCCESSORS:
            return
        name = f"Ws{len(workers)}"
        ctx.command(f"{last.worker_id} exited with code {last.returncode}; {name} takes over")
        workers.append(ctx.env.start_worker(name, "run"))

    seen = _watch_requeues(ctx, runs, keep_one_working)
    for worker in workers:
        worker.stop(grace_s=2.0)
    requests = checkers.tool_requests(ctx)
    ctx.fault(
        "the tool refused with 429",
        bool(requests) and all(r["outcome"] == "rejected_429" for r in requests),
        expected="every create logged rejected_429 by the tool",
        observed=f"{[r['outcome'] for r in requests]}",
    )
    trail = checkers.audit(ctx)
    for r in runs:
        _judge(ctx, r, seen[r], trail, requests, since)
    _delays_as_declared(ctx, runs)
    _no_dispatch_while_paused(ctx, runs)
    delays = [[d for d, _ in seen[r]] for r in runs]
    spread = [max(at) - min(at) for at in zip(*delays, strict=False)]
    jitter = dict(
        expected=f"measured delays (next_attempt_at - updated_at, audit trail) of the {RUNS} "
        f"runs differ by more than {JITTER_SAME_MS:g} ms at one of the {ATTEMPTS - 1} attempts "
        "at least",
        observed=f"delays (ms): {[[round(d, 3) for d in ds] for ds in delays]}; spread by "
        f"{[round(a, 3) for a in spread]} ms",
    )
    if all(len(ds) == ATTEMPTS - 1 for ds in delays):
        ctx.invariant("jitter spreads the runs", max(spread) > JITTER_SAME_MS, **jitter)
    else:
        # Jittered delays may coincide by chance; only every attempt of
        # every run together makes it a finding. Fewer requeues are the
        # budget's progress, judged above.
        ctx.not_judged("jitter spreads the runs", **jitter)
    _jitter_past_the_cap(ctx, ctl)
    retried = _retry_after_the_budget(ctx, ctl, runs[0])
    if retried:  # the old run, left paused for a person, is withdrawn
        cancel_ends_a_paused_run(ctx, ctl, runs[0])
    retried.append(_the_last_attempt_finishes(ctx, ctl))
    if ctx.system.capabilities.offers_op("decide"):
        _terminate_keeps_the_budget(ctx, ctl, runs[1])
    taken_over = _requeued_after_a_takeover(ctx, ctl)
    if ctx.system.capabilities.offers_op("decide"):
        _approve_changes_no_other_run(ctx, ctl, runs[2])
    writes_name_workflow_steps(ctx, [*runs, *retried, taken_over])
    checkers.lease_history_is_sound(ctx, [*runs, *retried, taken_over])


def _jitter_past_the_cap(ctx: ExperimentContext, ctl: WorkerProcess) -> None:
    """Three runs that have already been tried often enough for their next
    delay to be capped (planted: ``attempt_count`` set to the attempt before
    the first one whose exponential term is twice the declared cap, to 63
    and to 999, where a shift of a 64-bit integer by the attempt overflows),
    each refused once more with 429: every delay lies within the declared
    bounds (half the cap to the cap, for equal jitter), and the runs' delays
    still differ (blind hunt 66 #04: a Python cap applied to the jittered
    delay instead of the exponential term gave every run exactly the cap
    from attempt 10 on, while U's attempts 1 and 2 kept their jitter; hunt
    67 #07: a Go delay that overflowed from attempt 57 on). Judged where the
    mapping declares a jittered backoff; the chance that three equal-jitter
    delays drawn in whole milliseconds over half a 60 s cap coincide is
    about 1e-9."""
    declared = ctx.system.capabilities.backoff
    name = "jitter spreads the runs past the cap"
    if declared is None or declared.jitter == "none":
        ctx.not_judged(
            name,
            expected="judged where the mapping declares a jittered backoff",
            observed=f"declared backoff: {declared}",
        )
        return
    past = next(n for n in range(1, 64) if declared.base_ms * 2 ** (n - 1) >= 2 * declared.cap_ms)
    tried = {_plain_run(ctx, "task-u-cap", n + 2): n for n in (past - 1, 63, 999)}
    capped = list(tried)
    for run_id, n in tried.items():
        ctx.note_run(run_id)
        ctx.sql(
            f"a run already tried {n} times (planted)",
            "UPDATE fencecheck_model.agent_runs SET attempt_count = %s WHERE run_id = %s "
            "RETURNING run_id, attempt_count, max_attempts",
            [n, run_id],
        )
    # The tool still answers every create with 429 (set above, cleared by the retry).
    worker = ctx.env.start_worker("C", "run")
    requeued = seen_within(
        lambda: (
            all(
                row["attempt_count"] > tried[str(row["run_id"])] and row["status"] != "running"
                for row in ctx.env.query(
                    "SELECT run_id, attempt_count, status FROM fencecheck_model.agent_runs "
                    "WHERE run_id = ANY(%s)",
                    [capped],
                )
            )
            or None
        ),
        what=f"C to work the {len(tried)} planted runs once each",
        timeout_s=15,
    )
    worker.stop(grace_s=2.0)
    rows = _requeues(ctx, capped, "the planted runs' requeues (audit trail)")
    delays = {
        str(r["run_id"]): float(r["delay_ms"])
        for r in rows
        if r["attempt"] == tried[str(r["run_id"])] + 1
    }
    if not ctx.probe_reached(
        f"{len(tried)} runs requeued past the cap",
        bool(requeued) and len(delays) == len(tried),
        judges=name,
        expected=f"C claimed each planted run (attempt_count {sorted(tried.values())}) once, its "
        "create refused with 429, and requeued it at the next attempt",
        observed=f"requeues {[(str(r['run_id'])[:8], r['attempt']) for r in rows]}; C exit "
        f"{worker.returncode}",
    ):
        return
    _delays_as_declared(ctx, capped, name="every delay past the cap within the declared backoff")
    ctx.invariant(
        name,
        max(delays.values()) - min(delays.values()) > JITTER_SAME_MS,
        expected=f"the {len(tried)} runs' capped delays (next_attempt_at - updated_at, audit "
        f"trail) differ by more than {JITTER_SAME_MS:g} ms",
        observed=f"delays (ms) {sorted(round(d, 3) for d in delays.values())}",
    )
    if ctx.system.capabilities.offers_op("cancel"):
        for run_id in capped:  # they would wait half a minute or more
            ctx.op(ctl, "cancel", run_id=run_id, reason="the backoff past the cap was measured")


def _plain_run(ctx: ExperimentContext, task: str, attempts: int) -> str:
    """A new task's run of the ``plain`` tool given ``attempts``; its id. Made
    as every other experiment's runs (``new_run``), with the sensitive values
    the contract says every run the harness creates carries (blind hunt 20:
    U's bare ``{"tool": "plain"}`` inputs judged no sealing)."""
    return new_run(ctx, tool="plain", max_attempts=attempts, task_id=f"{task}-{ctx.uuid()[:8]}")


def _refused_once(
    ctx: ExperimentContext, run_id: str, worker: str
) -> tuple[int, dict[str, Any], list[str]]:
    """Work the run with a new ``run --once`` worker while the tool refuses its
    next create (429): the worker's exit, the run row after, the creates' outcomes."""
    ctx.env.tool.client().set_fault("plain", "reject_429", count=1, run_id=run_id)
    ctx.command(f"tool: the next create of 'plain' for run {run_id[:8]} answers 429")
    code = finish_or_take_over(
        ctx, ctx.env.start_worker(worker, "run", ["--run-id", run_id, "--once"]), run_id
    )
    row = checkers.run_row(ctx, run_id, f"the run after {worker}'s refused create")
    return code, row, [r["outcome"] for r in checkers.tool_requests(ctx, run_id=run_id)]


def _the_last_attempt_finishes(ctx: ExperimentContext, ctl: WorkerProcess) -> str:
    """A run given two attempts whose first create is refused (429) is requeued
    and then worked on its last attempt, which the tool accepts: the budget
    ends a run only at a requeue past it, so that attempt's writes go through
    and the run succeeds with attempt_count 2 of 2. The run's id."""
    run_id = _plain_run(ctx, "task-u-last", 2)
    ctx.note_run(run_id)
    first, requeued, refused = _refused_once(ctx, run_id, "L1")
    name = "the last attempt finishes the run"
    if not ctx.probe_reached(
        "a run requeued once, its last attempt left",
        refused == ["rejected_429"]
        and (requeued["status"], requeued["attempt_count"]) == ("queued", 1),
        judges=name,
        expected="one create refused with 429; the run queued with attempt_count 1 of 2",
        observed=f"creates {refused}; status {requeued['status']}, attempt_count "
        f"{requeued['attempt_count']} (L1 exit {first})",
    ):
        return run_id
    due = f"run {run_id[:8]}'s next attempt to be due by database time"
    if not seen_within(
        lambda: ctx.env.query(
            "SELECT 1 FROM fencecheck_model.agent_runs WHERE run_id = %s "
            "AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())",
            [run_id],
        ),
        what=due,
        timeout_s=30,
    ):
        # L2 may then find nothing due: the progress check below says so.
        ctx.command(f"waited 30 s for {due}; it never came")
    last = finish_or_take_over(
        ctx, ctx.env.start_worker("L2", "run", ["--run-id", run_id, "--once"]), run_id
    )
    done = checkers.run_row(ctx, run_id, "the run after its last attempt")
    ctx.progress_equal(
        name,
        (done["status"], done["attempt_count"]),
        ("succeeded", 2),
        what=f"(status, attempt_count) of a run given 2 attempts (L2 exit {last})",
    )
    return run_id


def _requeued_after_a_takeover(ctx: ExperimentContext, ctl: WorkerProcess) -> str:
    """A run whose first holder dies right after its claim is taken over once
    the lease ran out: a new epoch within the same attempt. The successor's
    create is refused (429) and the run requeued: its delay is the one for
    its attempt, not for its epoch (blind hunt 13 #09: a backoff computed
    from the lease's epoch, "one grant per attempt", waits as if for a later
    attempt). The run's id."""
    run_id = _plain_run(ctx, "task-u-takeover", ATTEMPTS)
    ctx.note_run(run_id)
    ctx.arm("K1", "after_lease_acquired", Crash())
    first = finish(ctx, ctx.env.start_worker("K1", "run", ["--run-id", run_id, "--once"]))
    wait_claimable(ctx, run_id)
    second, row, refused = _refused_once(ctx, run_id, "K2")
    if ctx.probe_reached(
        "a run taken over within its first attempt, then requeued",
        first == -9
        and refused == ["rejected_429"]
        and row["status"] == "queued"
        and row["attempt_count"] == 1
        and row["epoch"] >= 2,
        judges="the requeue after a takeover waits the delay of its attempt",
        expected="K1 killed right after its claim (exit -9); K2 took the run over, its create "
        "refused with 429; the run queued at attempt_count 1 and epoch 2 or more",
        observed=f"K1 exit {first}, K2 exit {second}; creates {refused}; status "
        f"{row['status']}, attempt_count {row['attempt_count']}, epoch {row['epoch']}",
    ):
        _delays_as_declared(
            ctx, [run_id], name="the requeue after a takeover waits the delay of its attempt"
        )
    return run_id


def _retried_run(ctx: ExperimentContext, ctl: WorkerProcess, task: str, attempts: int) -> str:
    """A run whose task has an earlier, cancelled run (a retry of it), where
    the system offers both: the operator's approve at the end then has a
    sibling run to leave alone (blind bug hunt 22, #05: an approve that
    raised the budget of every run of the task, a terminal one included)."""
    caps = ctx.system.capabilities
    first = _plain_run(ctx, task, attempts)
    if not (caps.offers_op("cancel") and caps.offers_op("retry_run")):
        return first
    ctx.note_run(first)
    # Cancelled while it waits out a requeue's backoff (planted: the run's
    # next attempt half a minute ahead; a cancel leaves it as it is): the
    # retry is a new run, due at once (blind hunt 55 #02: a retry that kept
    # the old run's next_attempt_at could not be claimed until it passed).
    ctx.sql(
        "the run waiting out a backoff (planted)",
        "UPDATE fencecheck_model.agent_runs SET next_attempt_at = clock_timestamp() + "
        "interval '30 seconds' WHERE run_id = %s RETURNING next_attempt_at::text",
        [first],
    )
    ctx.ok(ctl, "cancel", run_id=first, reason="withdrawn while it waited out a backoff")
    task_id = checkers.run_row(ctx, first, "the cancelled run, before its retry")["task_id"]
    retry = str(ctx.ok(ctl, "retry_run", task_id=task_id)["run_id"])
    due = ctx.sql(
        "the retry's next attempt against the database's clock",
        "SELECT next_attempt_at::text AS next_attempt_at, "
        "next_attempt_at <= clock_timestamp() AS due "
        "FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [retry],
    )
    ctx.invariant(
        "a retry is due at once, whatever backoff its old run waited out",
        bool(due) and bool(due[0]["due"]),
        expected="the retry's run next_attempt_at no later than now (database time): a new "
        "run, as create_run makes it",
        observed=f"next_attempt_at {due[0]['next_attempt_at'] if due else 'missing'}",
    )
    return retry


def _budget(ctx: ExperimentContext, run_id: str, why: str) -> dict[str, Any]:
    return ctx.sql(
        why,
        "SELECT status, attempt_count, max_attempts FROM fencecheck_model.agent_runs "
        "WHERE run_id = %s",
        [run_id],
    )[0]


def _spent_budget(
    ctx: ExperimentContext, run_id: str, why: str, judged: str
) -> dict[str, Any] | None:
    """The run's budget row when it is paused for a person with its attempts
    spent (the state a decision on a spent budget needs); else None, and the
    check ``judged`` recorded as not judged."""
    row = _budget(ctx, run_id, why)
    if (row["status"], row["attempt_count"]) == ("paused_human", row["max_attempts"]):
        return row
    ctx.not_judged(
        judged,
        expected="a run paused for a person with attempt_count at max_attempts",
        observed=f"not tried: {row['status']}, attempt_count {row['attempt_count']} "
        f"of {row['max_attempts']}",
    )
    return None


def _approve_changes_no_other_run(ctx: ExperimentContext, ctl: WorkerProcess, run_id: str) -> None:
    """An operator's ``decide approve`` of a run paused with its budget spent
    (the contract leaves the budget after an approve to the system; the
    reference grants one more attempt) changes no other run's budget
    (generated mutant 394288ad raised every run's max_attempts; the global
    operator.a_decision_changes_only_its_run judges the whole transaction)."""
    name = "an approve changes no other run's budget"
    if _spent_budget(ctx, run_id, "the third run before the operator's approve", name) is None:
        return
    budgets = (
        "SELECT run_id, max_attempts FROM fencecheck_model.agent_runs WHERE run_id <> %s "
        "ORDER BY run_id"
    )
    before = ctx.sql("every other run's budget before the approve", budgets, [run_id])
    ctx.ok(ctl, "decide", run_id=run_id, decision="approve", reason="budget spent: one more try")
    after = ctx.sql("every other run's budget after the approve", budgets, [run_id])
    ctx.equal(
        name,
        [(str(r["run_id"])[:8], r["max_attempts"]) for r in after],
        [(str(r["run_id"])[:8], r["max_attempts"]) for r in before],
        what="(run, max_attempts) of every other run",
    )


def _no_dispatch_while_paused(ctx: ExperimentContext, runs: list[str]) -> None:
    """Each run paused for a person holds its intent back in prepared (the
    last 429 returned it): a dispatcher's cycle sends only a live run's
    intent, so it sends neither, and the tool hears nothing more."""
    paused = [
        r
        for r in runs
        if checkers.run_row(ctx, r)["status"] == "paused_human"
        and any(o["status"] == "prepared" for o in checkers.ledger(ctx, r))
    ]
    if not paused:
        ctx.not_judged(
            "a dispatcher sends no intent of a run paused for a person",
            expected="judged once a run is paused for a person with its intent prepared",
            observed="no run got there (the budget checks above say why)",
        )
        return
    before = {r: len(checkers.tool_requests(ctx, run_id=r)) for r in paused}
    ledger = {
        r: [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, r)] for r in paused
    }
    dispatcher = ctx.env.start_worker("D", "ops")
    cycles = [ctx.op(dispatcher, "dispatch") for _ in paused]
    after = {r: len(checkers.tool_requests(ctx, run_id=r)) for r in paused}
    moved = {r: [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, r)] for r in paused}
    ctx.invariant(
        "a dispatcher sends no intent of a run paused for a person",
        after == before and moved == ledger,
        expected=f"{len(paused)} paused run(s) with a prepared intent: no create reaches the tool "
        "and no intent is claimed during dispatch cycles",
        observed=f"tool requests per run before {list(before.values())}, after "
        f"{list(after.values())}; ledgers {'unchanged' if moved == ledger else moved}; cycles "
        f"{[c.result if c.ok else c.error for c in cycles]}",
    )


def _requeues(ctx: ExperimentContext, runs: list[str], why: str) -> list[dict[str, Any]]:
    """Every requeue of ``runs`` in the audit trail (an UPDATE that changed the
    revision and left the run queued), in order: run_id, attempt (the
    attempt_count it stored) and its delay, next_attempt_at minus the
    updated_at the same transaction wrote."""
    return ctx.sql(
        why,
        "SELECT new->>'run_id' AS run_id, (new->>'attempt_count')::int AS attempt,"
        " extract(epoch FROM (new->>'next_attempt_at')::timestamptz"
        "  - (new->>'updated_at')::timestamptz) * 1000 AS delay_ms"
        " FROM fencecheck_audit.changes WHERE tbl = 'agent_runs' AND op = 'UPDATE'"
        " AND new->>'run_id' = ANY(%s) AND new->>'status' = 'queued'"
        " AND new->>'revision' IS DISTINCT FROM old->>'revision' ORDER BY seq",
        [runs],
    )


def _delays_as_declared(
    ctx: ExperimentContext,
    runs: list[str],
    name: str = "every delay within the declared backoff for its attempt",
) -> None:
    """Every requeue's delay within the bounds the system declares for its
    attempt (mapping ``capabilities.backoff``), give or take the stated
    tolerance: a jitter that reaches past the exponential delay, or a delay
    of the wrong attempt, is out of them. Declared values, not a comparison
    of two measurements; not judged where nothing is declared."""
    declared = ctx.system.capabilities.backoff
    if declared is None:
        ctx.not_judged(
            name,
            expected="judged where the mapping declares capabilities.backoff",
            observed="the mapping declares no backoff",
        )
        return
    rows = _requeues(ctx, runs, "each requeue's attempt and delay (audit trail)")
    shown, outside = [], []
    for row in rows:
        low, high = declared.bounds_ms(int(row["attempt"]))
        delay = float(row["delay_ms"])
        item = f"{str(row['run_id'])[:8]} attempt {row['attempt']}: {delay:.3f} ms in [{low:g}, {high:g}]"
        shown.append(item)
        if not low - DELAY_TOLERANCE_MS <= delay <= high + DELAY_TOLERANCE_MS:
            outside.append(item)
    ctx.invariant(
        name,
        not outside,
        expected=f"after attempt n a delay within the declared bounds (base {declared.base_ms} ms, "
        f"cap {declared.cap_ms} ms, {declared.jitter} jitter: d = min(base * 2^(n-1), cap)), "
        f"tolerance {DELAY_TOLERANCE_MS:g} ms",
        observed="; ".join(outside) + " (out of bounds)"
        if outside
        else "; ".join(shown) or "no requeue",
    )


def _terminate_keeps_the_budget(ctx: ExperimentContext, ctl: WorkerProcess, run_id: str) -> None:
    """An operator's ``decide terminate`` of a run paused with its budget spent
    ends it (failed) and leaves its budget as it was: a decision spends and
    grants no attempt, and a later retry copies max_attempts from this run."""

    name = "terminate leaves the attempt budget as it was"
    if _spent_budget(ctx, run_id, "the second run, before the operator's terminate", name) is None:
        return
    ctx.ok(ctl, "decide", run_id=run_id, decision="terminate", reason="budget spent: give up")
    after = _budget(ctx, run_id, "the second run after the terminate")
    ctx.equal(
        name,
        (after["status"], after["attempt_count"], after["max_attempts"]),
        ("failed", ATTEMPTS, ATTEMPTS),
        what="(status, attempt_count, max_attempts) of the terminated run",
    )
    # Its intent, back in prepared after the last 429, is cancelled with it:
    # a failed run's intent left prepared is one a dispatcher may still send,
    # and one that keeps its task from ever being purged.
    ledger = [(o["operation_id"], o["status"]) for o in checkers.ledger(ctx, run_id)]
    ctx.equal(
        "terminate cancels the run's prepared intents",
        [op for op, status in ledger if status == "prepared"],
        [],
        what=f"operations of the terminated run still prepared (ledger {ledger})",
    )


def _retry_after_the_budget(ctx: ExperimentContext, ctl: WorkerProcess, old: str) -> list[str]:
    """Retry the task of a run whose attempt budget is spent, with the tool
    accepting again: a new run, starting as create_run's do (contract §6,
    initial values), that a worker finishes; the old run untouched."""
    before = checkers.run_row(ctx, old, "the run to retry")
    spent = ctx.sql(
        "its attempt budget",
        "SELECT attempt_count >= max_attempts AS spent FROM fencecheck_model.agent_runs WHERE run_id = %s",
        [old],
    )
    reached = before["status"] == "paused_human" and bool(spent and spent[0]["spent"])
    if not reached:
        # The budget part above already judged why (a broken invariant there
        # is this experiment's fail); a retry presupposes a spent budget.
        ctx.not_judged(
            "a retry is a new run with a fresh attempt budget",
            expected="a retry of a run paused for a human with attempt_count at max_attempts",
            observed=f"not tried: the run is {before['status']}, attempt_count "
            f"{before['attempt_count']}: its budget was never spent",
        )
        return []
    ctx.fault(
        "the retried run had spent its attempt budget",
        reached,
        expected="paused for a human with attempt_count at max_attempts",
        observed=f"{before['status']}, attempt_count {before['attempt_count']}",
    )
    ctx.env.tool.client().clear_faults()
    ctx.command("tool: 429 cleared; creates are accepted again")
    # `before` (read from the database) shows the run paused, not live: a retry
    # refused as still live is no timing.
    retry = ctx.ok(ctl, "retry_run", task_id=before["task_id"], definite=("RunNotRetryable",))
    new = str(retry["run_id"])
    ctx.note_run(new)
    row = checkers.run_row(ctx, new, "the retry's new run")
    fresh = (row["status"], row["revision"], row["epoch"], row["attempt_count"], row["owner"])
    ctx.invariant(
        "a retry is a new run with a fresh attempt budget",
        new != old and fresh == ("queued", 0, 0, 0, None),
        expected="a new run_id; queued, revision 0, epoch 0, attempt_count 0, no owner "
        "(create_run's initial values), never the spent run's attempt count",
        observed=f"run {new[:8]} (old {old[:8]}): (status, revision, epoch, attempt_count, "
        f"owner) = {fresh}",
    )
    # The budget is the task's: a retry gets as many attempts as the run it
    # retries was given (ATTEMPTS here, never the default), and its input.
    given = {
        str(r["run_id"]): (r["max_attempts"], r["input"])
        for r in ctx.sql(
            "the budget and input of the old run and of its retry",
            "SELECT run_id, max_attempts, input FROM fencecheck_model.agent_runs "
            "WHERE run_id = ANY(%s)",
            [[old, new]],
        )
    }
    ctx.equal(
        "a retry keeps the task's attempt budget and input",
        given.get(new),
        given.get(old),
        what=f"(max_attempts, input) of the retry's run (the old run's: max_attempts {ATTEMPTS})",
    )
    worker = ctx.env.start_worker("W2", "run", ["--run-id", new, "--once"])
    # Under six CPU hogs the Go worker's renewal timed out and it cancelled
    # itself, as it must, leaving the retry running: a successor takes over.
    code = finish_or_take_over(ctx, worker, new)
    after = checkers.run_row(ctx, new, "the retry's run after a worker")
    ctx.progress_equal(
        "the retried run finishes once the tool accepts",
        after["status"],
        "succeeded",
        what=f"status of the retry's run (last worker's exit {code})",
    )
    left = checkers.run_row(ctx, old, "the old run after the retry")
    ctx.equal(
        "the old run is left as it was",
        (left["status"], left["revision"], left["attempt_count"]),
        (before["status"], before["revision"], before["attempt_count"]),
        what="(status, revision, attempt_count)",
    )
    return [new]


def _watch_requeues(
    ctx: ExperimentContext, runs: list[str], keep_one_working: Callable[[], None]
) -> dict[str, list[tuple[float, Any]]]:
    """Wait until every run is paused for a human, then take every requeue
    of each from the audit trail (an UPDATE of agent_runs that changed the
    revision and left the run queued) as (delay ms, next_attempt_at). The
    trail, not a poll: a worker that starts fast requeues and claims again
    within one poll interval of a loaded harness (Go worker, load 8: the
    first requeue of a run was missed)."""

    def paused() -> bool:
        keep_one_working()
        rows = ctx.env.query(
            "SELECT status FROM fencecheck_model.agent_runs WHERE run_id::text = ANY(%s)",
            [runs],
        )
        return all(row["status"] == "paused_human" for row in rows)

    started = time.monotonic()
    try:
        wait_for(
            paused,
            what="every run to spend its attempts and pause for a human",
            timeout_s=12,
            interval_s=0.02,
            max_interval_s=0.05,
        )
    except WaitTimeout:
        # Judged below from what the database shows: a budget that never ends is a fail.
        ctx.command("the runs did not all pause for a human within 12 s")
    seen: dict[str, list[tuple[float, Any]]] = {}
    for r in runs:
        rows = ctx.sql(
            f"requeues of run {r[:8]} (audit trail)",
            "SELECT (new->>'next_attempt_at')::timestamptz AS due,"
            " extract(epoch FROM (new->>'next_attempt_at')::timestamptz"
            "  - (new->>'updated_at')::timestamptz) * 1000 AS delay_ms"
            " FROM fencecheck_audit.changes WHERE tbl = 'agent_runs' AND op = 'UPDATE'"
            " AND new->>'run_id' = %s AND new->>'status' = 'queued'"
            " AND new->>'revision' IS DISTINCT FROM old->>'revision' ORDER BY seq",
            [r],
        )
        seen[r] = [(float(row["delay_ms"]), row["due"]) for row in rows]
    ctx.command(f"waited {time.monotonic() - started:.2f}s; requeues in the trail: {plain(seen)}")
    return seen


def _judge(
    ctx: ExperimentContext,
    run_id: str,
    seen: list[tuple[float, Any]],
    trail: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    since: float,
) -> None:
    """Safety: whatever the run got through, the budget was never overrun nor
    cut short, each delay outgrew the one before, no claim came early.
    Progress: the run got through its whole budget in the time given (on a
    loaded machine renewals time out, workers cancel themselves and the
    time may run out: unmet, not broken, when the timing shows why)."""
    short = run_id[:8]
    row = checkers.run_row(ctx, run_id)
    mine = [r for r in requests if r.get("run_id") == run_id]
    status, attempts = row["status"], row["attempt_count"]
    delays = [d for d, _ in seen]
    grants = [
        r["at"]
        for r in trail
        if str(r["run_id"]) == run_id and r["old_status"] == "queued" and r["status"] == "running"
    ]
    # A takeover of an attempt whose worker cancelled itself mid-call (its
    # renewal timed out) continues that attempt and may send its request
    # again after the tool's 429 (proof it did not act): one more request,
    # no more attempts (six CPU hogs, Go worker: 4 requests for 3 attempts).
    takeovers = [
        r["at"]
        for r in trail
        if str(r["run_id"]) == run_id
        and r["old_epoch"] is not None
        and r["epoch"] > r["old_epoch"]
        and r["old_status"] != "queued"
    ]
    most = ATTEMPTS + len(takeovers)
    shown = (
        f"(status, attempt_count, requests the tool received, requeues, grants): "
        f"({status!r}, {attempts}, {len(mine)}, {len(delays)}, {len(grants)}); "
        f"{len(takeovers)} takeover(s)"
    )
    ctx.invariant(
        f"{short}: the budget is never overrun nor cut short",
        max(attempts, len(delays) + 1, len(grants)) <= ATTEMPTS
        and len(mine) <= most
        and status in ("queued", "running", "waiting_tool", "paused_human")
        and (status != "paused_human" or attempts == ATTEMPTS),
        expected=f"at most {ATTEMPTS} attempts, grants and {ATTEMPTS - 1} requeues, and "
        f"{ATTEMPTS} requests plus one per takeover of an attempt; paused for a person only "
        f"with all {ATTEMPTS} attempts spent; never ended otherwise (the tool only ever "
        "answered 429)",
        observed=shown,
    )
    ctx.progress(
        f"{short}: the budget ends in a pause for a person",
        (status, attempts, len(delays), len(grants))
        == ("paused_human", ATTEMPTS, ATTEMPTS - 1, ATTEMPTS)
        and ATTEMPTS <= len(mine) <= most,
        expected=f"('paused_human', {ATTEMPTS}, {ATTEMPTS}..{most} requests, {ATTEMPTS - 1}, "
        f"{ATTEMPTS}) within 12 s",
        observed=shown,
        since=since,
    )
    ctx.invariant(
        f"{short}: the delay grows with every attempt",
        all(b > a + DELAY_TOLERANCE_MS for a, b in itertools.pairwise(delays)),
        expected=f"each measured delay more than {DELAY_TOLERANCE_MS:g} ms longer than the one "
        "before (judged on every requeue there was; their number is the budget's progress)",
        observed=f"delays (ms): {[round(d, 3) for d in delays]}",
    )
    early = [
        f"grant at {g} before {due}"
        for (_, due), g in zip(seen, grants[1:], strict=False)
        if g < due
    ]
    ctx.invariant(
        f"{short}: never claimed before next_attempt_at",
        not early,
        expected="every grant after a requeue at or after the stored next_attempt_at",
        observed=f"{len(grants)} grant(s); early: {early or 'none'}",
    )
