"""Names shared by the mock tool's server, client and documentation."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Final

#: Capability levels of English seed section 9, weakest last.
CAPABILITIES: Final = ("idempotent", "deterministic_id", "query", "none")

#: Tools a server offers when started without ``--tool``.
DEFAULT_TOOLS: Final[dict[str, str]] = {
    "idem": "idempotent",
    "detid": "deterministic_id",
    "queryable": "query",
    "plain": "none",
}

#: Fault modes of a tool's creates, accepted by ``POST /admin/faults``.
FAULT_MODES: Final = (
    "delay",
    "drop_after_act",
    "reject_429",
    "reject_final",
    "error_5xx_after_act",
    "unavailable_after_act",
    "hang",
    "slow_callback",
    "conflict_other_body",
    "accept_without_result",
    "answer_late",
    "arrive_late",
    "arrive_held",
)

#: The fault target of the broker's modes (never a tool's name; ``"*"`` never selects it).
BROKER: Final = "broker"

#: Fault modes of broker publishes (``POST /broker/publish``).
PUBLISH_FAULT_MODES: Final = ("publish_fail", "publish_nack", "publish_ack_late")

#: Fault modes of broker deliveries (``GET /broker/messages``).
DELIVERY_FAULT_MODES: Final = ("deliver_duplicate", "deliver_reorder")

#: Modes that need ``ms``.
MODES_WITH_MS: Final = (
    "delay",
    "slow_callback",
    "answer_late",
    "arrive_late",
    "publish_ack_late",
)

#: Default (and upper bound when no ``ms`` is given) of a ``hang`` fault.
DEFAULT_HANG_MS: Final = 30_000

#: Default idempotency retention window of an ``idempotent`` tool.
DEFAULT_RETENTION_S: Final = 86_400.0

#: The one line the server prints on stdout once it accepts connections.
LISTENING_PREFIX: Final = "mock_tool listening on "


def deterministic_resource_id(tool: str, operation_id: str) -> str:
    """Resource id a ``deterministic_id`` tool gives ``operation_id``.

    Invariant: a pure function of (tool, operation_id), so a caller can predict
    it and a second create with the same operation_id collides with the first.
    """
    digest = hashlib.sha256(f"{tool}\n{operation_id}".encode()).hexdigest()
    return f"det-{digest[:32]}"


def iso(ts: float | None) -> str | None:
    """ISO-8601 UTC text of a unix time (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="microseconds")
