"""Rule 8, 10 and 13 mutants: heartbeat, outbox consumer, checkpoint schema."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from reference_impl import checkpoint_schema
from reference_impl.db import Conn
from reference_impl.heartbeat import Heartbeat
from reference_impl.logs import log
from reference_impl.mutants.base import Component, Method, Mutant
from reference_impl.outbox import Consumer, _run_of
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
        "unknown_schema_to_defaults",
        13,
        ("M",),
        "a checkpoint of a schema version this code does not know is parsed as the "
        "current version, missing fields as zero values, instead of being refused",
        Method("decode_checkpoint", decode_to_defaults),
    ),
)
