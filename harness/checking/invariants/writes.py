"""Protected writes (SPEC rules 2, 3): who may write, and what one write is.

A *protected write* is a transaction that inserts a checkpoint row: the
contract (section 6) makes every write that changes a run's revision insert
exactly one checkpoint of that revision, with one outbox event of the same
event_id, in the same transaction. The lease a write ran under is read from
the same transaction's change of agent_runs (the row lock serialises it with
every grant), or, when a worker's write does not touch agent_runs, from the
last audited state of the run before it.
"""

from __future__ import annotations

from typing import Any

from harness.checking.invariants.model import Change, Evidence, Finding, group, ts
from harness.checking.invariants.registry import invariant


def protected_writes(ev: Evidence) -> list[Change]:
    """Checkpoint inserts made by the protocol (not planted by the harness)."""
    return [c for c in ev.of("agent_checkpoints", "INSERT") if not c.by_harness]


def lease_at(ev: Evidence, write: Change) -> dict[str, Any] | None:
    """The run's lease (owner, epoch, lease_expires_at) as the write found it."""
    run_id = str(write.row.get("run_id"))
    same_tx = [
        c
        for c in ev.in_tx(write.txid, "agent_runs")
        if c.op == "UPDATE" and str(c.row.get("run_id")) == run_id
    ]
    if same_tx:
        return same_tx[0].old
    before = [
        c
        for c in ev.of("agent_runs")
        if c.seq < write.seq and str(c.row.get("run_id")) == run_id and c.new is not None
    ]
    return before[-1].new if before else None


@invariant(
    "write.only_under_the_current_unexpired_lease",
    "SPEC rules 2, 5; English seed §6, §7",
    "every protected write (checkpoint, intent, tool result, completion, failure, freeze, "
    "and the outbox row with it) carries the owner and epoch that held the run's lease when "
    "it wrote, and that lease had not expired when its transaction began",
)
def only_under_current_lease(ev: Evidence) -> Finding:
    bad = []
    writes = protected_writes(ev)
    for w in writes:
        lease = lease_at(ev, w)
        why = []
        if lease is None:
            why.append("no lease state of the run before the write")
        else:
            if lease.get("owner") != w.row.get("owner"):
                why.append(f"lease owner {lease.get('owner')!r}")
            if lease.get("epoch") != w.row.get("epoch"):
                why.append(f"lease epoch {lease.get('epoch')}")
            expiry = ts(lease.get("lease_expires_at"))
            if expiry is None or expiry <= w.tx_start:
                why.append(f"lease expires {lease.get('lease_expires_at')}, tx began {w.tx_start}")
        if why:
            row = w.brief("run_id", "revision", "epoch", "owner", "event_id")
            row["why"] = "; ".join(why)
            bad.append(row)
    return Finding(len(writes), bad)


@invariant(
    "write.revision_advances_by_one",
    "SPEC rule 3; English seed §2 (revision), §6",
    "each change of agent_runs.revision is revision + 1, and each checkpoint carries the "
    "revision its own transaction gave the run",
)
def revision_advances_by_one(ev: Evidence) -> Finding:
    bad, checked = [], 0
    for c in ev.of("agent_runs", "UPDATE"):
        if not c.changed("revision"):
            continue
        checked += 1
        if int(c.after("revision")) != int(c.before("revision")) + 1:
            bad.append(c.brief("run_id", "revision", "epoch"))
    for w in protected_writes(ev):
        run_id = str(w.row.get("run_id"))
        same = [
            c
            for c in ev.in_tx(w.txid, "agent_runs")
            if c.op == "UPDATE" and str(c.row.get("run_id")) == run_id
        ]
        checked += 1
        if not same or same[-1].after("revision") != w.row.get("revision"):
            row = w.brief("run_id", "revision", "epoch")
            row["why"] = (
                "no change of the run's revision in the same transaction"
                if not same
                else f"run revision became {same[-1].after('revision')} in that transaction"
            )
            bad.append(row)
    return Finding(checked, bad)


@invariant(
    "write.revisions_gapless",
    "SPEC rule 3; worker contract §6 (every revision has a checkpoint)",
    "each run's checkpoints are revisions 1..N with no gap, and agent_runs.revision is N",
)
def revisions_gapless(ev: Evidence) -> Finding:
    by_run = group(ev.rows("agent_checkpoints"), lambda r: str(r["run_id"]))
    bad = []
    runs = ev.rows("agent_runs")
    for run in runs:
        revs = sorted(int(r["revision"]) for r in by_run.get(str(run["run_id"]), []))
        current = int(run.get("revision") or 0)
        if revs != list(range(1, current + 1)):
            bad.append(
                {
                    "run_id": str(run["run_id"]),
                    "run_revision": current,
                    "checkpoint_revisions": revs,
                }
            )
    return Finding(len(runs), bad)


@invariant(
    "write.run_names_its_checkpoints_schema_version",
    "SPEC rule 13; worker contract §6 (agent_runs.checkpoint_schema_version)",
    "a protected write that inserts a checkpoint leaves the run, in the same transaction, "
    "naming that checkpoint's schema_version: a reader that goes by the run row decodes the "
    "latest checkpoint as the version it is",
)
def run_names_its_checkpoints_version(ev: Evidence) -> Finding:
    if ev.declares("agent_runs", "checkpoint_schema_version") is False:
        return Finding(0, [], "the mapping gives checkpoint_schema_version no value: not judged")
    bad = []
    writes = protected_writes(ev)
    for w in writes:
        run_id = str(w.row.get("run_id"))
        rows = [
            c
            for c in ev.in_tx(w.txid, "agent_runs")
            if c.op == "UPDATE" and str(c.row.get("run_id")) == run_id
        ]
        if not rows:
            continue  # no run row in the trail of its transaction: judged by the write checks
        named = rows[-1].after("checkpoint_schema_version")
        if named != w.row.get("schema_version"):
            row = w.brief("run_id", "revision", "schema_version")
            row["run_names"] = named
            bad.append(row)
    return Finding(len(writes), bad)


@invariant(
    "write.checkpoint_and_outbox_event_in_one_transaction",
    "SPEC rule 2; English seed §6, §9.1",
    "every checkpoint has exactly one outbox event with its event_id, inserted in the same "
    "transaction",
)
def checkpoint_with_outbox_event(ev: Evidence) -> Finding:
    events = group(ev.of("outbox", "INSERT"), lambda c: str(c.row.get("event_id")))
    bad = []
    writes = protected_writes(ev)
    for w in writes:
        mine = events.get(str(w.row.get("event_id")), [])
        if len(mine) != 1 or mine[0].txid != w.txid:
            row = w.brief("run_id", "revision", "event_id")
            row["outbox_inserts"] = [{"seq": c.seq, "txid": c.txid} for c in mine]
            bad.append(row)
    return Finding(len(writes), bad)
