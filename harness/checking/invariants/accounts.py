"""The workers' accounts against the truth (worker contract, section 4).

A worker's history is never proof, but it can be caught lying: an ``ok`` says
the operation definitely happened, a ``fail`` that it definitely did not
(``info`` may go either way).
"""

from __future__ import annotations

from typing import Any

from harness.checking.invariants.model import Change, Evidence, Finding, group
from harness.checking.invariants.registry import invariant

# Ops whose event_id names something other than the worker's own write.
NOT_WRITES = frozenset({"relay", "consume"})


@invariant(
    "worker.accounts_match_the_evidence",
    "SPEC (evidence, not claims); worker contract §4",
    "every write a worker reported ok (by event_id) is in the outbox, none it reported fail "
    "is (unless it later reported the same event_id ok or info), every claim it reported "
    "ok granted that epoch of that run in the audit trail (to its own session, where its "
    "sessions name it), and none it reported fail was "
    "granted to its own session at the epoch it named (unless it reported that grant ok)",
)
def accounts_match(ev: Evidence) -> Finding:
    # A row the harness itself planted (O[half_found]: an event without its
    # checkpoint) is no write of the worker's.
    planted = {str(c.row.get("event_id")) for c in ev.of("outbox", "INSERT") if c.by_harness}
    events = {str(r["event_id"]) for r in ev.rows("outbox")} - planted
    granted = {
        (str(c.row.get("run_id")), int(c.after("epoch")))
        for c in ev.of("agent_runs")
        if c.after("epoch") is not None and c.after("owner") is not None
    }
    # The session each grant went to (application_name: the worker id).
    granted_to = {
        (str(c.row.get("run_id")), int(c.after("epoch"))): c.app
        for c in ev.of("agent_runs", "UPDATE")
        if c.changed("epoch") and c.after("epoch") is not None and c.after("owner") is not None
    }
    grantees = set(granted_to.values())
    # Worker ids with a history: a grant whose session carries one of them
    # went to that worker (its sessions name it, as PGAPPNAME makes them).
    workers = {e.worker for e in ev.history}
    reported_ok = {
        (e.worker, e.run_id, e.epoch) for e in ev.history if e.op == "claim" and e.type == "ok"
    }
    bad, checked = [], 0
    history = ev.history
    for i, e in enumerate(history):
        why = ""
        if e.event_id is not None and e.op not in NOT_WRITES and e.type in ("ok", "fail"):
            checked += 1
            present = e.event_id in events
            if e.type == "ok" and not present:
                why = "reported ok, but no outbox row has its event_id"
            elif e.type == "fail" and present:
                later = any(
                    x.worker == e.worker and x.event_id == e.event_id and x.type in ("ok", "info")
                    for x in history[i + 1 :]
                )
                if not later:
                    why = "reported fail, but its event_id is in the outbox"
        elif e.op == "claim" and e.type == "ok" and e.run_id and e.epoch is not None:
            checked += 1
            holder = granted_to.get((e.run_id, int(e.epoch)))
            if (e.run_id, e.epoch) not in granted:
                why = "reported a claim the audit trail never granted"
            elif (
                holder is not None
                and holder != e.worker
                and (e.worker in grantees or holder in workers)
            ):
                # Judged only where sessions are told apart by worker id: the
                # claimant got some grant under its own id, or this grant went
                # to another worker's id (a system whose sessions carry another
                # application_name is not judged this way). Blind hunt 58 #03:
                # a takeover of a paused run recorded ok, naming an old grant.
                why = f"reported a claim the audit trail granted to another session ({holder})"
        elif e.op == "claim" and e.type == "fail" and e.run_id and e.epoch is not None:
            checked += 1
            mine = granted_to.get((e.run_id, int(e.epoch))) == e.worker
            if mine and (e.worker, e.run_id, e.epoch) not in reported_ok:
                why = "reported a claim refused, but the audit trail granted it to its own session"
        if why:
            bad.append(
                {
                    "worker": e.worker,
                    "op": e.op,
                    "type": e.type,
                    "run_id": e.run_id,
                    "epoch": e.epoch,
                    "event_id": e.event_id,
                    "time": e.time,
                    "why": why,
                }
            )
    return Finding(checked, bad)


# The error classes of contract section 5 that say the database definitely
# refused (nothing happened): never the outcome of a timeout or a lost link.
DEFINITE_REFUSALS = frozenset(
    {
        "LeaseLost",
        "RevisionConflict",
        "NotClaimable",
        "SchemaVersionUnknown",
        "IntentConflict",
        "LedgerConflict",
        "RunNotFound",
        "TaskExists",
        "RunNotRetryable",
        "InsufficientPrivilege",
        "CheckpointCorrupt",
    }
)


