"""The evidence a finished history is judged on, and what a judgement says.

:class:`Evidence` is plain data gathered once per experiment from sources
independent of the worker (see :mod:`.gather`): the harness's audit trail of
every contract table, the final rows of those tables, the mock tool's own
log and the worker histories (its *account*, judged against the rest, never
taken as proof). It can also be built by hand (the unit tests do) or from a
stored history by a later exploration mode: nothing here talks to a
database or a process.

Times are Unix seconds (float) on the host's wall clock: the database's
``clock_timestamp()``, the tool's ``time.time()`` and the harness run on the
same kernel clock (local processes and containers alike).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.checking.history import Event

TERMINAL = ("succeeded", "failed", "cancelled")
LIVE = ("queued", "running", "waiting_tool")
HOLDS_LEASE = ("running", "waiting_tool")
# The harness's own sessions (planting a fault state, probing as superuser):
# their changes are evidence of what the harness did, not of the protocol.
HARNESS_APP_PREFIX = "fencecheck-harness"


def ts(value: Any) -> float | None:
    """Unix seconds of a timestamp given as a datetime, an ISO text or a number."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value).timestamp()
    raise TypeError(f"not a timestamp: {value!r}")


@dataclass(frozen=True)
class Change:
    """One row change of a contract table, as the harness's audit trigger saw it."""

    seq: int
    at: float  # clock_timestamp() when the row changed
    tx_start: float  # now(): when its transaction began
    txid: int
    app: str  # application_name of the session (the worker id for workers)
    table: str
    op: str  # INSERT | UPDATE | DELETE
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    statement: str = ""  # the client's top-level statement, truncated
    db_user: str = ""
    # When its transaction committed (None where the server does not track
    # commit times): from then on other sessions could see the change.
    committed_at: float | None = None

    @property
    def visible_at(self) -> float:
        """The earliest moment another session could have seen this change."""
        return self.at if self.committed_at is None else self.committed_at

    @property
    def row(self) -> dict[str, Any]:
        """The row after the change (before it, for a DELETE)."""
        return self.new if self.new is not None else (self.old or {})

    def before(self, column: str) -> Any:
        return (self.old or {}).get(column)

    def after(self, column: str) -> Any:
        return (self.new or {}).get(column)

    def changed(self, column: str) -> bool:
        return self.op == "UPDATE" and self.before(column) != self.after(column)

    @property
    def by_harness(self) -> bool:
        return self.app.startswith(HARNESS_APP_PREFIX)

    def brief(self, *columns: str) -> dict[str, Any]:
        """The change as a small row for a violation report."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "table": self.table,
            "op": self.op,
            "txid": self.txid,
            "app": self.app,
        }
        for c in columns:
            if self.op == "UPDATE" and self.changed(c):
                out[c] = [self.before(c), self.after(c)]
            else:
                out[c] = self.row.get(c)
        return out


@dataclass
class WorkerLogs:
    """The workers' log files an experiment left, as the harness read them."""

    files: int = 0
    planted_at: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Evidence:
    """Everything the global invariants read about one finished history."""

    changes: list[Change] = field(default_factory=list)
    # Final rows of each contract table, read as superuser (table -> rows).
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # The mock tool's own export (requests, resources, messages, callbacks, tools).
    tool: dict[str, Any] = field(default_factory=dict)
    # The workers' accounts (contract section 4): judged, never trusted.
    history: list[Event] = field(default_factory=list)
    lease_ttl_ms: int = 0
    # The lease duration each worker the harness started was given, by its
    # application name (its worker id): what a grant by that session asks for.
    lease_ttl_ms_by_app: dict[str, int] = field(default_factory=dict)
    # The dispatch claim duration each worker the harness started was given
    # (FENCECHECK_DISPATCH_TTL_MS), by its application name.
    dispatch_ttl_ms_by_app: dict[str, int] = field(default_factory=dict)
    # What the harness read of the workers' own logs (stdout, stderr, event
    # history): how many files, and every line holding a planted sensitive
    # value (file, line number). None: not read (judged vacuously).
    worker_logs: WorkerLogs | None = None
    # Write paths the worker declares (name -> text its top-level statement
    # contains), and the one the experiment asked for (None: not judged).
    write_paths: dict[str, str] = field(default_factory=dict)
    asked_write_path: str | None = None
    # Model columns the mapping gives a value, per relation (None: not known,
    # an older database; invariants then go by the values they see).
    declared: dict[str, frozenset[str]] | None = None
    # The harness's log of every ops request and its reply (worker, op, ok,
    # error, schema_problems): what the worker answered, judged against the
    # contract's reply schema.
    replies: list[dict[str, Any]] = field(default_factory=list)
    # The database functions the experiment ran, with the server's own count
    # of calls (track_functions; None: not known, e.g. after a failover).
    functions_called: dict[str, int] | None = None
    # Each statement the experiment's roles (not the harness) ran, with the
    # server's count: {role, query, calls} (pg_stat_statements; None: not known).
    statements_called: list[dict[str, Any]] | None = None
    # Why a server count above is None ("" when not told).
    server_counts_unknown: str = ""
    # The connection attempts (TCP SYNs) on each worker link of the experiment,
    # counted by the run's firewall table (None: not known; why in
    # connections_unknown).
    connection_attempts: dict[str, int] | None = None
    connections_unknown: str = ""
    # Each cut of a counted link: {link, seconds, attempts made meanwhile}.
    link_cuts: list[dict[str, Any]] = field(default_factory=list)
    # How long each worker process the harness started lived, in seconds
    # (start to the harness seeing its exit; a stopped process counts).
    worker_lifetimes_s: list[float] = field(default_factory=list)
    # Each worker process started on a history file earlier processes of its
    # worker id had written: {worker, bytes_before, kept} (kept: the file
    # still begins with those bytes).
    history_restarts: list[dict[str, Any]] = field(default_factory=list)
    # Index of changes by (txid, table), built on first use.
    _by_tx: dict[Any, list[Change]] | None = field(default=None, repr=False, compare=False)
    _indexed: int = field(default=-1, repr=False, compare=False)

    # ------------------------------------------------------------ access
    def answered_ok(self, op: str) -> list[dict[str, Any]]:
        """The ops log's ok replies to ``op`` whose arguments and audit window
        (seq_before, seq_after) are known: the ones a judge can place."""
        return [
            r
            for r in self.replies
            if r.get("op") == op
            and r.get("ok")
            and isinstance(r.get("args"), dict)
            and r.get("seq_before") is not None
            and r.get("seq_after") is not None
        ]

    def of(self, table: str, op: str | None = None) -> Iterator[Change]:
        """Audited changes of one table (optionally one kind), in audit order."""
        return (c for c in self.changes if c.table == table and (op is None or c.op == op))

    def rows(self, table: str) -> list[dict[str, Any]]:
        return self.tables.get(table, [])

    def declares(self, table: str, column: str) -> bool | None:
        """Whether the mapping gives ``column`` of ``table`` a value (None: not known)."""
        if self.declared is None:
            return None
        return column in self.declared.get(table, frozenset())

    def requests(self) -> list[dict[str, Any]]:
        """Create requests the tool received (bad input excluded: it never acts)."""
        return [r for r in self.tool.get("requests", []) if r.get("outcome") != "bad_request"]

    def purge_txids(self) -> set[int]:
        """Transactions that deleted a task row (a retention purge, contract
        op ``purge``): their deletions are judged by
        ``run.only_finished_tasks_are_purged``, not as history rewritten."""
        return purge_txids(self.changes)

    def capability(self, tool: str) -> str | None:
        caps = self.tool.get("tools") or {}
        value = caps.get(tool) if isinstance(caps, dict) else None
        return str(value) if value is not None else None

    def in_tx(self, txid: int, table: str) -> list[Change]:
        """Changes of ``table`` made by transaction ``txid``, in audit order."""
        if self._by_tx is None or self._indexed != len(self.changes):
            self._by_tx = group(self.changes, lambda c: (c.txid, c.table))
            self._indexed = len(self.changes)
        return self._by_tx.get((txid, table), [])


