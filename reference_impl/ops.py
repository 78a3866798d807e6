"""``ops`` mode: protocol operations as JSON lines on stdin / stdout.

One request per line, one reply per line, in order; a request with
``"async": true`` runs on its own thread and connection and answers when done.
Nothing but replies goes to stdout. The process is one worker session: its
owner is fixed unless an op passes ``owner`` (to impersonate a stale one).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import psycopg

from harness import injection
from reference_impl import errors as e
from reference_impl import history, retention
from reference_impl.cancellation import Cancellation
from reference_impl.checkpoint_schema import CURRENT_VERSION, DEFAULT_PLAN, migrate_v1
from reference_impl.db import Session
from reference_impl.durability import read_contract
from reference_impl.heartbeat import Heartbeat
from reference_impl.ids import request_digest
from reference_impl.leases import Lease
from reference_impl.ledger import intent_effect
from reference_impl.logs import log
from reference_impl.protected import ProtectedWriter, Write
from reference_impl.runtime import Runtime
from reference_impl.sqlstate import protocol_error

_log = logging.getLogger("reference_impl.ops")

Handler = Callable[["Ctx", dict[str, Any]], dict[str, Any]]


class Ctx:
    """What one op runs with: a session and a writer on it."""

    def __init__(self, rt: Runtime, session: Session, writer: ProtectedWriter) -> None:
        self.rt = rt
        self.session = session
        self.writer = writer


def _uuid(args: dict[str, Any], key: str) -> uuid.UUID:
    if key not in args:
        raise ValueError(f"missing argument {key!r}")
    return uuid.UUID(str(args[key]))


_REQUIRED: Any = object()


def _whole(args: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """A JSON integer argument (``default`` for null or absent; missing without
    one). Not ``int()``: that takes ``true`` for 1, ``3.7`` for 3 and ``"3"``
    for 3, where the contract's argument is a JSON integer (the Go worker
    refuses them; blind hunt 66's reader)."""
    value = args.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"missing argument {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"argument {key!r} must be a JSON integer, not {value!r}")
    return value


