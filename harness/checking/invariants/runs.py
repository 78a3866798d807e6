"""Runs as a whole (SPEC rules 5, 6, 7): terminal states, retries, liveness."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from harness.checking.invariants.model import (
    HOLDS_LEASE,
    LIVE,
    PURGED_TABLES,
    TERMINAL,
    Change,
    Evidence,
    Finding,
    group,
    ts,
)
from harness.checking.invariants.registry import invariant

# Ledger moves that reconcile an effect already in flight: allowed after the
# run ended, because the tool may have acted (English seed §9.3).
IN_FLIGHT = ("dispatching", "unknown")
SETTLED = ("succeeded", "failed_final", "unknown")


def _run_of(c: Change) -> str:
    return str(c.row.get("run_id"))


@invariant(
    "run.nothing_advances_after_terminal",
    "SPEC rules 5, 6; English seed §7 (terminal states never return)",
    "once a run is succeeded, failed or cancelled, no later transaction changes its status, "
    "revision, epoch or owner, writes a checkpoint for it, or moves its ledger except to "
    "settle an effect already in flight (dispatching/unknown -> succeeded/failed_final/unknown)",
)
def nothing_after_terminal(ev: Evidence) -> Finding:
    ended: dict[str, Change] = {}
    for c in ev.of("agent_runs"):
        if c.after("status") in TERMINAL and _run_of(c) not in ended:
            ended[_run_of(c)] = c
    bad: list[dict[str, Any]] = []
    for c in ev.changes:
        end = ended.get(_run_of(c))
        if end is None or c.seq <= end.seq or c.txid == end.txid or c.by_harness:
            continue
        if c.table != "agent_runs" and not _saw_the_end(c, end):
            continue
        if c.table == "agent_runs" and any(
            c.changed(k) for k in ("status", "revision", "epoch", "owner")
        ):
            bad.append(c.brief("run_id", "status", "revision", "epoch", "owner"))
        elif c.table == "agent_checkpoints" and c.op == "INSERT":
            bad.append(c.brief("run_id", "revision", "epoch", "owner"))
        elif (
            c.table == "tool_operations"
            and c.changed("status")
            and not (c.before("status") in IN_FLIGHT and c.after("status") in SETTLED)
        ):
            bad.append(c.brief("run_id", "operation_id", "status"))
    return Finding(len(ended), bad, f"{len(ended)} run(s) ended")


def _saw_the_end(c: Change, end: Change) -> bool:
    """Whether the transaction of ``c`` began after the run's end was committed,
    so every statement of it saw the run ended. Audit order is not commit
    order: a dispatch claim that read the run live while a cancel had updated
    the run row but not yet committed, and locked a ledger row the cancel had
    not touched, writes after the cancel in the trail yet commits before it
    (the cancel then finds the operation in flight and leaves it, as rule 6
    says). A change to the run row itself waits for the end's row lock, so
    audit order is its commit order. Without commit times: audit order."""
    if end.committed_at is None:
        return True
    return c.tx_start > end.committed_at


@invariant(
    "run.one_live_run_per_task",
    "SPEC rule 7; English seed §2 (run_id), §4",
    "at no point does a task have two runs that are queued, running or waiting_tool",
)
def one_live_run_per_task(ev: Evidence) -> Finding:
    status: dict[str, str] = {}
    task_of: dict[str, tuple[str, str]] = {}
    bad: list[dict[str, Any]] = []
    flagged: set[tuple[str, str]] = set()
    for c in ev.of("agent_runs"):
        run = _run_of(c)
        task_of[run] = (str(c.row.get("tenant_id")), str(c.row.get("task_id")))
        status[run] = str(c.row.get("status")) if c.new is not None else "deleted"
        task = task_of[run]
        live = sorted(r for r, t in task_of.items() if t == task and status[r] in LIVE)
        if len(live) > 1 and task not in flagged:
            flagged.add(task)
            bad.append({"seq": c.seq, "task_id": task[1], "live_runs": live})
    return Finding(len({t for t in task_of.values()}), bad)


@invariant(
    "run.history_is_append_only",
    "SPEC rules 4, 7; English seed §4, §9.3 (modifying a planned effect is a new version)",
    "checkpoints are never updated or deleted; a ledger row never changes its operation, run, "
    "step, effect version, tool or request digest; a run never changes its task or tenant "
    "(a retention purge's deletions are judged by run.only_finished_tasks_are_purged)",
)
def history_is_append_only(ev: Evidence) -> Finding:
    immutable = {
        "agent_checkpoints": None,  # no UPDATE or DELETE at all
        "tool_operations": (
            "operation_id",
            "run_id",
            "step_id",
            "effect_version",
            "tool_name",
            "request_digest",
        ),
        "agent_runs": ("run_id", "task_id", "tenant_id"),
    }
    bad: list[dict[str, Any]] = []
    checked = 0
    purges = ev.purge_txids()
    for c in ev.changes:
        if c.table not in immutable or c.op == "INSERT" or c.by_harness:
            continue
        if c.op == "DELETE" and c.txid in purges:
            continue  # retention: run.only_finished_tasks_are_purged judges it
        checked += 1
        columns = immutable[c.table]
        if c.op == "DELETE" or columns is None or any(c.changed(k) for k in columns):
            bad.append(c.brief(*(columns or ("run_id", "revision"))))
    return Finding(checked, bad)


@invariant(
    "run.every_run_can_progress_at_the_end",
    "SPEC rules 4, 5; English seed §9.3 (unknown converges or a person decides)",
    "when the experiment ends every run is terminal, paused for a person, paused in doubt "
    "with an operation in doubt (unknown or dispatching) named in its ledger or frozen for a "
    "commit read back inconsistent (its agent.commit_inconsistent event: rule 9), queued, or "
    "holding a lease a successor can take over once it expires",
)
def every_run_can_progress(ev: Evidence) -> Finding:
    doubt = group(
        (o for o in ev.rows("tool_operations") if o.get("status") in IN_FLIGHT),
        lambda o: str(o["run_id"]),
    )
    # Rule 9: a checkpoint and its outbox row disagreeing freezes the run in
    # doubt with nothing in its ledger in doubt; a person looks at the event.
    frozen = {
        str(e["run_id"])
        for e in ev.rows("outbox")
        if e.get("event_type") == "agent.commit_inconsistent"
    }
    bad = []
    runs = ev.rows("agent_runs")
    for run in runs:
        status = run.get("status")
        why = ""
        run_id = str(run["run_id"])
        if status == "paused_indoubt" and not doubt.get(run_id) and run_id not in frozen:
            why = "paused in doubt without an operation in doubt in its ledger"
        elif status in HOLDS_LEASE and (
            run.get("owner") is None or not run.get("lease_expires_at")
        ):
            why = "holds no lease (owner or expiry missing): nobody can take it over"
        elif status not in (*TERMINAL, *LIVE, "paused_human", "paused_indoubt"):
            why = f"status {status!r} is not one of the contract's"
        if why:
            bad.append({"run_id": str(run["run_id"]), "status": status, "why": why})
    return Finding(len(runs), bad)


@invariant(
    "run.leaves_doubt_only_with_nothing_in_doubt",
    "SPEC rules 4, 5; English seed §9.3 (unknown waits for the remote fact or a person); "
    "Chinese seed §8.3",
    "a run paused in doubt becomes claimable again (queued, or any live status) only in a "
    "transaction after which none of its operations is in doubt (unknown or dispatching), "
    "whoever moves it: the reconciler, a person's finding or a manual convergence",
)
def leaves_doubt_only_with_nothing_in_doubt(ev: Evidence) -> Finding:
    moves = [
        c
        for c in ev.of("agent_runs", "UPDATE")
        if c.before("status") == "paused_indoubt" and c.after("status") in LIVE and not c.by_harness
    ]
    if not moves:
        return Finding(0, [], "no run left paused_indoubt for a live status")
    ops = group(ev.of("tool_operations"), lambda c: (_run_of(c), str(c.row.get("operation_id"))))
    bad: list[dict[str, Any]] = []
    for move in moves:
        left = []
        for op_id, image, _ in _operations_as_left_by(ops, move):
            if image is not None and image.get("status") in IN_FLIGHT:
                left.append((op_id, image.get("status")))
        if left:
            bad.append({**move.brief("run_id", "status"), "in_doubt": left})
    return Finding(len(moves), bad, f"{len(moves)} run(s) left paused_indoubt")


@invariant(
    "run.freeze_leaves_no_claim_of_its_own",
    "SPEC rules 4, 5; English seed §9.3 (a call without an answer is unknown)",
    "a worker that pauses its run in doubt leaves no operation of the run dispatching under a "
    "live claim its own session made: the freeze turns its own claim unknown in the same "
    "transaction (a claim left live tells a person or a reconciler the request may still be "
    "on its way from a worker that has given it up)",
)
def freeze_leaves_no_claim_of_its_own(ev: Evidence) -> Finding:
    freezes = [
        c
        for c in ev.of("agent_runs", "UPDATE")
        if c.after("status") == "paused_indoubt"
        and c.before("status") in HOLDS_LEASE
        and not c.by_harness
    ]
    if not freezes:
        return Finding(0, [], "no run paused in doubt by a worker")
    ops = group(ev.of("tool_operations"), lambda c: (_run_of(c), str(c.row.get("operation_id"))))
    bad: list[dict[str, Any]] = []
    for freeze in freezes:
        left = []
        for op_id, image, timeline in _operations_as_left_by(ops, freeze):
            claims = [
                c
                for c in timeline
                if c.seq < freeze.seq
                and c.after("status") == "dispatching"
                and c.before("status") != "dispatching"
            ]
            until = ts((image or {}).get("dispatch_until"))
            if (
                image is not None
                and image.get("status") == "dispatching"
                and claims
                and claims[-1].app == freeze.app
                and until is not None
                and until > freeze.at
            ):
                left.append({"operation_id": op_id, "claimed_at_seq": claims[-1].seq})
        if left:
            bad.append({**freeze.brief("run_id", "status"), "own_live_claims": left})
    return Finding(len(freezes), bad, f"{len(freezes)} freeze(s) by a worker")


def _operations_as_left_by(
    ops: dict[tuple[str, str], list[Change]], move: Change
) -> Iterator[tuple[str, dict[str, Any] | None, list[Change]]]:
    """Each operation of ``move``'s run with its row as ``move``'s transaction
    left it, and the operation's whole timeline."""
    for (run_id, op_id), timeline in ops.items():
        if run_id == _run_of(move):
            yield op_id, _as_committed_with(timeline, move), timeline


