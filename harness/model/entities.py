"""The model's vocabulary: its relations, their columns and what they mean.

The names are the contract's (docs/worker-contract.md section 6): a worker of
the contract's own schema maps each relation to its table of the same name.
Every column has one SQL type in the model, so a relation the system lacks
(a queue has no outbox) is an empty view of the same shape and every read
works on every system.

Invariants:
- every model relation lives in schema :data:`SCHEMA` under its own name;
- a run holds a lease only in a :data:`HOLDING` status, and only then has an
  owner and an expiry (the model clears them in every other status, whatever
  the system's columns still say);
- ids (run, task, tenant, event, operation) are compared as text, so a
  system's bigint job id and the contract's uuid read alike.
"""

from __future__ import annotations

SCHEMA = "fencecheck_model"
HOLDING = ("running", "waiting_tool")
#: The model's run statuses (a system's are mapped onto these).
STATUSES = (
    "queued",
    "running",
    "waiting_tool",
    "paused_indoubt",
    "paused_human",
    "succeeded",
    "failed",
    "cancelled",
)

#: The statuses a run ends in: a run whose row the system deletes ends in one.
TERMINAL = ("succeeded", "failed", "cancelled")

#: relation -> column -> SQL type, in the contract's column order.
COLUMNS: dict[str, dict[str, str]] = {
    "agent_tasks": {"tenant_id": "text", "task_id": "text", "active_run_id": "text"},
    "agent_runs": {
        "run_id": "text",
        "tenant_id": "text",
        "task_id": "text",
        "status": "text",
        "revision": "bigint",
        "owner": "text",
        "epoch": "bigint",
        "lease_expires_at": "timestamptz",
        "next_attempt_at": "timestamptz",
        "attempt_count": "integer",
        "max_attempts": "integer",
        "current_step": "text",
        "checkpoint_schema_version": "integer",
        "input": "jsonb",
        "updated_at": "timestamptz",
    },
    "agent_checkpoints": {
        "run_id": "text",
        "revision": "bigint",
        "tenant_id": "text",
        "epoch": "bigint",
        "owner": "text",
        "state_json": "jsonb",
        "state_hash": "bytea",
        "schema_version": "integer",
        "event_id": "text",
        "created_at": "timestamptz",
    },
    "tool_operations": {
        "operation_id": "text",
        "tenant_id": "text",
        "run_id": "text",
        "step_id": "text",
        "effect_version": "integer",
        "tool_name": "text",
        "idempotency_key": "text",
        "request_digest": "text",
        "status": "text",
        "dispatch_owner": "text",
        "dispatch_until": "timestamptz",
        "remote_id": "text",
        "revision": "bigint",
        "updated_at": "timestamptz",
        "retention_ms": "bigint",
        "first_dispatched_at": "timestamptz",
    },
    "outbox": {
        "id": "bigint",
        "event_id": "text",
        "tenant_id": "text",
        "run_id": "text",
        "event_type": "text",
        "payload": "jsonb",
        "published_at": "timestamptz",
        "created_at": "timestamptz",
    },
    "consumed_events": {
        "consumer_name": "text",
        "event_id": "text",
        "tenant_id": "text",
        "consumed_at": "timestamptz",
    },
    "consumer_effects": {
        "id": "bigint",
        "consumer_name": "text",
        "event_id": "text",
        "tenant_id": "text",
        "effect": "text",
        "created_at": "timestamptz",
    },
    "operator_actions": {
        "id": "bigint",
        "tenant_id": "text",
        "run_id": "text",
        "operation_id": "text",
        "action": "text",
        "operator": "text",
        "reason": "text",
        "ticket": "text",
        "before": "jsonb",
        "after": "jsonb",
        "at": "timestamptz",
    },
}
RELATIONS = tuple(COLUMNS)
#: The run columns that describe its lease: cleared outside HOLDING statuses.
LEASE_COLUMNS = ("owner", "lease_expires_at")


def relation(name: str) -> str:
    """The qualified name of model relation ``name`` (``fencecheck_model.agent_runs``)."""
    if name not in COLUMNS:
        raise KeyError(f"{name!r} is not a relation of the model: {', '.join(RELATIONS)}")
    return f"{SCHEMA}.{name}"


RUNS = relation("agent_runs")
CHECKPOINTS = relation("agent_checkpoints")
LEDGER = relation("tool_operations")
OUTBOX = relation("outbox")
TASKS = relation("agent_tasks")
CONSUMED = relation("consumed_events")
EFFECTS = relation("consumer_effects")
OPERATOR_ACTIONS = relation("operator_actions")
