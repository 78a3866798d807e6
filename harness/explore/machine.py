"""The contract machine: rules over the contract's operations and the control
plane's actions that drive the real parts of a schedule towards the cells of
the state space (harness/contract/state_space.py) the schedule aims at.

A schedule's ``aims`` are cells drawn from the state space itself (so an
operation or a state added to operations.json is aimed at without a code
change here, and a value no rule here can bring about is reported as such).
For each aim the machine runs one rule: it brings a run into the aim's start
state (a fresh run of the machine's own tenant, built with the contract's
ops; or, for states only a running workflow reaches — a backoff, a pause for
a human or in doubt, a run an operator failed — a run of the schedule's own
workload found in that state), then sends the operation with arguments in
the aim's relation to what is stored. It runs beside the workload and the
nemesis, through the same database, tool, broker and links.

Invariants:
- what the machine meant is never evidence: whether a cell was reached is
  judged afterwards from the audit trail and the logs
  (harness/explore/cells.py);
- every request goes through ``ExperimentContext.op`` (or records the same
  log entry when it must be answered later), so its start state can be read;
- the machine leaves each of its own runs settled (cancelled or finished),
  so quiet after heal does not wait for them; every wait it makes is bounded
  and named.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.contract.state_space import Cell, contract_space
from harness.engine.experiment import ExperimentContext
from harness.explore.workload import Workload
from harness.parts.processes import WorkerProcess
from scenarios.common import control_plane

OP_TIMEOUT_S = 5.0
FIND_TIMEOUT_S = 4.0  # how long an aim waits for the workload to show a state
#: Tools by what they promise (the mock tool's defaults).
TOOL_OF = {"idempotent": "idem", "deterministic_id": "detid", "query": "queryable", "none": "plain"}
#: The mock tool's create fault that gives each answer a dispatch must handle.
FAULT_FOR_ANSWER = {
    "conflict_other_body": ("conflict_other_body", None),
    "error_after_act": ("error_5xx_after_act", None),
    "accepted_without_result": ("accept_without_result", None),
    "answer_late": ("answer_late", 1500),
    "reject_429": ("reject_429", None),
    "refused_422": ("reject_final", None),
    "no_answer": ("drop_after_act", None),
}
#: States only a running workflow brings about: found in the workload.
WORKLOAD_STATES = {
    "run": ("queued_backoff", "paused_indoubt", "paused_human", "failed"),
    "run_status": ("paused_indoubt", "paused_human", "failed"),
}


class NoRecipe(Exception):
    """The machine has no rule that brings this cell's state about."""


class NotThere(Exception):
    """The state did not come about within its bound (named in the message)."""


@dataclass
class Lease:
    run_id: str
    owner: str
    epoch: int
    revision: int


@dataclass
class AimRecord:
    cell: str
    outcome: str  # "sent", "no_recipe", "not_there", "error"
    detail: str = ""


