"""Rule 8, 10 and 13 mutants: heartbeat, outbox consumer, checkpoint schema."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from harness import injection
from reference_impl import checkpoint_schema
from reference_impl.db import Conn
from reference_impl.heartbeat import Heartbeat
from reference_impl.logs import log
from reference_impl.mutants.base import Component, Method, Mutant
from reference_impl.outbox import Consumer, Relay, _payload, _run_of
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


class NonDedupConsumer(Consumer):
    """Applies every delivery's business effect."""

    def process(self, conn: Conn, consumer: str, msg: dict[str, Any]) -> bool:
        # MUTANT: no dedup row is written or consulted.
        event_id = uuid.UUID(str(msg["event_id"]))
        with conn.transaction():
            conn.execute(
                self.q.sql("consume_effect"),
                {
                    "consumer": consumer,
                    "event_id": event_id,
                    "effect": f"{msg.get('topic')}:{_run_of(msg)}",
                },
            )
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


def decode_one_step_back(
    self: Protocol, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
) -> checkpoint_schema.Checkpoint:
    """MUTANT: resumes one step before the checkpoint's cursor (an off-by-one)."""
    ck = checkpoint_schema.decode(revision, schema_version, state, stored_hash)
    cursor = int(ck.state.get("cursor", 0))
    return dataclasses.replace(ck, state={**ck.state, "cursor": max(0, cursor - 1)})


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
)
