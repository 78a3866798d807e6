"""Side effects (SPEC rules 4, 5, 6): the ledger against the tool's own log.

The tool's request and resource log is the second witness: every create
request it received, with the operation_id, run_id and epoch the caller sent
and the outcome (did it act?), and every real resource it made.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from harness.checking.invariants.model import Change, Evidence, Finding, group, ts
from harness.checking.invariants.registry import invariant

# Outcomes in the tool's log that prove it did not act (docs/mock-tool.md).
NOT_ACTED = frozenset(
    {"rejected_429", "rejected_final", "interrupted", "bad_request", "key_reuse_rejected"}
)
# Tools whose promise makes a same-key resend safe.
SAFE_TO_RESEND = frozenset({"idempotent", "deterministic_id"})
# The ledger change of a claim is audited before its COMMIT, the request leaves
# only after that COMMIT, and the result is recorded only after the answer: so
# "the state in force when the request arrived" needs no tolerance (a result
# recorded a millisecond after the request must not count as before it). The
# tolerance only widens the window in which a 429 may justify a return to
# prepared.
CLOCK_TOLERANCE_S = 0.005


def _ledger_changes(ev: Evidence) -> dict[str, list[Change]]:
    return group(ev.of("tool_operations"), lambda c: str(c.row.get("operation_id")))


def _is_claim(c: Change) -> bool:
    """A change into ``dispatching``: a dispatch claim (or a same-key retry's)."""
    return bool(c.after("status") == "dispatching" and c.before("status") != "dispatching")


def _state_at(changes: list[Change], t: float) -> tuple[Change | None, Change | None]:
    """The change in force at time ``t``, and the last claim (change into
    ``dispatching``) made before ``t``."""
    current = claim = None
    for c in changes:
        if c.at > t:
            continue
        current = c
        if _is_claim(c):
            claim = c
    return current, claim


# Ledger statuses a request may meet on arrival: its claim is live, or expired
# and turned unknown while the request was on its way (a claim's expiry does
# not revoke a request already sent; English seed §9.2).
IN_FLIGHT = ("dispatching", "unknown")


def _epoch_at(ev: Evidence, run_id: str, t: float) -> int | None:
    """The run's epoch another session could read at ``t`` (by commit time: a
    takeover audited before a claim may commit after the dispatcher read the
    epoch it sends)."""
    epoch = None
    for c in ev.of("agent_runs"):
        if c.visible_at > t:
            continue
        if str(c.row.get("run_id")) == run_id and c.after("epoch") is not None:
            epoch = int(c.after("epoch"))
    return epoch


@invariant(
    "effect.one_real_resource_per_operation",
    "SPEC rules 4, 5; English seed §8, §11 E",
    "the tool holds at most one real resource per operation_id",
)
def one_resource_per_operation(ev: Evidence) -> Finding:
    per_op = group(
        ev.tool.get("resources", []), lambda r: (r.get("tool"), str(r.get("operation_id")))
    )
    bad = [
        {
            "tool": tool,
            "operation_id": op,
            "resources": [r.get("resource_id") for r in rs],
            "request_seqs": [r.get("request_seq") for r in rs],
        }
        for (tool, op), rs in per_op.items()
        if len(rs) > 1
    ]
    return Finding(len(per_op), bad)


@invariant(
    "effect.versions_of_a_step_count_from_one",
    "SPEC rules 5, 7; English seed §9.3 (modifying a planned effect is a new version)",
    "the intents a run registers for one step carry effect_version 1, then each one more "
    "than the last: a version is the run's own count, never taken from another run's ledger",
)
def versions_count_from_one(ev: Evidence) -> Finding:
    registered: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for c in ev.of("tool_operations"):
        if c.op != "INSERT" or c.by_harness or c.new is None:
            continue
        version, step = c.new.get("effect_version"), c.new.get("step_id")
        if version is None or step is None:  # a system without them (its mapping says so)
            continue
        key = (str(c.new.get("run_id")), str(step))
        registered.setdefault(key, []).append((c.seq, int(version)))
    bad = [
        {"run_id": run, "step_id": step, "versions_in_order": [v for _, v in sorted(seen)]}
        for (run, step), seen in registered.items()
        if [v for _, v in sorted(seen)] != list(range(1, len(seen) + 1))
    ]
    return Finding(len(registered), bad)


# The contract's operation_id: <tenant_id>/<run_id>/<step_id>/v<effect_version>.
# A step id may hold a slash, so the shape is read from both ends.
_CONTRACT_OPERATION_ID = re.compile(r"^([^/]+)/([^/]+)/(.+)/v(\d+)$")


@invariant(
    "effect.operation_id_names_its_intent",
    "SPEC rule 5 (the intent's identity is tenant, run, step and version; worker contract "
    "§6: operation_id is <tenant_id>/<run_id>/<step_id>/v<effect_version>)",
    "an intent a worker registers with an operation_id of the contract's form names its own "
    "row's tenant, run, step and version, in that order (an id of another form, a mapped "
    "system's own, is not judged)",
)
def operation_id_names_its_intent(ev: Evidence) -> Finding:
    judged, bad = 0, []
    for c in ev.of("tool_operations", "INSERT"):
        if c.by_harness or c.new is None:
            continue
        row = c.new
        parts = [row.get(k) for k in ("tenant_id", "run_id", "step_id", "effect_version")]
        if None in parts or not _CONTRACT_OPERATION_ID.match(str(row.get("operation_id") or "")):
            continue  # another form of id, or a mapping without those columns
        judged += 1
        expected = "{}/{}/{}/v{}".format(*parts)
        if row.get("operation_id") != expected:
            bad.append({**c.brief("operation_id", "run_id", "step_id"), "expected": expected})
    return Finding(judged, bad)


@invariant(
    "effect.no_resend_without_idempotency",
    "SPEC rules 4, 5; English seed §9.3 (unknown + no query, no idempotency)",
    "a tool that is neither idempotent nor deterministic-id gets no second create for an "
    "operation once a create for it may have acted (only a proven rejection allows a resend)",
)
def no_resend_without_idempotency(ev: Evidence) -> Finding:
    risky = [r for r in ev.requests() if r.get("capability") not in SAFE_TO_RESEND]
    bad = []
    per_op = group(risky, lambda r: (r.get("tool"), str(r.get("operation_id"))))
    for (tool, op), reqs in per_op.items():
        acted = None
        for r in sorted(reqs, key=lambda r: int(r.get("seq") or 0)):
            if acted is not None:
                bad.append(
                    {
                        "tool": tool,
                        "operation_id": op,
                        "capability": r.get("capability"),
                        "resent_seq": r.get("seq"),
                        "after_seq": acted.get("seq"),
                        "after_outcome": acted.get("outcome"),
                    }
                )
            elif r.get("outcome") not in NOT_ACTED:
                acted = r
    return Finding(len(per_op), bad)


@invariant(
    "effect.sent_only_under_a_dispatch_claim",
    "SPEC rule 4; English seed §8, §9.2",
    "every create request names an operation registered in the ledger for the run it names, "
    "arrives after a dispatch claim of it and while it is still in flight (dispatching, or "
    "unknown after that claim expired), and carries an epoch of that run between the one at "
    "the claim and the current one",
)
def sent_only_under_claim(ev: Evidence) -> Finding:
    ledger = {str(r["operation_id"]): r for r in ev.rows("tool_operations")}
    history = _ledger_changes(ev)
    bad = []
    requests = ev.requests()
    for r in requests:
        op = str(r.get("operation_id"))
        t = float(r.get("received_at") or 0.0)
        why = ""
        row = ledger.get(op)
        if row is None:
            why = "no intent for this operation_id in the ledger"
        elif str(row.get("run_id")) != str(r.get("run_id")):
            why = f"ledger run is {row.get('run_id')}"
        else:
            current, claim = _state_at(history.get(op, []), t)
            status = current.after("status") if current else None
            if claim is None:
                why = f"never claimed for dispatch before it arrived (ledger {status!r})"
            elif status not in IN_FLIGHT:
                why = f"ledger status {status!r} when the request arrived"
            else:
                low = _epoch_at(ev, str(row["run_id"]), claim.visible_at)
                high = _epoch_at(ev, str(row["run_id"]), t)
                epoch = r.get("epoch")
                if not isinstance(epoch, int) or low is None or high is None:
                    why = f"epoch {epoch!r} (run epochs unknown: {low}..{high})"
                elif epoch < max(low, 1) or epoch > high:
                    why = f"epoch {epoch} outside {max(low, 1)}..{high}"
        if why:
            bad.append(
                {
                    "request_seq": r.get("seq"),
                    "tool": r.get("tool"),
                    "operation_id": op,
                    "run_id": r.get("run_id"),
                    "epoch": r.get("epoch"),
                    "received_at": t,
                    "why": why,
                }
            )
    return Finding(len(requests), bad)


def _transitions(ev: Evidence, old: set[str], new: set[str]) -> list[Change]:
    return [
        c
        for c in ev.of("tool_operations", "UPDATE")
        if c.before("status") in old and c.after("status") in new
    ]


@invariant(
    "effect.cancelled_intent_never_sent",
    "SPEC rule 6; English seed §9.3 (prepared + run cancelled)",
    "no create request arrives for an operation after it went from prepared to cancelled",
)
def cancelled_intent_never_sent(ev: Evidence) -> Finding:
    cancelled = _transitions(ev, {"prepared"}, {"cancelled"})
    per_op = group(ev.requests(), lambda r: str(r.get("operation_id")))
    bad: list[dict[str, Any]] = []
    for c in cancelled:
        late = [
            r.get("seq")
            for r in per_op.get(str(c.row.get("operation_id")), [])
            if float(r.get("received_at") or 0) > c.at
        ]
        if late:
            bad.append({**c.brief("operation_id", "status"), "request_seqs": late})
    return Finding(len(cancelled), bad)


@invariant(
    "effect.in_flight_never_marked_cancelled",
    "SPEC rule 6; English seed §9.3 (dispatching/unknown + run cancelled)",
    "a dispatching or unknown operation is never marked cancelled (it may have happened)",
)
def in_flight_never_cancelled(ev: Evidence) -> Finding:
    changes = list(ev.of("tool_operations", "UPDATE"))
    bad = [
        c.brief("operation_id", "status")
        for c in _transitions(ev, {"dispatching", "unknown"}, {"cancelled"})
    ]
    return Finding(len(changes), bad)


@invariant(
    "effect.not_executed_only_where_the_tool_did_not_act",
    "SPEC rules 4, 5; English seed §9.3 (unknown: query, or stay unknown)",
    "an operation a worker records failed_final (the tool did not act) has no resource at the "
    "tool, then or later: 'not found' while a request may still arrive is no proof (an "
    "operator's finding, audited in the same transaction, is the operator's call)",
)
def not_executed_only_where_not_acted(ev: Evidence) -> Finding:
    by_operator = {c.txid for c in ev.of("operator_actions", "INSERT")}
    resources = group(ev.tool.get("resources", []), lambda r: str(r.get("operation_id")))
    recorded = [
        c
        for c in ev.of("tool_operations", "UPDATE")
        if c.after("status") == "failed_final"
        and c.before("status") != "failed_final"
        and not c.by_harness
        and c.txid not in by_operator
    ]
    bad = [
        {
            **c.brief("operation_id", "status"),
            "resources": [r.get("resource_id") for r in found],
            "made_at_request_seqs": [r.get("request_seq") for r in found],
        }
        for c in recorded
        if (found := resources.get(str(c.row.get("operation_id"))))
    ]
    return Finding(len(recorded), bad)


@invariant(
    "effect.refused_step_moved_on_only_by_a_person",
    "SPEC rules 4, 5; Chinese seed §3.1 (PAUSED_HUMAN), §10 (a permanent error waits for a person)",
    "after the tool refused an operation for good (its log: rejected_final, recorded "
    "failed_final), the step's next effect version is registered only after a person's approve "
    "or supplement of that run after the refusal was recorded (the run moved from paused_human "
    "to queued in between): a worker that finds a "
    "refusal nobody paused the run for (its recorder died before the pause, or lost its lease) "
    "pauses the run for a person instead of planning the step again (an ops client's own "
    "register_intent is the client's call, not judged)",
)
def refused_step_moved_on_only_by_a_person(ev: Evidence) -> Finding:
    refused = {
        str(r.get("operation_id")) for r in ev.requests() if r.get("outcome") == "rejected_final"
    }
    recorded: dict[str, Change] = {}
    for c in ev.of("tool_operations", "UPDATE"):
        op = str(c.row.get("operation_id"))
        if op in refused and c.after("status") == "failed_final" and op not in recorded:
            recorded[op] = c
    # A run leaves paused_human for the queue only by a person's approve or
    # supplement (the contract's run statuses); operator_actions is optional.
    decisions = group(
        [
            c
            for c in ev.of("agent_runs", "UPDATE")
            if c.before("status") == "paused_human" and c.after("status") == "queued"
        ],
        lambda c: str(c.row.get("run_id")),
    )
    registered = group(
        ev.of("tool_operations", "INSERT"),
        lambda c: (str(c.row.get("run_id")), str(c.row.get("step_id"))),
    )
    # An ops client's register_intent is the client's decision, not the
    # worker's (G registers a refused step's next version so on purpose).
    asked = [
        (int(r["seq_before"]), r.get("seq_after"), r.get("worker"))
        for r in ev.replies
        if r.get("op") == "register_intent" and r.get("seq_before") is not None
    ]

    def on_request(c: Change) -> bool:
        return any(
            before < c.seq and (after is None or c.seq <= int(after)) and c.app == worker
            for before, after, worker in asked
        )

    checked, bad = 0, []
    for (run, step), inserts in registered.items():
        by_version = {int(c.row.get("effect_version") or 0): c for c in inserts}
        for version, c in sorted(by_version.items()):
            before = by_version.get(version - 1)
            if before is None or c.by_harness or on_request(c):
                continue
            refusal = recorded.get(str(before.row.get("operation_id")))
            if refusal is None:
                continue  # not refused by the tool: a person's finding, a retirement
            checked += 1
            if not any(refusal.seq < d.seq < c.seq for d in decisions.get(run, [])):
                bad.append(
                    {
                        "run_id": run,
                        "step_id": step,
                        "refused": before.row.get("operation_id"),
                        "refusal_recorded_seq": refusal.seq,
                        "next_version": c.row.get("operation_id"),
                        "registered_seq": c.seq,
                        "registered_by": c.app,
                        "decisions_seqs": [d.seq for d in decisions.get(run, [])],
                    }
                )
    return Finding(checked, bad)


@invariant(
    "effect.claim_back_to_prepared_only_after_a_proven_rejection",
    "SPEC rule 4; English seed §9.2 (never revert dispatching to prepared)",
    "a dispatching operation goes back to prepared only when the tool's log shows it refused "
    "the claim's request without acting (429), or shows that no request of that claim ever "
    "reached it (a refused connection: nothing was sent); an expired claim becomes unknown",
)
def back_to_prepared_only_after_rejection(ev: Evidence) -> Finding:
    history = _ledger_changes(ev)
    per_op = group(ev.requests(), lambda r: str(r.get("operation_id")))
    back = _transitions(ev, {"dispatching"}, {"prepared"})
    bad = []
    for c in back:
        op = str(c.row.get("operation_id"))
        claims = [x for x in history.get(op, []) if _is_claim(x)]
        since = max((x.at for x in claims if x.seq < c.seq), default=0.0) - CLOCK_TOLERANCE_S
        # Requests of this claim arrive before the operation is claimed again.
        until = min((x.at for x in claims if x.seq > c.seq), default=float("inf"))
        arrived = [
            r for r in per_op.get(op, []) if since <= float(r.get("received_at") or 0) < until
        ]
        refused = [
            r
            for r in arrived
            if r.get("outcome") == "rejected_429" and float(r.get("received_at") or 0) <= c.at
        ]
        acted = [r for r in arrived if r.get("outcome") not in NOT_ACTED]
        if acted or (arrived and not refused):
            row = c.brief("operation_id", "status", "dispatch_owner")
            row["requests_of_the_claim"] = [(r.get("seq"), r.get("outcome")) for r in arrived]
            bad.append(row)
    return Finding(len(back), bad)


@invariant(
    "effect.never_prepared_again_once_in_doubt",
    "SPEC rules 4, 5; English seed §9.2 (never revert to prepared), §9.3 (unknown: query, "
    "same-key resend, or a person)",
    "an operation that was unknown never becomes prepared again, also not through a same-key "
    "resend's claim: a 429 to the resend proves only that the resend did not act, while the "
    "request that left the operation in doubt may still arrive (and the next dispatch of a "
    "prepared operation is judged by no key retention)",
)
def never_prepared_again_once_in_doubt(ev: Evidence) -> Finding:
    bad: list[dict[str, Any]] = []
    judged = 0
    for changes in _ledger_changes(ev).values():
        doubt: Change | None = None
        for c in changes:
            if c.by_harness:
                continue
            if c.after("status") == "unknown" and doubt is None:
                doubt = c
                judged += 1
            elif doubt is not None and c.after("status") == "prepared":
                bad.append({**c.brief("operation_id", "status"), "unknown_at_seq": doubt.seq})
                break
    return Finding(judged, bad)


# The ledger columns whose change is a step of the operation's state machine.
_LEDGER_STEP = ("status", "dispatch_owner", "dispatch_until", "remote_id")


@invariant(
    "effect.ledger_revision_advances_by_one",
    "SPEC rule 4; English seed §9.2-9.3 (every ledger change: revision = revision + 1)",
    "every change of an operation's status, dispatch claim or remote id advances its ledger "
    "revision by exactly one, so a result or a claim that names the revision it saw cannot "
    "land on a newer state",
)
def ledger_revision_advances(ev: Evidence) -> Finding:
    bad = []
    judged = 0
    for c in ev.of("tool_operations", "UPDATE"):
        old, new = c.old or {}, c.new or {}
        if old.get("revision") is None or new.get("revision") is None:
            continue  # a system without ledger revisions (its mapping has none)
        if all(old.get(k) == new.get(k) for k in _LEDGER_STEP):
            continue  # evidence or bookkeeping only: not a step
        judged += 1
        if int(new["revision"]) != int(old["revision"]) + 1:
            row = c.brief("operation_id", "status")
            row.update(revision=(old["revision"], new["revision"]), was=old.get("status"))
            bad.append(row)
    return Finding(judged, bad)


@invariant(
    "effect.first_dispatch_is_kept",
    "SPEC rules 4, 6; English seed §9.2 (the tool's key retention is counted from the "
    "first request)",
    "an operation's first_dispatched_at is set when it first becomes dispatching (and by "
    "nothing else), never changes after, and is no later than the tool's receipt of any request for it: the "
    "window a same-key resend is judged by (first_dispatched_at + the tool's retention) "
    "never starts late",
)
def first_dispatch_is_kept(ev: Evidence) -> Finding:
    ops = list(ev.of("tool_operations"))
    declared = ev.declares("tool_operations", "first_dispatched_at")
    if declared is False or (
        declared is None and not any(c.row.get("first_dispatched_at") is not None for c in ops)
    ):
        # A system without the column (its mapping has none). Known from the
        # mapping, a column that is declared but never written is judged.
        return Finding(0, [])
    bad: list[dict[str, Any]] = []
    judged = 0
    for c in ops:
        if c.op != "UPDATE":
            continue
        was, now = c.before("first_dispatched_at"), c.after("first_dispatched_at")
        if was is not None:
            judged += 1
            why = "changed after it was set" if now != was else ""
        elif c.after("status") == "dispatching" and c.before("status") != "dispatching":
            judged += 1
            why = "not set by the first dispatch claim" if now is None else ""
        elif now is not None:
            judged += 1
            why = "set by a change that is no dispatch claim"
        else:
            continue
        if why:
            row = c.brief("operation_id", "status")
            row.update(first_dispatched_at=(was, now), why=why)
            bad.append(row)
    received: dict[str, float] = {}
    for r in ev.requests():
        at = ts(r.get("received_at"))
        op = str(r.get("operation_id"))
        if at is not None and (op not in received or at < received[op]):
            received[op] = at
    for row in ev.rows("tool_operations"):
        first = ts(row.get("first_dispatched_at"))
        op = str(row.get("operation_id"))
        if first is None or op not in received:
            continue
        judged += 1
        # Same kernel clock (the database's and the tool's); 1 ms for rounding.
        if first > received[op] + 0.001:
            bad.append(
                {
                    "operation_id": op,
                    "first_dispatched_at": row.get("first_dispatched_at"),
                    "tool_received_at": received[op],
                    "why": "later than the tool's first receipt",
                }
            )
    return Finding(judged, bad)


@invariant(
    "effect.dispatch_claim_within_its_duration",
    "SPEC rules 4, 5; English seed §9.2 (a dispatch claim's own deadline); worker contract "
    "section 2 (FENCECHECK_DISPATCH_TTL_MS)",
    "a dispatch claim made by a worker the harness started ends no later than the database "
    "time of the claim plus the claim duration that worker was given (not its lease's, nor "
    "any other): a longer claim keeps an operation from its reconciler past what was agreed",
)
def dispatch_claim_within_its_duration(ev: Evidence) -> Finding:
    bad: list[dict[str, Any]] = []
    judged = 0
    for c in ev.of("tool_operations", "UPDATE"):
        asked = ev.dispatch_ttl_ms_by_app.get(c.app)
        until = ts(c.after("dispatch_until"))
        if (
            asked is None
            or until is None
            or c.after("status") != "dispatching"
            or not c.changed("dispatch_until")
            or c.by_harness
        ):
            continue
        judged += 1
        # The claim reads the clock a moment before the audit trigger does:
        # a correct claim is never past; the tolerance absorbs rounding.
        if until - c.at > asked / 1000 + 0.001:
            row = c.brief("operation_id", "dispatch_owner", "dispatch_until")
            row.update(claimed_for_ms=round((until - c.at) * 1000, 1), asked_ms=asked)
            bad.append(row)
    return Finding(judged, bad)


@invariant(
    "effect.ledger_records_the_tools_own_retention",
    "worker contract section 2 (the idempotency window: every path that registers an intent "
    "records the tool's declared retention in retention_ms)",
    "an intent of the idempotent tool that records a retention_ms records the retention the "
    "tool itself declares (idempotency_retention_s, in milliseconds): a window recorded in "
    "the wrong unit refuses resends the tool would still deduplicate, or allows them after",
)
def ledger_records_the_tools_own_retention(ev: Evidence) -> Finding:
    declared_s = (ev.tool.get("server") or {}).get("idempotency_retention_s")
    if declared_s is None:
        return Finding(0, [], "the tool declares no retention: not judged")
    declared_ms = round(float(declared_s) * 1000)
    bad: list[dict[str, Any]] = []
    judged = 0
    for c in ev.of("tool_operations"):
        recorded = c.after("retention_ms")
        tool = str(c.after("tool_name"))
        if recorded is None or c.by_harness or ev.capability(tool) != "idempotent":
            continue
        if c.op == "UPDATE" and not c.changed("retention_ms"):
            continue
        judged += 1
        if int(recorded) != declared_ms:
            row = c.brief("operation_id", "tool_name", "retention_ms")
            row["declared_ms"] = declared_ms
            bad.append(row)
    return Finding(judged, bad)


@invariant(
    "effect.resend_claim_ends_within_the_tools_retention",
    "SPEC rules 4, 5; English seed §9.2 (the tool's key retention)",
    "a same-key resend's claim (an operation in doubt claimed again for dispatch) of a tool "
    "that declares its key retention ends no later than first_dispatched_at + retention_ms "
    "(the ledger's, or where the ledger records none, the one the idempotent tool itself "
    "declares): the resend may reach the tool at any moment until its claim's deadline, and "
    "after the window the tool makes a new resource of it",
)
def resend_claim_within_retention(ev: Evidence) -> Finding:
    bad: list[dict[str, Any]] = []
    judged = 0
    # The mock tool's own declaration: an intent registered without the
    # window (a path that forgot to record it) is still judged by it.
    declared_s = (ev.tool.get("server") or {}).get("idempotency_retention_s")
    for c in ev.of("tool_operations", "UPDATE"):
        if c.before("status") != "unknown" or c.after("status") != "dispatching":
            continue
        retention, first = c.after("retention_ms"), ts(c.after("first_dispatched_at"))
        idempotent = ev.capability(str(c.after("tool_name"))) == "idempotent"
        if retention is None and declared_s is not None and idempotent:
            retention = round(float(declared_s) * 1000)
        until = ts(c.after("dispatch_until"))
        if retention is None or first is None or until is None:
            continue  # no declared window, or a system without the columns
        judged += 1
        ends = first + int(retention) / 1000
        if until > ends + 0.001:  # one clock (the database's); 1 ms for rounding
            row = c.brief("operation_id", "dispatch_owner")
            row.update(
                dispatch_until=c.after("dispatch_until"),
                window_ends=ends,
                past_by_s=round(until - ends, 3),
            )
            bad.append(row)
    return Finding(judged, bad)


# The sensitive field the harness plants in every run it creates (worker
# contract §9): ``ct_`` and 24 hex digits. Sealed at rest, sent in clear only
# to the tool: what the tool made from anything else is not what was asked.
PLANTED_SENSITIVE = "customer_token"
PLANTED_SHAPE = re.compile(r"ct_[0-9a-f]{24}")


@invariant(
    "effect.sensitive_field_reaches_the_tool_in_clear",
    "worker contract §9 (sensitive data: sealed at rest, in clear only to the tool)",
    "every resource the tool made from a request carrying the planted sensitive field "
    "(customer_token) got its value in clear, as planted, never its sealed form",
)
def sensitive_field_reaches_the_tool_in_clear(ev: Evidence) -> Finding:
    carrying = [
        r
        for r in ev.tool.get("resources", [])
        if isinstance(r.get("request"), dict) and PLANTED_SENSITIVE in r["request"]
    ]
    bad = [
        {
            "resource_id": r.get("resource_id"),
            "operation_id": r.get("operation_id"),
            "value_kind": type(r["request"][PLANTED_SENSITIVE]).__name__,
            "why": "not the planted value in clear (sealed, or changed on the way)",
        }
        for r in carrying
        if not (
            isinstance(r["request"][PLANTED_SENSITIVE], str)
            and PLANTED_SHAPE.fullmatch(r["request"][PLANTED_SENSITIVE])
        )
    ]
    return Finding(len(carrying), bad)


def _clear_values(value: Any, path: str = "") -> Iterator[str]:
    """Paths within ``value`` (a row, JSON decoded or as text) where a planted
    sensitive value sits in clear."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _clear_values(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _clear_values(v, f"{path}[{i}]")
    elif isinstance(value, str) and PLANTED_SHAPE.search(value):
        yield path


@invariant(
    "effect.sensitive_field_stored_sealed",
    "worker contract §9 (sensitive data: stored sealed wherever it appears, nested too)",
    "no row of a contract table, as it ends and as the audit trail saw each change, holds a "
    "planted sensitive value (customer_token: ct_ and 24 hex digits) in clear, at any depth "
    "of any column",
)
def sensitive_field_stored_sealed(ev: Evidence) -> Finding:
    return _found_in_rows(ev, _clear_values, "a planted sensitive value stored in clear")


def _row_images(ev: Evidence) -> list[tuple[str, Any, int | None]]:
    """Every row of a contract table as it ends (no audit seq), then as the
    audit trail saw each change a session other than the harness's made."""
    return [(t, r, None) for t, rows in ev.tables.items() for r in rows] + [
        (c.table, c.new, c.seq) for c in ev.changes if c.new is not None and not c.by_harness
    ]


def _found_in_rows(ev: Evidence, paths: Callable[[Any], Iterator[str]], why: str) -> Finding:
    """The rows (each table and path once) where ``paths`` finds something."""
    bad: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    images = _row_images(ev)
    for table, row, seq in images:
        for path in paths(row):
            if (table, path) not in seen:
                seen.add((table, path))
                bad.append({"table": table, "column": path, "audit_seq": seq, "why": why})
    return Finding(len(images), bad)


#: Section 9's sensitive field names, and the fields of the object the harness
#: plants as a card_number's value (scenarios.common.new_run): sealed whole,
#: its field names are in no stored row under the sensitive key.
SENSITIVE_KEYS = frozenset({"customer_token", "payment_token", "card_number", "customer_email"})
PLANTED_WHOLE_FIELDS = frozenset({"pan", "expiry"})


def _opened_structures(value: Any, path: str = "") -> Iterator[str]:
    """Paths within ``value`` where a sensitive key holds an object that shows
    a field of the planted structure (sealed part by part, or not at all)."""
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if k in SENSITIVE_KEYS and isinstance(v, dict) and PLANTED_WHOLE_FIELDS & set(v):
                yield here
            yield from _opened_structures(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _opened_structures(v, f"{path}[{i}]")


@invariant(
    "effect.sensitive_structure_sealed_whole",
    "worker contract §9 (a sensitive field whose value is an object or a list is sealed "
    "whole, in every column)",
    "no row of a contract table, as it ends and as the audit trail saw each change, holds "
    "under a sensitive key (card_number and its kin) an object showing a field of the "
    "structure the harness planted there (pan, expiry): sealed whole, its shape is hidden too",
)
def sensitive_structure_sealed_whole(ev: Evidence) -> Finding:
    return _found_in_rows(
        ev, _opened_structures, "a sensitive structure stored with its fields showing"
    )


# The contract's example sealed form (section 9): {"$sealed": "v1:<base64 of a
# 12-byte nonce, then the AES-GCM ciphertext>"}, in a decoded row or in text.
SEALED_V1 = re.compile(r'\$sealed\\?"\s*:\s*\\?"v1:([A-Za-z0-9+/]+=*)')


def _sealed_v1_nonces(row: Any) -> Iterator[tuple[bytes, str]]:
    """(nonce, the whole sealed text) of every sealed value of the example form
    anywhere in ``row``."""
    for match in SEALED_V1.finditer(json.dumps(row, default=str)):
        try:
            raw = base64.b64decode(match.group(1), validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(raw) > 12:
            yield raw[:12], match.group(1)


@invariant(
    "effect.sealed_values_never_share_a_nonce",
    "worker contract §9 (stored sealed); NIST SP 800-38D §8 (a GCM nonce is never reused "
    "under one key)",
    "two different sealed values of the contract's example form (v1: a 12-byte nonce, then "
    "the AES-GCM ciphertext) never begin with the same nonce: one nonce for two messages "
    "gives away their XOR and the key's authentication; a value copied as it was sealed is "
    "the same value; not judged for another sealed form",
)
def sealed_values_never_share_a_nonce(ev: Evidence) -> Finding:
    first: dict[bytes, tuple[str, str, int | None]] = {}
    bad: list[dict[str, Any]] = []
    for table, row, seq in _row_images(ev):
        for nonce, sealed in _sealed_v1_nonces(row):
            was = first.setdefault(nonce, (sealed, table, seq))
            if was[0] != sealed and len(bad) < 20:
                bad.append({"table": table, "audit_seq": seq, "also_in": was[1],
                            "nonce": nonce.hex(),
                            "why": "two different sealed values under one nonce"})  # fmt: skip
    if not first:
        return Finding(0, [], "no sealed value of the example form: not judged")
    return Finding(len(first), bad)


@invariant(
    "effect.sensitive_field_never_logged",
    "worker contract §9 (sensitive data: sent in clear only to the tool, never logged)",
    "no line of any worker's stdout, stderr or event history holds a planted sensitive value "
    "(ct_ and 24 hex digits) in clear: a log is read by people and kept by other systems",
)
def sensitive_field_never_logged(ev: Evidence) -> Finding:
    if ev.worker_logs is None:
        return Finding(0, [], "the workers' logs were not read")
    bad = [
        {**hit, "why": "a planted sensitive value in clear"} for hit in ev.worker_logs.planted_at
    ]
    return Finding(ev.worker_logs.files, bad)


COMPENSATION = "agent.compensation_required"


def _cancels(ev: Evidence) -> dict[str, list[Change]]:
    """Per run, the changes that made it cancelled."""
    return group(
        (c for c in ev.of("agent_runs", "UPDATE") if c.changed("status")
         and c.after("status") == "cancelled"),
        lambda c: str(c.row.get("run_id")),
    )  # fmt: skip


def _supersedes(ev: Evidence) -> dict[str, list[Change]]:
    """Per run, the changes of its task that made another run the active one
    (a retry): from then on the run's work is done again by its successor."""
    return group(
        (c for c in ev.of("agent_tasks", "UPDATE") if c.changed("active_run_id")
         and c.before("active_run_id") is not None),
        lambda c: str(c.before("active_run_id")),
    )  # fmt: skip


@invariant(
    "effect.compensation_required_exactly_for_a_cancelled_runs_success",
    "English seed §9.3 (a result after the cancel is recorded, never hides; a success asks "
    "for compensation); worker contract section 5 `cancel` and `retry_run`",
    "an operation that becomes succeeded once its run's cancel, or the retry that superseded "
    "its run, is committed gets an outbox event agent.compensation_required naming it "
    "(payload operation_id) and the resource to undo (payload remote_id, the ledger's) in the "
    "same transaction; no such event names an operation that "
    "did not become succeeded in its transaction, or whose run had been neither cancelled nor "
    "superseded",
)
def compensation_exactly_for_cancelled_success(ev: Evidence) -> Finding:
    # Why a superseded run too: its task's next run does the step again
    # under its own operation id, so the old run's late success is an effect
    # nobody wants any more, exactly as after a cancel.
    cancels = _cancels(ev)
    supersedes = _supersedes(ev)
    successes = [
        c
        for c in ev.of("tool_operations", "UPDATE")
        if c.changed("status") and c.after("status") == "succeeded" and not c.by_harness
    ]
    events = [
        c
        for c in ev.of("outbox", "INSERT")
        if c.row.get("event_type") == COMPENSATION and not c.by_harness
    ]
    written = {(c.txid, str((c.row.get("payload") or {}).get("operation_id"))): c for c in events}
    bad: list[dict[str, Any]] = []
    succeeded_in = {(c.txid, str(c.row.get("operation_id"))) for c in successes}
    for c in successes:
        run = str(c.row.get("run_id"))
        # Committed before the result's transaction began: any statement of
        # it saw the run cancelled or superseded (one committed later, a
        # race, is not judged).
        seen = [
            x for x in cancels.get(run, []) + supersedes.get(run, []) if x.visible_at <= c.tx_start
        ]
        if seen and (c.txid, str(c.row.get("operation_id"))) not in written:
            why = "cancelled" if seen[0].table == "agent_runs" else "superseded by a retry"
            bad.append({**c.brief("operation_id", "status", "run_id"),
                        "why": f"no {COMPENSATION} in its transaction; run {why} at seq "
                               f"{seen[0].seq}"})  # fmt: skip
        event = written.get((c.txid, str(c.row.get("operation_id"))))
        named = (event.row.get("payload") or {}).get("remote_id") if event else None
        if event is not None and str(named) != str(c.after("remote_id")):
            # The owning service undoes the effect by its resource: the event
            # must name the one the ledger recorded (blind hunt 46 #02).
            bad.append({**event.brief("event_id", "run_id", "payload"),
                        "why": f"names remote_id {named!r}, the ledger recorded "
                               f"{c.after('remote_id')!r}"})  # fmt: skip
    for (txid, op_id), e in written.items():
        run = str(e.row.get("run_id"))
        ended_before = any(x.at <= e.at for x in cancels.get(run, []) + supersedes.get(run, []))
        if (txid, op_id) not in succeeded_in or not ended_before:
            bad.append({**e.brief("event_id", "run_id", "payload"),
                        "why": "names an operation that did not become succeeded in its "
                               "transaction" if (txid, op_id) not in succeeded_in
                               else "its run was neither cancelled nor superseded"})  # fmt: skip
    return Finding(len(successes) + len(events), bad)


@invariant(
    "effect.prepared_holds_no_claim",
    "worker contract §6 (ledger statuses: a dispatch claim is `dispatch_owner` and "
    "`dispatch_until` of a dispatching row)",
    "no change leaves a prepared operation with a dispatch claim: registered, or back from "
    "dispatching after the tool's proven refusal, its dispatch_owner and dispatch_until are "
    "both null (a deadline left behind is a claim nobody holds)",
)
def prepared_holds_no_claim(ev: Evidence) -> Finding:
    prepared = [
        c
        for c in ev.of("tool_operations")
        if c.new is not None and c.new.get("status") == "prepared" and not c.by_harness
    ]
    bad = [
        c.brief("operation_id", "status", "dispatch_owner", "dispatch_until")
        for c in prepared
        if c.new is not None
        and (c.new.get("dispatch_owner") is not None or c.new.get("dispatch_until") is not None)
    ]
    return Finding(len(prepared), bad)