@dataclass(frozen=True)
class Finding:
    """What an invariant function found: how many items it judged, the rows
    that break it, and a note for the observed text."""

    checked: int
    violations: list[dict[str, Any]]
    note: str = ""


@dataclass(frozen=True)
class Result:
    """One invariant judged on one history."""

    name: str
    rule: str
    expected: str
    ok: bool
    checked: int
    violations: list[dict[str, Any]]
    observed: str
    exempt: str | None = None

    @property
    def broken(self) -> bool:
        """Broken and not exempted: makes the experiment fail."""
        return not self.ok and self.exempt is None


#: The tables a purge deletes from, each with the columns that name a row.
PURGED_TABLES = {
    "agent_runs": ("run_id",),
    "agent_checkpoints": ("run_id", "revision"),
    "tool_operations": ("operation_id",),
    "outbox": ("event_id",),
    "agent_tasks": ("tenant_id", "task_id"),
}


def purge_txids(changes: Iterable[Change]) -> set[int]:
    """The transactions (not the harness's) that deleted a task row."""
    return {
        c.txid
        for c in changes
        if c.table == "agent_tasks" and c.op == "DELETE" and not c.by_harness
    }


def with_purged(
    tables: dict[str, list[dict[str, Any]]], changes: list[Change]
) -> dict[str, list[dict[str, Any]]]:
    """The final rows plus the last image of every row a purge transaction
    deleted: the state a purged task ended in (its archive holds the same),
    so the invariants that read final rows judge it too."""
    txids = purge_txids(changes)
    out = {t: list(rows) for t, rows in tables.items()}
    for c in changes:
        if c.op == "DELETE" and c.txid in txids and c.old is not None and c.table in out:
            out[c.table].append(dict(c.old))
    return out


def group(items: Iterable[Any], key: Any) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out