def _as_committed_with(timeline: list[Change], move: Change) -> dict[str, Any] | None:
    """An operation's row as the transaction of ``move`` left it: its own last
    change of the row, else the last change committed before that transaction
    did (one committed later could not be seen; without commit times, audit
    order stands in)."""
    own = [c for c in timeline if c.txid == move.txid]
    if own:
        return own[-1].new
    until = move.committed_at
    seen = [
        c
        for c in timeline
        if (c.committed_at <= until if until is not None and c.committed_at is not None
            else c.seq < move.seq)
    ]  # fmt: skip
    return seen[-1].new if seen else None


@invariant(
    "run.only_finished_tasks_are_purged",
    "SPEC rule 10 (an unpublished event is never lost); Chinese seed §12 (retention); "
    "English seed §9.3 (unknown waits for a person)",
    "a row of a run, its checkpoints, ledger or outbox is deleted only by a transaction that "
    "deletes the run's task with all its runs; every run deleted was terminal, every "
    "operation deleted settled (not prepared, dispatching or unknown), every outbox row "
    "deleted published",
)
def only_finished_tasks_are_purged(ev: Evidence) -> Finding:
    task_of: dict[str, tuple[str, str]] = {}
    for c in ev.of("agent_runs"):
        task_of[_run_of(c)] = (str(c.row.get("tenant_id")), str(c.row.get("task_id")))
    tasks_deleted = group(
        (c for c in ev.of("agent_tasks", "DELETE") if not c.by_harness), lambda c: c.txid
    )
    bad: list[dict[str, Any]] = []
    checked = 0
    for c in ev.changes:
        if c.op != "DELETE" or c.by_harness or c.table not in PURGED_TABLES:
            continue
        checked += 1
        old = c.old or {}
        gone = {
            (str(d.row.get("tenant_id")), str(d.row.get("task_id")))
            for d in tasks_deleted.get(c.txid, [])
        }
        if c.table == "agent_tasks":
            task = (str(old.get("tenant_id")), str(old.get("task_id")))
            runs = [r for r, t in task_of.items() if t == task]
            deleted = {_run_of(d) for d in ev.in_tx(c.txid, "agent_runs") if d.op == "DELETE"}
            deleted |= {_run_of(d) for d in ev.of("agent_runs", "DELETE") if d.seq < c.seq}
            left = sorted(set(runs) - deleted)
            why = f"its runs {left} are not deleted with it" if left else ""
        elif task_of.get(str(old.get("run_id"))) not in gone:
            why = "its task is not deleted in the same transaction"
        elif c.table == "agent_runs" and old.get("status") not in TERMINAL:
            why = f"the run was {old.get('status')}"
        elif c.table == "tool_operations" and old.get("status") in (*IN_FLIGHT, "prepared"):
            why = f"the operation was {old.get('status')}"
        elif c.table == "outbox" and not old.get("published_at"):
            why = "the outbox row was not published"
        else:
            why = ""
        if why:
            bad.append({**c.brief(*PURGED_TABLES[c.table]), "why": why})
    return Finding(checked, bad)


