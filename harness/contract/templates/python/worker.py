"""A worker for the fencecheck worker contract v2: a small starting point.

Written by `fencecheck init-worker --lang python DIR`. It implements the
contract (docs/worker-contract.md of fencecheck) in the simplest way that is
still correct: the command line (section 1), the injection-point client
(section 3), the event history (section 4), every required `ops` operation
(section 5), the schema (`schema.sql`, sections 6 and 7) and the protocol as
SQL functions (`protocol.sql`), and the `run` workflow (section 10).

Simple where the contract allows it:
- an operation whose outcome is unknown converges by a query of its tool or
  by a same-key resend where that creates nothing new (idempotent within its
  retention, deterministic_id); anything else pauses the run in doubt;
- sensitive input fields are stored as given (section 9 asks for sealing);
- the optional operator ops (`resolve_indoubt`, `decide`,
  `converge_operation`) answer Unsupported (J[operator_resolves], V: unknown).

Run it with a Python that has psycopg 3: `python3 worker.py MODE`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

HERE = Path(__file__).resolve().parent
ENV = os.environ
WORKER_ID = ENV.get("FENCECHECK_WORKER_ID", "worker")
TENANT = ENV.get("FENCECHECK_TENANT", "")
OWNER = f"{WORKER_ID}/{uuid.uuid4().hex[:12]}"  # this session's lease owner
SCHEMA_VERSION = 2  # the version of the checkpoint state this worker writes
SENSITIVE = ("customer_token", "payment_token", "card_number", "customer_email")
HOLDING = ("running", "waiting_tool")


SETTING_ERRORS: list[str] = []  # refused at start (section 2, experiment X)


def env_ms(name: str, default: int) -> int:
    raw = ENV.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:  # "10s" is no duration here: never read as a default
        SETTING_ERRORS.append(f"{name}={raw!r} is not whole milliseconds")
        return default


LEASE_TTL_MS = env_ms("FENCECHECK_LEASE_TTL_MS", 5000)
HEARTBEAT_MS = env_ms("FENCECHECK_HEARTBEAT_MS", 1000)
HEARTBEAT_TIMEOUT_MS = env_ms("FENCECHECK_HEARTBEAT_TIMEOUT_MS", 1000)
DISPATCH_TTL_MS = env_ms("FENCECHECK_DISPATCH_TTL_MS", 5000)
TOOL_TIMEOUT_S = env_ms("FENCECHECK_TOOL_TIMEOUT_MS", 3000) / 1000
BACKOFF_BASE_MS = 400  # the first full delay of a requeue (then doubled, capped at 10 s)
RETRY_WRITE_S = 30  # how long a protected write whose connection broke is retried


def log(message: str, **fields: Any) -> None:
    """One JSON line on stderr (stdout carries `ops` replies only)."""
    print(json.dumps({"msg": message, "worker": WORKER_ID, **fields}, default=str), file=sys.stderr)


# ------------------------------------------------------------ errors (section 5)
class ProtocolError(Exception):
    """A refusal the contract names; the class name is the reply's `error`."""


class LeaseLost(ProtocolError): ...


class RevisionConflict(ProtocolError): ...


class NotClaimable(ProtocolError): ...


class RunNotFound(ProtocolError): ...


class TaskExists(ProtocolError): ...


class RunNotRetryable(ProtocolError): ...


class LedgerConflict(ProtocolError): ...


class IntentConflict(ProtocolError): ...


class SchemaVersionUnknown(ProtocolError): ...


class CheckpointCorrupt(ProtocolError): ...


class CommitOutcomeUnknown(ProtocolError): ...


# The SQLSTATEs protocol.sql raises.
SQLSTATE_ERRORS: dict[str, type[ProtocolError]] = {
    "FC001": LeaseLost,
    "FC002": RevisionConflict,
    "FC003": RunNotFound,
    "FC004": TaskExists,
    "FC005": RunNotRetryable,
    "FC006": LedgerConflict,
    "23505": IntentConflict,  # a unique key of the ledger: the intent exists
}


# ------------------------------------------------------------ injection points (section 3)
def point(name: str, run_id: Any = None, epoch: int | None = None, **ids: Any) -> None:
    """Tell the harness we reached `name` and obey its one-line answer."""
    path = ENV.get("FENCECHECK_CONTROL")
    if not path:
        return
    request = {"v": 1, "type": "point", "point": name, "worker": WORKER_ID, "pid": os.getpid()}
    request |= {"run_id": str(run_id) if run_id else None, "epoch": epoch}
    request |= {"revision": ids.get("revision"), "operation_id": ids.get("operation_id")}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.settimeout(None)  # a hold is the harness not answering yet
            sock.sendall((json.dumps(request) + "\n").encode())
            line = sock.makefile("rb").readline()
        answer = json.loads(line)
    except (OSError, ValueError) as exc:
        log("control socket unusable; continuing", point=name, error=repr(exc))
        return
    if answer.get("action") == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if answer.get("action") == "delay":
        time.sleep(int(answer.get("ms", 0)) / 1000)


# ------------------------------------------------------------ event history (section 4)
_history_lock = threading.Lock()
_history_fd: int | None = None


def record(kind: str, op: str, ids: dict[str, Any], error: str | None = None) -> None:
    """Append one line to FENCECHECK_EVENTS (one os.write on O_APPEND)."""
    global _history_fd
    path = ENV.get("FENCECHECK_EVENTS")
    if not path:
        return
    line = {"time": time.time(), "worker": WORKER_ID, "pid": os.getpid(), "type": kind, "op": op}
    for key in ("run_id", "epoch", "revision", "operation_id", "event_id"):
        value = ids.get(key)
        line[key] = str(value) if isinstance(value, uuid.UUID) else value
    line |= {"error": error, "detail": {}}
    with _history_lock:
        if _history_fd is None:
            _history_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_history_fd, (json.dumps(line) + "\n").encode())