@invariant(
    "worker.refusals_are_not_recorded_unknown",
    "worker contract §4 (`info` is an outcome unknown: a timeout, a lost connection), §5 "
    "(the error classes)",
    "no history line of type `info` names as its error a class section 5 gives to a "
    "definite refusal (LeaseLost, InsufficientPrivilege, IntentConflict, ...): a refusal the "
    "server answered definitely did not happen, so the account is `fail`, not unknown",
)
def refusals_are_not_unknown(ev: Evidence) -> Finding:
    unknown = [e for e in ev.history if e.type == "info"]
    bad = [
        {
            "worker": e.worker,
            "op": e.op,
            "run_id": e.run_id,
            "error": e.error,
            "where": f"{e.source}:{e.line}",
        }
        for e in unknown
        if e.error in DEFINITE_REFUSALS
    ]
    return Finding(len(unknown), bad, f"{len(unknown)} line(s) of type info")


@invariant(
    "worker.history_is_appended_to",
    "worker contract §4 (the history file is opened for appending), §10 (a worker started "
    "again under the same id and history file appends to it, never truncates it)",
    "a worker process started where an earlier process of the same worker id left history "
    "lines leaves those lines as they were: its file still begins with them when judged",
)
def history_is_appended_to(ev: Evidence) -> Finding:
    again = [r for r in ev.history_restarts if r.get("kept") is not None]
    bad = [r for r in again if not r["kept"]]
    return Finding(len(again), bad, f"{len(again)} worker(s) started again on their history")


@invariant(
    "worker.failures_name_their_class",
    "worker contract §4 (`error` is the error class name), §5 (the error classes)",
    "every history line of type `fail` or `info` names its error class: an account that "
    "says an operation did not happen, or may not have, without saying why cannot be told "
    "from a refusal or a lost answer (a timed-out renewal recorded with no class is read "
    "as neither)",
)
def failures_name_their_class(ev: Evidence) -> Finding:
    ended = [e for e in ev.history if e.type in ("fail", "info")]
    bad = [
        {"worker": e.worker, "op": e.op, "type": e.type, "where": f"{e.source}:{e.line}"}
        for e in ended
        if not isinstance(e.error, str) or not e.error.strip()
    ]
    return Finding(len(ended), bad, f"{len(ended)} line(s) of type fail or info")


@invariant(
    "worker.replies_match_the_contract",
    "worker contract §5 (one reply line per request, as ops.schema.json has it)",
    "every reply line a worker's ops session gave matches ops.schema.json: the envelope, "
    "and for an ok reply its operation's result (a reply that misstates what the operation "
    "did in a field the schema fixes, a null item say, is caught here)",
)
def replies_match(ev: Evidence) -> Finding:
    broken = [
        {"worker": r.get("worker"), "op": r.get("op"), "problems": r["schema_problems"][:3]}
        for r in ev.replies
        if r.get("schema_problems")
    ]
    return Finding(
        len(ev.replies),
        broken,
        f"{len(ev.replies)} repl(ies), {len(broken)} breaking the schema",
    )


@invariant(
    "worker.relay_lists_what_it_marked",
    "contract section 5 (relay: published, the event ids marked published in this cycle)",
    "an ok relay reply's published list is exactly the event ids of the outbox rows the "
    "requesting process's sessions marked published between the request and the reply, as "
    "the audit trail saw it; judged only where no other request of that process overlapped "
    "the cycle",
)
def relay_lists_what_it_marked(ev: Evidence) -> Finding:
    cycles = _alone(ev, "relay", "published")
    if not cycles:
        return Finding(0, [], "no relay reply to judge alone")
    marks = [
        c
        for c in ev.of("outbox", "UPDATE")
        if c.changed("published_at") and c.after("published_at") is not None
    ]
    bad: list[dict[str, Any]] = []
    for r in cycles:
        marked = {str(c.row.get("event_id")) for c in _by_the_cycle(r, marks)}
        listed = set(r["published"])
        if listed != marked:
            bad.append(
                {
                    "worker": r["worker"],
                    "listed_not_marked": sorted(listed - marked),
                    "marked_not_listed": sorted(marked - listed),
                }
            )
    return Finding(len(cycles), bad)


TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


