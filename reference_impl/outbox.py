"""Outbox relay and idempotent consumer (rule 10).

Invariants:
- the relay marks a row published only after the broker acknowledged it, so
  a crash between the two (point ``after_broker_ack_before_outbox_mark``)
  republishes: at-least-once, never at-most-once;
- relays skip rows another relay holds (SKIP LOCKED);
- the consumer inserts its dedup row (consumed_events) and its business
  effect (consumer_effects) in one transaction of its own: a conflict on
  the dedup row means already processed, and no effect is written.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from harness import injection
from reference_impl import metrics
from reference_impl.db import Conn
from reference_impl.logs import log
from reference_impl.queries import Queries
from reference_impl.tools import ToolGateway

_log = logging.getLogger("reference_impl.outbox")


class Relay:
    """Publishes pending outbox rows of the tenant to the broker."""

    def __init__(self, queries: Queries, tools: ToolGateway) -> None:
        self.q = queries
        self.tools = tools

    def cycle(self, conn: Conn, limit: int = 20) -> list[str]:
        """Publish one batch; returns the event ids marked published."""
        published: list[str] = []
        acked: list[int] = []
        with conn.transaction():
            rows = conn.execute(self.q.sql("outbox_lock_batch"), {"limit": limit}).fetchall()
            if rows:
                # The batch is locked in this open transaction; nothing published.
                injection.point("after_outbox_batch_locked", run_id=rows[0]["run_id"])
            try:
                for row in rows:
                    self.tools.broker.publish(
                        str(row["event_id"]), str(row["event_type"]), _payload(row)
                    )
                    injection.point("after_broker_ack_before_outbox_mark", run_id=row["run_id"])
                    metrics.outbox_published_total.inc()
                    acked.append(int(row["id"]))
                    published.append(str(row["event_id"]))
            except Exception as exc:
                # Mark what was acknowledged; the rest stays pending.
                metrics.outbox_publish_retries_total.inc()
                log(_log, logging.WARNING, "publish failed", error=repr(exc))
            if acked:
                conn.execute(self.q.sql("outbox_mark_published"), {"ids": acked})
        if acked:
            # Published and marked, committed: the next cycle starts from here.
            injection.point("after_outbox_mark_commit", run_id=rows[0]["run_id"])
        return published


def _payload(row: dict[str, Any]) -> Any:
    """The message's payload: the row's own, naming its event, run and tenant
    (a consumer at a broker shared by tenants tells its own events by the
    tenant; a compensation request's payload is written without one)."""
    payload = row["payload"]
    if isinstance(payload, dict):
        named = {"event_id": str(row["event_id"]), "run_id": str(row["run_id"])}
        if row.get("tenant_id") is not None:
            named["tenant_id"] = str(row["tenant_id"])
        return {**payload, **named}
    return payload


class Consumer:
    """Reads the broker's messages and applies each event's effect once."""

    def __init__(self, queries: Queries, tools: ToolGateway, tenant: str) -> None:
        self.q = queries
        self.tools = tools
        self.tenant = tenant
        self._after: dict[str, int] = {}

    def cycle(self, conn: Conn, consumer: str) -> dict[str, int]:
        consumed = duplicates = 0
        after = self._after.get(consumer, 0)
        messages = self.tools.broker.broker_messages(after)
        if messages:
            # Delivered by the broker, nothing of them committed here yet.
            injection.point("after_consumer_read", operation_id=messages[0].get("event_id"))
        for msg in messages:
            after = max(after, int(msg.get("seq", after)))
            payload = msg.get("payload")
            if isinstance(payload, dict) and payload.get("tenant_id") not in (None, self.tenant):
                continue  # another tenant's event: not ours to apply
            if self.process(conn, consumer, msg):
                consumed += 1
            else:
                duplicates += 1
                metrics.consumer_dedup_conflicts_total.inc()
        self._after[consumer] = after
        return {"consumed": consumed, "duplicates": duplicates}

    def process(self, conn: Conn, consumer: str, msg: dict[str, Any]) -> bool:
        """Apply one message in its own transaction; False when already processed."""
        event_id = uuid.UUID(str(msg["event_id"]))
        with conn.transaction():
            if not self.first_delivery(conn, consumer, event_id):
                return False
            self.apply_effect(conn, consumer, msg)
        # The dedup row and the business effect committed together: the event
        # counts as processed, whatever happens to this consumer next.
        injection.point("after_consumer_dedup_commit", operation_id=event_id)
        return True

    def first_delivery(self, conn: Conn, consumer: str, event_id: uuid.UUID) -> bool:
        """Insert the event's dedup row; False when it was there already."""
        # ON CONFLICT DO NOTHING: a concurrent consumer of the same event
        # makes this wait for its transaction, then returns no row.
        first = conn.execute(
            self.q.sql("consume_dedup"), {"consumer": consumer, "event_id": event_id}
        ).fetchone()
        return first is not None

    def apply_effect(self, conn: Conn, consumer: str, msg: dict[str, Any]) -> None:
        """The business effect of one message (in the caller's transaction)."""
        conn.execute(
            self.q.sql("consume_effect"),
            {
                "consumer": consumer,
                "event_id": uuid.UUID(str(msg["event_id"])),
                "effect": f"{msg.get('topic')}:{_run_of(msg)}",
            },
        )


def _run_of(msg: dict[str, Any]) -> str:
    payload = msg.get("payload")
    if isinstance(payload, dict):
        return str(payload.get("run_id", ""))
    return ""