@contextmanager
def recorded(op: str, **ids: Any) -> Iterator[dict[str, Any]]:
    """invoke, then ok / fail (definitely not done) / info (outcome unknown).
    The caller puts ids learnt on the way (e.g. the new revision) in the dict."""
    record("invoke", op, ids)
    learnt: dict[str, Any] = dict(ids)
    try:
        yield learnt
    except CommitOutcomeUnknown:
        record("info", op, learnt, "CommitOutcomeUnknown")
        raise
    except (ProtocolError, psycopg.errors.InsufficientPrivilege) as exc:
        record("fail", op, learnt, type(exc).__name__)
        raise
    except Exception as exc:  # a lost connection, a timeout: it may have happened
        record("info", op, learnt, type(exc).__name__)
        raise
    record("ok", op, learnt)


# ------------------------------------------------------------ database
class Db:
    """One connection (autocommit), made again when it broke."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self.sync_wait_cancelled = False

    @property
    def conn(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=5
            )
            self._conn.add_notice_handler(self._notice)
        return self._conn

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        # A COMMIT answered while its wait for the synchronous standby was
        # cancelled is committed locally but not known to be durable.
        if "synchronous replication" in (diag.message_primary or ""):
            self.sync_wait_cancelled = True

    def call(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            known = SQLSTATE_ERRORS.get(exc.sqlstate or "")
            if known is not None:
                raise known(exc.diag.message_primary) from exc
            raise

    def one(self, sql: str, params: Any = ()) -> dict[str, Any] | None:
        rows = self.call(sql, params)
        return rows[0] if rows else None


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def jsonable(value: Any) -> Any:
    return json.loads(
        json.dumps(value, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v))
    )


@dataclass(frozen=True)
class Lease:
    run_id: str
    owner: str
    epoch: int


def claim(db: Db, owner: str, run_id: str | None) -> dict[str, Any] | None:
    """The grant, or None when nothing (or not that run) is claimable now."""
    return db.one(
        "SELECT run_id, epoch, revision, status, owner, lease_expires_at, input"
        " FROM fencecheck.claim(%s, %s, %s)",  # not next_attempt_at: it may be -infinity
        (owner, LEASE_TTL_MS, run_id),
    )


def latest_checkpoint(db: Db, run_id: str) -> dict[str, Any] | None:
    return db.one(
        "SELECT revision, state_json, schema_version, state_hash FROM agent_checkpoints"
        " WHERE run_id = %s ORDER BY revision DESC LIMIT 1",
        (run_id,),
    )


def protected_write(
    db: Db,
    lease: Lease,
    expected_revision: int,
    state: dict[str, Any],
    *,
    step: str | None,
    status: str | None,
    event_type: str,
    event_id: str | None = None,
    schema_version: int = SCHEMA_VERSION,
    intent: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    delay_ms: int | None = None,
) -> tuple[int, str]:
    """One protected write (section 6) in an explicit transaction with its two
    injection points: (new revision, event id).

    A connection lost on the way is read back by event id: committed, or the
    same write is sent again (its event id and the revision check make a
    second commit impossible), for up to RETRY_WRITE_S. CommitOutcomeUnknown
    when that cannot settle it, or when the COMMIT was answered with its wait for the synchronous
    standby cancelled (committed here, not known to be durable)."""
    event_id = event_id or str(uuid.uuid4())
    payload = {"tenant_id": TENANT, "run_id": lease.run_id, "epoch": lease.epoch, "step": step}
    params = (
        lease.run_id, lease.owner, lease.epoch, expected_revision,
        Jsonb(state), hashlib.sha256(canonical(state).encode()).digest(),
        schema_version, event_id, step, status, event_type, Jsonb(payload),
        Jsonb(intent) if intent else None, Jsonb(result) if result else None, delay_ms,
    )  # fmt: skip
    give_up_at = time.monotonic() + RETRY_WRITE_S
    for attempt in itertools.count():
        db.sync_wait_cancelled = False
        try:
            with db.conn.transaction():
                db.call("SELECT fencecheck.lock_lease(%s, %s, %s)", params[:3])
                point(
                    "after_lease_row_locked", lease.run_id, lease.epoch, revision=expected_revision
                )
                row = db.one(
                    "SELECT fencecheck.protected_write(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                    " %s, %s, %s, %s) AS revision",
                    params,
                )
                point("before_commit", lease.run_id, lease.epoch, revision=expected_revision)
        except psycopg.OperationalError:
            if (found := read_back(db.dsn, event_id)) is not None:
                return found, event_id
            if time.monotonic() > give_up_at:
                raise CommitOutcomeUnknown(f"event {event_id} not committed so far") from None
            time.sleep(0.2)
            continue
        except ProtocolError:
            if attempt and (found := read_back(db.dsn, event_id)) is not None:
                return found, event_id  # our earlier COMMIT went through after all
            raise
        if db.sync_wait_cancelled:
            raise CommitOutcomeUnknown("the wait for the synchronous standby was cancelled")
        assert row is not None
        return int(row["revision"]), event_id
    raise AssertionError("unreachable")


def read_back(dsn: str, event_id: str) -> int | None:
    """The revision the write with this event id committed, if it did."""
    try:
        found = Db(dsn).one(
            "SELECT revision FROM agent_checkpoints WHERE event_id = %s", (event_id,)
        )
    except psycopg.Error:
        return None
    return None if found is None else int(found["revision"])


# ------------------------------------------------------------ the tool and the broker
def http(method: str, url: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body); raises OSError when there is no answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TOOL_TIMEOUT_S) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text or b"{}")
        except ValueError:
            return err.code, {}


TOOL_URL = ENV.get("FENCECHECK_TOOL_URL", "").rstrip("/")
RESENDABLE = ("idempotent", "deterministic_id")  # a same-key resend creates nothing new
_health: dict[str, Any] = {}


def capability(tool: str) -> str:
    """idempotent, deterministic_id, query or none, as the tool declares it."""
    if tool not in _health.get("tools", {}):
        _health.update(http("GET", f"{TOOL_URL}/health")[1])
    return str(_health.get("tools", {}).get(tool, "none"))


def retention_ms(tool: str) -> int | None:
    """How long an idempotent tool remembers a key (None: for ever, or no key)."""
    if capability(tool) != "idempotent":
        return None
    seconds = _health.get("server", {}).get("idempotency_retention_s")
    return None if seconds is None else int(float(seconds) * 1000)


def send(op: dict[str, Any], epoch: int) -> tuple[str, str | None]:
    """Create the operation at its tool: (ledger status, remote id)."""
    body = {
        "operation_id": op["operation_id"],
        "run_id": str(op["run_id"]),
        "epoch": epoch,
        "request": op["request"],
    }
    try:
        status, answer = http("POST", f"{TOOL_URL}/tools/{op['tool_name']}/operations", body)
    except OSError:
        return "unknown", None  # it may have acted
    if status in (200, 201, 409):  # created, replayed, or (deterministic id) exists
        return "succeeded", answer.get("resource_id")
    if status == 422:
        return "failed_final", None
    if status == 429:
        return "prepared", None  # the tool proved it did nothing
    return "unknown", None


def query(op: dict[str, Any]) -> str | None:
    """The remote resource of an operation, if the tool can say and has one."""
    if capability(op["tool_name"]) == "none":
        return None
    quoted = urllib.parse.quote(op["operation_id"], safe="")
    try:
        status, answer = http("GET", f"{TOOL_URL}/tools/{op['tool_name']}/operations/{quoted}")
    except OSError:
        return None
    return answer.get("resource_id") if status == 200 else None


def request_body(run_input: dict[str, Any]) -> dict[str, Any]:
    """The tool step's request (section 10)."""
    body = {
        "kind": "return_label",
        "order_id": run_input.get("order_id", "order-1"),
        "amount": run_input.get("amount", 10),
        "plan_ok": True,
        "refundable": True,
    }
    return body | {k: run_input[k] for k in SENSITIVE if k in run_input}


