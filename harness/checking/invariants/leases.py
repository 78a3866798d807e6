"""Lease history per run (SPEC rule 1), from the audit trail of agent_runs."""

from __future__ import annotations

from harness.checking.invariants.model import HOLDS_LEASE, Change, Evidence, Finding, ts
from harness.checking.invariants.registry import invariant

# How far past "database time of the change + lease duration" a recorded
# expiry may lie: the function computes the expiry a moment before the
# trigger reads its own clock, so a correct grant is never past it; the
# tolerance only absorbs timestamp rounding.
EXPIRY_TOLERANCE_S = 0.010


def is_grant(c: Change) -> bool:
    """A grant (claim, takeover): the epoch changes, or the lease gets a holder it
    did not have (how a system without a fencing token grants)."""
    if c.op != "UPDATE":
        return False
    return c.changed("epoch") or (c.after("owner") is not None and c.changed("owner"))


def grants(ev: Evidence) -> list[Change]:
    """Changes of agent_runs that grant the lease (claim, takeover)."""
    return [c for c in ev.of("agent_runs", "UPDATE") if is_grant(c)]


@invariant(
    "lease.epoch_grows_by_one_on_every_grant",
    "SPEC rule 1; English seed §5.1",
    "every change of a run's epoch is epoch + 1, whoever receives it; it never goes back",
)
def epoch_grows_by_one(ev: Evidence) -> Finding:
    bad = []
    granted = [c for c in ev.of("agent_runs", "UPDATE") if c.changed("epoch")]
    for c in granted:
        old, new = c.before("epoch"), c.after("epoch")
        if old is None or new is None or int(new) != int(old) + 1:
            bad.append(c.brief("run_id", "epoch", "owner"))
    return Finding(len(granted), bad)


@invariant(
    "lease.one_owner_per_epoch",
    "SPEC rule 1; English seed §2 (epoch)",
    "no epoch of a run is ever held by two owners",
)
def one_owner_per_epoch(ev: Evidence) -> Finding:
    owners: dict[tuple[str, int], set[str]] = {}
    for c in ev.of("agent_runs"):
        row = c.row
        if row.get("owner") is not None and row.get("epoch") is not None:
            owners.setdefault((str(row["run_id"]), int(row["epoch"])), set()).add(row["owner"])
    bad = [
        {"run_id": run, "epoch": epoch, "owners": sorted(who)}
        for (run, epoch), who in owners.items()
        if len(who) > 1
    ]
    return Finding(len(owners), bad)


@invariant(
    "lease.granted_only_when_free_or_expired",
    "SPEC rule 1; English seed §5.1",
    "a grant (epoch change) happens only over a free lease or one expired by database time",
)
def granted_only_when_free_or_expired(ev: Evidence) -> Finding:
    bad = []
    granted = grants(ev)
    for c in granted:
        expiry = ts(c.before("lease_expires_at"))
        if c.before("owner") is not None and expiry is not None and expiry > c.at:
            row = c.brief("run_id", "epoch", "owner")
            row["previous_lease_expires_at"] = c.before("lease_expires_at")
            row["granted_at"] = c.at
            bad.append(row)
    return Finding(len(granted), bad)


@invariant(
    "lease.expiry_within_lease_duration",
    "SPEC rule 1; English seed §5.1, §5.2",
    "after any grant or renewal the lease ends no later than the database time of that change "
    "plus the lease duration (that worker's own where the harness gave it one), and, for a "
    "worker the harness started, no earlier than the lease "
    "duration it was given after the row's previous change committed (an expiry counted from "
    "before the row lock was granted, such as the transaction's start, is short by the wait); "
    f"tolerance {EXPIRY_TOLERANCE_S * 1000:.0f} ms",
)
def expiry_within_lease_duration(ev: Evidence) -> Finding:
    if ev.lease_ttl_ms <= 0:
        return Finding(0, [], "no lease duration known: not judged")
    ttl = ev.lease_ttl_ms / 1000
    bad, checked = [], 0
    seen: dict[str, list[Change]] = {}  # run -> its row's changes so far
    for c in ev.of("agent_runs"):
        earlier = seen.setdefault(str(c.row.get("run_id")), [])
        previous = next((p for p in reversed(earlier) if p.txid != c.txid), None)
        earlier.append(c)
        expiry = ts(c.after("lease_expires_at"))
        if expiry is None or (c.op == "UPDATE" and not c.changed("lease_expires_at")):
            continue
        if c.by_harness:
            continue
        checked += 1
        # A change of the row waits for the previous one's transaction to end:
        # an expiry counted after the lock was granted lies at least the lease
        # duration after that commit, whatever the machine's load.
        asked = ev.lease_ttl_ms_by_app.get(c.app)  # known for the harness's own workers
        floor = previous.visible_at + asked / 1000 if previous is not None and asked else None
        ceiling = asked / 1000 if asked else ttl  # a worker given a lease of its own
        if expiry - c.at > ceiling + EXPIRY_TOLERANCE_S or (
            floor is not None and expiry < floor - EXPIRY_TOLERANCE_S
        ):
            row = c.brief("run_id", "epoch", "owner", "lease_expires_at")
            row["granted_for_ms"] = round((expiry - c.at) * 1000, 1)
            if previous is not None:
                row["after_previous_commit_ms"] = round((expiry - previous.visible_at) * 1000, 1)
            bad.append(row)
    return Finding(checked, bad, f"lease duration {ev.lease_ttl_ms} ms")