@invariant(
    "worker.cancel_reports_the_runs_status",
    "contract section 5 (cancel: run_status, the run's status once the cancel is done)",
    "an ok cancel reply's run_status is the named run's status once the cancel is done, by "
    "the audit trail as it stood at the reply: cancelled, or the terminal status the run "
    "already had; never the status it had before the cancel, nor another run's",
)
def cancel_reports_the_runs_status(ev: Evidence) -> Finding:
    cancels = [r for r in ev.answered_ok("cancel") if isinstance(r.get("run_status"), str)]
    by_run: dict[str, list[Change]] = {}
    for c in ev.of("agent_runs"):
        by_run.setdefault(str(c.row.get("run_id")), []).append(c)
    bad: list[dict[str, Any]] = []
    checked = 0
    for r in cancels:
        changes = by_run.get(str(r["args"].get("run_id")), [])
        before = [c for c in changes if c.seq <= r["seq_before"]]
        during = [c for c in changes if r["seq_before"] < c.seq <= r["seq_after"]]
        if not before and not during:
            continue  # a run the audit trail never saw (missing, another tenant's)
        checked += 1
        had = {str(c.after("status")) for c in during}
        if before:
            had.add(str(before[-1].after("status")))
        # A terminal run changes no more, so its status at the reply is the
        # one the cancel left (a purge's DELETE is no status).
        kept = [c for c in before + during if c.op != "DELETE"]
        done = str(kept[-1].after("status")) if kept else None
        if r["run_status"] not in had or r["run_status"] != done or done not in TERMINAL:
            bad.append(
                {
                    "worker": r["worker"],
                    "run_id": str(r["args"].get("run_id")),
                    "reported": r["run_status"],
                    "the_run_had": sorted(had),
                    "once_cancelled": done,
                }
            )
    return Finding(checked, bad)


@invariant(
    "worker.consume_counts_what_it_applied",
    "contract section 5 (consume: consumed, the messages applied in this cycle)",
    "an ok consume reply's consumed count is the number of dedup rows (consumed_events) the "
    "requesting process's sessions inserted between the request and the reply, as the audit "
    "trail saw it: a duplicate it turned away is no message applied; judged only where no "
    "other request of that process overlapped the cycle",
)
def consume_counts_what_it_applied(ev: Evidence) -> Finding:
    cycles = _alone(ev, "consume", "consumed")
    if not cycles:
        return Finding(0, [], "no consume reply to judge alone")
    inserts = list(ev.of("consumed_events", "INSERT"))
    bad: list[dict[str, Any]] = []
    for r in cycles:
        applied = len(_by_the_cycle(r, inserts))
        if r["consumed"] != applied:
            bad.append(
                {
                    "worker": r["worker"],
                    "consumed": r["consumed"],
                    "duplicates": r.get("duplicates"),
                    "dedup_rows_inserted": applied,
                }
            )
    return Finding(len(cycles), bad)


def _by_the_cycle(reply: dict[str, Any], changes: list[Change]) -> list[Change]:
    """The changes the replying process's sessions made between its request
    and its reply (audit positions)."""
    return [
        c
        for c in changes
        if reply["seq_before"] < c.seq <= reply["seq_after"] and c.app == reply["worker"]
    ]


def _alone(ev: Evidence, op: str, field: str) -> list[dict[str, Any]]:
    """The ok ``op`` replies carrying ``field`` whose process had no other
    request in flight meanwhile (what its sessions changed is then its own)."""
    per_worker = group(ev.replies, lambda r: r.get("worker"))
    return [
        r
        for r in ev.replies
        if r.get("op") == op
        and r.get(field) is not None
        and r.get("seq_before") is not None
        and r.get("seq_after") is not None
        and not any(
            o is not r and o["at"] < r["done"] and o["done"] > r["at"]
            for o in per_worker[r.get("worker")]
        )
    ]


@invariant(
    "worker.reconcile_lists_every_change",
    "contract section 5 (reconcile: its reply lists every operation whose status its cycle "
    "changed)",
    "an ok reconcile reply lists in its changes every operation whose status the requesting "
    "process's sessions changed between the request and the reply, as the audit trail saw it "
    "(a move there and back, unknown -> dispatching -> unknown, is a change), and no other: "
    "an operation it skipped (held by another session, claimed again meanwhile) is no change; "
    "judged only where no other request of that process overlapped the cycle",
)
def reconcile_lists_every_change(ev: Evidence) -> Finding:
    cycles = _alone(ev, "reconcile", "changes")
    if not cycles:
        return Finding(0, [], "no reconcile reply to judge alone")
    moves = [c for c in ev.of("tool_operations", "UPDATE") if c.changed("status")]
    bad: list[dict[str, Any]] = []
    for r in cycles:
        changed = {str(c.row.get("operation_id")) for c in _by_the_cycle(r, moves)}
        missing = sorted(changed - set(r["changes"]))
        unchanged = sorted(set(r["changes"]) - changed)
        if missing or unchanged:
            bad.append(
                {
                    "worker": r["worker"],
                    "listed": r["changes"],
                    "not_listed": missing,
                    "listed_but_not_changed": unchanged,
                }
            )
    return Finding(len(cycles), bad)