#: The harness's clock and the database's are one host's clock: this only
#: absorbs rounding of the timestamps.
PURGE_CLOCK_TOLERANCE_S = 0.005


@invariant(
    "run.purged_only_past_the_retention",
    "contract section 5 (purge: tasks whose every run ended older_than_ms ago or earlier)",
    "a run a purge request deleted had ended at least the request's older_than_ms before "
    "the deletion, by the database's clock: judged for each purge request of the harness's "
    "ops log against the runs its process deleted while it ran; the run's end is the later "
    "of its updated_at and the audit time of its last change before the deletion (the "
    "harness's own record: a change that left updated_at behind does not make a run look "
    "long ended)",
)
def purged_only_past_the_retention(ev: Evidence) -> Finding:
    purges = [r for r in ev.answered_ok("purge") if isinstance(r["args"].get("older_than_ms"), int)]
    deleted = [c for c in ev.of("agent_runs", "DELETE") if not c.by_harness]
    # Per run, its changes by transaction: the purge's own transaction may
    # touch the row before it deletes it, which says nothing of its end.
    changes: dict[str, list[tuple[int, float]]] = {}
    for c in ev.of("agent_runs"):
        if c.op != "DELETE":
            changes.setdefault(_run_of(c), []).append((c.txid, c.at))
    bad: list[dict[str, Any]] = []
    checked = 0
    for r in purges:
        window_s = r["args"]["older_than_ms"] / 1000
        for c in deleted:
            if not (r["seq_before"] < c.seq <= r["seq_after"] and c.app == r["worker"]):
                continue
            checked += 1
            stamped = ts((c.old or {}).get("updated_at"))
            changed = max(
                (at for tx, at in changes.get(_run_of(c), []) if tx != c.txid), default=None
            )
            ended = max((t for t in (stamped, changed) if t is not None), default=None)
            if ended is not None and ended > c.at - window_s + PURGE_CLOCK_TOLERANCE_S:
                bad.append(
                    {
                        "run_id": _run_of(c),
                        "older_than_ms": r["args"]["older_than_ms"],
                        "ended_ms_before_the_deletion": round((c.at - ended) * 1000, 1),
                    }
                )
    return Finding(checked, bad)


