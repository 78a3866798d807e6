"""Outbox relay and consumers (SPEC rule 10), against the broker's own log."""

from __future__ import annotations

from harness.checking.invariants.model import Change, Evidence, Finding, group, ts
from harness.checking.invariants.registry import invariant

# The broker commits a message before it acknowledges it, and the relay marks
# the row only after the acknowledgement: this only absorbs rounding.
CLOCK_TOLERANCE_S = 0.005


@invariant(
    "outbox.marked_published_only_after_the_broker_has_it",
    "SPEC rule 10; Chinese seed §11",
    "an outbox row is marked published only after the broker logged a message with its event_id",
)
def marked_only_after_broker(ev: Evidence) -> Finding:
    messages = group(ev.tool.get("messages", []), lambda m: str(m.get("event_id")))
    marked = [r for r in ev.rows("outbox") if r.get("published_at") is not None]
    bad = []
    for row in marked:
        at = ts(row["published_at"])
        assert at is not None
        first = min(
            (float(m["received_at"]) for m in messages.get(str(row["event_id"]), [])), default=None
        )
        if first is None or first > at + CLOCK_TOLERANCE_S:
            bad.append(
                {
                    "event_id": str(row["event_id"]),
                    "published_at": row["published_at"],
                    "broker_received_at": first,
                }
            )
    return Finding(len(marked), bad)


@invariant(
    "outbox.a_relay_cycle_publishes_in_outbox_order",
    "contract section 5 (relay: a cycle publishes in outbox order); SPEC rule 10",
    "the rows one transaction marks published reached the broker in outbox order: for each "
    "such transaction, the broker's copies it published (the last copy of each event received "
    "before its mark) carry increasing broker seq along increasing outbox id; not judged where "
    "a transaction marks one row",
)
def a_relay_cycle_publishes_in_outbox_order(ev: Evidence) -> Finding:
    if ev.declares("outbox", "id") is False:
        return Finding(0, [], "the system's outbox declares no order (id): not judged")
    marks = [
        c
        for c in ev.of("outbox", "UPDATE")
        if c.before("published_at") is None and c.after("published_at") is not None
    ]
    messages = group(ev.tool.get("messages", []), lambda m: str(m.get("event_id")))
    bad: list[dict[str, object]] = []
    cycles = [tx for tx in group(marks, lambda c: c.txid).values() if len(tx) > 1]
    for tx in cycles:
        sent: list[tuple[int, float]] = []  # (outbox id, the broker's order of its copy)
        for c in tx:
            copies = [
                m
                for m in messages.get(str(c.row.get("event_id")), [])
                if float(m["received_at"]) <= c.at + CLOCK_TOLERANCE_S
            ]
            # No copy: the invariant above names it. The broker's seq where it
            # logs one, else its receipt time (one clock: the broker's).
            if copies and c.row.get("id") is not None:
                last = copies[-1]
                sent.append((int(c.row["id"]), float(last.get("seq", last["received_at"]))))
        sent.sort()
        order = [at for _, at in sent]
        if order != sorted(order):
            bad.append(
                {
                    "txid": tx[0].txid,
                    "app": tx[0].app,
                    "outbox_id_and_broker_order": [[i, at] for i, at in sent],
                }
            )
    return Finding(len(cycles), bad)


@invariant(
    "consumer.business_effect_at_most_once_per_event",
    "SPEC rule 10; Chinese seed §11, §13.2",
    "each consumer applies its business effect at most once per event_id",
)
def effect_once_per_event(ev: Evidence) -> Finding:
    per = group(ev.rows("consumer_effects"), lambda r: (r.get("consumer_name"), str(r["event_id"])))
    bad = [
        {"consumer_name": c, "event_id": e, "effects": len(rows)}
        for (c, e), rows in per.items()
        if len(rows) > 1
    ]
    return Finding(len(per), bad)


@invariant(
    "consumer.effect_only_for_a_delivered_event",
    "SPEC rule 10",
    "a consumer's business effect names an event the broker delivered",
)
def effect_only_for_delivered(ev: Evidence) -> Finding:
    delivered = {str(m.get("event_id")) for m in ev.tool.get("messages", [])}
    effects = ev.rows("consumer_effects")
    bad = [
        {"consumer_name": r.get("consumer_name"), "event_id": str(r["event_id"])}
        for r in effects
        if str(r["event_id"]) not in delivered
    ]
    return Finding(len(effects), bad)


