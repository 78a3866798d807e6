"""Prometheus metrics named in the English seed, section 12.

Labels are low-cardinality outcomes and reasons only; run_id, task_id and
operation_id go to logs, never to labels.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

lease_acquire_total = Counter(
    "lease_acquire_total",
    "Lease acquisitions by outcome (success, busy, missing, terminal, paused, db_error).",
    ["outcome"],
    registry=REGISTRY,
)
lease_renew_total = Counter(
    "lease_renew_total",
    "Lease renewals by outcome (success, lost, unknown).",
    ["outcome"],
    registry=REGISTRY,
)
protected_write_rejected_total = Counter(
    "protected_write_rejected_total",
    "Protected writes rejected by the database, by reason (lease, state, revision, ledger).",
    ["reason"],
    registry=REGISTRY,
)
lease_row_lock_wait_seconds = Histogram(
    "lease_row_lock_wait_seconds",
    "Time a protected write or takeover waited for the lease row lock.",
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
    registry=REGISTRY,
)
tool_operation_unknown_total = Counter(
    "tool_operation_unknown_total",
    "Tool operations that entered the unknown state.",
    registry=REGISTRY,
)
tool_operation_unknown_oldest_age_seconds = Gauge(
    "tool_operation_unknown_oldest_age_seconds",
    "Age of the oldest tool operation still unknown (as last seen by the reconciler).",
    registry=REGISTRY,
)
workflow_takeover_duration_seconds = Histogram(
    "workflow_takeover_duration_seconds",
    "From lease expiry to takeover by a new owner (database time).",
    buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
commit_outcome_unknown_total = Counter(
    "commit_outcome_unknown_total",
    "Protected writes whose commit outcome was unknown, by read-back result.",
    ["resolution"],
    registry=REGISTRY,
)


def serve(port: int) -> None:
    """Serve the registry on 127.0.0.1:port (a daemon thread)."""
    start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