# ------------------------------------------------------------ checkpoint versions
def legacy_sample(plan_done: bool = False) -> dict[str, Any]:
    """A version-1 checkpoint this worker migrates, and what it must keep; with
    ``plan_done`` one whose every step is done (experiment M[plan_done])."""
    steps = ["plan", "lookup", "create_label", "notify"] if plan_done else ["plan", "lookup"]
    state = {"steps": steps, "order": {"id": "o-legacy", "amount": 42}}
    # The first write after resuming a sample with every step done is the
    # finish, which adds itself to "done": only the data must be kept there.
    expect = {"data.order_id": "o-legacy", "data.amount": 42} | (
        {} if plan_done else {"done": steps}
    )
    sample = {"schema_version": 1, "state": state, "expect": expect}
    return sample | {"plan_done": True} if plan_done else sample


def _field(state: dict[str, Any], key: str, kind: type) -> Any:
    """A field a version needs: missing or of another type is refused, never defaulted."""
    if not isinstance(state.get(key), kind):
        raise SchemaVersionUnknown(f"checkpoint lacks a valid {key!r} ({kind.__name__})")
    return state[key]


def decode(ck: dict[str, Any]) -> dict[str, Any]:
    """A stored checkpoint in this worker's current version (section 6, experiment M):
    migrated from version 1, or refused (SchemaVersionUnknown, CheckpointCorrupt)."""
    state, version = ck["state_json"], ck["schema_version"]
    if version not in (1, SCHEMA_VERSION):
        raise SchemaVersionUnknown(f"checkpoint schema version {version}")
    if not isinstance(state, dict):
        raise SchemaVersionUnknown("checkpoint state is not an object")
    if bytes(ck["state_hash"]) != hashlib.sha256(canonical(state).encode()).digest():
        raise CheckpointCorrupt(f"checkpoint revision {ck['revision']} does not match its hash")
    if version == SCHEMA_VERSION:
        return state
    order = _field(state, "order", dict)
    data = {"order_id": order.get("id"), "amount": order.get("amount")}
    return {"done": list(_field(state, "steps", list)), "data": data}


# ------------------------------------------------------------ heartbeat
class Heartbeat:
    """Renews one lease every interval; the first refused or unconfirmed
    renewal (none within the timeout) calls on_lost once and stops."""

    def __init__(
        self, dsn: str, lease: Lease, interval_ms: int, timeout_ms: int, on_lost: Callable[[], None]
    ) -> None:
        self.db, self.lease, self.on_lost = Db(dsn), lease, on_lost
        self.interval_s, self.timeout_s = interval_ms / 1000, timeout_ms / 1000
        self.stopped = threading.Event()
        self.lost = False
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_s):
            point("before_renew", self.lease.run_id, self.lease.epoch)
            if self.stopped.is_set():
                return
            if not self._renew_within_timeout():
                self.lost = True
                self.on_lost()
                return

    def _renew_within_timeout(self) -> bool:
        done, outcome = threading.Event(), []

        def renew() -> None:
            try:
                with recorded("renew", run_id=self.lease.run_id, epoch=self.lease.epoch):
                    self.db.call(
                        "SELECT fencecheck.renew(%s, %s, %s, %s)",
                        (self.lease.run_id, self.lease.owner, self.lease.epoch, LEASE_TTL_MS),
                    )
                outcome.append(True)
            except Exception:
                outcome.append(False)
            finally:
                done.set()

        threading.Thread(target=renew, daemon=True).start()
        return done.wait(self.timeout_s) and outcome == [True]