@dataclass
class ContractMachine:
    """Runs a schedule's aims, one after another, on its own thread."""

    ctx: ExperimentContext
    workload: Workload
    aims: tuple[str, ...]
    stop: threading.Event
    records: list[AimRecord] = field(default_factory=list)
    _tenant: str = ""
    _mine: list[str] = field(default_factory=list)  # every run the machine created
    _n: int = 0
    _thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if not self.aims:
            return
        self._tenant = self.ctx.uuid()
        self._thread = threading.Thread(target=self._run, name="explore-machine", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        self._aims()

    def finish(self) -> None:
        """After heal: every run of the machine's settled, every event of its
        tenant at the broker and at the workload's consumer, as the
        workload's own are (a few tries: a failover may have just moved the
        links, and a session reconnects on its next request)."""
        if not self._tenant:
            return
        for _ in range(3):
            try:
                self._drain()
                return
            except Exception:
                self.stop.wait(0.5)

    def _drain(self) -> None:
        # An aim cut short (a fault on the way) may have left its run holding
        # a lease nobody renews: no worker of this tenant would ever finish
        # it, and quiet would wait for it.
        left = self.ctx.env.query(
            "SELECT run_id::text AS run_id FROM agent_runs WHERE run_id::text = ANY(%s) "
            "AND status IN ('queued', 'running', 'waiting_tool')",
            [self._mine],
        )
        for row in left:
            self.must(self.control(), "cancel", run_id=str(row["run_id"]), reason="machine")
        proc = self.worker()
        self.must(proc, "relay", limit=1000)
        self.must(proc, "consume", consumer="billing")

    def _aims(self) -> None:
        cells = contract_space().by_id()
        for aim in self.aims:
            if self.stop.is_set():
                return
            cell = cells.get(aim)
            if cell is None:
                self.records.append(AimRecord(aim, "no_recipe", "not a cell of the state space"))
                continue
            try:
                self.rule_for(cell)(cell)
                self.records.append(AimRecord(aim, "sent"))
            except NoRecipe as exc:
                self.records.append(AimRecord(aim, "no_recipe", str(exc)))
            except NotThere as exc:
                self.records.append(AimRecord(aim, "not_there", str(exc)))
            except Exception as exc:  # a part that went away under a fault: recorded
                self.records.append(AimRecord(aim, "error", f"{type(exc).__name__}: {exc}"))

    # ------------------------------------------------------------ sessions
    def worker(self, tenant: str | None = None) -> WorkerProcess:
        tenant = tenant or self._tenant
        name = "mach-w" if tenant == self._tenant else f"mach-w-{tenant[:4]}"
        proc = self.ctx.env.workers.get(name)
        if proc is None or not proc.is_alive():
            proc = self.ctx.env.start_worker(name, "ops", tenant_id=tenant)
        return proc

    def control(self, tenant: str | None = None) -> WorkerProcess:
        tenant = tenant or self._tenant
        if tenant == self.ctx.env.tenant_id:
            return control_plane(self.ctx)
        return control_plane(self.ctx, tenant)

    def op(self, proc: WorkerProcess, op: str, **args: Any) -> Any:
        """One request (logged by the context); the reply, whatever it was."""
        return self.ctx.op(proc, op, timeout_s=OP_TIMEOUT_S, **args)

    def must(self, proc: WorkerProcess, op: str, **args: Any) -> dict[str, Any]:
        reply = self.op(proc, op, **args)
        if not reply.ok:
            raise NotThere(f"{op} was refused on the way: {reply.error}: {reply.message}")
        result: dict[str, Any] = reply.result
        return result

    def op_later(self, proc: WorkerProcess, op: str, **args: Any) -> Callable[[], Any]:
        """Send now, answer later (a dispatch held by the tool): the log entry is
        the one ``ExperimentContext.op`` writes, completed when answered."""
        pending = self.ctx.op_async(proc, op, args, worker_async=True)

        def answer() -> Any:
            try:
                return pending.result(OP_TIMEOUT_S + 10)
            except Exception:
                return None

        return answer

    def owner(self) -> str:
        self._n += 1
        return f"mach-{self._n}"

    def wait(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def lease_ttl_s(self) -> float:
        return self.ctx.env.lease_ttl_ms / 1000

    def dispatch_ttl_s(self) -> float:
        return self.ctx.env.dispatch_ttl_ms / 1000

    # ------------------------------------------------------------ building blocks
    def new_run(self, *, tool: str = "idem", max_attempts: int | None = None) -> tuple[str, str]:
        task = f"task-m-{self.ctx.uuid()[:8]}"
        args: dict[str, Any] = {"task_id": task, "input": {"tool": tool, "machine": True}}
        if max_attempts is not None:
            args["max_attempts"] = max_attempts
        result = self.must(self.control(), "create_run", **args)
        self._mine.append(str(result["run_id"]))
        return str(result["run_id"]), task

    def claim(self, run_id: str, owner: str | None = None) -> Lease:
        owner = owner or self.owner()
        got = self.must(self.worker(), "claim", run_id=run_id, owner=owner)
        return Lease(run_id, owner, int(got["epoch"]), int(got["revision"]))

    def save(self, lease: Lease) -> Lease:
        got = self.must(
            self.worker(), "save_checkpoint", run_id=lease.run_id, epoch=lease.epoch,
            owner=lease.owner, expected_revision=lease.revision, state={"machine": lease.revision},
        )  # fmt: skip
        return Lease(lease.run_id, lease.owner, lease.epoch, int(got["revision"]))

    def intent(self, lease: Lease, tool: str = "idem", step: str = "m.label") -> tuple[Lease, str]:
        got = self.must(
            self.worker(), "register_intent", run_id=lease.run_id, epoch=lease.epoch,
            owner=lease.owner, expected_revision=lease.revision, step_id=step,
            effect_version=1, tool=tool, request={"kind": "machine", "step": step},
        )  # fmt: skip
        return Lease(lease.run_id, lease.owner, lease.epoch, int(got["revision"])), str(
            got["operation_id"]
        )

    def settle(self, run_id: str) -> None:
        """Leave the machine's run settled (quiet after heal must not wait for it)."""
        with contextlib.suppress(Exception):
            self.op(self.control(), "cancel", run_id=run_id, reason="machine: done")

    def tool_fault(self, tool: str, answer: str) -> None:
        mode, ms = FAULT_FOR_ANSWER[answer]
        self.ctx.env.tool.client().set_fault(tool, mode, count=1, ms=ms)

    def free_tool(self, capability: str = "idempotent") -> str:
        """A tool of that capability, or one no workload run calls (a fault armed
        for the machine's call should not fire on a workload's)."""
        return TOOL_OF[capability]

    def leased(self, lease_state: str, identity: str) -> tuple[Lease, Lease]:
        """A run of the machine's in ``lease_state`` and the identity to send:
        (the run's current lease, the lease identity in ``identity`` to it)."""
        run_id, _ = self.new_run()
        first = self.claim(run_id)
        current = first
        if identity != "current":
            self.wait(self.lease_ttl_s() + 0.1)
            current = self.claim(run_id)
        if lease_state == "expired":
            self.wait(self.lease_ttl_s() + 0.1)
        elif lease_state == "none":
            self.must(
                self.worker(), "release", run_id=run_id, epoch=current.epoch, owner=current.owner
            )
        sent = {
            "current": current,
            "stale_epoch": first,
            "other_owner": Lease(run_id, first.owner, current.epoch, current.revision),
        }[identity]
        return current, sent

    def run_in(self, state: str, *, dim: str) -> tuple[str, str | None, str]:
        """A run in ``state`` (a value of ``run`` or ``run_status``): (run_id,
        operation_id or None, tenant)."""
        if state in WORKLOAD_STATES.get(dim, ()):
            return self.find(state)
        run_id, _ = self.new_run()
        if state == "queued":
            return run_id, None, self._tenant
        if state == "cancelled":
            self.must(self.control(), "cancel", run_id=run_id, reason="machine")
            return run_id, None, self._tenant
        lease = self.claim(run_id)
        if state.startswith("running"):
            if state.endswith("expired"):
                self.wait(self.lease_ttl_s() + 0.1)
            return run_id, None, self._tenant
        if state == "succeeded":
            self.must(
                self.worker(), "complete", run_id=run_id, epoch=lease.epoch, owner=lease.owner,
                expected_revision=lease.revision, result={"machine": True},
            )  # fmt: skip
            return run_id, None, self._tenant
        lease, op_id = self.intent(lease)
        if state.endswith("expired"):
            self.wait(self.lease_ttl_s() + 0.1)
        return run_id, op_id, self._tenant

    def find(self, state: str, ledger: str | None = None) -> tuple[str, str | None, str]:
        """A run of the schedule's workload in ``state`` now, its latest operation
        in ``ledger`` state when given (bounded wait)."""
        where = {
            "queued_backoff": "status = 'queued' AND coalesce((to_jsonb(r) ->> 'next_attempt_at')"
            "::timestamptz, '-infinity') > clock_timestamp() + interval '200 milliseconds'",
        }.get(state, "status = %s")
        params: list[Any] = [] if state == "queued_backoff" else [state]
        if ledger is not None:
            where += (
                " AND coalesce((SELECT o.status FROM tool_operations o WHERE o.run_id = r.run_id"
                " ORDER BY o.updated_at DESC LIMIT 1), 'none') = %s"
            )
            params.append(ledger.removesuffix("_live").removesuffix("_expired"))
        tenants = list(self.workload.tenants)
        deadline = time.monotonic() + FIND_TIMEOUT_S
        while time.monotonic() < deadline and not self.stop.is_set():
            rows = self.ctx.env.query(
                "SELECT r.run_id::text AS run_id, r.tenant_id::text AS tenant, "
                "(SELECT o.operation_id FROM tool_operations o WHERE o.run_id = r.run_id "
                " ORDER BY o.updated_at DESC LIMIT 1) AS op "
                f"FROM agent_runs r WHERE {where} AND r.tenant_id::text = ANY(%s) LIMIT 1",
                [*params, tenants],
            )
            if rows:
                return str(rows[0]["run_id"]), rows[0]["op"], str(rows[0]["tenant"])
            self.wait(0.1)
        raise NotThere(
            f"no run of the workload was {state}"
            + (f" with its operation {ledger}" if ledger else "")
            + f" within {FIND_TIMEOUT_S:.0f}s"
        )

    def op_in(self, ledger: str, *, tool: str = "idem") -> tuple[str, str, Callable[[], Any]]:
        """An operation of a fresh run in ``ledger`` state: (run_id, operation_id,
        what to call once done with it: answers a held dispatch)."""
        run_id, _ = self.new_run(tool=tool)
        lease = self.claim(run_id)
        if ledger == "none":
            return run_id, f"{self._tenant}/{run_id}/m.none/v1", lambda: None
        lease, op_id = self.intent(lease, tool=tool)
        done: Callable[[], Any] = lambda: None  # noqa: E731
        w = self.worker()
        if ledger == "prepared":
            pass
        elif ledger in ("dispatching_live", "dispatching_expired"):
            self.ctx.env.tool.client().set_fault(tool, "hang", count=1, ms=8000)
            answer = self.op_later(w, "dispatch", operation_id=op_id)
            self._await_ledger(op_id, "dispatching")
            if ledger == "dispatching_expired":
                self.wait(self.dispatch_ttl_s() + 0.1)

            def done() -> Any:
                with contextlib.suppress(Exception):
                    self.ctx.env.tool.client().release()
                return answer()
        elif ledger == "unknown":
            self.tool_fault(tool, "no_answer")
            self.op(w, "dispatch", operation_id=op_id)
        elif ledger == "succeeded":
            self.op(w, "dispatch", operation_id=op_id)
        elif ledger == "failed_final":
            self.tool_fault(tool, "refused_422")
            self.op(w, "dispatch", operation_id=op_id)
        elif ledger == "cancelled":
            self.must(self.control(), "cancel", run_id=run_id, reason="machine")
        else:
            raise NoRecipe(f"no rule brings an operation to ledger={ledger}")
        return run_id, op_id, done

    def _await_ledger(self, op_id: str, status: str) -> None:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            rows = self.ctx.env.query(
                "SELECT status FROM tool_operations WHERE operation_id = %s", [op_id]
            )
            if rows and rows[0]["status"] == status:
                return
            self.wait(0.02)
        raise NotThere(f"operation {op_id[-12:]} never became {status} within 3s")

    # ------------------------------------------------------------ the rules
    def rule_for(self, cell: Cell) -> Callable[[Cell], None]:
        rule = getattr(self, f"rule_{cell.op}", None)
        if rule is None:
            if not cell.values:
                return self.rule_plain
            raise NoRecipe(f"no rule for operation {cell.op}")
        return rule  # type: ignore[no-any-return]

    def rule_plain(self, cell: Cell) -> None:
        """An operation with no state of its own (a read)."""
        args: dict[str, Any] = {}
        if cell.op in ("run_state", "operator_actions"):
            args["run_id"], _ = self.new_run()
        proc = self.control() if cell.op in ("list_paused", "operator_actions") else self.worker()
        self.op(proc, cell.op, **args)
        if "run_id" in args:
            self.settle(args["run_id"])

    def _lease_op(self, cell: Cell, extra: Callable[[Lease], dict[str, Any]]) -> None:
        current, sent = self.leased(str(cell.get("lease")), str(cell.get("identity")))
        args: dict[str, Any] = {"run_id": sent.run_id, "epoch": sent.epoch, "owner": sent.owner}
        if cell.get("revision") is not None:
            stale = cell.get("revision") == "stale"
            if stale:  # a revision the run has moved past
                current = self.save(current)
            args["expected_revision"] = current.revision - 1 if stale else current.revision
        args |= extra(current)
        self.op(self.worker(), cell.op, **args)
        if cell.op == "heartbeat":
            with contextlib.suppress(Exception):
                self.op(self.worker(), "heartbeat", **{**args, "action": "stop"})
        self.settle(sent.run_id)

    def rule_renew(self, cell: Cell) -> None:
        self._lease_op(cell, lambda _l: {})

    def rule_release(self, cell: Cell) -> None:
        self._lease_op(cell, lambda _l: {})

    def rule_heartbeat(self, cell: Cell) -> None:
        self._lease_op(cell, lambda _l: {"action": "start", "interval_ms": 100, "timeout_ms": 300})

    def rule_save_checkpoint(self, cell: Cell) -> None:
        self._lease_op(cell, lambda _l: {"state": {"machine": "aim"}})

    def rule_complete(self, cell: Cell) -> None:
        self._lease_op(cell, lambda _l: {"result": {"machine": "aim"}})

    def rule_register_intent(self, cell: Cell) -> None:
        key = cell.get("key")
        request = {"kind": "machine", "body": 1}
        if key == "new":
            self._lease_op(
                cell,
                lambda _l: {"step_id": "m.aim", "effect_version": 1, "tool": "idem",
                            "request": request},
            )  # fmt: skip
            return
        run_id, _ = self.new_run()
        lease = self.claim(run_id)
        lease, _op = self.intent(lease, step="m.aim")
        # The intent's own body again, or another one, under the same key.
        body = {"kind": "machine", "step": "m.aim"} if key == "same_body" else {"kind": "other"}
        self.op(
            self.worker(), "register_intent", run_id=run_id, epoch=lease.epoch,
            owner=lease.owner, expected_revision=lease.revision, step_id="m.aim",
            effect_version=1, tool="idem", request=body,
        )  # fmt: skip
        self.settle(run_id)

    def rule_claim(self, cell: Cell) -> None:
        run_id, _op, tenant = self.run_in(str(cell.get("run")), dim="run")
        if cell.get("target") == "any":
            if tenant != self._tenant:
                raise NoRecipe("a claim of any run is aimed only at the machine's own tenant")
            self.op(self.worker(), "claim", owner=self.owner())
        else:
            reply = self.op(self.worker(tenant), "claim", run_id=run_id, owner=self.owner())
            if tenant != self._tenant and reply.ok:  # give a workload's run back at once
                self.op(
                    self.worker(tenant), "release", run_id=run_id,
                    epoch=reply.result["epoch"], owner=reply.result["owner"],
                )  # fmt: skip
        if tenant == self._tenant:
            self.settle(run_id)

    def rule_create_run(self, cell: Cell) -> None:
        key = cell.get("key")
        task = f"task-m-{self.ctx.uuid()[:8]}"
        body = {"tool": "idem", "machine": True}
        got = self.op(self.control(), "create_run", task_id=task, input=body)
        if key != "new":
            again = body if key == "same_body" else {"tool": "plain", "machine": "other"}
            self.op(self.control(), "create_run", task_id=task, input=again)
        if got.ok:
            self.settle(str(got.result["run_id"]))

    def rule_retry_run(self, cell: Cell) -> None:
        status, budget = str(cell.get("run_status")), cell.get("budget")
        if status in WORKLOAD_STATES["run_status"]:
            run_id, _op, tenant = self.find(status)
            task = self.ctx.env.query("SELECT task_id FROM agent_runs WHERE run_id = %s", [run_id])[
                0
            ]["task_id"]
            self.op(self.control(tenant), "retry_run", task_id=task)
            return
        run_id, task = self.new_run(max_attempts=1 if budget == "spent" else None)
        if status != "queued":
            lease = self.claim(run_id)  # a claim spends an attempt
            if status == "waiting_tool":
                self.intent(lease)
            elif status == "succeeded":
                self.must(
                    self.worker(), "complete", run_id=run_id, epoch=lease.epoch,
                    owner=lease.owner, expected_revision=lease.revision, result={"m": 1},
                )  # fmt: skip
            elif status == "cancelled":
                self.must(self.control(), "cancel", run_id=run_id, reason="machine")
        got = self.op(self.control(), "retry_run", task_id=task)
        self.settle(run_id)
        if got.ok:
            self._mine.append(str(got.result["run_id"]))
            self.settle(str(got.result["run_id"]))

    def rule_cancel(self, cell: Cell) -> None:
        status, ledger = str(cell.get("run_status")), str(cell.get("ledger"))
        if ledger != "none":
            run_id, _op, done = self.op_in(ledger)
            self.op(self.control(), "cancel", run_id=run_id, reason="machine aim")
            done()
            return
        run_id, _found_op, tenant = self.run_in(status, dim="run_status")
        self.op(self.control(tenant), "cancel", run_id=run_id, reason="machine aim")

    def rule_dispatch(self, cell: Cell) -> None:
        ledger, answer = str(cell.get("ledger")), str(cell.get("tool_answer"))
        tool = self.free_tool()
        run_id, op_id, done = self.op_in(ledger if answer == "ok" else "prepared", tool=tool)
        if answer != "ok":
            self.tool_fault(tool, answer)
        if answer == "answer_late" or ledger.startswith("dispatching"):
            later = self.op_later(self.worker(), "dispatch", operation_id=op_id)
            done()
            later()
        else:
            self.op(self.worker(), "dispatch", operation_id=op_id)
            done()
        self.settle(run_id)

    def rule_reconcile(self, cell: Cell) -> None:
        ledger, capability = str(cell.get("ledger")), str(cell.get("capability"))
        if ledger not in ("unknown", "dispatching_expired"):
            raise NoRecipe(f"reconcile is aimed only at unknown and expired claims, not {ledger}")
        run_id, _op, done = self.op_in(ledger, tool=TOOL_OF[capability])
        self.op(self.control(), "reconcile")
        done()
        self.settle(run_id)

    def rule_deliver_callback(self, cell: Cell) -> None:
        status, ledger = str(cell.get("run_status")), str(cell.get("ledger"))
        ref, payload = cell.get("run_ref"), cell.get("payload")
        tool = "idem"
        op_id: str | None
        if ledger != "dispatching_live" or status == "waiting_tool":
            run_id, op_id, done = self.op_in(ledger, tool=tool)
            tenant = self._tenant
        else:
            run_id, op_id, tenant = self.run_in(status, dim="run_status")
            done = lambda: None  # noqa: E731
        if op_id is None:
            raise NotThere(f"the {status} run had no operation to call back for")
        if ref == "superseded":
            self.must(self.control(), "cancel", run_id=run_id, reason="machine")
            task = self.ctx.env.query("SELECT task_id FROM agent_runs WHERE run_id = %s", [run_id])
            again = self.must(self.control(), "retry_run", task_id=task[0]["task_id"])
            self._mine.append(str(again["run_id"]))
        resources = [
            r for r in self.ctx.env.tool.client().export().get("resources", [])
            if r.get("operation_id") == op_id
        ]  # fmt: skip
        resource = (
            str(resources[0]["resource_id"])
            if resources and payload == "tool_resource"
            else f"res-forged-{self.ctx.uuid()[:6]}"
        )
        self.op(
            self.control(tenant), "deliver_callback", run_id=run_id, operation_id=op_id,
            payload={"operation_id": op_id, "resource_id": resource, "tool": tool},
        )  # fmt: skip
        done()
        if tenant == self._tenant:
            self.settle(run_id)

    def _operator(
        self, cell: Cell, op: str, args: Callable[[str, str | None], dict[str, Any]]
    ) -> None:
        status, ledger = str(cell.get("run_status")), str(cell.get("ledger"))
        base_ledger = {"resolve_indoubt": "unknown", "decide": "none"}[op]
        # The pause itself only a running workflow reaches: a workload's run
        # paused with its operation in the aimed ledger state.
        if status in WORKLOAD_STATES["run_status"]:
            run_id, op_id, tenant = self.find(status, None if ledger == base_ledger else ledger)
        else:
            run_id, op_id, tenant = self.run_in(status, dim="run_status")
        self.op(self.control(tenant), op, **args(run_id, op_id))
        if tenant == self._tenant:
            self.settle(run_id)

    def rule_resolve_indoubt(self, cell: Cell) -> None:
        finding = str(cell.get("finding"))
        decision = finding if finding != "outside" else "maybe"
        self._operator(
            cell, "resolve_indoubt",
            lambda run_id, op_id: {"run_id": run_id, "operation_id": op_id or "none",
                                   "decision": decision, "reason": "machine", "ticket": "M-1"},
        )  # fmt: skip

    def rule_decide(self, cell: Cell) -> None:
        decision = str(cell.get("decision"))
        sent = decision if decision != "outside" else "postpone"
        supplement = None
        if decision == "supplement":
            supplement = {"tool": "plain"} if cell.get("field") == "present" else {"note": "m"}

        def args(run_id: str, _op: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {"run_id": run_id, "decision": sent, "reason": "machine"}
            if supplement is not None:
                out["supplement"] = supplement
            return out

        self._operator(cell, "decide", args)

    def rule_converge_operation(self, cell: Cell) -> None:
        ledger, outcome = str(cell.get("ledger")), str(cell.get("outcome"))
        run_id, op_id, done = self.op_in(ledger)
        sent = outcome if outcome != "outside" else "prepared"
        self.op(
            self.control(), "converge_operation", operation_id=op_id, outcome=sent,
            reason="machine", ticket="M-2",
        )  # fmt: skip
        done()
        self.settle(run_id)

    def rule_read_checkpoint(self, cell: Cell) -> None:
        state = cell.get("checkpoint")
        if state not in ("none", "current"):
            raise NoRecipe(f"checkpoint={state} is written only by the harness itself (M)")
        run_id, _ = self.new_run()
        if state == "current":
            self.save(self.claim(run_id))
        self.op(self.worker(), "read_checkpoint", run_id=run_id)
        self.settle(run_id)

    def rule_durability(self, cell: Cell) -> None:
        self.op(self.worker(), "durability")

    def rule_relay(self, cell: Cell) -> None:
        answer = cell.get("broker_answer")
        if cell.get("outbox") == "empty":
            self.op(self.worker(), "relay", limit=100)
            return
        run_id, _ = self.new_run()
        self.save(self.claim(run_id))
        mode = {"fail_one": ("publish_fail", None), "late_ack": ("publish_ack_late", 1500)}
        if answer in mode:
            m, ms = mode[str(answer)]
            self.ctx.env.tool.client().set_fault("broker", m, count=1, ms=ms)
        self.op(self.worker(), "relay", limit=100)
        self.op(self.worker(), "relay", limit=100)  # what was refused goes again
        self.settle(run_id)

    def rule_consume(self, cell: Cell) -> None:
        delivery = cell.get("delivery")
        run_id, _ = self.new_run()
        lease = self.save(self.claim(run_id))
        self.save(lease)
        self.op(self.worker(), "relay", limit=100)
        if delivery in ("duplicate", "reorder"):
            self.ctx.env.tool.client().set_fault("broker", f"deliver_{delivery}", count=1)
        self.op(self.worker(), "consume", consumer="billing")
        if cell.get("consumer") == "seen":
            self.op(self.worker(), "consume", consumer="billing")
        self.settle(run_id)
