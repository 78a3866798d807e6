"""Durable storage of the mock tool: its request log is independent evidence.

The store is one SQLite file in the tool's own storage directory, never the
agent database, so that what the tool says happened cannot be rewritten by
the system under test.

Invariants (the rest of the mock tool relies on them):

* Every write method commits before it returns, in WAL mode with
  ``synchronous=FULL`` (the WAL is fsync'd on every commit). The server only
  answers after the write returned, so nothing it acknowledged can be lost to
  a SIGKILL of the tool.
* A request is logged as ``pending`` when it arrives, before any fault or act.
  A resource row and the final outcome of the request that created it commit
  in one transaction: a ``pending`` (later ``interrupted``) request never
  created anything, and every resource has exactly one creating request.
* Sequence numbers come from ``AUTOINCREMENT``: never reused, also after a
  crash, so ``seq`` orders the log and gaps mean nothing was committed.
* Resources are counted from the ``resources`` table, never from requests:
  requests are attempts, resources are real side effects.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mock_tool.canonical import request_digest
from mock_tool.constants import deterministic_resource_id, iso

DB_FILE = "mock_tool.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS boots (
    boot INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL,
    pid INTEGER NOT NULL,
    tools_json TEXT NOT NULL,
    retention_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    received_at REAL NOT NULL,
    completed_at REAL,
    tool TEXT,
    capability TEXT,
    operation_id TEXT,
    run_id TEXT,
    epoch INTEGER,
    body_digest TEXT,
    outcome TEXT NOT NULL,
    resource_id TEXT,
    http_status INTEGER,
    fault_id TEXT,
    fault_mode TEXT,
    callback_url TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS requests_by_op ON requests (tool, operation_id);
CREATE TABLE IF NOT EXISTS resources (
    resource_id TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    capability TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    body_digest TEXT NOT NULL,
    request_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    request_seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS resources_by_op ON resources (tool, operation_id);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tool TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    body_digest TEXT NOT NULL,
    stored_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (tool, operation_id)
);
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    received_at REAL NOT NULL,
    tool TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    resource_id TEXT,
    http_status INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    received_at REAL NOT NULL,
    event_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    duplicate_of INTEGER
);
CREATE INDEX IF NOT EXISTS messages_by_event ON messages (event_id);
CREATE TABLE IF NOT EXISTS refused_publishes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    received_at REAL NOT NULL,
    event_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    fault_id TEXT,
    fault_mode TEXT
);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    delivered_at REAL NOT NULL,
    after_seq INTEGER NOT NULL,
    seqs_json TEXT NOT NULL,
    event_ids_json TEXT NOT NULL,
    fault_id TEXT,
    fault_mode TEXT
);
CREATE TABLE IF NOT EXISTS callbacks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    boot INTEGER NOT NULL,
    tool TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    resource_id TEXT NOT NULL,
    url TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    delay_ms INTEGER NOT NULL,
    scheduled_at REAL NOT NULL,
    attempted_at REAL NOT NULL,
    completed_at REAL,
    http_status INTEGER,
    error TEXT
);
"""

# Columns added after the first release of the log: a storage directory written
# by an older server gains them (NULL in its old rows) when it is opened.
_ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("requests", "answered_at", "REAL"),
    ("messages", "arrived_at", "REAL"),
    ("messages", "fault_id", "TEXT"),
    ("messages", "fault_mode", "TEXT"),
)

# Columns that hold unix times; export adds an ``<name>_iso`` twin for each.
_TIME_COLUMNS = frozenset(
    {"received_at", "completed_at", "created_at", "started_at", "stored_at", "expires_at"}
    | {"scheduled_at", "attempted_at", "answered_at", "arrived_at", "delivered_at"}
)

# HTTP status answered for each base outcome when no fault changes the answer.
_STATUS_OF: dict[str, int] = {
    "created": 201,
    "replayed": 200,
    "conflict": 409,
    "conflict_other_body": 409,
    "key_reuse_rejected": 422,
}

# How the caller will be answered once the tool acted: normally, not at all
# (drop), with an ambiguous 500 or 503, with a 202 that carries no result, or
# normally but late (after the caller may have given up).
After = Literal["answer", "drop", "5xx", "503", "accepted", "late"]
_SUFFIX_OF: dict[str, tuple[str, int | None]] = {
    "drop": ("_then_dropped", None),
    "5xx": ("_then_5xx", 500),
    "503": ("_then_503", 503),
    "accepted": ("_then_accepted", 202),
}