# The attempt budget a create_run without max_attempts gives (contract
# section 10).
DEFAULT_MAX_ATTEMPTS = 12
# A fresh run's values (contract section 6, initial values), by column.
FRESH = {"status": "queued", "revision": 0, "epoch": 0, "attempt_count": 0, "owner": None}


@invariant(
    "run.created_with_its_initial_values",
    "worker contract §6 (initial values), §10 (max_attempts: a create_run argument, default "
    f"{DEFAULT_MAX_ATTEMPTS})",
    "every run a create_run or retry_run answered ok with was inserted queued, at revision "
    "0, epoch 0, attempt_count 0, with no owner; a create_run's with the max_attempts it was "
    f"given, or {DEFAULT_MAX_ATTEMPTS} when it was given none; a retry_run's with the "
    "max_attempts and input the task's previous run had when the retry was inserted (a "
    "person's supplement included) (columns the mapping gives no value are not judged)",
)
def created_with_initial_values(ev: Evidence) -> Finding:
    inserted = {_run_of(c): c for c in ev.of("agent_runs", "INSERT") if c.new is not None}
    bad: list[dict[str, Any]] = []
    checked = 0
    for r in ev.replies:
        insert = inserted.get(str(r.get("run_id")))
        if insert is None or insert.new is None:
            continue  # no run named, or its insert not audited (a mapped system)
        checked += 1
        expected: dict[str, Any] = dict(FRESH)
        if r.get("op") == "create_run":
            args = r.get("args") or {}
            expected["max_attempts"] = int(args.get("max_attempts") or DEFAULT_MAX_ATTEMPTS)
        elif r.get("op") == "retry_run":
            previous = _previous_run_of_the_task(ev, insert)
            if previous is not None:  # its run made before the audit trail began: not judged
                expected.update({c: previous.get(c) for c in ("max_attempts", "input")})
        wrong = {
            col: {"expected": want, "inserted": insert.new.get(col)}
            for col, want in expected.items()
            if ev.declares("agent_runs", col) is not False
            and col in insert.new
            and insert.new.get(col) != want
        }
        if wrong:
            bad.append({"op": r.get("op"), "run_id": r.get("run_id"), "wrong": wrong})
    return Finding(checked, bad, f"{checked} run(s) created through ops")