@invariant(
    "lease.live_lease_moved_only_by_its_holder",
    "SPEC rule 1; English seed §5.1, §5.3 (release only by the holder)",
    "a live lease (unexpired by database time) changes owner or is cleared only by the session "
    "it was granted to, keeping its epoch (release, completion, a pause), by a cancel of the run "
    "(rule 6), or by a grant over it once it has expired; never by another session",
)
def live_lease_moved_only_by_its_holder(ev: Evidence) -> Finding:
    # "Its owner" is the session the audit trail saw receive the grant, not the
    # owner text a call passes: that text is no secret (contract §7.6), and a
    # session that did not take the lease must not give it up or hand it on.
    holder: dict[str, str] = {}  # run -> session of its latest grant
    bad, checked = [], 0
    for c in ev.of("agent_runs"):
        run = str(c.row.get("run_id"))
        old_owner = c.before("owner")
        expiry = ts(c.before("lease_expires_at"))
        live = c.op == "UPDATE" and old_owner is not None and expiry is not None and expiry > c.at
        granted_to = holder.get(run)
        if (c.op == "INSERT" and c.after("owner") is not None) or is_grant(c):
            holder[run] = c.app
        if not live or not (c.changed("owner") or c.changed("epoch")) or c.by_harness:
            continue
        checked += 1
        why = ""
        if is_grant(c):
            why = "a grant over the live lease"
        elif c.after("status") == "cancelled":
            continue
        elif granted_to is None:
            continue  # granted outside the trail (a harness plant): nobody to compare with
        elif c.app != granted_to:
            why = f"session {c.app!r} moved the lease granted to session {granted_to!r}"
        if why:
            row = c.brief("run_id", "epoch", "owner", "status")
            row["lease_expires_at"] = c.before("lease_expires_at")
            row["why"] = why
            bad.append(row)
    return Finding(checked, bad)


@invariant(
    "lease.takeover_counts_no_attempt",
    "contract §6 (grants: a queued run's attempt_count grows by 1); English seed §5.1",
    "a grant of a run that was not queued (a takeover of an expired lease) leaves attempt_count "
    "as it was: an attempt is counted when a run leaves the queue, never when its work changes "
    "hands, so a run taken over does not spend its budget faster",
)
def takeover_counts_no_attempt(ev: Evidence) -> Finding:
    if ev.declares("agent_runs", "attempt_count") is False:
        return Finding(0, [], "the mapping gives attempt_count no value: not judged")
    bad = []
    taken_over = [c for c in grants(ev) if c.before("status") != "queued" and not c.by_harness]
    for c in taken_over:
        before, after = c.before("attempt_count"), c.after("attempt_count")
        if before is not None and after is not None and int(after) != int(before):
            row = c.brief("run_id", "epoch", "owner", "status")
            row["attempt_count"] = f"{before} -> {after}"
            row["status_before"] = c.before("status")
            bad.append(row)
    return Finding(len(taken_over), bad)


@invariant(
    "lease.takeover_keeps_the_status",
    "contract §6 (grants: only a queued run becomes running; run statuses: only a tool intent "
    "or result moves running and waiting_tool); English seed §5.1",
    "a grant of a run that held a lease (running or waiting_tool, taken over once it expired) "
    "leaves its status as it was: a run waiting for a tool is still waiting for it when its "
    "work changes hands, so its successor looks at the operation in flight first",
)
def takeover_keeps_the_status(ev: Evidence) -> Finding:
    bad = []
    taken_over = [
        c
        for c in grants(ev)
        if c.before("status") in HOLDS_LEASE and c.after("status") is not None and not c.by_harness
    ]
    for c in taken_over:
        if c.after("status") != c.before("status"):
            row = c.brief("run_id", "epoch", "owner")
            row["status"] = f"{c.before('status')} -> {c.after('status')}"
            bad.append(row)
    return Finding(len(taken_over), bad)


