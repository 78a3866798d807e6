"""V[purge]: an operator's retention purge archives, then deletes, old
finished tasks of its own tenant, and nothing else.

Seven tasks: two finished and relayed (eligible), one finished whose outbox
is not relayed yet, one whose run is still queued, one cancelled and relayed
while its operation is dispatching (the tool may act: never purged until it
converges), one whose first run is paused for a person and whose retry
finished (a task is finished only when every run of it is), and a finished,
relayed task of the other tenant under the same task name as an eligible
one. The
operator (tenant 1) purges four times: with a retention of an hour (all
finished seconds ago: nothing goes), with limit 1 (one eligible task goes),
while the harness holds the other eligible task's row locked (it is skipped,
not waited for), and once more (it goes). Judged from the database the
harness reads itself and the archive file the worker wrote:

* purged are exactly the eligible tasks, each with every row of its runs,
  checkpoints, operations and outbox (none left behind);
* the archive holds, per task purged with one, exactly the rows the harness read
  before the purge (appended after a line an earlier purge wrote, which
  stays), and a purge whose archive cannot be written deletes nothing;
* every other task's rows, including the other tenant's, are unchanged;
* each purge call is audited with the number of tasks it purged, and one
  with arguments out of bounds (a negative retention, a limit of 0) is
  refused and audited nowhere.
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, plain
from harness.parts.control import Hold
from harness.parts.processes import WorkerProcess
from scenarios.common import control_plane, finish, finish_or_kill, new_run, op_and_changes

# Per table of the model: the key that tells its rows apart within a run.
ROW_KEYS = {
    "agent_runs": ("run_id",),
    "agent_checkpoints": ("run_id", "revision"),
    "tool_operations": ("operation_id",),
    "outbox": ("event_id",),
}
HOUR_MS = 3_600_000
#: The archive's line from an earlier purge, there before this experiment's.
EARLIER_LINE = json.dumps({"task_id": "archived-by-an-earlier-purge", "runs": []})
RELAY_ROUNDS = 10
#: Between making the eligible tasks and starting their first run.
MADE_TO_RUN_S = 0.4


def run(ctx: ExperimentContext) -> None:
    t2 = ctx.env.other_tenant_id
    made = _db_now(ctx, "database time before the eligible tasks are made")
    eligible = [new_run(ctx, tool="plain") for _ in range(2)]
    live = new_run(ctx, tool="plain")
    # Left queued until the end, then cancelled: long made, ended just now.
    idle = new_run(ctx, tool="plain")
    tasks = {r: _task_of(ctx, r) for r in (*eligible, live, idle)}
    theirs = new_run(ctx, tool="plain", tenant_id=t2, task_id=tasks[eligible[0]])
    # Room for a cut-off between their making and their first end (the purge
    # between below), which one run alone may otherwise finish too soon for.
    time.sleep(MADE_TO_RUN_S)
    # One after the other: the first is then the older by any measure (made,
    # ended), the one a limit-1 purge must take (contract purge: oldest first).
    codes = [
        finish(ctx, ctx.env.start_worker(f"W{i}", "run", ["--run-id", r, "--once"]))
        for i, r in enumerate(eligible, 1)
    ]
    other = ctx.env.start_worker("T2", "run", ["--run-id", theirs, "--once"], tenant_id=t2)
    inflight, holder = _cancelled_in_flight(ctx)
    tasks[inflight] = _task_of(ctx, inflight)
    paused, retried = _retried_while_paused(ctx)
    tasks[paused] = tasks[retried] = _task_of(ctx, paused)
    unsent, unsent_op = _finished_with_an_unsent_intent(ctx)
    tasks[unsent] = _task_of(ctx, unsent)
    codes.append(finish(ctx, other))
    _relay_all(ctx, "R1", None)
    _relay_all(ctx, "R2", t2)
    unrelayed = new_run(ctx, tool="plain")
    tasks[unrelayed] = _task_of(ctx, unrelayed)
    last = ctx.env.start_worker("W3", "run", ["--run-id", unrelayed, "--once"])
    codes.append(finish(ctx, last))
    mine = [*eligible, live, unrelayed, inflight, paused, retried, unsent]
    before = _rows(ctx, [*mine, theirs], "every row of the eight tasks before the purges")
    status = {r: _one(before["agent_runs"], r)["status"] for r in [*mine, theirs]}
    pending = {
        r: sum(1 for x in before["outbox"] if x["run_id"] == r and not x["published_at"])
        for r in [*mine, theirs]
    }
    in_flight = [o["status"] for o in before["tool_operations"] if o["run_id"] == inflight]
    never_sent = [o["status"] for o in before["tool_operations"] if o["operation_id"] == unsent_op]
    ctx.fault(
        "the tasks are in the states the purge must tell apart",
        [status[r] for r in (*eligible, theirs, unrelayed, live, inflight, retried, paused, unsent)]
        == ["succeeded"] * 4 + ["queued", "cancelled", "succeeded", "paused_human", "succeeded"]
        and pending[eligible[0]] == pending[eligible[1]] == pending[theirs] == 0
        and pending[inflight] == pending[retried] == pending[paused] == pending[unsent] == 0
        and pending[unrelayed] > 0
        and in_flight == ["dispatching"]
        and never_sent == ["prepared"],
        expected="two finished relayed tasks, the other tenant's finished relayed task, a "
        "finished task with unpublished outbox rows, a queued run, a cancelled and relayed "
        "run whose operation is still dispatching (its dispatcher held after its claim), a "
        "task whose first run is paused for a person and whose retry finished, relayed, a "
        "finished and relayed run with an intent never sent (prepared)",
        observed=f"status {plain(status)}, unpublished outbox rows {plain(pending)}, the "
        f"cancelled run's ledger {in_flight}, the unsent intent {never_sent} (exits {codes})",
    )
    ctl = control_plane(ctx)
    archive = ctx.env.log_dir / "purge-archive.jsonl"
    # An archive an earlier purge already wrote to: purges append to it.
    archive.write_text(EARLIER_LINE + "\n", encoding="utf-8")
    archive.chmod(0o666)  # the worker may run as another OS user than the harness
    args: dict[str, Any] = {"reason": "retention", "ticket": "RET-1", "archive": str(archive)}
    _refused_out_of_bounds(ctx, ctl, args)
    first = _purged(ctx, ctx.ok(ctl, "purge", older_than_ms=HOUR_MS, limit=100, **args))
    ctx.equal(
        "nothing finished within the retention is purged",
        first,
        [],
        what="tasks purged with a retention of an hour",
    )
    middle = _purge_between_made_and_ended(ctx, ctl, made, eligible, args)
    _purge_without_room_for_its_archive(ctx, ctl, [tasks[r] for r in eligible], args)
    # A cut-off halfway back to the last eligible end: both are older than it
    # in milliseconds (blind hunt 14 #06: the window read as seconds kept them).
    window_ms = _half_since_the_last_end(ctx, eligible)
    second = _purged(ctx, ctx.ok(ctl, "purge", older_than_ms=window_ms, limit=1, **args))
    ctx.invariant(
        "a purge takes at most its limit, and only eligible tasks",
        len(second) == 1 and set(second) <= {tasks[r] for r in eligible},
        expected=f"one of {sorted(tasks[r] for r in eligible)} (limit 1, older_than_ms "
        f"{window_ms}: half the time since the later of them ended)",
        observed=plain(second),
    )
    ctx.invariant(
        "a limited purge takes the oldest eligible task first",
        len(second) != 1 or second == [tasks[eligible[0]]],
        expected=f"{tasks[eligible[0]]}, made and finished before {tasks[eligible[1]]} "
        "(blind hunt 19 #11: a pick ordered newest first)",
        observed=plain(second),
    )
    rest = [r for r in eligible if tasks[r] not in second]
    locked: list[list[str]] | None = None
    if len(rest) == 1:
        locked = _purge_while_locked(ctx, ctl, tasks[rest[0]], args)
    third = [t for got in locked or [] for t in got] if locked is not None else None
    # The last purge keeps no archive: the archive then holds the first
    # purged task's rows alone (an archive is optional, and its absence must
    # not stop a purge).
    fourth = _purged(
        ctx, ctx.ok(ctl, "purge", older_than_ms=0, limit=100, **{**args, "archive": None})
    )
    purged = [*second, *(third or []), *fourth]
    ctx.equal(
        "exactly the finished, relayed tasks of the operator's tenant are purged",
        sorted(purged),
        sorted(tasks[r] for r in eligible),
        what="task ids the purges reported",
    )
    archived = [r for r in eligible if tasks[r] in [*second, *(third or [])]]
    kept = [live, unrelayed, theirs, inflight, paused, retried, unsent]
    _judge_rows(ctx, before, eligible, kept, archive, archived)
    first_line = next(iter(archive.read_text(encoding="utf-8").splitlines()), None)
    ctx.invariant(
        "the archive is appended to, never rewritten",
        first_line == EARLIER_LINE,
        expected=f"the archive still begins with the line written before the purges: {EARLIER_LINE}",
        observed=f"its first line: {first_line}",
    )
    ctx.release("W4", "after_dispatch_claim_commit")
    finish_or_kill(ctx, holder, 10.0)
    actions = ctx.sql(
        "the purges' audit",
        "SELECT action, ticket, (before->>'tasks')::int AS tasks FROM "
        "fencecheck_model.operator_actions WHERE action = 'purge' ORDER BY id",
    )
    counts = [
        len(first),
        *([len(middle)] if middle is not None else []),
        len(second),
        *[len(got) for got in locked or []],
        len(fourth),
    ]
    ctx.equal(
        "each purge audited with the number of tasks it purged",
        [(a["action"], a["ticket"], a["tasks"]) for a in actions],
        [("purge", "RET-1", n) for n in counts],
        what="operator_actions (action, ticket, tasks)",
    )
    _ended_just_now_after_idling(ctx, ctl, idle, tasks[idle], made, args)
    # Last: a decision the worker wrongly takes leaves the states above intact.
    if ctx.system.capabilities.offers_op("decide"):
        _superseded_decisions_refused(ctx, paused)


def _cancelled_in_flight(ctx: ExperimentContext) -> tuple[str, WorkerProcess]:
    """A run cancelled while its operation is dispatching: W4 is held right
    after its dispatch claim commits, and the control plane cancels the run
    (a cancel leaves dispatching operations as they are: the tool may act).
    Its task is terminal and, once relayed, held back only by that operation."""
    run_id = new_run(ctx, tool="plain")
    ctx.arm("W4", "after_dispatch_claim_commit", Hold())
    holder = ctx.env.start_worker("W4", "run", ["--run-id", run_id, "--once"])
    ctx.reached("W4", "after_dispatch_claim_commit")
    ctx.ok(control_plane(ctx), "cancel", run_id=run_id)
    return run_id, holder


def _retried_while_paused(ctx: ExperimentContext) -> tuple[str, str]:
    """A task whose first run paused for a person (its tool step refused for
    good) and was retried; the retry finished. The task is not finished: its
    first run is still paused, a person may still decide it, so no purge takes
    it however long ago its retry ended (blind hunt 27 #06: a purge that
    judged a task by its active run alone deleted the paused run)."""
    paused = new_run(ctx, tool="plain")
    ctx.env.tool.client().set_fault("plain", "reject_final", count=1, run_id=paused)
    finish(ctx, ctx.env.start_worker("P1", "run", ["--run-id", paused, "--once"]))
    retry = ctx.ok(control_plane(ctx), "retry_run", task_id=_task_of(ctx, paused))
    retried = ctx.note_run(str(retry["run_id"]))
    finish(ctx, ctx.env.start_worker("P2", "run", ["--run-id", retried, "--once"]))
    return paused, retried


def _superseded_decisions_refused(ctx: ExperimentContext, paused: str) -> None:
    """A person's approve or supplement of the paused run a retry superseded
    asks it to go on, which only the task's active run may (contract section
    5, decide): queued again, it would be a live run beside its task's retry,
    able to act at the tool. Each refused, nothing written; the run stays
    paused (blind hunt 41 #04: the refusal covered approve only, and a
    supplement cancelled the run and wrote its input, event and audit)."""
    ctl = control_plane(ctx)
    for decision, extra in (("approve", {}), ("supplement", {"supplement": {"amount": 7}})):
        reply, changes = op_and_changes(
            ctx, ctl, "decide", run_id=paused, decision=decision,
            reason="refusal probe: a run its task's retry superseded", **extra,
        )  # fmt: skip
        status = checkers.run_row(ctx, paused, f"the superseded run after the {decision}")
        ctx.invariant(
            f"a {decision} of a run a retry superseded is refused and writes nothing",
            not reply.ok and not changes and status["status"] == "paused_human",
            expected=f"decide {decision} refused, no audited change, the run still paused_human",
            observed=f"reply {'ok ' + plain(reply.result) if reply.ok else reply.error}; "
            f"{len(changes)} change(s); run {status['status']}",
        )


def _finished_with_an_unsent_intent(ctx: ExperimentContext) -> tuple[str, str]:
    """A run that finished (an ``ops`` complete) with an intent of another
    step registered and never sent: its operation stays prepared, which no
    purge may delete (contract section 5, purge: no operation prepared,
    dispatching or unknown; blind hunt 28 #07: a purge that skipped only
    dispatching and unknown ones took it)."""
    run_id = new_run(ctx, tool="plain")
    w = ctx.env.start_worker("W5", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    intent = ctx.ok(
        w, "register_intent", run_id=run_id, epoch=lease["epoch"],
        expected_revision=lease["revision"], step_id="v.never_sent", effect_version=1,
        tool="plain", request={"kind": "return_label"},
    )  # fmt: skip
    ctx.ok(
        w, "complete", run_id=run_id, epoch=lease["epoch"], owner=lease["owner"],
        expected_revision=intent["revision"], result={"by": "W5"},
    )  # fmt: skip
    return run_id, str(intent["operation_id"])


def _refused_out_of_bounds(ctx: ExperimentContext, ctl: Any, args: dict[str, Any]) -> None:
    """A purge with arguments outside ops.schema.json's bounds is refused and
    changes nothing: a negative retention would put the cut an hour in the
    future (every finished task due), a limit of 0 is no purge at all."""
    for bad in ({"older_than_ms": -HOUR_MS, "limit": 100}, {"older_than_ms": 0, "limit": 0}):
        reply = ctx.op(ctl, "purge", **bad, **args)
        ctx.invariant(
            f"a purge with {plain(bad)} is refused",
            not reply.ok and not (reply.result or {}).get("purged_tasks"),
            expected="an error reply, nothing purged",
            observed=f"{reply.error}: {reply.message}"
            if not reply.ok
            else f"ok, purged {plain(reply.result.get('purged_tasks'))}",
        )


def _purge_while_locked(
    ctx: ExperimentContext, ctl: Any, task: str, args: dict[str, Any]
) -> list[list[str]] | None:
    """Purge while the harness holds ``task``'s row: the purge must skip it,
    not wait for it. Then purge while the harness holds the row of the task's
    run instead: the purge may skip the task or wait for the row, but its
    reply must name the task exactly when it deleted it (blind hunt 46 #08: a
    Go purge that listed a task its guarded delete had refused under its
    locks). What each of the two purges reported; None when the first waited
    (judged broken)."""
    with checkers.row_locked(ctx, "agent_tasks", "task_id", task) as lock:
        pending = ctx.op_async(ctl, "purge", {"older_than_ms": 0, "limit": 100, **args})
        waited = lock.answered_or_waiting(pending, ctl.worker_id)
        ctx.invariant(
            "a purge skips a task another session holds, never waits for it",
            waited is None,
            expected="the purge answered while the harness held the task row locked",
            observed=waited or "answered",
        )
    reply = pending.result(15.0)
    if not reply.ok:
        ctx.invariant(
            "a purge beside a locked task succeeds",
            False,
            expected="ok",
            observed=f"{reply.error}: {reply.message}",
        )
        return None
    got = [str(t) for t in reply.result.get("purged_tasks") or []]
    if waited is None:
        ctx.equal("the locked task is not purged", got, [], what="tasks purged beside the lock")
    run = ctx.env.query(
        "SELECT run_id FROM fencecheck_model.agent_runs WHERE task_id = %s", [task]
    )[0]["run_id"]
    with checkers.row_locked(ctx, "agent_runs", "run_id", run) as lock:
        pending = ctx.op_async(ctl, "purge", {"older_than_ms": 0, "limit": 100, **args})
        waited = lock.answered_or_waiting(pending, ctl.worker_id)
        ctx.command(f"the purge beside the locked run: {waited or 'answered'}")
    beside = pending.result(15.0)
    named = [str(t) for t in (beside.result or {}).get("purged_tasks") or []]
    present = bool(
        ctx.env.query("SELECT 1 FROM fencecheck_model.agent_tasks WHERE task_id = %s", [task])
    )
    ctx.invariant(
        "a purge reports exactly the tasks it deleted",
        beside.ok and (task in named) != present,
        expected=f"{task} named in purged_tasks exactly when it is gone from the database "
        "(the purge skipped it for its locked run, or waited and deleted it)",
        observed=f"reply {plain(named) if beside.ok else beside.error}; task still there: "
        f"{present}",
    )
    return [got, named if beside.ok else []]


def _judge_rows(
    ctx: ExperimentContext,
    before: dict[str, list[dict[str, Any]]],
    purged: list[str],
    kept: list[str],
    archive: Any,
    archived_runs: list[str],
) -> None:
    after = _rows(ctx, [*purged, *kept], "every row of the eight tasks after the purges")
    left = {t: [_key(t, r) for r in rows if r["run_id"] in purged] for t, rows in after.items()}
    ctx.equal(
        "no row of a purged task is left",
        {t: keys for t, keys in left.items() if keys},
        {},
        what="rows of the purged runs still in the database",
    )
    tasks_left = ctx.sql(
        "task rows of the purged runs' tasks, every tenant",
        "SELECT tenant_id::text AS tenant_id, task_id, active_run_id::text AS active_run_id"
        " FROM fencecheck_model.agent_tasks WHERE task_id = ANY(%s) ORDER BY tenant_id",
        [sorted({_one(before["agent_runs"], r)["task_id"] for r in [*purged, *kept]})],
    )
    ctx.invariant(
        "every other task, of either tenant, is unchanged",
        all(
            sorted(map(_canon, (r for r in before[t] if r["run_id"] in kept)))
            == sorted(map(_canon, (r for r in after[t] if r["run_id"] in kept)))
            for t in ROW_KEYS
        )
        # one task row per kept task (a retried task has two runs)
        and len(tasks_left)
        == len(
            {
                (str(r["tenant_id"]), r["task_id"])
                for r in before["agent_runs"]
                if r["run_id"] in kept
            }
        )
        and all(t["active_run_id"] in kept for t in tasks_left),
        expected="the rows of the queued, the unrelayed and the other tenant's task as before; "
        "each of their task rows still naming its run",
        observed="changed: "
        + plain(
            {
                t: sorted(
                    _key(t, r)
                    for r in before[t]
                    if r["run_id"] in kept and _canon(r) not in {_canon(a) for a in after[t]}
                )
                for t in ROW_KEYS
            }
        )
        + f"; task rows {plain(tasks_left)}",
    )
    docs = _archive(archive)
    archived = {
        t: sorted(
            _key(t, r)
            for d in docs
            for run in d.get("runs") or []
            for r in ([run.get("run")] if t == "agent_runs" else run.get(_DOC[t]) or [])
            if isinstance(r, dict)
        )
        for t in ROW_KEYS
    }
    wanted = {
        t: sorted(_key(t, r) for r in before[t] if r["run_id"] in archived_runs) for t in ROW_KEYS
    }
    ctx.equal(
        "the archive holds every row of each task purged with it, and only those",
        archived,
        wanted,
        what=f"row keys in {archive.name} ({len(docs)} documents)",
    )
    # Whole rows, not only their keys: each archived run still holds its input
    # (the order id the harness gave it, a value no other column has; blind
    # hunt 69 #08: a Go archive that left the run's input out, "data
    # minimisation", while the row itself was deleted).
    runs = {
        str(run["run"].get("run_id")): run["run"]
        for d in docs
        for run in d.get("runs") or []
        if isinstance(run, dict) and isinstance(run.get("run"), dict)
    }
    without = [
        r[:8]
        for r in archived_runs
        if (order := (_one(before["agent_runs"], r).get("input") or {}).get("order_id"))
        and not _holds(runs.get(r), order)
    ]
    ctx.invariant(
        "each archived run holds its input",
        not without,
        expected="every archived run's row holds the order id of its input, as the harness "
        "read the row before the purge",
        observed=f"archived runs without it: {without or 'none'} (of {len(archived_runs)})",
    )


def _holds(value: Any, wanted: str) -> bool:
    """Whether ``wanted`` is a string anywhere in ``value`` (a JSON document)."""
    if isinstance(value, dict):
        return any(_holds(v, wanted) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, wanted) for v in value)
    return bool(value == wanted)


_DOC = {"agent_checkpoints": "checkpoints", "tool_operations": "operations", "outbox": "outbox"}


def _archive(path: Any) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    docs = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def _ended_just_now_after_idling(
    ctx: ExperimentContext,
    ctl: WorkerProcess,
    idle: str,
    task: str,
    made: float,
    args: dict[str, Any],
) -> None:
    """A run made at the start and left queued all along is cancelled only
    now and its event relayed: it ended just now, however long ago it was
    made, so a purge whose cut-off lies halfway back to its making must not
    take its task (blind hunt 36 #02: a cancel that left the run's
    updated_at at its creation made it look long ended). The global
    run.purged_only_past_the_retention judges the same by the audit trail."""
    ctx.ok(ctl, "cancel", run_id=idle)
    _relay_all(ctx, "R3", None)
    now = _db_now(ctx, "database time before the purge after the late cancel")
    row = checkers.run_row(ctx, idle, "the idle run after its cancel")
    unpublished = ctx.sql(
        "the idle run's outbox rows not yet published",
        "SELECT count(*) AS n FROM fencecheck_model.outbox WHERE run_id = %s "
        "AND published_at IS NULL",
        [idle],
    )[0]["n"]
    name = "a task that ended just now is not purged, however long ago it was made"
    if not ctx.probe_reached(
        "the idle run was cancelled and relayed long after it was made",
        row["status"] == "cancelled" and not unpublished and now - made >= 1.0,
        judges=name,
        expected="the run cancelled, its outbox published, at least 1 s after it was made",
        observed=f"status {row['status']}, {unpublished} unpublished, made {now - made:.2f} s back",
    ):
        return
    older_than_ms = int((now - made) / 2 * 1000)
    purged = _purged(
        ctx,
        ctx.ok(ctl, "purge", older_than_ms=older_than_ms, limit=100, **{**args, "archive": None}),
    )
    ctx.invariant(
        name,
        task not in purged,
        expected=f"task {task} kept: made {int((now - made) * 1000)} ms back, cancelled just "
        f"now; the cut-off {older_than_ms} ms back",
        observed=f"purged {plain(purged)}",
    )


def _relay_all(ctx: ExperimentContext, name: str, tenant_id: str | None) -> None:
    relay = ctx.env.start_worker(name, "ops", tenant_id=tenant_id)
    for _ in range(RELAY_ROUNDS):
        if not ctx.ok(relay, "relay").get("published"):
            return


def _purged(ctx: ExperimentContext, result: dict[str, Any]) -> list[str]:
    return [str(t) for t in result.get("purged_tasks") or []]


def _db_now(ctx: ExperimentContext, label: str) -> float:
    return float(ctx.sql(label, "SELECT extract(epoch FROM clock_timestamp()) AS now")[0]["now"])


def _purge_between_made_and_ended(
    ctx: ExperimentContext,
    ctl: WorkerProcess,
    made: float,
    eligible: list[str],
    args: dict[str, Any],
) -> list[str] | None:
    """A purge whose cut-off falls after the eligible tasks were made and
    before any of their runs ended: they ended within the retention, so nothing
    goes (blind bug hunt round 4, #07: a cut-off judged by when a run was
    created purged them). None when the gap is too short to place it."""
    # The first to end: a cut-off after it would let that task go, rightly.
    ended = min(
        float(r["ended"])
        for r in ctx.sql(
            "when the eligible runs ended (updated_at)",
            "SELECT extract(epoch FROM updated_at) AS ended FROM fencecheck_model.agent_runs "
            "WHERE run_id = ANY(%s)",
            [eligible],
        )
    )
    now = _db_now(ctx, "database time before the purge between")
    if ended - made < 0.2:  # no room for a cut-off between them
        ctx.not_judged(
            "nothing that ended within the retention is purged, however old",
            expected="a cut-off between the eligible tasks' making and their end",
            observed=f"made and ended {ended - made:.3f}s apart",
        )
        return None
    older_than_ms = int(((now - made) + (now - ended)) / 2 * 1000)
    middle = _purged(ctx, ctx.ok(ctl, "purge", older_than_ms=older_than_ms, limit=100, **args))
    ctx.equal(
        "nothing that ended within the retention is purged, however old",
        middle,
        [],
        what=f"tasks purged with a cut-off {older_than_ms} ms back (the eligible tasks were "
        f"made {int((now - made) * 1000)} ms and ended {int((now - ended) * 1000)} ms back)",
    )
    return middle


def _half_since_the_last_end(ctx: ExperimentContext, eligible: list[str]) -> int:
    """Half the milliseconds since the last of the eligible runs ended, by the
    database's clock (at least 1): a retention both are older than."""
    rows = ctx.sql(
        "milliseconds since the last eligible run ended",
        "SELECT extract(epoch FROM clock_timestamp() - max(updated_at)) * 1000 AS ms "
        "FROM fencecheck_model.agent_runs WHERE run_id = ANY(%s)",
        [eligible],
    )
    ms = rows[0]["ms"] if rows else None
    # None: an earlier purge already deleted them (its own check failed it).
    return 1 if ms is None else max(1, int(float(ms) / 2))