def _previous_run_of_the_task(ev: Evidence, insert: Change) -> dict[str, Any] | None:
    """The task's run inserted last before ``insert`` (the one a retry
    supersedes), as it stood just before ``insert``; None if none is audited."""
    task, new_run = insert.row.get("task_id"), _run_of(insert)
    earlier = sorted(
        (
            c
            for c in ev.of("agent_runs")
            if c.seq < insert.seq and c.row.get("task_id") == task and _run_of(c) != new_run
        ),
        key=lambda c: c.seq,
    )
    made = [c for c in earlier if c.op == "INSERT"]
    if not made:
        return None
    previous = _run_of(made[-1])
    return next((c.row for c in reversed(earlier) if _run_of(c) == previous), None)


@invariant(
    "run.attempts_never_exceed_the_budget",
    "worker contract §6 (run statuses: once attempt_count reached max_attempts the run is "
    "paused for a person), §10; English seed §9 (retry budget)",
    "no change leaves a run with attempt_count above max_attempts: a run whose budget is "
    "spent is not granted again until a person's decision gives it another attempt",
)
def attempts_within_budget(ev: Evidence) -> Finding:
    seen = [c for c in ev.of("agent_runs") if c.new is not None and not c.by_harness]
    bad = [
        c.brief("run_id", "status", "epoch", "attempt_count", "max_attempts")
        for c in seen
        if c.new is not None
        and c.new.get("attempt_count") is not None
        and c.new.get("max_attempts") is not None
        and int(c.new["attempt_count"]) > int(c.new["max_attempts"])
    ]
    return Finding(len(seen), bad)
