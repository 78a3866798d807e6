"""Control plane of runs: create, retry, cancel, callbacks, operator decisions.

Everything here is the operator group's (worker contract v2): the worker
role cannot execute these functions. Each operator decision (cancel,
resolve in doubt, approve / supplement / terminate, manual convergence)
writes one row of ``operator_actions`` (who, why, ticket, before/after,
database time) in the same transaction.

Invariants:
- a retry is a new run_id under the same task; active_run_id switches in the
  same transaction; the old run is left exactly as it is (rule 7);
- cancel forbids dispatch of prepared effects and leaves in-flight ones
  (dispatching, unknown) as they are (rule 6);
- a callback advances nothing but the ledger row of the run it names, and
  only while that run is its task's active, live run (rule 7).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from reference_impl import errors as e
from reference_impl import metrics
from reference_impl.checkpoint_schema import Checkpoint, decode
from reference_impl.db import Conn
from reference_impl.queries import Queries
from reference_impl.sealing import Sealer
from reference_impl.sqlstate import protocol_error


def translated(conn: Conn, sql: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Execute; database rejections become protocol errors (by SQLSTATE)."""
    try:
        return conn.execute(sql, params).fetchall()
    except psycopg.Error as exc:
        perr = protocol_error(exc)
        if perr is None:
            raise
        raise perr from exc


class RunControl:
    def __init__(
        self,
        queries: Queries,
        decoder: Callable[[int, int | None, Any, bytes | None], Checkpoint] = decode,
    ) -> None:
        self.q = queries
        self.decoder = decoder
        #: Seals the sensitive fields of a run's input before it is stored.
        self.sealer = Sealer(None)

    def create(
        self, conn: Conn, task_id: str, input_: dict[str, Any], max_attempts: int = 12
    ) -> dict[str, Any]:
        rows = translated(
            conn,
            self.q.sql("create_run"),
            {
                "task_id": task_id,
                "input": Jsonb(self.sealer.seal(input_)),
                "max_attempts": max_attempts,
            },
        )
        return {"run_id": str(rows[0]["run_id"]), "task_id": rows[0]["task_id"]}

    def retry(self, conn: Conn, task_id: str) -> dict[str, Any]:
        rows = translated(conn, self.q.sql("retry_run"), {"task_id": task_id})
        r = rows[0]
        return {"run_id": str(r["run_id"]), "task_id": r["task_id"], "retry_of": str(r["retry_of"])}

    def cancel(
        self,
        conn: Conn,
        run_id: uuid.UUID,
        reason: str = "cancelled",
        ticket: str | None = None,
    ) -> dict[str, Any]:
        rows = translated(
            conn, self.q.sql("cancel_run"), {"run_id": run_id, "reason": reason, "ticket": ticket}
        )
        metrics.operator_actions_total.labels("cancel").inc()
        return dict(rows[0])

    def resolve(
        self,
        conn: Conn,
        run_id: uuid.UUID,
        operation_id: str,
        decision: str,
        remote_id: str | None,
        reason: str,
        ticket: str | None = None,
    ) -> dict[str, Any]:
        """A person's finding on an operation in doubt; the paused run is queued again."""
        rows = translated(
            conn,
            self.q.sql("resolve_indoubt"),
            {
                "run_id": run_id,
                "operation_id": operation_id,
                "decision": decision,
                "remote_id": remote_id,
                "reason": reason,
                "ticket": ticket,
            },
        )
        metrics.operator_actions_total.labels("resolve").inc()
        return dict(rows[0])

    def decide(
        self,
        conn: Conn,
        run_id: uuid.UUID,
        decision: str,
        supplement: dict[str, Any] | None,
        reason: str,
        ticket: str | None = None,
    ) -> dict[str, Any]:
        """Approve, supplement or terminate a run paused for a human."""
        rows = translated(
            conn,
            self.q.sql("decide_human"),
            {
                "run_id": run_id,
                "decision": decision,
                "supplement": Jsonb(self.sealer.seal(supplement))
                if supplement is not None
                else None,
                "reason": reason,
                "ticket": ticket,
            },
        )
        metrics.operator_actions_total.labels(decision).inc()
        return dict(rows[0])

    def converge(
        self,
        conn: Conn,
        operation_id: str,
        outcome: str,
        remote_id: str | None,
        reason: str,
        ticket: str | None = None,
    ) -> dict[str, Any]:
        """Manual convergence of an unknown operation (a run paused in doubt with
        nothing else in doubt goes back to the queue; any other run is not moved)."""
        rows = translated(
            conn,
            self.q.sql("converge_operation"),
            {
                "operation_id": operation_id,
                "outcome": outcome,
                "remote_id": remote_id,
                "reason": reason,
                "ticket": ticket,
            },
        )
        metrics.operator_actions_total.labels("converge").inc()
        return dict(rows[0])

    def paused(self, conn: Conn) -> list[dict[str, Any]]:
        """Runs paused in doubt or for a human, with their operations and evidence."""
        return translated(conn, self.q.sql("paused_runs"), {})

    def actions(self, conn: Conn, run_id: uuid.UUID) -> list[dict[str, Any]]:
        """The operator decisions taken on a run, oldest first."""
        return translated(conn, self.q.sql("operator_actions"), {"run_id": run_id})

    def deliver_callback(
        self, conn: Conn, run_id: uuid.UUID, operation_id: str, payload: dict[str, Any]
    ) -> bool:
        rows = translated(
            conn,
            self.q.sql("deliver_callback"),
            {"run_id": run_id, "operation_id": operation_id, "payload": Jsonb(payload)},
        )
        return bool(rows[0]["accepted"])

    def state(self, conn: Conn, run_id: uuid.UUID) -> dict[str, Any]:
        rows = translated(conn, self.q.sql("run_state"), {"run_id": run_id})
        if not rows:
            raise e.RunNotFound(f"run {run_id} not found", reason="missing")
        return rows[0]

    def read_checkpoint(self, conn: Conn, run_id: uuid.UUID) -> Checkpoint | None:
        """The checkpoint at the run's revision, decoded (or refused) per rule 13."""
        self.state(conn, run_id)
        rows = translated(conn, self.q.sql("latest_checkpoint"), {"run_id": run_id})
        if not rows:
            return None
        row = rows[0]
        try:
            ck = self.decoder(
                int(row["revision"]), row["schema_version"], row["state_json"], row["state_hash"]
            )
        except (e.SchemaVersionUnknown, e.CheckpointCorrupt):
            metrics.checkpoint_migrations_total.labels("refused").inc()
            metrics.checkpoint_migration_failures_total.inc()
            raise
        if ck.migrated_from is not None:
            metrics.checkpoint_migrations_total.labels("migrated").inc()
        return ck
