"""Polls and retries are paced (worker contract section 2): from the server's
own count of each statement the experiment's roles ran (pg_stat_statements),
never from what a worker says about itself.

A loop that asks the database the same thing again without a pause (a poll of
a ledger row someone else's claim holds, a retry of a refused write) is a
bound broken even when it ends in time: on a busy system it is the load that
starves everyone else's renewals. Statements are told apart by the server's
normalised text, so one statement run with different values counts as one.

Reconnects are retries too: a worker whose link the harness cut and that
connects again without a pause makes hundreds of attempts a second, none of
which reaches a server. The run's firewall table counts them per link
(harness/parts/port_guard.py).
"""

from __future__ import annotations

from typing import Any

from harness.checking.invariants.model import Evidence, Finding
from harness.checking.invariants.registry import invariant

# One statement, a second of worker lifetime: the correct workers' busiest
# statement stays far under it (docs/worker-contract.md, section 2, has the
# figures); a loop without a pause runs its statement thousands of times.
PACED_STATEMENTS_PER_S = 50.0
# Each ops request the harness sends may run a statement a few times.
STATEMENTS_PER_ASKED_OP = 4
# What any experiment may run without a pause: start-up, a storm's first claims.
STATEMENT_SLACK = 200


def statement_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Calls per normalised statement, summed over the experiment's roles."""
    totals: dict[str, int] = {}
    for r in rows:
        query = " ".join(str(r.get("query") or "").split())
        totals[query] = totals.get(query, 0) + int(r.get("calls") or 0)
    return totals


@invariant(
    "worker.statements_are_paced",
    "worker contract section 2 (a poll or retry waits before it asks again; a busy loop is "
    "a bound broken, not a slow pass)",
    f"no statement the experiment's own roles ran (the server's count, pg_stat_statements) ran "
    f"more than {PACED_STATEMENTS_PER_S:g} times a second of the workers' summed lifetime, plus "
    f"{STATEMENTS_PER_ASKED_OP} per ops request the harness sent and {STATEMENT_SLACK} more",
)
def statements_are_paced(ev: Evidence) -> Finding:
    if ev.statements_called is None:
        why = f" ({ev.server_counts_unknown})" if ev.server_counts_unknown else ""
        return Finding(0, [], f"the server's count of statements is not known{why}: not judged")
    totals = statement_totals(ev.statements_called)
    lived = sum(max(0.0, s) for s in ev.worker_lifetimes_s)
    asked = len(ev.replies)
    allowed = int(PACED_STATEMENTS_PER_S * lived) + STATEMENTS_PER_ASKED_OP * asked
    allowed += STATEMENT_SLACK
    busiest = max(totals.items(), key=lambda kv: kv[1], default=("", 0))
    note = (
        f"{len(totals)} statement(s); the busiest ran {busiest[1]} time(s) in {lived:.1f} "
        f"worker-second(s), {asked} ops request(s) sent; at most {allowed} allowed"
    )
    bad = [
        {
            "statement": query[:300],
            "calls": calls,
            "worker_seconds": round(lived, 3),
            "ops_requests": asked,
            "allowed": allowed,
            "per_worker_second": round(calls / lived, 1) if lived > 0 else None,
        }
        for query, calls in totals.items()
        if calls > allowed
    ]
    return Finding(len(totals), bad, note)


# Connection attempts on one link, a second of worker lifetime: a correct
# worker connects once per session and again after a failure, after a pause
# (docs/worker-contract.md, section 2, has the figures); one that reconnects in
# a loop makes hundreds a second.
PACED_CONNECTS_PER_S = 10.0
# Each worker opens its sessions at start; each ops request may open one more
# (a tool call, a fresh session after an error).
CONNECTS_PER_WORKER = 10
CONNECTS_PER_ASKED_OP = 3
CONNECT_SLACK = 100
# While the harness holds a link cut, every attempt is refused at once, so a
# loop without a pause spins: at most this many attempts per worker started,
# plus as many per second of the cut and worker (a session's reconnects with
# a pause of at least 50 ms that doubles come to a handful in any cut).
CUT_CONNECTS_PER_WORKER = 10
CUT_CONNECTS_PER_WORKER_S = 20.0


@invariant(
    "worker.connections_are_paced",
    "worker contract section 2 (a reconnect is a retry: it waits before it asks again)",
    f"no worker link of the experiment saw more connection attempts (the run's firewall "
    f"table's count of TCP SYNs to the link) than {PACED_CONNECTS_PER_S:g} a second of the "
    f"workers' summed lifetime, plus {CONNECTS_PER_WORKER} per worker started, "
    f"{CONNECTS_PER_ASKED_OP} per ops request the harness sent and {CONNECT_SLACK} more; and "
    f"while the harness held a link cut (every attempt refused at once), no more than "
    f"{CUT_CONNECTS_PER_WORKER} per worker started plus {CUT_CONNECTS_PER_WORKER_S:g} per "
    f"second of the cut and worker",
)
def connections_are_paced(ev: Evidence) -> Finding:
    if ev.connection_attempts is None:
        why = f" ({ev.connections_unknown})" if ev.connections_unknown else ""
        return Finding(0, [], f"the links' connection attempts are not known{why}: not judged")
    lived = sum(max(0.0, s) for s in ev.worker_lifetimes_s)
    workers = len(ev.worker_lifetimes_s)
    asked = len(ev.replies)
    allowed = int(PACED_CONNECTS_PER_S * lived) + CONNECTS_PER_WORKER * workers
    allowed += CONNECTS_PER_ASKED_OP * asked + CONNECT_SLACK
    counts = ev.connection_attempts
    cuts = [
        (f"{c['link']} cut {float(c['seconds']):.3f} s: {int(c['attempts'])}") for c in ev.link_cuts
    ]
    note = (
        f"connection attempts per link {dict(sorted(counts.items()))} in {lived:.1f} "
        f"worker-second(s) of {workers} worker(s), {asked} ops request(s) sent; at most "
        f"{allowed} allowed per link; during cuts: {'; '.join(cuts) or 'no cut'}"
    )
    bad: list[dict[str, Any]] = [
        {
            "link": link,
            "attempts": n,
            "worker_seconds": round(lived, 3),
            "workers": workers,
            "ops_requests": asked,
            "allowed": allowed,
            "per_worker_second": round(n / lived, 1) if lived > 0 else None,
        }
        for link, n in sorted(counts.items())
        if n > allowed
    ]
    for cut in ev.link_cuts:
        seconds = max(0.0, float(cut["seconds"]))
        cap = CUT_CONNECTS_PER_WORKER * workers
        cap += int(CUT_CONNECTS_PER_WORKER_S * seconds * max(1, workers))
        if int(cut["attempts"]) > cap:
            bad.append(
                {
                    "link": cut["link"],
                    "cut_seconds": round(seconds, 3),
                    "attempts_during_the_cut": int(cut["attempts"]),
                    "workers": workers,
                    "allowed": cap,
                }
            )
    return Finding(len(counts) + len(ev.link_cuts), bad, note)
