"""Prometheus metrics: the sets of both seeds (English §12, Chinese §14).

Labels are low-cardinality outcomes, reasons, statuses and transitions
only; run_id, task_id and operation_id go to logs, never to labels. Where
the two seeds name the same signal twice, both names exist and move
together (docs/operations.md lists them).

Counters and histograms move where their event happens in this process.
The gauges that describe the database (runs by status, oldest queued run,
oldest run in doubt, oldest unknown operation, oldest pending outbox row)
are read at scrape time by :class:`DatabaseGauges`, through the worker's
own login role: they cover the worker's tenant (RLS), as its operators see
it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()
_log = logging.getLogger("reference_impl.metrics")

# ----------------------------------------------------------- English seed §12
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
    "Tool operations that entered the unknown state (a lost answer, an expired claim).",
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

# ----------------------------------------------------------- Chinese seed §14
lease_claim_conflicts_total = Counter(
    "lease_claim_conflicts_total",
    "Targeted claims refused because another owner holds an unexpired lease.",
    registry=REGISTRY,
)
stale_fence_rejections_total = Counter(
    "stale_fence_rejections_total",
    "Writes or renewals refused for a stale fence (owner/epoch no longer current, or expired).",
    registry=REGISTRY,
)
lease_renewal_failures_total = Counter(
    "lease_renewal_failures_total",
    "Renewals not confirmed (lost, expired or no answer in time).",
    registry=REGISTRY,
)
checkpoint_commit_latency_seconds = Histogram(
    "checkpoint_commit_latency_seconds",
    "Duration of a committed protected write, by transition.",
    ["transition"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
    registry=REGISTRY,
)
checkpoint_migrations_total = Counter(
    "checkpoint_migrations_total",
    "Checkpoints read in an older schema version, by result (migrated, refused).",
    ["result"],
    registry=REGISTRY,
)
checkpoint_migration_failures_total = Counter(
    "checkpoint_migration_failures_total",
    "Checkpoints refused: unknown schema version or corrupt state (never parsed to zero values).",
    registry=REGISTRY,
)
tool_unknown_result_total = Counter(
    "tool_unknown_result_total",
    "Tool calls whose result is unknown (Chinese seed name of tool_operation_unknown_total).",
    registry=REGISTRY,
)
reconcile_total = Counter(
    "reconcile_total",
    "Reconciliation attempts of unknown operations by outcome (success, failure, no_result).",
    ["outcome"],
    registry=REGISTRY,
)
outbox_published_total = Counter(
    "outbox_published_total",
    "Outbox rows the broker acknowledged.",
    registry=REGISTRY,
)
outbox_publish_retries_total = Counter(
    "outbox_publish_retries_total",
    "Publishes that failed and leave their rows pending for a later relay cycle.",
    registry=REGISTRY,
)
consumer_dedup_conflicts_total = Counter(
    "consumer_dedup_conflicts_total",
    "Messages a consumer had already processed (its dedup row existed).",
    registry=REGISTRY,
)
runs_paused_total = Counter(
    "runs_paused_total",
    "Runs this worker paused, by status (paused_indoubt, paused_human) and reason.",
    ["status", "reason"],
    registry=REGISTRY,
)
operator_actions_total = Counter(
    "operator_actions_total",
    "Operator decisions taken through this process, by action.",
    ["action"],
    registry=REGISTRY,
)

# One statement for every database gauge (the worker's tenant, by RLS).
_GAUGES_SQL = """
SELECT (SELECT COALESCE(jsonb_object_agg(status, n), '{}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM agent_runs GROUP BY status) s) AS by_status,
       (SELECT COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)
          FROM agent_runs WHERE status = 'queued')::float8 AS oldest_queued_s,
       (SELECT COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)
          FROM agent_runs WHERE status = 'paused_indoubt')::float8 AS in_doubt_s,
       (SELECT COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)
          FROM tool_operations WHERE status = 'unknown')::float8 AS unknown_s,
       (SELECT COALESCE(extract(epoch FROM clock_timestamp() - min(created_at)), 0)
          FROM outbox WHERE published_at IS NULL)::float8 AS outbox_s
"""
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


class DatabaseGauges(Collector):
    """Gauges read from the database when scraped (one short statement)."""

    def __init__(self, connect: Callable[[], psycopg.Connection[tuple[object, ...]]]) -> None:
        self.connect = connect

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            with self.connect() as conn:
                row = conn.execute(_GAUGES_SQL.encode()).fetchone()
        except psycopg.Error as exc:
            _log.warning("database gauges unavailable: %s", exc)
            return
        if row is None:
            return
        by_status, queued_s, in_doubt_s, unknown_s, outbox_s = row
        runs = GaugeMetricFamily(
            "agent_runs_by_status", "Runs of this tenant by status.", labels=["status"]
        )
        counts = by_status if isinstance(by_status, dict) else {}
        for status in STATUSES:
            runs.add_metric([status], float(str(counts.get(status, 0))))
        yield runs
        for name, help_, value in (
            ("agent_oldest_queued_age_seconds", "Age of the oldest queued run.", queued_s),
            (
                "in_doubt_age_seconds",
                "How long the oldest run paused in doubt has waited.",
                in_doubt_s,
            ),
            (
                "tool_operation_unknown_oldest_age_seconds",
                "Age of the oldest tool operation still unknown.",
                unknown_s,
            ),
            (
                "outbox_oldest_pending_age_seconds",
                "Age of the oldest outbox row not yet published.",
                outbox_s,
            ),
        ):
            yield GaugeMetricFamily(name, help_, value=float(str(value or 0.0)))


def watch_database(connect: Callable[[], psycopg.Connection[tuple[object, ...]]]) -> None:
    """Add the database gauges to the registry (once per process)."""
    REGISTRY.register(DatabaseGauges(connect))


def serve(port: int) -> None:
    """Serve the registry on 127.0.0.1:port (a daemon thread)."""
    start_http_server(port, addr="127.0.0.1", registry=REGISTRY)


def write_snapshot(path: Path) -> None:
    """The registry in the text exposition format, written at exit (the harness
    reads it for workers that ended before it could scrape them)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(generate_latest(REGISTRY))
    tmp.replace(path)
