"""Rule 4, 5 and 6 mutants: the side-effect ledger, operation identity, cancel."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from mock_tool.errors import ToolError
from reference_impl import backoff, ids
from reference_impl.cancellation import Cancellation
from reference_impl.db import Conn
from reference_impl.ledger import Answer, Dispatcher, Ledger, Operation, Reconciler
from reference_impl.mutants.base import Component, Method, Mutant, SqlOverlay
from reference_impl.protocol import Protocol


def operation_id_per_attempt(
    self: Protocol, tenant: str, run_id: str, step_id: str, effect_version: int
) -> str:
    """MUTANT: the id carries a per-attempt nonce (like a worker, epoch or time)."""
    return f"{ids.operation_id(tenant, run_id, step_id, effect_version)}/{uuid.uuid4().hex[:8]}"


def backoff_same_for_every_run(self: Protocol, run_id: str, attempt: int) -> int:
    """MUTANT: the jitter is drawn from the attempt alone, not from the run."""
    del run_id
    return backoff.delay_ms("the-same-for-every-run", attempt)


class ResendingReconciler(Reconciler):
    """Takes an unknown outcome for a failed attempt and sends the request again."""

    def reconcile_one(
        self, conn: Conn, row: dict[str, Any], cancel: Cancellation | None = None
    ) -> dict[str, Any] | None:
        del cancel
        # MUTANT: no query, no check of what the tool promises: resend with the
        # same key and record whatever the second answer says as the fact.
        op_id = str(row["operation_id"])
        try:
            res = self.dispatcher.tools.create(
                str(row["tool_name"]), op_id, str(row["run_id"]), 0, dict(row["request_body"])
            )
        except ToolError:
            return None
        status = self.ledger.converge(
            conn,
            op_id,
            int(row["revision"]),
            "succeeded",
            res.resource_id,
            {"resource_id": res.resource_id},
            {"source": "resend after unknown"},
        )
        return {"operation_id": op_id, "from": "unknown", "to": status}


class SilenceAsRefusalDispatcher(Dispatcher):
    """Takes a call that got no answer at all for the tool's refusal to act."""

    def send(self, op: Operation, epoch: int, cancel: Cancellation | None = None) -> Answer:
        answer = super().send(op, epoch, cancel)
        # MUTANT: no HTTP status (a timeout, a reset or closed connection after
        # the request left) is read as "the tool did not act", like a 429: the
        # claim goes back to prepared and the request is sent again later,
        # although the tool may well have acted.
        error = answer.error or {}
        if answer.kind == "unknown" and error.get("http_status") is None:
            return Answer("rejected_retryable", error=error, result={"executed": False})
        return answer


class DeadlineBlindLedger(Ledger):
    """Claims without a local deadline, so the dispatcher never checks one."""

    def _claimed(self, row: dict[str, Any] | None, sent: float) -> Operation | None:
        # MUTANT: the claim's deadline is not carried to the call: a dispatcher
        # frozen between its claim and its call (SIGSTOP, a VM pause) sends on
        # resume, under a claim that expired while a successor holds a newer one.
        return Operation.from_row(row) if row else None


class ResendDeadlineBlindLedger(Ledger):
    """A same-key resend's claim without a local deadline (first claims keep theirs)."""

    def claim_retry(self, conn: Conn, owner: str, op_id: str, revision: int) -> Operation | None:
        op = super().claim_retry(conn, owner, op_id, revision)
        # MUTANT: the resend's claim does not carry its deadline to the call: a
        # reconciler frozen between that claim and its call sends on resume,
        # under a claim another reconciler has since expired and replaced.
        return None if op is None else dataclasses.replace(op, local_deadline=None)


class DeadlineFromAnswerLedger(Ledger):
    """A dispatch claim whose local deadline counts from the claim's answer."""

    def claim(self, conn: Conn, owner: str, operation_id: str | None = None) -> Operation | None:
        row = conn.execute(
            self.q.sql("dispatch_claim"),
            {"dispatch_owner": owner, "ttl_ms": self.dispatch_ttl_ms, "operation_id": operation_id},
        ).fetchone()
        # MUTANT: the clock is read once the answer is in, not before the claim
        # was sent: an answer that came late makes the local deadline later than
        # the database's, and a dispatcher let go in between still sends.
        return self._claimed(row, time.monotonic())


class ResendDeadlineFromAnswerLedger(Ledger):
    """A same-key resend's claim whose local deadline counts from its answer."""

    def claim_retry(self, conn: Conn, owner: str, op_id: str, revision: int) -> Operation | None:
        row = conn.execute(
            self.q.sql("claim_retry"),
            {
                "dispatch_owner": owner,
                "ttl_ms": self.dispatch_ttl_ms,
                "operation_id": op_id,
                "expected_revision": revision,
            },
        ).fetchone()
        # MUTANT: as claim_deadline_from_answer, for the reconciler's resend
        # (blind bug hunt round 19, #12, in Go): a resend claim answered late
        # is believed to hold past the database's deadline.
        return self._claimed(row, time.monotonic())