def _object(value: Any, what: str, default: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON object argument (``default`` for null or absent). Not ``dict()``:
    that also makes an object of a list of pairs, so ``[["amount", 12]]`` would
    pass for a supplement the contract refuses (V; blind hunt 65's reader)."""
    if value is None and default is not None:
        return dict(default)
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, not {type(value).__name__}")
    return dict(value)


def _resource(args: dict[str, Any], named: bool) -> str | None:
    """The ``remote_id`` of a person's finding; one that says the tool acted
    (``named``) must name the resource: a missing or blank one is refused, or
    the operation would be succeeded naming nothing (blind hunt 71's reader)."""
    remote_id = args.get("remote_id")
    if named and (not isinstance(remote_id, str) or not remote_id.strip()):
        raise ValueError("a finding that the tool acted names its resource: remote_id is required")
    return None if remote_id is None else str(remote_id)


def _ticket(args: dict[str, Any]) -> str | None:
    ticket = args.get("ticket")
    return str(ticket) if ticket not in (None, "") else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return value


class OpsServer:
    def __init__(self, rt: Runtime, out: IO[str] | None = None) -> None:
        self.rt = rt
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self.main = Ctx(rt, rt.session, rt.writer)
        # Keyed by the whole lease: a heartbeat started under another owner at the
        # same epoch (refused by the database) must not replace the holder's.
        self.heartbeats: dict[tuple[str, str, int], tuple[Heartbeat, Cancellation]] = {}
        self.handlers: dict[str, Handler] = {
            "create_run": self.create_run,
            "retry_run": self.retry_run,
            "claim": self.claim,
            "renew": self.renew,
            "release": self.release,
            "save_checkpoint": self.save_checkpoint,
            "register_intent": self.register_intent,
            "dispatch": self.dispatch,
            "reconcile": self.reconcile,
            "cancel": self.cancel,
            "complete": self.complete,
            "deliver_callback": self.deliver_callback,
            "relay": self.relay,
            "consume": self.consume,
            "read_checkpoint": self.read_checkpoint,
            "durability": self.durability,
            "heartbeat": self.heartbeat,
            "run_state": self.run_state,
            "legacy_checkpoint": self.legacy_checkpoint,
            "resolve_indoubt": self.resolve_indoubt,
            "decide": self.decide,
            "converge_operation": self.converge_operation,
            "list_paused": self.list_paused,
            "operator_actions": self.operator_actions,
            "purge": self.purge,
        }

    # ------------------------------------------------------------ loop
    def serve(self, stdin: IO[str] | None = None) -> int:
        threads: list[threading.Thread] = []
        for line in stdin or sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("a request is a JSON object")
            except ValueError as exc:
                self._reply({"id": None, "ok": False, "error": "BadRequest", "message": str(exc)})
                continue
            if req.get("async"):
                t = threading.Thread(target=self._handle_async, args=(req,), daemon=True)
                t.start()
                threads.append(t)
            else:
                self._reply(self.handle(self.main, req))
        for t in threads:
            t.join(60)
        for hb, _ in list(self.heartbeats.values()):
            hb.stop()
        return 0

    def _handle_async(self, req: dict[str, Any]) -> None:
        session = self.rt.session_for()
        try:
            self._reply(self.handle(Ctx(self.rt, session, self.rt.writer_for(session)), req))
        finally:
            session.close()

    def _reply(self, reply: dict[str, Any]) -> None:
        text = json.dumps(_jsonable(reply), separators=(",", ":"), default=str)
        with self._out_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def handle(self, ctx: Ctx, req: dict[str, Any]) -> dict[str, Any]:
        rid = req.get("id")
        op = str(req.get("op"))
        args = req.get("args") or {}
        handler = self.handlers.get(op)
        if handler is None:
            return {"id": rid, "ok": False, "error": "Unsupported", "message": f"no op {op!r}"}
        try:
            return {"id": rid, "ok": True, "result": handler(ctx, args)}
        except e.ProtocolError as exc:
            return {
                "id": rid,
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
                "reason": exc.reason,
            }
        except psycopg.Error as exc:
            perr = protocol_error(exc)
            if perr is not None:
                return {
                    "id": rid,
                    "ok": False,
                    "error": type(perr).__name__,
                    "message": str(perr),
                    "reason": perr.reason,
                }
            return {
                "id": rid,
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
                "sqlstate": exc.sqlstate,
            }
        except (ValueError, KeyError, TypeError) as exc:
            return {"id": rid, "ok": False, "error": "BadRequest", "message": str(exc)}
        except Exception as exc:
            log(_log, logging.ERROR, "op failed", op=op, error=repr(exc))
            return {"id": rid, "ok": False, "error": type(exc).__name__, "message": str(exc)}

    # ------------------------------------------------------------ helpers
    def _lease(self, args: dict[str, Any]) -> Lease:
        return Lease(
            _uuid(args, "run_id"), str(args.get("owner") or self.rt.owner), _whole(args, "epoch")
        )

    def _check_not_cancelled(self, lease: Lease) -> None:
        entry = self.heartbeats.get((str(lease.run_id), lease.owner, lease.epoch))
        if entry is not None:
            entry[1].check()

    def _current_state(self, ctx: Ctx, run_id: uuid.UUID) -> dict[str, Any]:
        row = ctx.session.conn.execute(
            self.rt.protocol.queries.sql("latest_checkpoint"), {"run_id": run_id}
        ).fetchone()
        return dict(row["state_json"]) if row and isinstance(row["state_json"], dict) else {}

    def _write(self, ctx: Ctx, name: str, w: Write, operation_id: str | None = None) -> Any:
        with history.operation(
            name,
            run_id=w.lease.run_id,
            epoch=w.lease.epoch,
            revision=w.expected_revision,
            event_id=w.event_id,
            operation_id=operation_id,
        ) as h:
            out = ctx.writer.write(w)
            h.ids["revision"] = out.revision
        return out

    def _payload(self, lease: Lease, **extra: Any) -> dict[str, Any]:
        return {
            "tenant_id": self.rt.settings.tenant,
            "run_id": str(lease.run_id),
            "epoch": lease.epoch,
            **extra,
        }

    # ------------------------------------------------------------ ops
    def create_run(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        tenant = args.get("tenant_id")
        if tenant and str(tenant) != self.rt.settings.tenant:
            # The tenant comes from the login role's binding (contract v2):
            # one session can never act for another tenant.
            raise ValueError(
                f"this session is bound to tenant {self.rt.settings.tenant}; a run of tenant"
                f" {tenant} needs a login role bound to that tenant"
            )
        with history.operation("create_run", task_id=args.get("task_id")):
            return self.rt.runs.create(
                ctx.session.conn,
                str(args["task_id"]),
                _object(args.get("input"), "input", {}),
                _whole(args, "max_attempts", 12),
            )

    def retry_run(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        with history.operation("retry_run", task_id=args.get("task_id")):
            return self.rt.runs.retry(ctx.session.conn, str(args["task_id"]))

    def claim(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        owner = str(args.get("owner") or self.rt.owner)
        ttl = _whole(args, "ttl_ms", None) or self.rt.settings.lease_ttl_ms
        run_id = _uuid(args, "run_id") if args.get("run_id") else None
        with history.operation("claim", run_id=run_id) as h:
            if run_id is None:
                grant = self.rt.leases.claim(ctx.session.conn, owner, ttl)
            else:
                grant = self.rt.leases.takeover(ctx.session.conn, run_id, owner, ttl)
            h.ids.update(run_id=grant.run_id, epoch=grant.epoch, revision=grant.revision)
            h.detail.update(outcome=grant.outcome)
            if not grant.acquired:
                raise e.NotClaimable(f"not claimable: {grant.outcome}", reason=grant.outcome)
        return {
            "run_id": grant.run_id,
            "epoch": grant.epoch,
            "revision": grant.revision,
            "status": grant.status,
            "owner": grant.owner,
            "lease_expires_at": grant.lease_expires_at,
            "lock_wait_ms": grant.lock_wait_ms,
        }

    def renew(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        ttl = _whole(args, "ttl_ms", None) or self.rt.settings.lease_ttl_ms
        with history.operation("renew", run_id=lease.run_id, epoch=lease.epoch):
            r = self.rt.leases.renew(ctx.session.conn, lease, ttl)
            if not r.ok:
                raise e.LeaseLost(f"renew refused: {r.outcome}", reason=r.outcome)
        return {"expires_at": r.lease_expires_at}

    def release(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        with history.operation("release", run_id=lease.run_id, epoch=lease.epoch):
            outcome = self.rt.leases.release(ctx.session.conn, lease)
            if outcome != "released":
                raise e.LeaseLost(f"release refused: {outcome}", reason=outcome)
        return {}

    def save_checkpoint(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        self._check_not_cancelled(lease)
        event_id = uuid.UUID(str(args["event_id"])) if args.get("event_id") else uuid.uuid4()
        w = Write(
            lease,
            _whole(args, "expected_revision"),
            "checkpoint",
            # Sensitive fields are stored sealed, as run mode's are (contract §9).
            self.rt.sealer.seal(_object(args["state"], "state")),
            _whole(args, "schema_version", CURRENT_VERSION),
            "agent.checkpoint",
            self._payload(lease),
            current_step=args.get("step"),
            event_id=event_id,
        )
        out = self._write(ctx, "save_checkpoint", w)
        return {"revision": out.revision, "event_id": out.event_id, "read_back": out.read_back}

    def register_intent(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        self._check_not_cancelled(lease)
        step, version = str(args["step_id"]), _whole(args, "effect_version", 1)
        tool = str(args["tool"])
        op_id = self.rt.protocol.operation_id(
            self.rt.settings.tenant, str(lease.run_id), step, version
        )
        cap = str(args.get("capability") or self.rt.tools.capability(tool))
        request = _object(args["request"], "request")
        # Stored sealed, its digest of the request as the tool will see it
        # (as the workflow's, reference_impl/workflow.py).
        sealed = self.rt.sealer.seal(request)
        effect = intent_effect(
            op_id,
            step,
            version,
            tool,
            cap,
            sealed,
            # How long the tool keeps our key, as run mode records it: a
            # same-key resend must end within it (fencecheck.ledger_claim_retry).
            self.rt.tools.retention_ms(tool),
            digest=request_digest(request),
        )
        state = {
            **self._current_state(ctx, lease.run_id),
            "pending": {"operation_id": op_id, "tool": tool, "step": step},
        }
        w = Write(
            lease,
            _whole(args, "expected_revision"),
            "intent",
            state,
            CURRENT_VERSION,
            "agent.tool_intent",
            self._payload(lease, step=step),
            current_step=step,
            effect=effect,
        )
        out = self._write(ctx, "register_intent", w, operation_id=op_id)
        from harness import injection

        injection.point(
            "after_outbound_intent_commit",
            run_id=lease.run_id,
            epoch=lease.epoch,
            revision=out.revision,
            operation_id=op_id,
        )
        return {"operation_id": op_id, "revision": out.revision, "ledger_status": out.ledger_status}

    def dispatch(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        op_id = args.get("operation_id")
        with history.operation("dispatch", operation_id=op_id) as h:
            result = self.rt.dispatcher.cycle(ctx.session.conn, str(op_id) if op_id else None)
            h.ids["operation_id"] = result["operation_id"]
            h.detail.update(status=result["status"])
        return result

    def reconcile(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        with history.operation("reconcile"):
            return {"changes": self.rt.reconciler.cycle(ctx.session.conn)}

    def cancel(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _uuid(args, "run_id")
        with history.operation("cancel", run_id=run_id):
            return self.rt.runs.cancel(
                ctx.session.conn, run_id, str(args.get("reason", "cancelled")), _ticket(args)
            )

    # ------------------------------------------------------------ operator
    def resolve_indoubt(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        """Under the harness in steps: lock the run, point ``after_operator_lock``,
        decide, commit (a racing takeover waits on the lock meanwhile)."""
        run_id = _uuid(args, "run_id")
        op_id = str(args["operation_id"])
        conn = ctx.session.conn
        with (
            history.operation("resolve_indoubt", run_id=run_id, operation_id=op_id),
            conn.transaction(),
        ):
            if injection.active():
                conn.execute(self.rt.protocol.queries.sql("operator_lock_run"), {"run_id": run_id})
                injection.point("after_operator_lock", run_id=run_id, operation_id=op_id)
            return self.rt.runs.resolve(
                conn,
                run_id,
                op_id,
                str(args["decision"]),
                _resource(args, args.get("decision") == "executed"),
                str(args["reason"]),
                _ticket(args),
            )

    def decide(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _uuid(args, "run_id")
        supplement = args.get("supplement")
        with history.operation("decide", run_id=run_id):
            return self.rt.runs.decide(
                ctx.session.conn,
                run_id,
                str(args["decision"]),
                _object(supplement, "supplement") if supplement is not None else None,
                str(args["reason"]),
                _ticket(args),
            )

    def converge_operation(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        op_id = str(args["operation_id"])
        with history.operation("converge_operation", operation_id=op_id):
            return self.rt.runs.converge(
                ctx.session.conn,
                op_id,
                str(args["outcome"]),
                _resource(args, args.get("outcome") == "succeeded"),
                str(args["reason"]),
                _ticket(args),
            )

    def list_paused(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        return {"runs": self.rt.runs.paused(ctx.session.conn)}

    def operator_actions(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        return {"actions": self.rt.runs.actions(ctx.session.conn, _uuid(args, "run_id"))}

    def purge(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        archive = args.get("archive")
        with history.operation("purge"):
            return retention.purge(
                ctx.session.conn,
                _whole(args, "older_than_ms") / 1000,
                str(args["reason"]),
                _ticket(args),
                Path(str(archive)) if archive else None,
                limit=_whole(args, "limit", 100),
            )

    def complete(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        self._check_not_cancelled(lease)
        # Sealed as save_checkpoint's state is (contract section 9): a result
        # may carry a sensitive field (blind hunt 66's reader: it was stored in
        # clear; the Go writer seals every state). Values already sealed stay.
        state = self.rt.sealer.seal(
            {**self._current_state(ctx, lease.run_id), "result": args.get("result")}
        )
        w = Write(
            lease,
            _whole(args, "expected_revision"),
            "succeed",
            state,
            CURRENT_VERSION,
            "agent.succeeded",
            self._payload(lease, reason="done"),
            current_step="finish",
        )
        out = self._write(ctx, "complete", w)
        return {"revision": out.revision, "status": out.status}

    def deliver_callback(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _uuid(args, "run_id")
        op_id = str(args["operation_id"])
        with history.operation("deliver_callback", run_id=run_id, operation_id=op_id) as h:
            accepted = self.rt.runs.deliver_callback(
                ctx.session.conn, run_id, op_id, _object(args.get("payload"), "payload", {})
            )
            h.detail.update(accepted=accepted)
        return {"accepted": accepted}

    def relay(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        with history.operation("relay"):
            return {"published": self.rt.relay.cycle(ctx.session.conn, _whole(args, "limit", 20))}

    def consume(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        with history.operation("consume"):
            return self.rt.consumer.cycle(ctx.session.conn, str(args.get("consumer", "notifier")))

    def read_checkpoint(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _uuid(args, "run_id")
        with history.operation("read_checkpoint", run_id=run_id):
            ck = self.rt.runs.read_checkpoint(ctx.session.conn, run_id)
        if ck is None:
            return {"revision": 0, "schema_version": None, "state": None}
        return {
            "revision": ck.revision,
            "schema_version": CURRENT_VERSION,
            "state": ck.state,
            "stored_schema_version": ck.schema_version,
            "migrated_from": ck.migrated_from,
        }

    def durability(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        return read_contract(ctx.session.conn, self.rt.protocol.queries).as_dict()

    def heartbeat(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        lease = self._lease(args)
        key = (str(lease.run_id), lease.owner, lease.epoch)
        action = str(args.get("action", "start"))
        if action == "stop":
            entry = self.heartbeats.pop(key, None)
            if entry is not None:
                entry[0].stop()
                return {"last_outcome": entry[0].last_outcome, "cancelled": entry[1].cancelled}
            return {}
        if action != "start":
            raise ValueError("action is start or stop")
        cancel = Cancellation()
        hb = self.rt.heartbeat(
            lease,
            cancel,
            _whole(args, "interval_ms", None) or None,
            _whole(args, "timeout_ms", None) or None,
        ).start()
        old = self.heartbeats.pop(key, None)
        if old is not None:
            old[0].stop()
        self.heartbeats[key] = (hb, cancel)
        return {}

    def legacy_checkpoint(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        """A version-1 checkpoint this worker migrates, with what the migration
        must keep; with ``plan_done``, one whose every step is done (the old
        code died between its last step and the run's terminal status)."""
        plan_done = args.get("plan_done") is True
        state = {
            "step": "finish" if plan_done else "create_label",
            "done": list(DEFAULT_PLAN) if plan_done else ["plan", "lookup"],
            "vars": {"order_id": "o-legacy", "amount": 42},
        }
        migrated = migrate_v1(state)
        expect = {
            "data.order_id": "o-legacy",
            "data.amount": 42,
            "cursor": migrated["cursor"],
            "plan": list(migrated["plan"]),
        }
        reply = {"schema_version": 1, "state": state, "expect": expect}
        return {**reply, "plan_done": True} if plan_done else reply

    def run_state(self, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
        return self.rt.runs.state(ctx.session.conn, _uuid(args, "run_id"))
