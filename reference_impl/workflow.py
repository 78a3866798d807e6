"""The built-in agent workflow: a refund, so experiments have real work.

plan -> lookup -> create_label (tool call) -> notify -> [work_1..n] -> finish

Every step ends in a protected write; the tool step goes intent (Tx1,
``prepared``) -> dispatch claim -> tool call -> result (Tx2), and resumes
from whatever the ledger says after a takeover, with the same operation_id.

Run input (all optional): ``tool`` (tool name for create_label, default
``idem``), ``extra_steps`` (number of plain checkpoint steps added before
finish), ``step_delay_ms`` (work time per step, cancellable), ``order_id``,
``amount``.

Invariants: the cancellation token is checked before every step and before
every side effect; a lost lease ends the execution without any further
write; a tool outcome that cannot be learned freezes the run in doubt; a
permanent error (the tool refused for good, the attempt budget is spent)
pauses the run for a human; a step's effect is planned again, under the
next effect_version, only when every earlier version is definitely without
effect (refused, or found not executed), with the request as it is now
(an operator's ``supplement`` changes it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from harness import injection
from reference_impl import errors as e
from reference_impl import history, metrics
from reference_impl.cancellation import Cancellation
from reference_impl.checkpoint_schema import CURRENT_VERSION, DEFAULT_PLAN, validate_v2
from reference_impl.ids import request_digest
from reference_impl.leases import Lease
from reference_impl.ledger import Answer, intent_effect
from reference_impl.logs import log
from reference_impl.protected import Write, Written
from reference_impl.runtime import Runtime
from reference_impl.sealing import SENSITIVE

_log = logging.getLogger("reference_impl.workflow")

TOOL_STEPS = frozenset({"create_label"})
_OP_NAMES = {
    "start": "start",
    "checkpoint": "save_checkpoint",
    "intent": "register_intent",
    "tool_result": "tool_result",
    "succeed": "complete",
    "fail": "fail",
    "freeze": "freeze",
    "requeue": "requeue",
    "pause_human": "pause_human",
}
_LIVE = ("queued", "running", "waiting_tool")


class Draining(Exception):
    """SIGTERM: stop at the next step boundary and give the lease back."""


# Marks a step's refused result once the run was paused for a person over it.
PAUSED_FOR_PERSON = "paused_for_person"


def refused_by_tool(row: dict[str, Any]) -> bool:
    """A ``failed_final`` the tool answered (a definite refusal, its error kept),
    not a person's finding or an intent retired unsent."""
    result = row.get("result")
    return isinstance(result, dict) and "error" in result


def paused_for(state: dict[str, Any], step: str, op_id: str) -> bool:
    """Whether the run was paused for a person over this refused operation."""
    done = state["results"].get(step)
    return (
        isinstance(done, dict)
        and done.get("operation_id") == op_id
        and bool(done.get(PAUSED_FOR_PERSON))
    )


def initial_state(input_: dict[str, Any]) -> dict[str, Any]:
    extra = int(input_.get("extra_steps", 0))
    plan = [*DEFAULT_PLAN[:-1], *(f"work_{i + 1}" for i in range(extra)), DEFAULT_PLAN[-1]]
    return {
        "workflow": "refund",
        "plan": plan,
        "cursor": 0,
        "data": {
            "order_id": input_.get("order_id", "order-1"),
            "amount": input_.get("amount", 10),
            # sensitive fields travel sealed (reference_impl/sealing.py)
            **{k: input_[k] for k in sorted(SENSITIVE) if k in input_},
        },
        "results": {},
        "pending": None,
    }


