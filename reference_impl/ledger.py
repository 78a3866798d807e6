"""Side-effect ledger (rule 4): intents, dispatch, results, reconciliation.

Invariants (held by the fencecheck.* functions, surfaced here):
- an effect is registered ``prepared`` (inside a protected write) before it
  can be dispatched; its operation_id comes from the business intent only;
- a dispatcher claims with SKIP LOCKED and a deadline; an expired claim
  becomes ``unknown``, never ``prepared``;
- a result is recorded only when dispatch owner, ledger revision and request
  digest match; a zero-row answer is raised (LedgerConflict), never ignored;
- ``unknown`` converges only by query, by same-key retry where the tool
  promises it, or by a person (the run is paused in doubt).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from harness import injection
from mock_tool.errors import (
    QueryUnsupported,
    ToolConflict,
    ToolError,
    ToolOutcomeUnknown,
    ToolRejected,
)
from reference_impl import errors as e
from reference_impl import metrics
from reference_impl.cancellation import Cancellation
from reference_impl.db import Conn
from reference_impl.ids import request_digest
from reference_impl.logs import log
from reference_impl.queries import Queries
from reference_impl.sealing import Sealer
from reference_impl.tools import ToolGateway

_log = logging.getLogger("reference_impl.ledger")


@dataclass(frozen=True)
class Operation:
    """A ledger row as the dispatcher needs it."""

    operation_id: str
    run_id: uuid.UUID
    step_id: str
    tool_name: str
    tool_capability: str
    request_body: dict[str, Any]
    request_digest: str
    status: str
    dispatch_owner: str | None
    dispatch_until: datetime | None
    revision: int
    # The claim's deadline on this process's monotonic clock, from a reading
    # taken before the claim was sent (so it ends no later than the
    # database's): the dispatcher sends only before it. A process frozen
    # between its claim and its call (SIGSTOP, a VM pause) must not send under
    # a claim that expired meanwhile, as a successor may hold a newer one.
    local_deadline: float | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Operation:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in row})


@dataclass(frozen=True)
class Answer:
    """What the tool said to one create, classified by whether it acted."""

    kind: str  # succeeded | failed_final | unknown | rejected_retryable | conflict
    remote_id: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def intent_effect(
    operation_id: str,
    step_id: str,
    effect_version: int,
    tool: str,
    capability: str,
    request: dict[str, Any],
    retention_ms: int | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    """The ledger half of an ``intent`` protected write (``retention_ms``: how long
    the tool declares it keeps the idempotency key; ``digest``: of the request as
    the tool sees it, when ``request`` carries sealed fields)."""
    return {
        "retention_ms": retention_ms,
        "operation_id": operation_id,
        "step_id": step_id,
        "effect_version": effect_version,
        "tool_name": tool,
        "tool_capability": capability,
        "idempotency_key": operation_id,
        "request_digest": digest or request_digest(request),
        "request_body": request,
    }


def _error(exc: BaseException) -> dict[str, Any]:
    return {"class": type(exc).__name__, "http_status": getattr(exc, "http_status", None)}


class Ledger:
    """The ledger statements, by name."""

    def __init__(self, queries: Queries, dispatch_ttl_ms: int) -> None:
        self.q = queries
        self.dispatch_ttl_ms = dispatch_ttl_ms

    def get(self, conn: Conn, operation_id: str) -> dict[str, Any] | None:
        return conn.execute(self.q.sql("operation"), {"operation_id": operation_id}).fetchone()

    def step_operations(self, conn: Conn, run_id: uuid.UUID, step_id: str) -> list[dict[str, Any]]:
        """Every effect version of one step of a run, oldest first."""
        return conn.execute(
            self.q.sql("step_operations"), {"run_id": run_id, "step_id": step_id}
        ).fetchall()

    def claim(self, conn: Conn, owner: str, operation_id: str | None = None) -> Operation | None:
        """Claim one prepared operation of a live run (SKIP LOCKED, with a deadline)."""
        sent = time.monotonic()
        row = conn.execute(
            self.q.sql("dispatch_claim"),
            {"dispatch_owner": owner, "ttl_ms": self.dispatch_ttl_ms, "operation_id": operation_id},
        ).fetchone()
        return self._claimed(row, sent)

    def _claimed(self, row: dict[str, Any] | None, sent: float) -> Operation | None:
        if row is None:
            return None
        op = Operation.from_row(row)
        return dataclasses.replace(op, local_deadline=sent + self.dispatch_ttl_ms / 1000)

    def claim_retry(self, conn: Conn, owner: str, op_id: str, revision: int) -> Operation | None:
        """Same-key retry claim of an unknown operation (idempotent tools, live runs)."""
        sent = time.monotonic()
        row = conn.execute(
            self.q.sql("claim_retry"),
            {
                "dispatch_owner": owner,
                "ttl_ms": self.dispatch_ttl_ms,
                "operation_id": op_id,
                "expected_revision": revision,
            },
        ).fetchone()
        return self._claimed(row, sent)

    def record_result(self, conn: Conn, op: Operation, owner: str, answer: Answer) -> str:
        """Ledger-only result of our claim; LedgerConflict when the claim no longer
        matches. A late answer that does not match is kept as evidence on the
        ledger row (English seed §9.3): it never moves anything."""
        row = conn.execute(
            self.q.sql("record_tool_result"),
            {
                "operation_id": op.operation_id,
                "dispatch_owner": owner,
                "expected_revision": op.revision,
                "request_digest": op.request_digest,
                "outcome": answer.kind,
                "remote_id": answer.remote_id,
                "result": Jsonb(answer.result),
            },
        ).fetchone()
        if row is None or row["outcome"] != "ok":
            self.add_evidence(
                conn,
                op.operation_id,
                {
                    "event": "late_result_refused",
                    "why": row["outcome"] if row else "missing",
                    "answer": answer.kind,
                    "remote_id": answer.remote_id,
                    "dispatch_owner": owner,
                    "claim_revision": op.revision,
                },
            )
        return _checked(row, op.operation_id)

    def mark_unknown(self, conn: Conn, op: Operation, owner: str, error: dict[str, Any]) -> str:
        row = conn.execute(
            self.q.sql("mark_unknown"),
            {
                "operation_id": op.operation_id,
                "dispatch_owner": owner,
                "expected_revision": op.revision,
                "error": Jsonb(error),
            },
        ).fetchone()
        status = _checked(row, op.operation_id)
        metrics.tool_operation_unknown_total.inc()
        metrics.tool_unknown_result_total.inc()
        return status

    def return_rejected(self, conn: Conn, op: Operation, owner: str, error: dict[str, Any]) -> str:
        row = conn.execute(
            self.q.sql("return_rejected"),
            {
                "operation_id": op.operation_id,
                "dispatch_owner": owner,
                "expected_revision": op.revision,
                "error": Jsonb(error),
            },
        ).fetchone()
        return _checked(row, op.operation_id)

    def expire_claims(self, conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
        rows = conn.execute(self.q.sql("expire_claims"), {"limit": limit}).fetchall()
        if rows:
            metrics.tool_operation_unknown_total.inc(len(rows))
            metrics.tool_unknown_result_total.inc(len(rows))
            # Committed (autocommit): these claims are unknown now, none queried yet.
            injection.point("after_claims_expired_commit", operation_id=rows[0]["operation_id"])
        return [
            {"operation_id": r["operation_id"], "from": r["from_status"], "to": r["to_status"]}
            for r in rows
        ]

    def converge(
        self,
        conn: Conn,
        op_id: str,
        revision: int,
        outcome: str,
        remote_id: str | None,
        result: dict[str, Any] | None,
        evidence: dict[str, Any],
    ) -> str:
        row = conn.execute(
            self.q.sql("converge"),
            {
                "operation_id": op_id,
                "expected_revision": revision,
                "outcome": outcome,
                "remote_id": remote_id,
                "result": Jsonb(result),
                "evidence": Jsonb(evidence),
            },
        ).fetchone()
        return _checked(row, op_id)

    def add_evidence(self, conn: Conn, op_id: str, evidence: dict[str, Any]) -> None:
        conn.execute(
            self.q.sql("add_evidence"), {"operation_id": op_id, "evidence": Jsonb(evidence)}
        )

    def run_epoch(self, conn: Conn, run_id: uuid.UUID) -> int:
        """The run's epoch now, read after a claim: the epoch a request carries
        when its dispatcher is not the run's lease holder."""
        row = conn.execute(self.q.sql("run_epoch"), {"run_id": run_id}).fetchone()
        return int(row["epoch"]) if row else 0

    def unknown_operations(self, conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
        return conn.execute(self.q.sql("unknown_operations"), {"limit": limit}).fetchall()


def _checked(row: dict[str, Any] | None, op_id: str) -> str:
    """The new status, or LedgerConflict naming why zero rows matched."""
    if row is None or row["outcome"] != "ok":
        why = row["outcome"] if row else "missing"
        raise e.LedgerConflict(f"ledger row {op_id} not changed: {why}", reason=str(why))
    return str(row["status"])


def outcome_committed(run_id: object, operation_id: str) -> None:
    """Point ``after_dispatch_outcome_commit``: a ledger-only outcome (unknown;
    back to prepared after a proven refusal; the result of a dispatcher that
    does not hold the run's lease; the reconciler's convergence) is committed,
    the run not moved yet."""
    injection.point("after_dispatch_outcome_commit", run_id=run_id, operation_id=operation_id)


class Dispatcher:
    """Sends claimed operations to the tool; never inside a database transaction."""

    def __init__(self, ledger: Ledger, tools: ToolGateway, owner: str) -> None:
        self.ledger = ledger
        self.tools = tools
        self.owner = owner
        #: Opens sealed request fields just before they go to the tool.
        self.sealer = Sealer(None)

    def send(self, op: Operation, epoch: int, cancel: Cancellation | None = None) -> Answer:
        """Call the tool for a claim we hold, with the stable operation_id as key."""
        injection.point(
            "after_dispatch_claim_commit",
            run_id=op.run_id,
            epoch=epoch,
            operation_id=op.operation_id,
        )
        if cancel is not None:
            cancel.check()  # last check before the side effect
        if op.local_deadline is not None and time.monotonic() >= op.local_deadline:
            # Nothing was sent, but the claim is past its deadline and another
            # dispatcher may already hold a newer one: send nothing. Our word
            # that nothing was sent proves nothing to anyone else, so the
            # operation takes the path of every lost claim: unknown.
            injection.record(
                "fail",
                "dispatch",
                run_id=op.run_id,
                epoch=epoch,
                operation_id=op.operation_id,
                error="DispatchClaimExpired",
            )
            return Answer("unknown", error={"class": "DispatchClaimExpired", "sent": False})
        try:
            res = self.tools.create(
                op.tool_name,
                op.operation_id,
                str(op.run_id),
                epoch,
                self.sealer.open(op.request_body),
            )
            answer = Answer(
                "succeeded",
                res.resource_id,
                {"resource_id": res.resource_id, "replayed": res.replayed},
            )
        except ToolOutcomeUnknown as exc:
            return Answer("unknown", error=_error(exc))
        except ToolConflict as exc:
            same = exc.body.get("same_request") is True and exc.resource_id is not None
            if not same:
                # The tool's answer names its resource, whose request may carry a
                # sensitive field: kept on the ledger, so sealed (contract §9).
                return Answer("conflict", error=_error(exc) | {"body": self.sealer.seal(exc.body)})
            answer = Answer(
                "succeeded", exc.resource_id, {"resource_id": exc.resource_id, "conflict": True}
            )
        except ToolRejected as exc:
            kind = "rejected_retryable" if exc.retryable else "failed_final"
            # A refusal is proof the tool did not act (executed: false).
            answer = Answer(
                kind, error=_error(exc), result={"error": _error(exc), "executed": False}
            )
            if kind == "rejected_retryable":
                return answer
        injection.point(
            "after_tool_response_before_tx2_commit",
            run_id=op.run_id,
            epoch=epoch,
            operation_id=op.operation_id,
        )
        return answer

    def settle_without_result(self, conn: Conn, op: Operation, answer: Answer) -> str:
        """Ledger consequence of an answer that records no result.

        ``unknown`` (timeout, lost answer, 5xx) -> unknown: a timeout is never
        a failure and is never resent blindly. A 429 is the tool's proof it
        did not act -> prepared again. A conflicting resource -> unknown, for
        a person.
        """
        if answer.kind == "rejected_retryable":
            status = self.ledger.return_rejected(conn, op, self.owner, answer.error or {})
        else:
            status = self.on_unknown(conn, op, answer)
        outcome_committed(op.run_id, op.operation_id)
        return status

    def on_unknown(self, conn: Conn, op: Operation, answer: Answer) -> str:
        """Rule 5: a timeout is unknown, never failed, never resent here."""
        log(
            _log,
            logging.WARNING,
            "tool outcome unknown",
            run_id=str(op.run_id),
            operation_id=op.operation_id,
            error=answer.error,
        )
        return self.ledger.mark_unknown(conn, op, self.owner, answer.error or {})

    def cycle(self, conn: Conn, operation_id: str | None = None) -> dict[str, Any]:
        """One standalone dispatcher cycle: claim, call, record in the ledger only."""
        op = self.ledger.claim(conn, self.owner, operation_id)
        if op is None:
            return {"operation_id": operation_id, "status": None, "remote_id": None}
        answer = self.send(op, epoch=self.ledger.run_epoch(conn, op.run_id))
        if answer.kind in ("succeeded", "failed_final"):
            status = self.ledger.record_result(conn, op, self.owner, answer)
            outcome_committed(op.run_id, op.operation_id)
        else:
            status = self.settle_without_result(conn, op, answer)
        return {"operation_id": op.operation_id, "status": status, "remote_id": answer.remote_id}


class Reconciler:
    """Converges unknown operations: query, same-key retry, or leave for a person."""

    def __init__(self, ledger: Ledger, dispatcher: Dispatcher) -> None:
        self.ledger = ledger
        self.dispatcher = dispatcher

    def cycle(self, conn: Conn) -> list[dict[str, Any]]:
        changes = self.ledger.expire_claims(conn)
        for row in self.ledger.unknown_operations(conn):
            try:
                change = self.reconcile_one(conn, row)
            except e.LedgerConflict:
                # Another reconciler, a person or a callback settled it since
                # the list was read: nothing of ours changed; go on.
                continue
            if change is not None:
                changes.append(change)
        return changes

    def reconcile_one(
        self, conn: Conn, row: dict[str, Any], cancel: Cancellation | None = None
    ) -> dict[str, Any] | None:
        """Try to learn the remote fact of one unknown operation (reconcile_total
        counts success, failure or no_result). ``cancel``: the execution this
        runs for (a run's tool step); once it is cancelled (its lease lost) no
        same-key resend is claimed or sent."""
        change = self._reconcile_one(conn, row, cancel)
        to = (change or {}).get("to")
        outcome = {"succeeded": "success", "failed_final": "failure"}.get(str(to), "no_result")
        metrics.reconcile_total.labels(outcome).inc()
        return change

    def _reconcile_one(
        self, conn: Conn, row: dict[str, Any], cancel: Cancellation | None
    ) -> dict[str, Any] | None:
        op_id = str(row["operation_id"])
        cap = str(row["tool_capability"])
        if cap == "none":
            return None  # no query, no idempotency: a person decides
        try:
            found = self.dispatcher.tools.query(str(row["tool_name"]), op_id)
        except QueryUnsupported:
            found = None
        except ToolError as exc:
            log(_log, logging.WARNING, "query failed", operation_id=op_id, error=repr(exc))
            return None
        # The tool answered; what it said is not recorded anywhere yet.
        injection.point("after_reconcile_query", run_id=row["run_id"], operation_id=op_id)
        if found is not None:
            # The remote resource must come from THIS request, not another
            # body sent under the same operation_id.
            if found.body_digest is not None and found.body_digest != row["request_digest"]:
                self.ledger.add_evidence(conn, op_id, {"event": "query_digest_mismatch"})
                return None
            status = self.ledger.converge(
                conn,
                op_id,
                int(row["revision"]),
                "succeeded",
                found.resource_id,
                {"resource_id": found.resource_id, "resource_ids": list(found.resource_ids)},
                {"source": "query", "count": len(found.resource_ids)},
            )
            # One statement (fencecheck.ledger_converge) converged the operation
            # and queued a run paused in doubt with nothing else in doubt: a
            # crash here leaves both done.
            injection.point("after_reconcile_converge", run_id=row["run_id"], operation_id=op_id)
            outcome_committed(row["run_id"], op_id)
            return {"operation_id": op_id, "from": "unknown", "to": status}
        # Not found is no proof of "not executed": a dispatcher whose claim
        # expired may still be about to send (experiment E[stale_dispatcher]
        # holds one there). Only a same-key retry, which the tool folds into
        # any late original, is safe; past the tool's retention window not
        # even that (fencecheck.ledger_claim_retry refuses): a person decides.
        if cap in ("idempotent", "deterministic_id") and row["run_status"] in (
            "queued",
            "running",
            "waiting_tool",
        ):
            return self.retry_same_key(conn, row, cancel)
        return None

    def retry_same_key(
        self, conn: Conn, row: dict[str, Any], cancel: Cancellation | None = None
    ) -> dict[str, Any] | None:
        """Resend with the original operation_id (tools that promise it is safe)."""
        if cancel is not None:
            cancel.check()  # a cancelled execution claims no resend
        op = self.ledger.claim_retry(
            conn, self.dispatcher.owner, str(row["operation_id"]), int(row["revision"])
        )
        if op is None:
            return None
        answer = self.dispatcher.send(
            op, epoch=self.ledger.run_epoch(conn, op.run_id), cancel=cancel
        )
        if answer.kind in ("succeeded", "failed_final"):
            status = self.ledger.record_result(conn, op, self.dispatcher.owner, answer)
            outcome_committed(op.run_id, op.operation_id)
        else:
            status = self.dispatcher.settle_without_result(conn, op, answer)
        return {"operation_id": op.operation_id, "from": "unknown", "to": status}