# ------------------------------------------------------------ dispatch, relay, consume
def claim_op(db: Db, function: str, op_id: str | None, owner: str) -> dict[str, Any] | None:
    """dispatch_claim (prepared) or ledger_claim_retry (unknown) for ``owner``,
    with the claim's deadline by this process's monotonic clock, read before
    the claim was sent (so it ends no later than the database's)."""
    sent = time.monotonic()
    op = db.one(f"SELECT * FROM fencecheck.{function}(%s, %s, %s)", (op_id, owner, DISPATCH_TTL_MS))
    if op is not None:
        op["local_deadline"] = sent + DISPATCH_TTL_MS / 1000
    return op


def send_claimed(db: Db, op: dict[str, Any], epoch: int) -> tuple[str, str | None]:
    """Call the tool for an operation this session claimed, between the two
    injection points around the call: (ledger status, remote id). A claim
    past its deadline (this process was frozen after claiming: a successor
    may hold a newer claim) sends nothing and counts as unknown."""
    ids = {"run_id": op["run_id"], "epoch": epoch, "operation_id": op["operation_id"]}
    point("after_dispatch_claim_commit", **ids)
    if time.monotonic() >= op.get("local_deadline", float("inf")):
        return "unknown", None
    status, remote_id = send(op, epoch)
    point("after_tool_response_before_tx2_commit", **ids)
    return status, remote_id


def record_answer(db: Db, op: dict[str, Any], owner: str, status: str, remote_id: str | None) -> tuple[str, str | None]:  # fmt: skip
    """Record the tool's answer in the ledger, only under this claim (same
    dispatch owner, same ledger revision); else what the ledger says now."""
    done = db.one(
        "SELECT fencecheck.record_tool_result(%s, %s, %s, %s, %s) AS ok",
        (op["operation_id"], owner, op["revision"], status, remote_id),
    )
    if done and done["ok"]:
        return status, remote_id
    now = db.one("SELECT status, remote_id FROM tool_operations WHERE operation_id = %s",
                 (op["operation_id"],))  # fmt: skip
    return (now["status"], now["remote_id"]) if now else (status, remote_id)


def run_epoch(db: Db, run_id: Any) -> int:
    """A dispatcher that holds no lease sends the run's current epoch."""
    run = db.one("SELECT epoch FROM agent_runs WHERE run_id = %s", (run_id,))
    return int(run["epoch"]) if run else 0


def dispatch(db: Db, operation_id: str | None) -> dict[str, Any]:
    """One dispatcher cycle: claim a prepared operation, call its tool, record the answer."""
    op = claim_op(db, "dispatch_claim", operation_id, OWNER)
    if op is None:
        return {"operation_id": operation_id, "status": None}
    answer = send_claimed(db, op, run_epoch(db, op["run_id"]))
    status, remote_id = record_answer(db, op, OWNER, *answer)
    return {"operation_id": op["operation_id"], "status": status, "remote_id": remote_id}


def reconcile(db: Db) -> list[dict[str, Any]]:
    """Expired dispatch claims become unknown; an unknown operation converges
    by a query of its tool, or by a same-key resend where that creates
    nothing new (idempotent within its retention, deterministic_id)."""
    changes = [
        {"operation_id": r["op"], "from": "dispatching", "to": "unknown"}
        for r in db.call("SELECT fencecheck.reconcile_expire_claims() AS op")
    ]
    for op in db.call("SELECT * FROM tool_operations WHERE status = 'unknown'"):
        remote_id, status = query(op), None
        if remote_id is not None:
            converged = db.one(
                "SELECT fencecheck.ledger_converge(%s, 'succeeded', %s) AS ok",
                (op["operation_id"], remote_id),
            )
            status = "succeeded" if converged and converged["ok"] else None
        elif capability(op["tool_name"]) in RESENDABLE:
            claimed = claim_op(db, "ledger_claim_retry", op["operation_id"], OWNER)
            if claimed is not None:
                answer = send_claimed(db, claimed, run_epoch(db, claimed["run_id"]))
                if answer[0] == "prepared":  # a 429 to the resend: the call it repeats may act
                    answer = ("unknown", answer[1])
                status, _ = record_answer(db, claimed, OWNER, *answer)
        if status is not None and status != "unknown":
            changes.append({"operation_id": op["operation_id"], "from": "unknown", "to": status})
    return changes


BROKER_URL = ENV.get("FENCECHECK_BROKER_URL", "").rstrip("/")


def relay(db: Db, limit: int) -> list[str]:
    """Publish unpublished outbox rows (topic = event_type); mark each only
    after the broker acknowledged it."""
    published = []
    with db.conn.transaction():
        for row in db.call("SELECT * FROM fencecheck.outbox_lock_batch(%s)", (limit,)):
            event_id = str(row["event_id"])
            # The row's tenant last: a consumer at a shared broker tells its
            # events by it, and some payloads (compensation) carry none.
            message = {"event_id": event_id, "run_id": str(row["run_id"]), **row["payload"],
                       "tenant_id": str(row["tenant_id"])}  # fmt: skip
            status, answer = http(
                "POST", f"{BROKER_URL}/broker/publish",
                {"event_id": event_id, "topic": row["event_type"], "payload": message},
            )  # fmt: skip
            if status != 200 or not answer.get("ack"):
                break
            point("after_broker_ack_before_outbox_mark", row["run_id"])
            db.call("SELECT fencecheck.outbox_mark_published(%s)", (event_id,))
            published.append(event_id)
    return published