#: What a resource planted by ``conflict_other_body`` was made from: the
#: caller's request with this field added, so its digest differs.
OTHER_BODY_FIELD = "made_by_another_request"


class StoreClosed(RuntimeError):
    """The store was closed (the server is shutting down)."""


@dataclass(frozen=True)
class ActResult:
    """What one create did, as committed to the log."""

    outcome: str  # final logged outcome, e.g. ``created_then_dropped``
    base: str  # ``created``, ``replayed``, ``conflict`` or ``key_reuse_rejected``
    resource_id: str | None
    http_status: int | None  # status to answer with; None = close without answering
    created: bool  # a new resource row was committed for this request's body
    resource: dict[str, Any] | None  # the resource the request created or hit


def _row_dict(row: sqlite3.Row) -> dict[str, Any]:
    """A row as a plain dict, JSON columns decoded, times also as ISO text."""
    out: dict[str, Any] = {}
    for key in row.keys():  # noqa: SIM118 - sqlite3.Row is not a mapping
        value = row[key]
        if key.endswith("_json"):
            out[key.removesuffix("_json")] = json.loads(value)
            continue
        out[key] = value
        if key in _TIME_COLUMNS:
            out[f"{key}_iso"] = iso(value)
    return out


def _remember_key(
    db: sqlite3.Connection,
    tool: str,
    operation_id: str,
    resource_id: str,
    body_digest: str,
    retention_s: float,
) -> None:
    """An idempotent tool's key for ``operation_id``, kept for ``retention_s``."""
    now = time.time()
    db.execute(
        "INSERT OR REPLACE INTO idempotency_keys (tool, operation_id, resource_id,"
        " body_digest, stored_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        (tool, operation_id, resource_id, body_digest, now, now + retention_s),
    )


