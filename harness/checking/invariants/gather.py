"""Gather :class:`Evidence` from a live experiment database and tool.

Only independent sources: the database queried as superuser (the harness's
audit trail, recorded as model rows, and the final rows of every relation of
the model, harness/model), the mock tool's own export, and the workers'
history files (their account, to be judged). The caller passes a query
function, so this works on any database holding the model, not only inside
an experiment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.checking.history import Event
from harness.checking.invariants.model import Change, Evidence, WorkerLogs, with_purged
from harness.model.compile import DECLARED
from harness.model.entities import RELATIONS, relation

Query = Callable[[str, Sequence[Any] | None], list[dict[str, Any]]]

CHANGES_SQL = (
    "SELECT seq, extract(epoch FROM at)::float8 AS at, "
    "extract(epoch FROM tx_start)::float8 AS tx_start, txid, app, db_user, "
    "coalesce(statement, '') AS statement, tbl, op, old, new, "
    # The audit row is written by the transaction it records, so its xmin
    # is that transaction's (or subtransaction's) id.
    "CASE WHEN current_setting('track_commit_timestamp')::bool "
    "THEN extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 END AS committed_at "
    "FROM fencecheck_audit.changes ORDER BY seq"
)


class AuditMissing(RuntimeError):
    """The database holds no audit trail: the harness's trigger was not installed."""


def changes(query: Query) -> list[Change]:
    """The audit trail of every contract table, in audit order."""
    present = query("SELECT to_regclass('fencecheck_audit.changes') IS NOT NULL AS ok", None)
    if not present or not present[0]["ok"]:
        raise AuditMissing("fencecheck_audit.changes does not exist in this database")
    return [
        Change(
            seq=int(r["seq"]),
            at=float(r["at"]),
            tx_start=float(r["tx_start"]),
            txid=int(r["txid"]),
            app=str(r["app"]),
            table=str(r["tbl"]),
            op=str(r["op"]),
            old=r["old"],
            new=r["new"],
            statement=str(r["statement"]),
            db_user=str(r["db_user"]),
            committed_at=None if r.get("committed_at") is None else float(r["committed_at"]),
        )
        for r in query(CHANGES_SQL, None)
    ]


def tables(query: Query) -> dict[str, list[dict[str, Any]]]:
    """Final rows of every relation of the model, as jsonb (times as ISO text)."""
    return {
        name: [r["row"] for r in query(f"SELECT to_jsonb(t) AS row FROM {relation(name)} t", None)]
        for name in RELATIONS
    }


def declared(query: Query) -> dict[str, frozenset[str]] | None:
    """The model columns the mapping declares, per relation (None: a database
    whose model predates the record)."""
    present = query(f"SELECT to_regclass('{DECLARED}') IS NOT NULL AS ok", None)
    if not present or not present[0]["ok"]:
        return None
    out: dict[str, set[str]] = {name: set() for name in RELATIONS}
    for r in query(f"SELECT relation, column_name FROM {DECLARED}", None):
        out.setdefault(str(r["relation"]), set()).add(str(r["column_name"]))
    return {name: frozenset(cols) for name, cols in out.items()}


def gather(
    query: Query,
    *,
    tool_export: dict[str, Any],
    history: list[Event],
    lease_ttl_ms: int,
    lease_ttl_ms_by_app: dict[str, int] | None = None,
    dispatch_ttl_ms_by_app: dict[str, int] | None = None,
    worker_logs: WorkerLogs | None = None,
    write_paths: dict[str, str] | None = None,
    asked_write_path: str | None = None,
    replies: list[dict[str, Any]] | None = None,
    functions_called: dict[str, int] | None = None,
    statements_called: list[dict[str, Any]] | None = None,
    server_counts_unknown: str = "",
    worker_lifetimes_s: list[float] | None = None,
    history_restarts: list[dict[str, Any]] | None = None,
    connection_attempts: dict[str, int] | None = None,
    connections_unknown: str = "",
    link_cuts: list[dict[str, Any]] | None = None,
) -> Evidence:
    trail = changes(query)
    return Evidence(
        changes=trail,
        tables=with_purged(tables(query), trail),
        tool=tool_export,
        history=history,
        lease_ttl_ms=lease_ttl_ms,
        lease_ttl_ms_by_app=dict(lease_ttl_ms_by_app or {}),
        dispatch_ttl_ms_by_app=dict(dispatch_ttl_ms_by_app or {}),
        worker_logs=worker_logs,
        write_paths=dict(write_paths or {}),
        asked_write_path=asked_write_path,
        declared=declared(query),
        replies=list(replies or []),
        functions_called=functions_called,
        statements_called=statements_called,
        server_counts_unknown=server_counts_unknown,
        worker_lifetimes_s=list(worker_lifetimes_s or []),
        history_restarts=list(history_restarts or []),
        connection_attempts=connection_attempts,
        connections_unknown=connections_unknown,
        link_cuts=list(link_cuts or []),
    )