_consumed_up_to: dict[str, int] = {}


def consume(db: Db, consumer: str) -> dict[str, int]:
    """Apply each new broker message of this tenant once: the dedup row and
    the business effect in one transaction."""
    after = _consumed_up_to.get(consumer, 0)
    _, answer = http("GET", f"{BROKER_URL}/broker/messages?after={after}")
    consumed = duplicates = 0
    for message in answer.get("messages", []):
        _consumed_up_to[consumer] = max(_consumed_up_to.get(consumer, 0), int(message["seq"]))
        payload = message.get("payload") or {}
        if not isinstance(payload, dict) or payload.get("tenant_id") != TENANT:
            continue
        with db.conn.transaction():
            new = db.call(
                "INSERT INTO consumed_events (consumer_name, event_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING RETURNING event_id",
                (consumer, message["event_id"]),
            )
            if new:
                db.call(
                    "INSERT INTO consumer_effects (consumer_name, event_id, effect)"
                    " VALUES (%s, %s, %s) RETURNING id",
                    (consumer, message["event_id"], f"notified:{message['topic']}"),
                )
        consumed, duplicates = consumed + bool(new), duplicates + (not new)
    return {"consumed": consumed, "duplicates": duplicates}


def durability(db: Db) -> dict[str, Any]:
    """The replication mode an acknowledged commit has here (never sync under async)."""
    s = db.one(
        "SELECT current_setting('synchronous_commit') AS level,"
        " current_setting('synchronous_standby_names') AS names,"
        " (SELECT count(*) FROM pg_stat_replication) AS standbys"
    )
    assert s is not None
    if s["names"].strip() and s["level"] in ("on", "remote_write", "remote_apply"):
        mode, guarantee = "sync", "a COMMIT is acknowledged after a synchronous standby has it"
    elif s["names"].strip() or s["standbys"]:
        mode, guarantee = "async", "acknowledged commits may be lost if a standby is promoted"
    else:
        mode, guarantee = "none", "durable on this primary only"
    return {"mode": mode, "guarantee": guarantee, "settings": jsonable(s)}


