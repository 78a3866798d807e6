"""The broker the outbox relay publishes to and consumers read from, with the
answers an at-least-once broker gives: a publish refused, an ack that comes
late, a delivery repeated, deliveries out of order (docs/mock-tool.md, "Broker").

Invariants:

* A message is committed to the log before its ack is sent; a refused
  publish stores no message (it is logged in ``refused_publishes``).
* Every read is logged (``deliveries``): where it began (``after_seq``) and
  the sequence numbers in the order handed out (none for an empty read), so
  "what the broker delivered" is the broker's own account, not a consumer's.
* A delivery fault changes what one read hands out, never what is stored.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from mock_tool.constants import BROKER, DELIVERY_FAULT_MODES, PUBLISH_FAULT_MODES
from mock_tool.faults import FaultBoard
from mock_tool.storage import Store

_PUBLISH_MODES = frozenset(PUBLISH_FAULT_MODES)
_DELIVERY_MODES = frozenset(DELIVERY_FAULT_MODES)
#: The status of a publish the broker refused, or could not take because it stopped.
REFUSED_STATUS = 503


@dataclass(frozen=True)
class PublishAnswer:
    status: int
    body: dict[str, Any]


def publish(
    store: Store,
    faults: FaultBoard,
    stopping: threading.Event,
    event_id: str,
    topic: str,
    payload: Any,
) -> PublishAnswer:
    """Take one message (or refuse it, or take it late, as a fault says)."""
    arrived_at = time.time()
    fault = faults.take(BROKER, _PUBLISH_MODES)
    if fault is not None and fault.mode == "publish_fail":
        store.refuse_publish(event_id, topic, REFUSED_STATUS, fault.fault_id, fault.mode)
        return PublishAnswer(
            REFUSED_STATUS,
            {
                "error": "the broker did not take the message (injected fault); nothing stored",
                "code": "publish_failed",
            },
        )
    if fault is not None and fault.mode == "publish_nack":
        # A negative acknowledgement: a 200 whose body says the broker did not
        # take the message (a publisher confirm's nack), logged as refused.
        store.refuse_publish(event_id, topic, 200, fault.fault_id, fault.mode)
        return PublishAnswer(
            200,
            {
                "ack": False,
                "error": "the broker did not take the message (injected nack); nothing stored",
                "code": "publish_nacked",
            },
        )
    late = fault is not None and fault.mode == "publish_ack_late"
    if late and stopping.wait((fault.ms or 0) / 1000 if fault else 0):
        # A broker stopping while it holds a late publish never takes the message.
        return PublishAnswer(
            REFUSED_STATUS,
            {"error": "the broker is shutting down; nothing stored", "code": "stopping"},
        )
    seq, first = store.publish(
        event_id,
        topic,
        payload,
        arrived_at=arrived_at,
        fault_id=fault.fault_id if fault else None,
        fault_mode=fault.mode if fault else None,
    )
    return PublishAnswer(
        200, {"ack": True, "seq": seq, "duplicate": first is not None, "duplicate_of": first}
    )


def deliver(
    store: Store, faults: FaultBoard, after: int, limit: int | None
) -> list[dict[str, Any]]:
    """The messages after ``after`` as one read hands them out: in seq order,
    unless a delivery fault repeats the first one at the end or reverses them.
    A fault is only taken by a read that has something to hand out."""
    messages = store.messages(after, limit)
    if not messages:
        # Logged too: where a consumer's read began shows what it passed over.
        store.log_delivery(after, messages, None, None)
        return messages
    fault = faults.take(BROKER, _DELIVERY_MODES)
    if fault is not None and fault.mode == "deliver_duplicate":
        messages = [*messages, messages[0]]
    elif fault is not None and fault.mode == "deliver_reorder":
        messages = messages[::-1]
    store.log_delivery(
        after, messages, fault.fault_id if fault else None, fault.mode if fault else None
    )
    return messages