class Store:
    """The tool's durable log; thread-safe (one connection behind one lock).

    One connection serialised by a lock keeps every read-check-write of a
    create atomic without relying on SQLite busy handling.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / DB_FILE
        self._lock = threading.Lock()
        self._closed = False
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"SQLite refused WAL mode for {self.path} (got {mode!r})")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        for table, column, kind in _ADDED_COLUMNS:
            have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self.boot = 0

    # -- plumbing -------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()

    # -- lifecycle ------------------------------------------------------

    def start_boot(self, pid: int, tools: dict[str, str], retention_s: float) -> int:
        """Record a server start; requests left ``pending`` by earlier boots
        become ``interrupted`` (they were received but never acted on)."""
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO boots (started_at, pid, tools_json, retention_s) VALUES (?, ?, ?, ?)",
                (now, pid, json.dumps(tools, sort_keys=True), retention_s),
            )
            self.boot = int(cur.lastrowid or 0)
            db.execute(
                "UPDATE requests SET outcome = 'interrupted', completed_at = ?,"
                " error = 'the tool stopped before acting on this request'"
                " WHERE outcome = 'pending' AND boot < ?",
                (now, self.boot),
            )
        return self.boot

    # -- creates --------------------------------------------------------

    def begin_request(
        self,
        *,
        received_at: float,
        tool: str,
        capability: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        body_digest: str,
        fault_id: str | None,
        fault_mode: str | None,
        callback_url: str | None,
    ) -> int:
        """Log an arriving valid create as ``pending``; returns its seq."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO requests (boot, received_at, tool, capability, operation_id, run_id,"
                " epoch, body_digest, outcome, fault_id, fault_mode, callback_url)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                (
                    self.boot,
                    received_at,
                    tool,
                    capability,
                    operation_id,
                    run_id,
                    epoch,
                    body_digest,
                    fault_id,
                    fault_mode,
                    callback_url,
                ),
            )
            return int(cur.lastrowid or 0)

    def finish_without_act(
        self, seq: int, outcome: str, http_status: int | None, error: str | None = None
    ) -> None:
        """Close a pending request that was answered without acting."""
        with self._tx() as db:
            db.execute(
                "UPDATE requests SET outcome = ?, http_status = ?, error = ?, completed_at = ?"
                " WHERE seq = ?",
                (outcome, http_status, error, time.time(), seq),
            )

    def log_bad_request(
        self,
        *,
        received_at: float,
        http_status: int,
        error: str,
        tool: str | None = None,
        operation_id: str | None = None,
        run_id: str | None = None,
        epoch: int | None = None,
        body_digest: str | None = None,
    ) -> int:
        """Log a refused create (outcome ``bad_request``); it creates nothing."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO requests (boot, received_at, completed_at, tool, operation_id, run_id,"
                " epoch, body_digest, outcome, http_status, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'bad_request', ?, ?)",
                (
                    self.boot,
                    received_at,
                    time.time(),
                    tool,
                    operation_id,
                    run_id,
                    epoch,
                    body_digest,
                    http_status,
                    error,
                ),
            )
            return int(cur.lastrowid or 0)

    def act(
        self,
        seq: int,
        *,
        tool: str,
        capability: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        body_digest: str,
        request: dict[str, Any],
        retention_s: float,
        after: After,
        other_body: bool = False,
    ) -> ActResult:
        """Perform the create per the tool's capability and log its outcome.

        One transaction: the resource (if any) and the request's final outcome
        commit together, before the caller answers. ``after`` says how the
        caller will answer (see :data:`After`), and is folded into the logged
        outcome so the log says what the caller saw. ``other_body`` (fault
        ``conflict_other_body``): instead of acting, the tool finds under this
        operation_id a resource made from another request body (planted now,
        by this request's row, when the tool holds none yet) and answers 409.
        """
        with self._tx() as db:
            if other_body:
                base, resource_id = (
                    "conflict_other_body",
                    self._plant_other_body(
                        db, seq, tool, capability, operation_id, run_id, epoch, request, retention_s
                    ),
                )
                created = False
            else:
                base, resource_id, created = self._apply(
                    db, tool, capability, operation_id, body_digest, retention_s
                )
            if created:
                self._insert_resource(
                    db, resource_id, tool, capability, operation_id, run_id, epoch, request, seq
                )
            row = db.execute(
                "SELECT * FROM resources WHERE resource_id = ?", (resource_id,)
            ).fetchone()
            resource = _row_dict(row) if row is not None else None
            suffix, status = _SUFFIX_OF.get(after, ("", _STATUS_OF[base]))
            if after == "late":
                suffix = "_then_late"
            outcome = base + suffix
            db.execute(
                "UPDATE requests SET outcome = ?, resource_id = ?, http_status = ?,"
                " completed_at = ? WHERE seq = ?",
                (outcome, resource_id, status, time.time(), seq),
            )
        return ActResult(outcome, base, resource_id, status, created, resource)

    @staticmethod
    def _apply(
        db: sqlite3.Connection,
        tool: str,
        capability: str,
        operation_id: str,
        body_digest: str,
        retention_s: float,
    ) -> tuple[str, str, bool]:
        """What the tool's capability makes of a create: (base outcome,
        resource id, whether a new resource is to be inserted)."""
        now = time.time()
        if capability == "idempotent":
            key = db.execute(
                "SELECT * FROM idempotency_keys WHERE tool = ? AND operation_id = ?",
                (tool, operation_id),
            ).fetchone()
            if key is not None and key["expires_at"] > now:
                # Same key, different request: a real API refuses to guess.
                same = key["body_digest"] == body_digest
                return ("replayed" if same else "key_reuse_rejected"), key["resource_id"], False
            # No key, or the retention window is over: the tool forgot the key,
            # so the repeat creates a second resource.
            resource_id = f"res-{uuid.uuid4().hex}"
            _remember_key(db, tool, operation_id, resource_id, body_digest, retention_s)
            return "created", resource_id, True
        if capability == "deterministic_id":
            resource_id = deterministic_resource_id(tool, operation_id)
            exists = db.execute(
                "SELECT 1 FROM resources WHERE resource_id = ?", (resource_id,)
            ).fetchone()
            return ("conflict", resource_id, False) if exists else ("created", resource_id, True)
        # "query" and "none": create is not idempotent; every create is new.
        return "created", f"res-{uuid.uuid4().hex}", True

    def _plant_other_body(
        self,
        db: sqlite3.Connection,
        seq: int,
        tool: str,
        capability: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        request: dict[str, Any],
        retention_s: float,
    ) -> str:
        """The resource another request body made under ``operation_id``: the one
        the tool already holds, else one planted now (an idempotent tool also
        keeps the key with that body's digest, so a resend is a key reuse)."""
        existing = db.execute(
            "SELECT resource_id FROM resources WHERE tool = ? AND operation_id = ?"
            " ORDER BY created_at, rowid LIMIT 1",
            (tool, operation_id),
        ).fetchone()
        if existing is not None:
            return str(existing["resource_id"])
        other = {**request, OTHER_BODY_FIELD: True}
        resource_id = (
            deterministic_resource_id(tool, operation_id)
            if capability == "deterministic_id"
            else f"res-{uuid.uuid4().hex}"
        )
        self._insert_resource(
            db, resource_id, tool, capability, operation_id, run_id, epoch, other, seq
        )
        if capability == "idempotent":
            _remember_key(db, tool, operation_id, resource_id, request_digest(other), retention_s)
        return resource_id

    @staticmethod
    def _insert_resource(
        db: sqlite3.Connection,
        resource_id: str,
        tool: str,
        capability: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        request: dict[str, Any],
        seq: int,
    ) -> None:
        db.execute(
            "INSERT INTO resources (resource_id, tool, capability, operation_id, run_id,"
            " epoch, body_digest, request_json, created_at, request_seq)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                resource_id,
                tool,
                capability,
                operation_id,
                run_id,
                epoch,
                request_digest(request),
                json.dumps(request, sort_keys=True, ensure_ascii=False),
                time.time(),
                seq,
            ),
        )

    def mark_answered(self, seq: int) -> None:
        """Record when a late answer (fault ``answer_late``) was sent."""
        with self._tx() as db:
            db.execute("UPDATE requests SET answered_at = ? WHERE seq = ?", (time.time(), seq))

    # -- queries --------------------------------------------------------

    def find_resources(self, tool: str, operation_id: str) -> list[dict[str, Any]]:
        """All resources ``tool`` created for ``operation_id``, oldest first."""
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            rows = self._db.execute(
                "SELECT * FROM resources WHERE tool = ? AND operation_id = ?"
                " ORDER BY created_at, rowid",
                (tool, operation_id),
            ).fetchall()
        return [_row_dict(r) for r in rows]

    def key_remembered(self, tool: str, operation_id: str) -> bool:
        """Whether ``tool`` still holds the idempotency key (inside its retention)."""
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            row = self._db.execute(
                "SELECT expires_at FROM idempotency_keys WHERE tool = ? AND operation_id = ?",
                (tool, operation_id),
            ).fetchone()
        return row is not None and float(row["expires_at"]) > time.time()

    def in_progress(self, tool: str, operation_id: str) -> bool:
        """Whether a create of ``operation_id`` arrived and has not been acted on yet."""
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            row = self._db.execute(
                "SELECT 1 FROM requests WHERE tool = ? AND operation_id = ? AND outcome = 'pending'"
                " AND boot = ?",
                (tool, operation_id, self.boot),
            ).fetchone()
        return row is not None

    def log_query(
        self,
        *,
        received_at: float,
        tool: str,
        operation_id: str,
        outcome: str,
        resource_id: str | None,
        http_status: int,
    ) -> int:
        """Log a query by operation_id (``found``, ``not_found``, ``unsupported``)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO queries (boot, received_at, tool, operation_id, outcome, resource_id,"
                " http_status) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.boot, received_at, tool, operation_id, outcome, resource_id, http_status),
            )
            return int(cur.lastrowid or 0)

    # -- broker ---------------------------------------------------------

    def publish(
        self,
        event_id: str,
        topic: str,
        payload: Any,
        *,
        arrived_at: float | None = None,
        fault_id: str | None = None,
        fault_mode: str | None = None,
    ) -> tuple[int, int | None]:
        """Append a message (duplicates kept); returns (seq, seq of first copy or None).
        ``received_at`` is when the broker took it (this commit); ``arrived_at``
        when the publish arrived, earlier under ``publish_ack_late``."""
        with self._tx() as db:
            first = db.execute(
                "SELECT MIN(seq) FROM messages WHERE event_id = ?", (event_id,)
            ).fetchone()[0]
            now = time.time()
            cur = db.execute(
                "INSERT INTO messages (boot, received_at, event_id, topic, payload_json,"
                " duplicate_of, arrived_at, fault_id, fault_mode)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.boot,
                    now,
                    event_id,
                    topic,
                    json.dumps(payload, ensure_ascii=False),
                    first,
                    now if arrived_at is None else arrived_at,
                    fault_id,
                    fault_mode,
                ),
            )
            return int(cur.lastrowid or 0), first

    def refuse_publish(
        self, event_id: str, topic: str, http_status: int, fault_id: str, fault_mode: str
    ) -> int:
        """Log a publish the broker refused without taking the message (``publish_fail``)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO refused_publishes (boot, received_at, event_id, topic, http_status,"
                " fault_id, fault_mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.boot, time.time(), event_id, topic, http_status, fault_id, fault_mode),
            )
            return int(cur.lastrowid or 0)

    def log_delivery(
        self,
        after: int,
        delivered: list[dict[str, Any]],
        fault_id: str | None,
        fault_mode: str | None,
    ) -> int:
        """Log one read: where it began and what it handed out, in that order
        (duplicates and reordering by a delivery fault included; nothing for
        an empty read)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO deliveries (boot, delivered_at, after_seq, seqs_json,"
                " event_ids_json, fault_id, fault_mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    self.boot,
                    time.time(),
                    after,
                    json.dumps([m["seq"] for m in delivered]),
                    json.dumps([m["event_id"] for m in delivered]),
                    fault_id,
                    fault_mode,
                ),
            )
            return int(cur.lastrowid or 0)

    def messages(self, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Messages with ``seq > after`` in seq order."""
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            rows = self._db.execute(
                "SELECT * FROM messages WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, -1 if limit is None else limit),
            ).fetchall()
        return [_row_dict(r) for r in rows]

    # -- callbacks ------------------------------------------------------

    def begin_callback_attempt(
        self,
        *,
        tool: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        resource_id: str,
        url: str,
        attempt: int,
        delay_ms: int,
        scheduled_at: float,
    ) -> int:
        """Log a callback attempt before it is sent (so a receiver never sees a
        callback the log lacks); returns its id. ``http_status`` stays NULL
        until :meth:`finish_callback_attempt`."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO callbacks (boot, tool, operation_id, run_id, epoch, resource_id, url,"
                " attempt, delay_ms, scheduled_at, attempted_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.boot,
                    tool,
                    operation_id,
                    run_id,
                    epoch,
                    resource_id,
                    url,
                    attempt,
                    delay_ms,
                    scheduled_at,
                    time.time(),
                ),
            )
            return int(cur.lastrowid or 0)

    def finish_callback_attempt(
        self, callback_id: int, http_status: int | None, error: str | None
    ) -> None:
        """Record what the receiver answered (or why there was no answer)."""
        with self._tx() as db:
            db.execute(
                "UPDATE callbacks SET completed_at = ?, http_status = ?, error = ? WHERE id = ?",
                (time.time(), http_status, error, callback_id),
            )

    # -- export ---------------------------------------------------------

    def export(self) -> dict[str, list[dict[str, Any]]]:
        """Every table as plain JSON-able lists of dicts, in log order."""
        tables = {
            "requests": "SELECT * FROM requests ORDER BY seq",
            "resources": "SELECT * FROM resources ORDER BY request_seq",
            "messages": "SELECT * FROM messages ORDER BY seq",
            "callbacks": "SELECT * FROM callbacks ORDER BY id",
            "queries": "SELECT * FROM queries ORDER BY seq",
            "refused_publishes": "SELECT * FROM refused_publishes ORDER BY seq",
            "deliveries": "SELECT * FROM deliveries ORDER BY id",
            "boots": "SELECT * FROM boots ORDER BY boot",
        }
        with self._lock:
            if self._closed:
                raise StoreClosed("mock_tool storage is closed")
            # One read transaction: all lists describe the same instant.
            self._db.execute("BEGIN")
            try:
                out = {
                    name: [_row_dict(r) for r in self._db.execute(sql).fetchall()]
                    for name, sql in tables.items()
                }
            finally:
                self._db.execute("COMMIT")
        return out