def _purge_without_room_for_its_archive(
    ctx: ExperimentContext, ctl: WorkerProcess, eligible: list[str], args: dict[str, Any]
) -> None:
    """A purge whose archive cannot be written (its path runs through a
    regular file) deletes nothing: every row of a purged task is in the
    archive before the deletion commits (blind bug hunt round 5, #09: an
    archive written after the commit lost the tasks it failed to write)."""
    blocker = ctx.env.log_dir / "purge-archive-blocked"
    blocker.write_text("a regular file: no archive can be made below it\n")
    archive = blocker / "archive.jsonl"
    reply = ctx.op(ctl, "purge", older_than_ms=0, limit=100, **{**args, "archive": str(archive)})
    left = sorted(
        str(r["task_id"])
        for r in ctx.sql(
            "the eligible tasks after the purge whose archive cannot be written",
            "SELECT task_id FROM fencecheck_model.agent_tasks WHERE task_id = ANY(%s) "
            "AND tenant_id = %s",
            [eligible, ctx.env.tenant_id],
        )
    )
    ctx.invariant(
        "a purge whose archive cannot be written deletes nothing",
        left == sorted(eligible),
        expected=f"the eligible tasks {sorted(eligible)} still there after a purge whose "
        f"archive path {archive} runs through a regular file",
        observed=f"left {left}; reply "
        + (f"ok, purged {plain(reply.result.get('purged_tasks'))}" if reply.ok else
           f"{reply.error}: {reply.message}"),
    )  # fmt: skip


def _task_of(ctx: ExperimentContext, run_id: str) -> str:
    return str(checkers.run_row(ctx, run_id, "the run's task")["task_id"])


def _rows(ctx: ExperimentContext, runs: list[str], label: str) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [
            r["row"]
            for r in ctx.sql(
                f"{label}: {t}",
                f"SELECT to_jsonb(x) AS row FROM fencecheck_model.{t} x "
                "WHERE x.run_id::text = ANY(%s)",
                [runs],
            )
        ]
        for t in ROW_KEYS
    }


def _one(rows: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    return next((r for r in rows if r["run_id"] == run_id), {})


def _key(table: str, row: dict[str, Any]) -> str:
    return "/".join(str(row.get(k)) for k in ROW_KEYS[table])


def _canon(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)
