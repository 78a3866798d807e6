"""Rule 8, 10 and 13 mutants: heartbeat, outbox consumer, checkpoint schema."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

import psycopg

from harness import injection
from mock_tool.errors import ToolOutcomeUnknown
from reference_impl import checkpoint_schema
from reference_impl.db import Conn
from reference_impl.heartbeat import Heartbeat
from reference_impl.logs import log
from reference_impl.mutants.base import Component, Method, Mutant
from reference_impl.outbox import Consumer, Relay, _payload
from reference_impl.protocol import Protocol

_log = logging.getLogger("reference_impl.mutants")


class NonCancellingHeartbeat(Heartbeat):
    """Notices an unconfirmed renewal and lets the execution go on."""

    def on_unconfirmed(self, outcome: str) -> None:
        # MUTANT: logged, but the cancellation token is never set.
        log(
            _log,
            logging.WARNING,
            "lease renewal unconfirmed (execution goes on)",
            run_id=str(self.lease.run_id),
            epoch=self.lease.epoch,
            outcome=outcome,
        )


class ServerBoundedHeartbeat(Heartbeat):
    """Waits for each renewal's answer on its own thread, however long it takes."""

    def renew_once(self) -> str:
        # MUTANT: no client-side bound. Only the server's statement_timeout
        # limits the call, and it never fires for a renewal the server never
        # received (a black-holed link), one waiting for a synchronous standby,
        # or one whose answer is merely late: the renewal stays "in progress"
        # (or succeeds late) instead of unconfirmed within the heartbeat timeout.
        lease = self.lease
        injection.record("invoke", "renew", run_id=lease.run_id, epoch=lease.epoch)
        try:
            renewal = self.leases.renew(self._session.conn, lease, self.ttl_ms)
        except psycopg.Error as exc:
            self._session.discard()
            injection.record("info", "renew", run_id=lease.run_id, epoch=lease.epoch, error=exc)
            return "unknown"
        if renewal.ok:
            injection.record("ok", "renew", run_id=lease.run_id, epoch=lease.epoch)
            return "renewed"
        injection.record("fail", "renew", run_id=lease.run_id, epoch=lease.epoch, error="LeaseLost")
        return str(renewal.outcome)


class AckFirstConsumer(Consumer):
    """Commits an event's dedup row (its "ack") before the business effect."""

    def process(self, conn: Conn, consumer: str, msg: dict[str, Any]) -> bool:
        # MUTANT: two transactions. A crash between them leaves the event marked
        # processed without its effect, and every later delivery is skipped as a
        # duplicate: the effect is lost (at most once instead of exactly once).
        event_id = uuid.UUID(str(msg["event_id"]))
        with conn.transaction():
            if not self.first_delivery(conn, consumer, event_id):
                return False
        injection.point("after_consumer_dedup_commit", operation_id=event_id)
        with conn.transaction():
            self.apply_effect(conn, consumer, msg)
        return True


class ReadAckConsumer(Consumer):
    """Acknowledges a whole batch on receipt (auto-commit), then applies it."""

    def cycle(self, conn: Conn, consumer: str) -> dict[str, int]:
        # MUTANT: every message read is marked processed (its dedup row) in one
        # transaction before any effect is applied, like offsets auto-committed
        # on read: a crash before the effects loses them all for good.
        messages = [
            m
            for m in self.tools.broker.broker_messages(0)
            if not isinstance(m.get("payload"), dict)
            or m["payload"].get("tenant_id") in (None, self.tenant)
        ]
        with conn.transaction():
            fresh = [
                m
                for m in messages
                if self.first_delivery(conn, consumer, uuid.UUID(str(m["event_id"])))
            ]
        if messages:
            injection.point("after_consumer_read", operation_id=messages[0].get("event_id"))
        for msg in fresh:
            with conn.transaction():
                self.apply_effect(conn, consumer, msg)
        return {"consumed": len(fresh), "duplicates": len(messages) - len(fresh)}


class NonDedupConsumer(Consumer):
    """Applies every delivery's business effect."""

    def process(self, conn: Conn, consumer: str, msg: dict[str, Any]) -> bool:
        # MUTANT: no dedup row is written or consulted.
        with conn.transaction():
            self.apply_effect(conn, consumer, msg)
        return True