class ConflictAsSuccessDispatcher(Dispatcher):
    """Takes any 409 under our key for our success."""

    def send(self, op: Operation, epoch: int, cancel: Cancellation | None = None) -> Answer:
        answer = super().send(op, epoch, cancel)
        # MUTANT: a conflict is read as "the resource exists, so it is ours",
        # without comparing the body it was made from (same_request false: it
        # was made from another request under our operation_id).
        body = (answer.error or {}).get("body") or {}
        if answer.kind == "conflict" and isinstance(body.get("resource_id"), str):
            rid = body["resource_id"]
            return Answer("succeeded", rid, {"resource_id": rid, "conflict": True})
        return answer


class AcceptedAsSuccessDispatcher(Dispatcher):
    """Takes a 202 (accepted, no result in it) for a recorded success."""

    def send(self, op: Operation, epoch: int, cancel: Cancellation | None = None) -> Answer:
        answer = super().send(op, epoch, cancel)
        # MUTANT: any 2xx is a success, even one that carries no resource id:
        # the ledger records succeeded without the remote fact.
        if answer.kind == "unknown" and (answer.error or {}).get("http_status") == 202:
            return Answer("succeeded", None, {"accepted": True})
        return answer


class ServerErrorAsRefusalDispatcher(Dispatcher):
    """Takes a 5xx for the tool's definite refusal."""

    def send(self, op: Operation, epoch: int, cancel: Cancellation | None = None) -> Answer:
        answer = super().send(op, epoch, cancel)
        # MUTANT: a 500 is read as "the tool failed, nothing happened"
        # (failed_final), although a tool may act and then answer 5xx.
        status = (answer.error or {}).get("http_status")
        if answer.kind == "unknown" and isinstance(status, int) and status >= 500:
            error = answer.error or {}
            return Answer("failed_final", error=error, result={"error": error, "executed": False})
        return answer


class EpochlessLedger(Ledger):
    """Sends requests of a dispatcher that does not hold the lease with epoch 0."""

    def run_epoch(self, conn: Conn, run_id: uuid.UUID) -> int:
        # MUTANT: the request does not carry the run's epoch: the tool (and any
        # high-water check of its own) cannot tell which term sent it.
        return 0