# ------------------------------------------------------------ `ops` mode (section 5)
class Ops:
    """One JSON request per line on stdin, one reply per line on stdout."""

    def __init__(self) -> None:
        self.dsn = ENV["FENCECHECK_DSN"]
        self.out_lock = threading.Lock()
        self.heartbeats: dict[tuple[str, int], Heartbeat] = {}

    def serve(self) -> int:
        main = Db(self.dsn)
        if not bound_to_tenant(main):
            return 1
        threads = []
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                assert isinstance(req, dict)
            except (ValueError, AssertionError):
                self.reply({"id": None, "ok": False, "error": "BadRequest", "message": line[:200]})
                continue
            if req.get("async"):  # its own thread and connection; answers when done
                t = threading.Thread(target=lambda r=req: self.reply(self.handle(Db(self.dsn), r)))
                t.start()
                threads.append(t)
            else:
                self.reply(self.handle(main, req))
        for t in threads:
            t.join(60)
        return 0

    def reply(self, reply: dict[str, Any]) -> None:
        with self.out_lock:
            sys.stdout.write(json.dumps(jsonable(reply)) + "\n")
            sys.stdout.flush()

    def handle(self, db: Db, req: dict[str, Any]) -> dict[str, Any]:
        rid, op, args = req.get("id"), str(req.get("op")), req.get("args") or {}
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"id": rid, "ok": False, "error": "Unsupported", "message": f"no op {op!r}"}
        try:
            return {"id": rid, "ok": True, "result": handler(db, args)}
        except (KeyError, ValueError, TypeError) as exc:
            return {"id": rid, "ok": False, "error": "BadRequest", "message": repr(exc)}
        except Exception as exc:
            return {"id": rid, "ok": False, "error": type(exc).__name__, "message": str(exc)}

    def lease(self, args: dict[str, Any]) -> Lease:
        return Lease(str(args["run_id"]), str(args.get("owner") or OWNER), int(args["epoch"]))

    def not_cancelled(self, lease: Lease) -> None:
        hb = self.heartbeats.get((lease.run_id, lease.epoch))
        if hb is not None and hb.lost:
            raise LeaseLost("this lease's heartbeat failed: its work is cancelled")

    def write(self, db: Db, op: str, lease: Lease, args: dict[str, Any], state: dict[str, Any], **kw: Any) -> tuple[int, str]:  # fmt: skip
        self.not_cancelled(lease)
        expected = int(args["expected_revision"])
        ids = {"run_id": lease.run_id, "epoch": lease.epoch, "revision": expected}
        with recorded(op, **ids, event_id=kw.get("event_id")) as h:
            revision, event_id = protected_write(db, lease, expected, state, **kw)
            h.update(revision=revision, event_id=event_id)
        return revision, event_id

    def current_state(self, db: Db, run_id: str) -> dict[str, Any]:
        ck = latest_checkpoint(db, run_id)
        return decode(ck) if ck else {}

    # -- control plane
    def op_create_run(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        if a.get("tenant_id") not in (None, TENANT):
            raise ValueError(f"this session is bound to tenant {TENANT}")
        with recorded("create_run"):
            row = db.one(
                "SELECT fencecheck.create_run(%s, %s, %s) AS run_id",
                (str(a["task_id"]), Jsonb(dict(a["input"])), int(a.get("max_attempts", 12))),
            )
        assert row is not None
        return {"run_id": str(row["run_id"]), "task_id": a["task_id"]}

    def op_retry_run(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("retry_run"):
            row = db.one("SELECT fencecheck.retry_run(%s) AS run_id", (str(a["task_id"]),))
        assert row is not None
        return {"run_id": str(row["run_id"]), "task_id": a["task_id"]}

    def op_cancel(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("cancel", run_id=a["run_id"]):
            row = db.one(
                "SELECT fencecheck.cancel_run(%s, %s, %s) AS r",
                (a["run_id"], a.get("reason", "cancelled"), a.get("ticket")),
            )
        assert row is not None
        return dict(row["r"])

    def op_deliver_callback(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("deliver_callback", run_id=a["run_id"], operation_id=a["operation_id"]):
            row = db.one(
                "SELECT fencecheck.deliver_callback(%s, %s, %s) AS accepted",
                (a["run_id"], a["operation_id"], Jsonb(dict(a["payload"]))),
            )
        return {"accepted": bool(row and row["accepted"])}

    def op_reconcile(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("reconcile"):
            return {"changes": reconcile(db)}

    def op_list_paused(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        rows = db.call(
            "SELECT run_id, status FROM agent_runs"
            " WHERE status IN ('paused_indoubt', 'paused_human') ORDER BY updated_at"
        )
        return {"runs": [{"run_id": str(r["run_id"]), "status": r["status"]} for r in rows]}

    def op_operator_actions(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        rows = db.call(
            "SELECT action, operator, reason, ticket FROM operator_actions"
            " WHERE run_id = %s ORDER BY id",
            (a["run_id"],),
        )
        return {"actions": rows}

    # -- the lease
    def op_claim(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("claim", run_id=a.get("run_id")) as h:
            grant = claim(db, str(a.get("owner") or OWNER), a.get("run_id"))
            if grant is None:
                raise NotClaimable("nothing claimable")
            h.update(run_id=grant["run_id"], epoch=grant["epoch"], revision=grant["revision"])
        keys = ("run_id", "epoch", "revision", "status", "owner", "lease_expires_at")
        return {k: grant[k] for k in keys}

    def op_renew(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        with recorded("renew", run_id=lease.run_id, epoch=lease.epoch):
            row = db.one(
                "SELECT fencecheck.renew(%s, %s, %s, %s) AS expires_at",
                (lease.run_id, lease.owner, lease.epoch, LEASE_TTL_MS),
            )
        assert row is not None
        return {"expires_at": row["expires_at"].isoformat()}

    def op_release(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        with recorded("release", run_id=lease.run_id, epoch=lease.epoch):
            db.call(
                "SELECT fencecheck.release(%s, %s, %s)", (lease.run_id, lease.owner, lease.epoch)
            )
        return {}

    def op_heartbeat(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        old = self.heartbeats.pop((lease.run_id, lease.epoch), None)
        if old is not None:
            old.stop()
        if a["action"] == "stop":
            return {"cancelled": bool(old and old.lost)}
        interval = int(a.get("interval_ms") or HEARTBEAT_MS)
        timeout = int(a.get("timeout_ms") or HEARTBEAT_TIMEOUT_MS)
        self.heartbeats[(lease.run_id, lease.epoch)] = Heartbeat(
            self.dsn, lease, interval, timeout, lambda: log("lease lost", run_id=lease.run_id)
        )
        return {}

    # -- protected writes
    def op_save_checkpoint(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        revision, event_id = self.write(
            db, "save_checkpoint", lease, a, dict(a["state"]), step=a.get("step"), status=None,
            event_type="agent.checkpoint", event_id=a.get("event_id"),
            schema_version=int(a.get("schema_version", SCHEMA_VERSION)),
        )  # fmt: skip
        return {"revision": revision, "event_id": event_id}

    def op_register_intent(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        step, version = str(a["step_id"]), int(a["effect_version"])
        op_id = f"{TENANT}/{lease.run_id}/{step}/v{version}"
        request = dict(a["request"])
        intent = {"operation_id": op_id, "step_id": step, "effect_version": version,
                  "tool": str(a["tool"]), "request": request,
                  "digest": hashlib.sha256(canonical(request).encode()).hexdigest()}  # fmt: skip
        state = self.current_state(db, lease.run_id) | {"pending": op_id}
        revision, _ = self.write(
            db, "register_intent", lease, a, state, step=step, status="waiting_tool",
            event_type="agent.tool_intent", intent=intent,
        )  # fmt: skip
        point("after_outbound_intent_commit", lease.run_id, lease.epoch, operation_id=op_id)
        return {"operation_id": op_id, "revision": revision, "ledger_status": "prepared"}

    def op_complete(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(a)
        state = self.current_state(db, lease.run_id) | {"result": a["result"]}
        revision, _ = self.write(
            db, "complete", lease, a, state, step="finish", status="succeeded",
            event_type="agent.succeeded",
        )  # fmt: skip
        return {"revision": revision, "status": "succeeded"}

    # -- the ledger, the outbox, the consumer
    def op_dispatch(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("dispatch", operation_id=a.get("operation_id")):
            return dispatch(db, a.get("operation_id"))

    def op_relay(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("relay"):
            return {"published": relay(db, int(a.get("limit", 20)))}

    def op_consume(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("consume"):
            return consume(db, str(a["consumer"]))

    # -- reads
    def op_read_checkpoint(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        with recorded("read_checkpoint", run_id=a["run_id"]):
            ck = latest_checkpoint(db, str(a["run_id"]))
            if ck is None:
                if not db.call("SELECT 1 FROM agent_runs WHERE run_id = %s", (a["run_id"],)):
                    raise RunNotFound(f"no run {a['run_id']} of this tenant")
                return {"revision": 0, "schema_version": None, "state": None}
            state = decode(ck)
        return {"revision": ck["revision"], "schema_version": SCHEMA_VERSION, "state": state}

    def op_legacy_checkpoint(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        return legacy_sample(a.get("plan_done") is True)

    def op_durability(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        return durability(db)

    def op_run_state(self, db: Db, a: dict[str, Any]) -> dict[str, Any]:
        row = db.one(
            "SELECT to_jsonb(r) AS run FROM agent_runs r WHERE run_id = %s", (a["run_id"],)
        )
        return dict(row["run"]) if row else {}


# ------------------------------------------------------------ `run` mode (section 10)
EXIT_CANCELLED, EXIT_FROZEN, EXIT_SCHEMA, EXIT_DURABILITY = 10, 11, 12, 13


class Execution:
    """One run under one lease, resumed from its latest checkpoint."""

    def __init__(self, db: Db, grant: dict[str, Any]) -> None:
        self.db = db
        self.lease = Lease(str(grant["run_id"]), str(grant["owner"]), int(grant["epoch"]))
        self.revision = int(grant["revision"])
        self.input: dict[str, Any] = dict(grant["input"])
        self.state: dict[str, Any] = {}
        self.giving_up = False  # a write that gives the lease up is under way

    def run(self) -> int:
        def lost() -> None:  # cancel the execution at once: nothing more is sent
            if self.giving_up:  # the write giving the lease up decides (LeaseLost: exit 10)
                return
            log("lease lost or renewal unconfirmed: cancelling", run_id=self.lease.run_id)
            os._exit(EXIT_CANCELLED)

        hb = Heartbeat(self.db.dsn, self.lease, HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS, lost)
        try:
            return self.steps()
        except (SchemaVersionUnknown, CheckpointCorrupt) as exc:
            log("checkpoint refused", error=str(exc))
            return EXIT_SCHEMA
        except LeaseLost:
            return EXIT_CANCELLED
        finally:
            hb.stop()

    def write(self, op: str, step: str | None, status: str, **kw: Any) -> None:
        ids = {"run_id": self.lease.run_id, "epoch": self.lease.epoch, "revision": self.revision}
        self.giving_up = status not in HOLDING
        with recorded(op, **ids) as h:
            self.revision, event_id = protected_write(
                self.db, self.lease, self.revision, self.state, step=step, status=status,
                event_type=f"agent.{op}", **kw,
            )  # fmt: skip
            h.update(revision=self.revision, event_id=event_id)
        point(
            "after_checkpoint_commit", self.lease.run_id, self.lease.epoch, revision=self.revision
        )

    def step(self, name: str) -> None:
        """Do one step's work (here: wait step_delay_ms), then commit it."""
        time.sleep(int(self.input.get("step_delay_ms", 0)) / 1000)
        self.state = self.state | {"done": [*self.state["done"], name]}
        self.write(name, name, "running")

    def steps(self) -> int:
        ck = latest_checkpoint(self.db, self.lease.run_id)
        if ck is None:
            data = {
                "order_id": self.input.get("order_id", "order-1"),
                "amount": self.input.get("amount", 10),
            }
            self.state = {"done": [], "data": data}
            self.write("start", "plan", "running")
        else:
            self.state = decode(ck)
        for name in ("plan", "lookup"):
            if name not in self.state["done"]:
                self.step(name)
        if "create_label" not in self.state["done"]:
            code = self.tool_step()
            if code is not None:
                return code
        extra = [f"work_{i}" for i in range(1, int(self.input.get("extra_steps", 0)) + 1)]
        for name in ("notify", *extra):
            if name not in self.state["done"]:
                self.step(name)
        self.state = self.state | {"done": [*self.state["done"], "finish"]}
        self.write("complete", "finish", "succeeded")
        return 0

    def ledger_row(self, operation_id: str) -> dict[str, Any] | None:
        return self.db.one(
            "SELECT *, dispatch_until > clock_timestamp() AS claim_live FROM tool_operations"
            " WHERE operation_id = %s",
            (operation_id,),
        )

    def tool_step(self) -> int | None:
        """Register, dispatch and record the tool step; an exit code when the
        run stops here (paused, requeued, frozen), None to go on."""
        op_id = f"{TENANT}/{self.lease.run_id}/create_label/v1"
        op = self.ledger_row(op_id)
        if op is None:
            request = request_body(self.input)
            intent = {"operation_id": op_id, "step_id": "create_label", "effect_version": 1,
                      "tool": self.input.get("tool", "idem"), "request": request,
                      "digest": hashlib.sha256(canonical(request).encode()).hexdigest(),
                      "retention_ms": retention_ms(self.input.get("tool", "idem"))}  # fmt: skip
            self.state = self.state | {"pending": op_id}
            self.write("register_intent", "create_label", "waiting_tool", intent=intent)
            ids = {"operation_id": op_id}
            point("after_outbound_intent_commit", self.lease.run_id, self.lease.epoch, **ids)
        resends = 0
        while True:
            op = self.ledger_row(op_id)
            assert op is not None
            status, remote_id = op["status"], op["remote_id"]
            if status == "dispatching":
                if op["claim_live"]:  # someone's claim: wait it out
                    time.sleep(0.05)
                else:
                    self.db.call("SELECT fencecheck.reconcile_expire_claims()")
                continue
            if status == "cancelled":
                raise LeaseLost("the run was cancelled")
            if status == "unknown" and (remote_id := query(op)) is not None:
                status = "succeeded"
            elif status in ("prepared", "unknown"):
                claimed = None
                if status == "prepared":
                    claimed = self.claim_for_dispatch("dispatch_claim", op_id)
                elif capability(op["tool_name"]) in RESENDABLE and resends < 3:
                    claimed, resends = (
                        self.claim_for_dispatch("ledger_claim_retry", op_id),
                        resends + 1,
                    )
                if claimed is None and status == "unknown":  # the remote fact is out of reach
                    self.write("freeze", "create_label", "paused_indoubt")
                    return EXIT_FROZEN
                if claimed is None:
                    continue
                was_in_doubt = status == "unknown"
                status, remote_id = send_claimed(self.db, claimed, self.lease.epoch)
                if status == "prepared" and was_in_doubt:  # a 429 to a same-key resend proves
                    status = "unknown"  # nothing of the call it repeats: never prepared again
                if status in ("unknown", "prepared"):  # only a final answer waits for tx2
                    record_answer(self.db, claimed, self.lease.owner, status, None)
                if status == "prepared":
                    return self.requeue()
                if status == "unknown":
                    continue
            result = {"operation_id": op_id, "status": status, "remote_id": remote_id}
            if status == "failed_final":  # a definite refusal: a person decides
                self.write("pause_human", "create_label", "paused_human", result=result)
                return 0
            self.state = self.state | {
                "done": [*self.state["done"], "create_label"],
                "pending": None,
            }
            self.write("tool_result", "create_label", "running", result=result)
            return None

    def claim_for_dispatch(self, function: str, op_id: str) -> dict[str, Any] | None:
        """dispatch_claim (prepared) or ledger_claim_retry (unknown) under this lease's owner."""
        return claim_op(self.db, function, op_id, self.lease.owner)

    def requeue(self) -> int:
        """The tool said 429: try again later, with a growing, jittered delay,
        until the attempt budget is spent (then a person decides)."""
        run = self.db.one("SELECT attempt_count, max_attempts FROM agent_runs WHERE run_id = %s",
                          (self.lease.run_id,))  # fmt: skip
        assert run is not None
        if run["attempt_count"] >= run["max_attempts"]:
            self.write("pause_human", "create_label", "paused_human")
            return 0
        full = min(BACKOFF_BASE_MS * 2 ** (run["attempt_count"] - 1), 10_000)
        self.write(
            "requeue", "create_label", "queued", delay_ms=int(full / 2 + random.random() * full / 2)
        )
        return 0


def run_mode(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="worker.py run")
    parser.add_argument("--run-id")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--exit-when-idle", action="store_true")
    parser.add_argument("--require-durability", default=ENV.get("FENCECHECK_REQUIRE_DURABILITY"))
    args = parser.parse_args(argv)
    db = Db(ENV["FENCECHECK_DSN"])
    if not bound_to_tenant(db):
        return 1
    contract = durability(db)
    log("durability contract", **contract)
    order = ["none", "async", "sync"]
    if args.require_durability and order.index(contract["mode"]) < order.index(
        args.require_durability
    ):
        return EXIT_DURABILITY
    while True:
        with recorded("claim", run_id=args.run_id) as h:
            grant = claim(db, OWNER, args.run_id)
            h.update(run_id=grant and grant["run_id"], epoch=grant and grant["epoch"])
        if grant is None:
            if args.run_id:  # that run only: wait until it is claimable, or done
                row = db.one("SELECT status FROM agent_runs WHERE run_id = %s", (args.run_id,))
                if row is None or row["status"] not in (*HOLDING, "queued"):
                    return 0
            elif args.exit_when_idle or args.once:
                return 0
            time.sleep(0.1)
            continue
        point("after_lease_acquired", grant["run_id"], grant["epoch"], revision=grant["revision"])
        code = Execution(db, grant).run()
        if args.once or args.run_id or code != 0:
            return code


# ------------------------------------------------------------ the command line (section 1)
def migrate() -> int:
    """Apply schema.sql (the contract's tables, roles, tenant binding) and
    protocol.sql (this worker's functions); both are idempotent."""
    with psycopg.connect(ENV["FENCECHECK_ADMIN_DSN"], autocommit=True) as conn:
        for name in ("schema.sql", "protocol.sql"):
            log("applying", file=name)
            conn.execute((HERE / name).read_bytes())
    return 0


def settings_refused() -> list[str]:
    """What is wrong with the lease settings (section 2): the protocol forbids them."""
    wrong = list(SETTING_ERRORS)
    timers = {"FENCECHECK_LEASE_TTL_MS": LEASE_TTL_MS, "FENCECHECK_HEARTBEAT_MS": HEARTBEAT_MS,
              "FENCECHECK_HEARTBEAT_TIMEOUT_MS": HEARTBEAT_TIMEOUT_MS,
              "FENCECHECK_DISPATCH_TTL_MS": DISPATCH_TTL_MS}  # fmt: skip
    wrong += [f"{name} must be > 0 ms, not {value}" for name, value in timers.items() if value <= 0]
    if HEARTBEAT_MS >= LEASE_TTL_MS:
        wrong.append("the heartbeat interval must be shorter than the lease")
    if ENV.get("FENCECHECK_REQUIRE_DURABILITY") not in (None, "", "none", "async", "sync"):
        wrong.append("FENCECHECK_REQUIRE_DURABILITY must be none, async or sync")
    return wrong


def bound_to_tenant(db: Db) -> bool:
    """Whether the login role is bound to FENCECHECK_TENANT; checked at start
    in every mode that acts (``run`` and ``ops``): a process told another
    tenant than its binding must not serve anything."""
    bound = db.one("SELECT fencecheck.session_tenant() AS tenant")
    if bound is None or str(bound["tenant"]) != TENANT:
        log("the login role is not bound to FENCECHECK_TENANT", bound=bound, tenant=TENANT)
        return False
    return True


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: worker.py migrate | run [--run-id ID] [--once] | ops", file=sys.stderr)
        return 64
    mode, rest = argv[0], argv[1:]
    if mode == "migrate":
        return migrate()
    wrong = settings_refused()
    if wrong:
        log("settings refused", errors=wrong)
        return 1
    if mode == "ops":
        return Ops().serve()
    if mode == "run":
        return run_mode(rest)
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