class MarkFirstRelay(Relay):
    """Marks a batch published, commits, and only then publishes it."""

    def cycle(self, conn: Conn, limit: int = 20) -> list[str]:
        # MUTANT: the mark commits before the broker has the message (at most
        # once): a crash in between loses the event for good.
        with conn.transaction():
            rows = conn.execute(self.q.sql("outbox_lock_batch"), {"limit": limit}).fetchall()
            if rows:
                conn.execute(
                    self.q.sql("outbox_mark_published"), {"ids": [int(r["id"]) for r in rows]}
                )
        for row in rows:
            self.tools.broker.publish(str(row["event_id"]), str(row["event_type"]), _payload(row))
            injection.point("after_broker_ack_before_outbox_mark", run_id=row["run_id"])
        return [str(r["event_id"]) for r in rows]


class MarkWholeBatchRelay(Relay):
    """Marks the whole locked batch published once it tried to publish it."""

    def cycle(self, conn: Conn, limit: int = 20) -> list[str]:
        # MUTANT: a failed publish ends the loop as it should, but the mark
        # covers every row of the batch, the refused and the untried ones too:
        # events the broker never took are never published again.
        with conn.transaction():
            rows = conn.execute(self.q.sql("outbox_lock_batch"), {"limit": limit}).fetchall()
            try:
                for row in rows:
                    self.tools.broker.publish(
                        str(row["event_id"]), str(row["event_type"]), _payload(row)
                    )
                    injection.point("after_broker_ack_before_outbox_mark", run_id=row["run_id"])
            except Exception as exc:
                log(_log, logging.WARNING, "publish failed", error=repr(exc))
            if rows:
                conn.execute(
                    self.q.sql("outbox_mark_published"), {"ids": [int(r["id"]) for r in rows]}
                )
        return [str(r["event_id"]) for r in rows]


class UnansweredAsAckRelay(Relay):
    """Counts a publish that got no answer in time as acknowledged."""

    def cycle(self, conn: Conn, limit: int = 20) -> list[str]:
        # MUTANT: a publish whose answer did not come (a timeout: no HTTP
        # status) is taken for "the broker has it" and marked, although the
        # broker may take it later or never.
        acked: list[dict[str, Any]] = []
        with conn.transaction():
            rows = conn.execute(self.q.sql("outbox_lock_batch"), {"limit": limit}).fetchall()
            for row in rows:
                try:
                    self.tools.broker.publish(
                        str(row["event_id"]), str(row["event_type"]), _payload(row)
                    )
                except ToolOutcomeUnknown as exc:
                    if exc.http_status is not None:
                        break
                injection.point("after_broker_ack_before_outbox_mark", run_id=row["run_id"])
                acked.append(row)
            if acked:
                conn.execute(
                    self.q.sql("outbox_mark_published"), {"ids": [int(r["id"]) for r in acked]}
                )
        return [str(r["event_id"]) for r in acked]


class CursorSkippingConsumer(Consumer):
    """Skips a message whose seq is not above the highest one already handled."""

    def cycle(self, conn: Conn, consumer: str) -> dict[str, int]:
        # MUTANT: "a seq at or below the highest seen is a redelivery" is used
        # as a cheap dedup instead of the event_id: a read handed out out of
        # order loses every message behind the first (distinct events dropped).
        consumed = duplicates = 0
        after = self._after.get(consumer, 0)
        for msg in self.tools.broker.broker_messages(after):
            seq = int(msg.get("seq", after))
            if seq <= after:
                duplicates += 1
                continue
            after = seq
            payload = msg.get("payload")
            if isinstance(payload, dict) and payload.get("tenant_id") not in (None, self.tenant):
                continue
            if self.process(conn, consumer, msg):
                consumed += 1
            else:
                duplicates += 1
        self._after[consumer] = after
        return {"consumed": consumed, "duplicates": duplicates}


def decode_one_step_back(
    self: Protocol, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
) -> checkpoint_schema.Checkpoint:
    """MUTANT: resumes one step before the checkpoint's cursor (an off-by-one)."""
    ck = checkpoint_schema.decode(revision, schema_version, state, stored_hash)
    cursor = int(ck.state.get("cursor", 0))
    return dataclasses.replace(ck, state={**ck.state, "cursor": max(0, cursor - 1)})


def decode_old_version_unhashed(
    self: Protocol, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
) -> checkpoint_schema.Checkpoint:
    """MUTANT: the state hash is checked for the current version only ("older
    workers wrote no meaningful hash"): a changed older state is migrated."""
    if schema_version != checkpoint_schema.CURRENT_VERSION:
        stored_hash = None
    return checkpoint_schema.decode(revision, schema_version, state, stored_hash)


