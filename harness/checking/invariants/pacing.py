"""Polls and retries are paced (worker contract section 2): from the server's
own count of each statement the experiment's roles ran (pg_stat_statements),
never from what a worker says about itself.

A loop that asks the database the same thing again without a pause (a poll of
a ledger row someone else's claim holds, a retry of a refused write) is a
bound broken even when it ends in time: on a busy system it is the load that
starves everyone else's renewals. Statements are told apart by the server's
normalised text, so one statement run with different values counts as one.
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