MUTANTS = (
    Mutant(
        "expired_claim_back_to_prepared",
        4,
        ("J", "E"),
        "a dispatch claim past its deadline goes back to prepared instead of unknown, "
        "so it is dispatched again although the tool may have acted",
        SqlOverlay("expired_claim_back_to_prepared.sql", "fencecheck.reconcile_expire_claims"),
    ),
    Mutant(
        "result_ignores_dispatch_claim",
        4,
        ("E",),
        "a dispatcher's tool result is recorded whenever the operation is dispatching, "
        "whoever holds the claim and whatever the ledger revision: a stale "
        "dispatcher's late answer overwrites a newer claim still in flight",
        SqlOverlay("result_ignores_dispatch_claim.sql", "fencecheck.record_tool_result"),
    ),
    Mutant(
        "request_without_run_epoch",
        4,
        ("E",),
        "a dispatcher that is not the run's lease holder (a standalone dispatch or a "
        "same-key retry) sends the request with epoch 0 instead of the run's epoch",
        Component("ledger_cls", EpochlessLedger),
    ),
    Mutant(
        "dispatch_after_claim_deadline",
        4,
        ("E",),
        "a dispatcher does not check its claim's deadline right before the call: frozen "
        "between its claim and its call, it sends on resume under a claim that expired "
        "while a successor took the run over and holds a newer claim",
        Component("ledger_cls", DeadlineBlindLedger),
    ),
    Mutant(
        "resend_after_claim_deadline",
        4,
        ("E",),
        "a reconciler's same-key resend does not check its claim's deadline right before "
        "the call: frozen between that claim and its call, it sends on resume under a "
        "claim another reconciler expired and replaced (blind bug hunt round 5, #14)",
        Component("ledger_cls", ResendDeadlineBlindLedger),
    ),
    Mutant(
        "claim_deadline_from_answer",
        4,
        ("E",),
        "a dispatch claim's local deadline counts from the claim's answer, not from when it "
        "was sent: an answer that came late leaves the dispatcher believing it holds a claim "
        "the database has expired, and it sends (blind bug hunt round 6, #14, in Go)",
        Component("ledger_cls", DeadlineFromAnswerLedger),
    ),
    Mutant(
        "resend_deadline_from_answer",
        4,
        ("E",),
        "a same-key resend claim's local deadline counts from the claim's answer, not from "
        "when it was sent: a reconciler whose resend claim was answered late sends under a "
        "claim the database has expired (blind bug hunt round 19, #12, in Go)",
        Component("ledger_cls", ResendDeadlineFromAnswerLedger),
    ),
    Mutant(
        "new_operation_id_on_retry",
        5,
        ("E", "J"),
        "the operation_id carries a per-attempt nonce, so a takeover or retry derives a "
        "new id for the same business intent instead of resuming the persisted one",
        Method("operation_id", operation_id_per_attempt),
    ),
    Mutant(
        "unknown_resent_as_failure",
        5,
        ("J", "E"),
        "an unknown tool outcome (timeout, lost answer, dead dispatcher) is taken for a "
        "failure and the request is sent again, whatever the tool promises",
        Component("reconciler_cls", ResendingReconciler),
    ),
    Mutant(
        "no_answer_taken_as_refusal",
        5,
        ("S", "W"),
        "a tool call that got no answer (timeout, connection reset or closed after the "
        "request was sent) is taken for the tool's refusal to act: the claim goes back to "
        "prepared and the request is sent again, although the tool may have acted",
        Component("dispatcher_cls", SilenceAsRefusalDispatcher),
    ),
    Mutant(
        "conflict_taken_as_success",
        4,
        ("W",),
        "a 409 under our operation_id is recorded as our success whatever body the existing "
        "resource was made from: a resource another request made under our key becomes the "
        "result of ours",
        Component("dispatcher_cls", ConflictAsSuccessDispatcher),
    ),
    Mutant(
        "accepted_taken_as_success",
        4,
        ("W",),
        "a 202 (accepted, no result in it) is recorded as succeeded without a remote id, "
        "instead of unknown until a query learns the remote fact",
        Component("dispatcher_cls", AcceptedAsSuccessDispatcher),
    ),
    Mutant(
        "server_error_taken_as_refusal",
        5,
        ("W",),
        "a 5xx is taken for the tool's definite refusal (failed_final) although the tool may "
        "have acted before answering it: an unknown outcome is not left unknown",
        Component("dispatcher_cls", ServerErrorAsRefusalDispatcher),
    ),
    Mutant(
        "cancel_marks_inflight_cancelled",
        6,
        ("F",),
        "cancel marks dispatching and unknown operations cancelled too, pretending "
        "effects that may have happened did not",
        SqlOverlay("cancel_marks_inflight_cancelled.sql", "fencecheck.cancel_run"),
    ),
    Mutant(
        "cancel_keeps_prepared",
        6,
        ("F",),
        "cancel stops the run but leaves its prepared operations prepared: nothing "
        "forbids dispatching them later",
        SqlOverlay("cancel_keeps_prepared.sql", "fencecheck.cancel_run"),
    ),
    Mutant(
        "resolve_unaudited",
        4,
        ("J",),
        "the operator's resolution of an operation in doubt writes no audit row (who, why, "
        "ticket, before/after)",
        SqlOverlay("resolve_unaudited.sql", "fencecheck.operator_resolve"),
    ),
    Mutant(
        "operator_audit_before_after_change",
        4,
        ("J", "V"),
        "the operator's resolution takes the audit row's before snapshot after it changed "
        "the operation: the audit shows a finding already made, never what was in doubt",
        SqlOverlay("operator_audit_before_after_change.sql", "fencecheck.operator_resolve"),
    ),
    Mutant(
        "converge_leaves_paused",
        5,
        ("J",),
        "an operator's manual convergence leaves the run paused in doubt with nothing left "
        "in doubt: nobody may resolve it any more and nothing resumes it",
        SqlOverlay("converge_leaves_paused.sql", "fencecheck.operator_converge"),
    ),
    Mutant(
        "retry_ignores_retention",
        4,
        ("E",),
        "a same-key retry is sent after the tool's declared idempotency retention has run "
        "out: the tool no longer knows the key and creates a second resource",
        SqlOverlay("retry_ignores_retention.sql", "fencecheck.ledger_claim_retry"),
    ),
    Mutant(
        "requeue_without_backoff",
        4,
        ("U",),
        "a requeued run is due again at once: the worker's backoff is ignored and a refusing "
        "tool is asked again without waiting",
        SqlOverlay(
            "requeue_without_backoff.sql",
            "fencecheck.protected_write and fencecheck._protected_write_lock_first",
        ),
    ),
    Mutant(
        "jitter_same_for_every_run",
        4,
        ("U",),
        "the retry backoff grows with the attempt but its jitter is the same for every run: "
        "runs that failed together are all due again at the same moment",
        Method("backoff_ms", backoff_same_for_every_run),
    ),
    Mutant(
        "grant_without_attempt_count",
        4,
        ("U",),
        "claiming a queued run does not count the attempt: the attempt budget is never spent and "
        "a refusing tool is retried forever",
        SqlOverlay("grant_without_attempt_count.sql", "fencecheck._grant"),
    ),
    Mutant(
        "supplement_dropped",
        5,
        ("V",),
        "an operator's supplement queues the run again but its fields are dropped: the effect "
        "is planned again with the refused request",
        SqlOverlay("supplement_dropped.sql", "fencecheck.operator_decide"),
    ),
    Mutant(
        "purge_cutoff_by_creation",
        10,
        ("V",),
        "the retention purge judges a task's age by when its runs were created, not when they "
        "ended: a task made long ago whose run just finished is purged inside the retention",
        SqlOverlay("purge_cutoff_by_creation.sql", "fencecheck.operator_purge"),
    ),
)