def decode_to_defaults(
    self: Protocol, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
) -> checkpoint_schema.Checkpoint:
    """MUTANT: a version this code does not know is read as the current one."""
    if schema_version in checkpoint_schema.MIGRATIONS or schema_version == (
        checkpoint_schema.CURRENT_VERSION
    ):
        return checkpoint_schema.decode(revision, schema_version, state, stored_hash)
    raw = state if isinstance(state, dict) else {}
    # Every field the current schema has, missing ones as zero values.
    parsed = {
        "workflow": str(raw.get("workflow") or "refund"),
        "plan": list(raw.get("plan") or checkpoint_schema.DEFAULT_PLAN),
        "cursor": int(raw.get("cursor") or 0),
        "data": dict(raw.get("data") or {}),
        "results": dict(raw.get("results") or {}),
        "pending": raw.get("pending"),
    }
    return checkpoint_schema.Checkpoint(revision, int(schema_version or 0), parsed)


MUTANTS = (
    Mutant(
        "heartbeat_failure_ignored",
        8,
        ("P",),
        "an unconfirmed renewal is logged but does not cancel the execution: the "
        "worker goes on and starts new side effects without a lease it can prove",
        Component("heartbeat_cls", NonCancellingHeartbeat),
    ),
    Mutant(
        "renewal_without_client_timeout",
        8,
        ("S",),
        "the heartbeat waits for each renewal's answer however long it takes (only the "
        "server's statement_timeout bounds it): a black-holed link, a renewal waiting for a "
        "synchronous standby or an answer slower than the heartbeat timeout never cancels "
        "the execution in time, and a late answer keeps the lease alive",
        Component("heartbeat_cls", ServerBoundedHeartbeat),
    ),
    Mutant(
        "consumer_ack_before_effect",
        10,
        ("T",),
        "the outbox consumer commits an event's dedup row (its ack) in one transaction and "
        "the business effect in a second: a crash between the two loses the effect for good, "
        "every later delivery being skipped as a duplicate",
        Component("consumer_cls", AckFirstConsumer),
    ),
    Mutant(
        "consumer_acks_on_read",
        10,
        ("T",),
        "the outbox consumer marks every message it reads processed (its dedup rows) in one "
        "transaction before applying any effect, like offsets auto-committed on read: a "
        "crash before the effects loses them, later deliveries being skipped as duplicates",
        Component("consumer_cls", ReadAckConsumer),
    ),
    Mutant(
        "consumer_without_dedup",
        10,
        ("L",),
        "the outbox consumer applies its business effect for every delivery, without "
        "its dedup row: an at-least-once repeat is applied twice",
        Component("consumer_cls", NonDedupConsumer),
    ),
    Mutant(
        "relay_marks_before_publish",
        10,
        ("L",),
        "the outbox relay marks a batch published and commits before it publishes it: "
        "a crash between the two loses the events (at most once, not at least once)",
        Component("relay_cls", MarkFirstRelay),
    ),
    Mutant(
        "relay_marks_failed_batch",
        10,
        ("L",),
        "when one publish of a locked batch fails, the outbox relay marks the whole batch "
        "published: the refused event and those after it never reach the broker",
        Component("relay_cls", MarkWholeBatchRelay),
    ),
    Mutant(
        "relay_marks_unanswered_publish",
        10,
        ("L",),
        "a publish that got no answer within the relay's timeout is taken as acknowledged "
        "and marked published, although the broker has not taken it (yet)",
        Component("relay_cls", UnansweredAsAckRelay),
    ),
    Mutant(
        "consumer_skips_behind_cursor",
        10,
        ("L",),
        "the outbox consumer takes a message whose broker seq is not above the highest one "
        "it handled for a redelivery and skips it: a read handed out of order loses distinct "
        "events for good",
        Component("consumer_cls", CursorSkippingConsumer),
    ),
    Mutant(
        "resume_redoes_last_step",
        5,
        ("I",),
        "a successor resumes one step before the committed checkpoint's cursor (an "
        "off-by-one on resume): the last completed step is done again",
        Method("decode_checkpoint", decode_one_step_back),
    ),
    Mutant(
        "unknown_schema_to_defaults",
        13,
        ("M",),
        "a checkpoint of a schema version this code does not know is parsed as the "
        "current version, missing fields as zero values, instead of being refused",
        Method("decode_checkpoint", decode_to_defaults),
    ),
    Mutant(
        "old_checkpoint_hash_unchecked",
        13,
        ("M",),
        "a checkpoint's state hash is checked only for the current schema version: an older "
        "checkpoint whose state was changed after it was hashed is migrated and resumed "
        "instead of refused as corrupt (blind bug hunt round 3, #14, in Go)",
        Method("decode_checkpoint", decode_old_version_unhashed),
    ),
)