@invariant(
    "consumer.dedup_row_and_effect_in_one_transaction",
    "SPEC rule 10; English seed §10 (consumers deduplicate in their own transaction); "
    "Chinese seed §11",
    "a consumer's dedup row for an event and its business effect commit in the same "
    "transaction: a crash between two transactions would lose the effect (the dedup row "
    "then turns every redelivery away) or repeat it",
)
def dedup_row_and_effect_together(ev: Evidence) -> Finding:
    # Judged on the audit trail (which transaction wrote what), not on timing: a
    # consumer writing them apart breaks this whether or not a crash came between.
    def key(c: Change) -> tuple[object, str]:
        return (c.row.get("consumer_name"), str(c.row.get("event_id")))

    dedups = group(ev.of("consumed_events", "INSERT"), key)
    effects = group(ev.of("consumer_effects", "INSERT"), key)
    bad = []
    for k in sorted(set(dedups) | set(effects), key=str):
        dedup_tx = sorted({c.txid for c in dedups.get(k, [])})
        effect_tx = sorted({c.txid for c in effects.get(k, [])})
        if not set(dedup_tx) & set(effect_tx) or len(effect_tx) > len(dedup_tx):
            bad.append(
                {
                    "consumer_name": k[0],
                    "event_id": k[1],
                    "dedup_row_txids": dedup_tx,
                    "effect_txids": effect_tx,
                }
            )
    return Finding(len(set(dedups) | set(effects)), bad)


@invariant(
    "outbox.message_payload_names_its_event_and_run",
    "SPEC rule 10; contract section 5 (relay)",
    "every message the relay publishes for an outbox row carries, in its payload, that row's "
    "event_id and run_id: a consumer that deduplicates on what it reads must read the event's "
    "own identity",
)
def payload_names_its_event(ev: Evidence) -> Finding:
    # Every outbox row ever written (the audit trail's inserts: a purge may
    # have deleted some since), by event_id.
    runs = {str(c.row.get("event_id")): str(c.row.get("run_id")) for c in ev.of("outbox", "INSERT")}
    judged = [m for m in ev.tool.get("messages", []) if str(m.get("event_id")) in runs]
    bad = []
    for m in judged:
        event_id = str(m.get("event_id"))
        payload = m.get("payload")  # the tool's export decodes payload_json
        carried = (
            (str(payload.get("event_id")), str(payload.get("run_id")))
            if isinstance(payload, dict)
            else None
        )
        if carried != (event_id, runs[event_id]):
            bad.append(
                {
                    "seq": m.get("seq"),
                    "event_id": event_id,
                    "run_id": runs[event_id],
                    "payload": payload,
                }
            )
    return Finding(len(judged), bad)


@invariant(
    "outbox.message_payload_names_its_tenant",
    "SPEC rule 12 (tenant isolation); contract section 5 (relay)",
    "every message the relay publishes for an outbox row carries, in its payload, that row's "
    "tenant_id: a consumer at a broker shared by tenants tells its own events by it, so an event "
    "whose payload the worker wrote without one (a compensation request) must still name it; "
    "not judged where the mapping gives the outbox no tenant",
)
def payload_names_its_tenant(ev: Evidence) -> Finding:
    tenants = {
        str(c.row.get("event_id")): str(c.row.get("tenant_id"))
        for c in ev.of("outbox", "INSERT")
        if c.row.get("tenant_id") is not None
    }
    judged = [m for m in ev.tool.get("messages", []) if str(m.get("event_id")) in tenants]
    bad = []
    for m in judged:
        event_id = str(m.get("event_id"))
        payload = m.get("payload")
        named = payload.get("tenant_id") if isinstance(payload, dict) else None
        if str(named) != tenants[event_id]:
            bad.append({"seq": m.get("seq"), "event_id": event_id,
                        "tenant_id": tenants[event_id], "payload": payload})  # fmt: skip
    return Finding(len(judged), bad)