def is_renewal(c: Change) -> bool:
    """A renewal: the same holder and epoch, the lease pushed later."""
    if c.op != "UPDATE" or is_grant(c) or c.before("owner") is None:
        return False
    old, new = ts(c.before("lease_expires_at")), ts(c.after("lease_expires_at"))
    return old is not None and new is not None and new > old and not c.changed("owner")


@invariant(
    "lease.renewed_only_while_unexpired",
    "SPEC rule 1; contract `renew` (only while owner and epoch match and the lease is "
    "unexpired by database time); English seed §5.1",
    "a renewal (same owner and epoch, a later expiry) is made only of a lease that had not "
    "expired when the renewing transaction began: an expired lease nobody took over yet is "
    "never revived by its old holder (judged against the transaction's start, so a lease "
    "that ran out while the renewal waited for the row is not counted)",
)
def renewed_only_while_unexpired(ev: Evidence) -> Finding:
    bad = []
    renewals = [c for c in ev.of("agent_runs", "UPDATE") if is_renewal(c) and not c.by_harness]
    for c in renewals:
        expiry = ts(c.before("lease_expires_at"))
        if expiry is not None and expiry <= c.tx_start:
            row = c.brief("run_id", "epoch", "owner", "status")
            row["expired_at"] = c.before("lease_expires_at")
            row["renewed_to"] = c.after("lease_expires_at")
            row["expired_ms_before_the_renewal_began"] = round((c.tx_start - expiry) * 1000, 1)
            bad.append(row)
    return Finding(len(renewals), bad)


# A worker that was not granted a lease asks again after a pause (the
# reference workers poll every 200 ms: 5 a second); the bound is four times
# that, averaged over every worker's life, so only a loop that does not wait
# at all (hundreds of attempts a second) breaks it, however busy the machine.
ACQUIRE_FUNCTIONS = ("fencecheck.claim", "fencecheck.takeover")
PACED_ATTEMPTS_PER_S = 20.0
# Attempts any experiment may make without a pause: the first claims of a
# storm of workers, and the ones the harness asks for itself (ops requests).
PACED_SLACK = 20
ASKED_OPS = ("claim", "takeover")


@invariant(
    "lease.acquisition_attempts_are_paced",
    "worker contract section 2 (a lease not granted is asked for again after a pause; a busy "
    "retry is a bound broken, not a slow pass)",
    f"the database's own count of lease acquisitions ({', '.join(ACQUIRE_FUNCTIONS)}) stays "
    f"within {PACED_ATTEMPTS_PER_S:g} a second of the workers' summed lifetime, plus one for "
    f"each claim or takeover the harness asked for and {PACED_SLACK} more: a worker waiting "
    "for a lease someone else holds does not ask for it in a loop without a pause",
)
def acquisition_attempts_are_paced(ev: Evidence) -> Finding:
    if ev.functions_called is None:
        why = f" ({ev.server_counts_unknown})" if ev.server_counts_unknown else ""
        return Finding(0, [], f"the server's count of function calls is not known{why}: not judged")
    attempts = sum(ev.functions_called.get(f, 0) for f in ACQUIRE_FUNCTIONS)
    if not any(f in ev.functions_called for f in ACQUIRE_FUNCTIONS):
        return Finding(0, [], "no call of the contract's claim or takeover: not judged")
    lived = sum(max(0.0, s) for s in ev.worker_lifetimes_s)
    asked = sum(1 for r in ev.replies if r.get("op") in ASKED_OPS)
    allowed = int(PACED_ATTEMPTS_PER_S * lived) + asked + PACED_SLACK
    note = (
        f"{attempts} acquisition(s) in {lived:.1f} worker-second(s) of "
        f"{len(ev.worker_lifetimes_s)} worker(s), {asked} asked by the harness; at most "
        f"{allowed} allowed"
    )
    bad = []
    if attempts > allowed:
        bad.append(
            {
                "acquisitions": attempts,
                "by_function": {f: ev.functions_called.get(f, 0) for f in ACQUIRE_FUNCTIONS},
                "worker_seconds": round(lived, 3),
                "asked_by_the_harness": asked,
                "allowed": allowed,
                "per_worker_second": round(attempts / lived, 1) if lived > 0 else None,
            }
        )
    return Finding(1, bad, note)