class RefundWorkflow:
    """Executes one run under one lease until it ends, freezes or loses the lease."""

    def __init__(
        self,
        rt: Runtime,
        lease: Lease,
        cancel: Cancellation,
        draining: threading.Event | None = None,
    ) -> None:
        self.rt = rt
        self.lease = lease
        self.cancel = cancel
        self.draining = draining or threading.Event()
        self.revision = 0
        self.input: dict[str, Any] = {}
        self.attempts = (0, 1)  # attempt_count, max_attempts of the run

    # ------------------------------------------------------------ driver
    def run(self) -> str:
        """Returns the run's status when this execution ends."""
        conn = self.rt.conn
        st = self.rt.runs.state(conn, self.lease.run_id)
        self.revision = int(st["revision"])
        self.input = dict(st["input"] or {})
        self.attempts = (int(st["attempt_count"]), int(st["max_attempts"]))
        ck = self.rt.runs.read_checkpoint(conn, self.lease.run_id)
        if ck is None:
            state = initial_state(self.input)
            self.write("start", state, step=state["plan"][0], event_type="agent.started")
        else:
            state = validate_v2(ck.state)
            if ck.migrated_from is not None:
                log(
                    _log,
                    logging.INFO,
                    "checkpoint migrated",
                    run_id=str(self.lease.run_id),
                    from_version=ck.migrated_from,
                    to_version=CURRENT_VERSION,
                )
        delay_s = float(self.input.get("step_delay_ms", 0)) / 1000.0
        while state["cursor"] < len(state["plan"]):
            self.cancel.check()
            if self.draining.is_set():
                raise Draining()
            step = str(state["plan"][state["cursor"]])
            if delay_s:
                self.cancel.sleep(delay_s)
            if step in TOOL_STEPS:
                outcome = self.tool_step(state, step)
                if outcome is not None:
                    return outcome
                continue
            if step == "finish":
                done = {**state, "cursor": state["cursor"] + 1}
                out = self.write(
                    "succeed",
                    done,
                    step=step,
                    event_type="agent.succeeded",
                    payload={"reason": "done"},
                )
                return out.status
            state = self.plain_step(state, step)
        # The plan is done but the run is not: a state saved by another writer,
        # or a migrated one listing every step done. The run ends only by its
        # own write; answering "succeeded" without it would leave it held.
        out = self.write(
            "succeed",
            state,
            step="finish",
            event_type="agent.succeeded",
            payload={"reason": "done"},
        )
        return out.status

    def plain_step(self, state: dict[str, Any], step: str) -> dict[str, Any]:
        data = dict(state["data"])
        if step == "lookup":
            data["refundable"] = True
        elif step == "plan":
            data["plan_ok"] = True
        results = {**state["results"], step: "done"}
        new = {**state, "data": data, "results": results, "cursor": state["cursor"] + 1}
        event_type = "refund.notified" if step == "notify" else "agent.checkpoint"
        self.write("checkpoint", new, step=step, event_type=event_type)
        return new

    # ------------------------------------------------------------ tool step
    def tool_step(self, state: dict[str, Any], step: str) -> str | None:
        """Advance the tool step by what the ledger says; None when the step is done."""
        rt = self.rt
        tool = str(self.input.get("tool", "idem"))
        # An operator's supplement is part of the request from then on.
        request = {
            "kind": "return_label",
            **state["data"],
            **dict(self.input.get("supplement") or {}),
        }
        version = self.effect_version(step)
        op_id = rt.protocol.operation_id(rt.settings.tenant, str(self.lease.run_id), step, version)
        for _ in range(10_000):
            self.cancel.check()
            # The session's connection of this pass: a write in the last one
            # (an unknown commit read back) may have replaced the connection.
            conn = rt.conn
            row = rt.ledger.get(conn, op_id)
            if row is None:
                cap = rt.tools.capability(tool)
                effect = intent_effect(
                    op_id,
                    step,
                    version,
                    tool,
                    cap,
                    rt.sealer.seal(request),
                    rt.tools.retention_ms(tool),
                    request_digest(rt.sealer.open(request)),
                )
                pending = {"operation_id": op_id, "tool": tool, "step": step}
                state["pending"] = pending
                self.write(
                    "intent",
                    state,
                    step=step,
                    event_type="agent.tool_intent",
                    effect=effect,
                    operation_id=op_id,
                )
                injection.point(
                    "after_outbound_intent_commit",
                    run_id=self.lease.run_id,
                    epoch=self.lease.epoch,
                    revision=self.revision,
                    operation_id=op_id,
                )
                continue
            status = str(row["status"])
            if status == "prepared" and row["request_digest"] != request_digest(
                rt.sealer.open(request)
            ):
                # Planned before a person's supplement changed the request:
                # never sent as it is (V[supplement_after_budget]); retired
                # unsent, so the next pass plans the next version with it.
                self.retire_unsent(op_id)
            elif status == "prepared":
                done = self.dispatch_own(state, step, op_id)
                if done is not None:
                    return done if done != "" else None
            elif status == "dispatching":
                if row["claim_expired"]:
                    if not rt.ledger.expire_claims(conn):
                        # Its row is locked by another session (the expiry
                        # skips locked rows): wait for it, never spin.
                        self.cancel.sleep(0.1)
                else:
                    # Someone's claim is live: its answer may still come.
                    self.cancel.sleep(0.1)
            elif status == "unknown":
                try:
                    change = rt.reconciler.reconcile_one(
                        conn, {**row, "run_status": "running"}, cancel=self.cancel
                    )
                except e.LedgerConflict:
                    # Another reconciler, a person or a callback settled it
                    # first: go on from what the ledger says now.
                    continue
                if change is None or change.get("to") == "unknown":
                    try:
                        return self.freeze(state, step, op_id, None, {"reason": "unresolved"})
                    except e.LedgerConflict:
                        # It converged since we read it (a callback, say): the
                        # freeze rolled back; go on from what the ledger says.
                        continue
            elif status == "succeeded":
                return self.finish_tool(state, step, op_id, status, {"mode": "adopt"}, row)
            elif status == "failed_final":
                if refused_by_tool(row) and not paused_for(state, step, op_id):
                    # The tool refused it for good and nobody paused the run for
                    # it (its worker died between recording the refusal and the
                    # pause, or another dispatcher recorded it): only a person
                    # may move a refused step on.
                    return self.finish_tool(state, step, op_id, status, {"mode": "adopt"}, row)
                # Definitely not executed (refused and decided on, or found not
                # executed): the next version is planned on the next pass.
                version += 1
                op_id = rt.protocol.operation_id(
                    rt.settings.tenant, str(self.lease.run_id), step, version
                )
            else:  # cancelled: the run was cancelled under us
                raise e.LeaseLost(f"operation {op_id} is {status}", reason="cancelled")
        raise RuntimeError(f"tool step {step} did not converge")

    def retire_unsent(self, op_id: str) -> None:
        """Claim our prepared intent and record it failed_final without
        sending it: definitely not executed (it was only ever refused with a
        429, the tool's proof it did not act), so a version with the
        supplied fields may follow."""
        rt = self.rt
        op = rt.ledger.claim(rt.conn, rt.owner, op_id)
        if op is None:
            self.cancel.sleep(0.1)  # claimed by someone else meanwhile
            return
        why = {"executed": False, "reason": "superseded by a person's supplement, never sent"}
        rt.ledger.record_result(rt.conn, op, rt.owner, Answer("failed_final", result=why))

    def effect_version(self, step: str) -> int:
        """The step's current effect version: the newest one (1 when none yet)."""
        rows = self.rt.ledger.step_operations(self.rt.conn, self.lease.run_id, step)
        return int(rows[-1]["effect_version"]) if rows else 1

    def dispatch_own(self, state: dict[str, Any], step: str, op_id: str) -> str | None:
        """Claim and send our prepared intent; '' when the step completed."""
        rt, conn = self.rt, self.rt.conn
        self.cancel.check()
        op = rt.ledger.claim(conn, rt.owner, op_id)
        if op is None:
            self.cancel.sleep(0.1)  # claimed by someone else, or forbidden
            return None
        # The request carries the run's epoch as the ledger stands after the
        # claim, never our lease's: a dispatch claim is not fenced by the lease
        # (any dispatcher may send a prepared intent once), and a process that
        # was frozen past its lease may claim the successor's intent of the same
        # step before its heartbeat notices the loss (seen in Q).
        epoch = rt.ledger.run_epoch(conn, op.run_id)
        answer: Answer = rt.dispatcher.send(op, epoch, self.cancel)
        if answer.kind in ("succeeded", "failed_final"):
            effect = {
                "mode": "record",
                "operation_id": op.operation_id,
                "outcome": answer.kind,
                "dispatch_owner": rt.owner,
                "ledger_revision": op.revision,
                "request_digest": op.request_digest,
                "remote_id": answer.remote_id,
                "result": answer.result,
            }
            try:
                out = self.finish_tool(state, step, op_id, answer.kind, effect, None)
            except e.LeaseLost:
                # Keep the late answer as a ledger fact (matching our claim) so
                # the successor adopts it instead of asking again; on the
                # session's connection now (the refused write may have read
                # back on a new one).
                with contextlib.suppress(e.LedgerConflict):
                    rt.ledger.record_result(rt.conn, op, rt.owner, answer)
                raise
            except e.LedgerConflict:
                # Our claim no longer matches: the operation moved while we held
                # the answer (a callback converged it, or the claim expired and
                # turned unknown). The whole write rolled back; the loop goes on
                # from what the ledger says now, never from our copy.
                return None
            return out if out is not None else ""
        rt.dispatcher.settle_without_result(conn, op, answer)
        if answer.kind == "rejected_retryable":
            return self.requeue(state, step, "tool_rejected_retryable")
        return None  # unknown: the loop reconciles it

    def requeue(self, state: dict[str, Any], step: str, reason: str) -> str:
        """Back to the queue after a transient error, with exponential backoff and
        jitter (``Protocol.backoff_ms``); a spent attempt budget is a permanent error:
        paused for a human instead."""
        attempt, budget = self.attempts
        if attempt >= budget:
            out = self.write(
                "pause_human",
                state,
                step=step,
                event_type="agent.paused_human",
                payload={"reason": "attempts_exhausted", "after": reason},
            )
            return out.status
        delay = self.rt.protocol.backoff_ms(str(self.lease.run_id), max(1, attempt))
        out = self.write(
            "requeue",
            state,
            step=step,
            event_type="agent.requeued",
            effect={"backoff_ms": delay},
            payload={"reason": reason, "attempt": attempt, "backoff_ms": delay},
        )
        return out.status

    def finish_tool(
        self,
        state: dict[str, Any],
        step: str,
        op_id: str,
        outcome: str,
        effect: dict[str, Any],
        row: dict[str, Any] | None,
    ) -> str | None:
        effect = {**effect, "operation_id": op_id}
        remote = effect.get("remote_id") or (row or {}).get("remote_id")
        results = {
            **state["results"],
            step: {"operation_id": op_id, "outcome": outcome, "remote_id": remote},
        }
        # A refused effect does not complete the step: it is planned again
        # (next version) once a person approved or supplemented it.
        cursor = state["cursor"] + (1 if outcome == "succeeded" else 0)
        new = {**state, "results": results, "pending": None, "cursor": cursor}
        self.write(
            "tool_result",
            new,
            step=step,
            event_type="agent.tool_result",
            effect=effect,
            operation_id=op_id,
        )
        state.clear()
        state.update(new)
        if outcome == "failed_final":
            # A permanent error (Chinese seed §10): a person approves,
            # supplements or terminates (fencecheck.operator_decide). The
            # pause marks the refusal it was for: a run that leaves this pause
            # was moved on by a person's decision.
            paused = {**results, step: {**results[step], PAUSED_FOR_PERSON: True}}
            marked = {**new, "results": paused}
            out = self.write(
                "pause_human",
                marked,
                step=step,
                event_type="agent.paused_human",
                payload={"reason": "tool_rejected"},
            )
            state.update(marked)
            return out.status
        return None

    def freeze(
        self,
        state: dict[str, Any],
        step: str,
        op_id: str,
        claim: tuple[str, int] | None,
        error: dict[str, Any],
    ) -> str:
        """Pause in doubt: nothing automatic can learn what the tool did."""
        effect: dict[str, Any] = {"operation_id": op_id, "error": error}
        if claim is not None:
            effect["dispatch_owner"], effect["ledger_revision"] = claim
        self.write(
            "freeze",
            state,
            step=step,
            event_type="agent.tool_in_doubt",
            effect=effect,
            payload={"reason": "tool_outcome_unknown"},
            operation_id=op_id,
        )
        return "paused_indoubt"

    # ------------------------------------------------------------ writes
    def write(
        self,
        transition: str,
        state: dict[str, Any],
        *,
        step: str,
        event_type: str,
        effect: dict[str, Any] | None = None,
        payload: dict[str, Any] | None = None,
        operation_id: str | None = None,
    ) -> Written:
        self.cancel.check()
        lease = self.lease
        body = {
            "tenant_id": self.rt.settings.tenant,
            "run_id": str(lease.run_id),
            "epoch": lease.epoch,
            "step": step,
            **(payload or {}),
        }
        w = Write(
            lease,
            self.revision,
            transition,
            state,
            CURRENT_VERSION,
            event_type,
            body,
            current_step=step,
            effect=effect,
        )
        with history.operation(
            _OP_NAMES[transition],
            run_id=lease.run_id,
            epoch=lease.epoch,
            revision=self.revision,
            event_id=w.event_id,
            operation_id=operation_id,
            step=step,
        ) as h:
            out = self.rt.writer.write(w)
            h.ids["revision"] = out.revision
        self.revision = out.revision
        if out.status in ("paused_indoubt", "paused_human"):
            metrics.runs_paused_total.labels(out.status, str((payload or {}).get("reason"))).inc()
        log(
            _log,
            logging.INFO,
            f"{transition} committed",
            run_id=str(lease.run_id),
            owner=lease.owner,
            epoch=lease.epoch,
            revision=out.revision,
            operation_id=operation_id,
            event_id=str(w.event_id),
            status=out.status,
        )
        injection.point(
            "after_checkpoint_commit",
            run_id=lease.run_id,
            epoch=lease.epoch,
            revision=out.revision,
            operation_id=operation_id,
        )
        return out
