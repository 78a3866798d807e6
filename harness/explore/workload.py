"""The workload of a schedule: runs, autonomous workers, relay and consumer, and
the control plane's cancels, retries and late callbacks.

Workers run in the contract's autonomous ``run`` mode (worker contract §1,
§10), each with a link of its own to PostgreSQL so one worker can be cut
alone. A worker that dies (killed, crashed at a point, or exiting because it
lost its lease) is started again, as a process manager would, under the same
name (its history file is appended to; every line carries the pid).
The outbox relay and a consumer run in an ``ops`` process per tenant.

Invariant: every process is started through the environment, so the
experiment's teardown stops every one of them whatever happens here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.engine.experiment import ExperimentContext
from harness.explore.schedule import RELAY, ControlAction, Schedule
from harness.parts.processes import ProcessError, WorkerProcess
from scenarios.common import control_plane, new_run

RESTART_AFTER_S = 0.15
MAX_RESTARTS = 12  # per worker slot: a worker that dies at once every time is not restarted forever
RELAY_INTERVAL_S = 0.3
OP_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 20.0
SETTLED = ("succeeded", "failed", "cancelled", "paused_indoubt", "paused_human")


@dataclass
class Slot:
    """One worker position of the schedule and its incarnations."""

    index: int
    tenant_id: str
    pg_link: str
    incarnations: list[WorkerProcess] = field(default_factory=list)
    died_at: float | None = None

    @property
    def current(self) -> WorkerProcess | None:
        return self.incarnations[-1] if self.incarnations else None

    @property
    def base_name(self) -> str:
        return f"w{self.index}"


class Workload:
    """Starts and keeps the schedule's processes going; issues its control actions."""

    def __init__(self, ctx: ExperimentContext, schedule: Schedule, stop: threading.Event) -> None:
        self.ctx = ctx
        self.schedule = schedule
        self.stop = stop
        env = ctx.env
        self.tenants = [env.tenant_id, env.other_tenant_id][: schedule.tenants]
        self.run_ids: list[str] = []
        self.task_ids: list[str] = []
        self.slots = [
            Slot(i, self.tenants[schedule.worker_tenant(i)], f"pg_w{i}")
            for i in range(schedule.workers)
        ]
        self.relays: dict[str, WorkerProcess] = {}
        self.relay_restarts = 0
        self._relay_thread: threading.Thread | None = None
        self._relay_stop = threading.Event()
        self.action_log: list[dict[str, Any]] = []

    # ------------------------------------------------------------ start
    def create_runs(self) -> None:
        """Every run of the schedule, through its tenant's control plane."""
        for run in self.schedule.runs:
            tenant = self.tenants[run.tenant]
            run_id = new_run(
                self.ctx,
                tool=run.tool,
                input={"extra_steps": run.extra_steps, "step_delay_ms": run.step_delay_ms},
                tenant_id=None if tenant == self.ctx.env.tenant_id else tenant,
                max_attempts=run.max_attempts,
            )
            self.run_ids.append(run_id)
            row = self.ctx.env.query(
                "SELECT task_id FROM fencecheck_model.agent_runs WHERE run_id = %s", [run_id]
            )
            self.task_ids.append(str(row[0]["task_id"]))

    def start_workers(self) -> None:
        # A stale holder must speak at once when its moment comes: its
        # session is started with the workers.
        if any(f.kind == "stale" for f in self.schedule.faults):
            for tenant in self.tenants:
                self.stale_session(tenant)
        for slot in self.slots:
            self.ctx.env.add_pg_link(slot.pg_link)
            self._start(slot)
        if self.schedule.relay:
            for tenant in self.tenants:
                self._start_relay(tenant)
            self._relay_thread = threading.Thread(
                target=self._relay_loop, name="explore-relay", daemon=True
            )
            self._relay_thread.start()

    def _start(self, slot: Slot) -> WorkerProcess:
        # Every incarnation keeps the slot's name: point faults armed for it
        # apply after a restart too, and its history file (appended to, each
        # line with its pid) holds every incarnation's account.
        proc = self.ctx.env.start_worker(
            slot.base_name, "run", tenant_id=slot.tenant_id, pg_link=slot.pg_link
        )
        slot.incarnations.append(proc)
        slot.died_at = None
        if len(slot.incarnations) > 1:
            self.ctx.command(f"restarted worker {slot.base_name} (pid {proc.pid})")
        return proc

    def relay_name(self, tenant: str) -> str:
        return RELAY if tenant == self.tenants[0] else f"{RELAY}-t{self.tenants.index(tenant)}"

    def _start_relay(self, tenant: str) -> None:
        name = self.relay_name(tenant)
        self.relays[tenant] = self.ctx.env.start_worker(name, "ops", tenant_id=tenant)

    def wait_working(self, timeout_s: float = STARTUP_TIMEOUT_S) -> bool:
        """Wait until a worker of the schedule reached its first injection point
        (it is up, connected and claimed): the schedule's clock starts there,
        so process start-up time does not eat into the drawn moments."""
        deadline = time.monotonic() + timeout_s
        names = {s.base_name for s in self.slots}
        while time.monotonic() < deadline and not self.stop.is_set():
            if any(h.worker in names for h in self.ctx.env.control.hits()):
                return True
            self.stop.wait(0.02)
        return False

    # ------------------------------------------------------------ keep going
    def supervise(self) -> None:
        """Start again every worker that died (not one the kernel holds stopped)."""
        now = time.monotonic()
        for slot in self.slots:
            proc = slot.current
            if proc is None or proc.is_alive():
                continue
            if slot.died_at is None:
                slot.died_at = now
                self.ctx.command(f"{proc.worker_id} exited with code {proc.returncode}")
            elif now - slot.died_at >= RESTART_AFTER_S and len(slot.incarnations) <= MAX_RESTARTS:
                self._start(slot)

    def _relay_loop(self) -> None:
        """Relay the outbox and consume it, over and over, until told to stop."""
        while not (self._relay_stop.is_set() or self.stop.is_set()):
            self.relay_once()
            self._relay_stop.wait(RELAY_INTERVAL_S)

    def relay_once(self) -> None:
        for tenant in self.tenants:
            proc = self.relays.get(tenant)
            if proc is None:
                continue
            if not proc.is_alive():
                self.relay_restarts += 1
                self.ctx.command(f"{proc.worker_id} exited with code {proc.returncode}; restarted")
                self._start_relay(tenant)
                proc = self.relays[tenant]
            with contextlib.suppress(ProcessError, TimeoutError):
                proc.request("relay", {}, timeout_s=OP_TIMEOUT_S)
                proc.request("consume", {"consumer": "billing"}, timeout_s=OP_TIMEOUT_S)

    def stop_relay_loop(self) -> None:
        self._relay_stop.set()
        if self._relay_thread is not None:
            self._relay_thread.join(timeout=2 * OP_TIMEOUT_S + 1)

    def tenant_of(self, run_id: str) -> str:
        return self.tenants[self.schedule.runs[self.run_ids.index(run_id)].tenant]

    def stale_session(self, tenant: str) -> WorkerProcess:
        """The worker-role ``ops`` session a stale holder of a run of ``tenant``
        speaks through (one per tenant)."""
        name = f"stale-t{self.tenants.index(tenant)}"
        proc = self.ctx.env.workers.get(name)
        if proc is None or not proc.is_alive():
            proc = self.ctx.env.start_worker(name, "ops", tenant_id=tenant)
        return proc

    # ------------------------------------------------------------ control plane
    def act(self, action: ControlAction) -> None:
        """Issue one control-plane action; what it answered goes into the archive."""
        run_id = self.run_ids[action.run]
        tenant = self.tenants[self.schedule.runs[action.run].tenant]
        ctl = control_plane(self.ctx, None if tenant == self.ctx.env.tenant_id else tenant)
        args: dict[str, Any]
        if action.action == "cancel":
            args = {"run_id": run_id, "reason": "explore"}
            op = "cancel"
        elif action.action == "retry":
            args = {"task_id": self.task_ids[action.run]}
            op = "retry_run"
        else:
            request = self._first_request(run_id)
            if request is None:
                self.action_log.append(
                    {
                        "action": action.action,
                        "run": action.run,
                        "sent": False,
                        "why": "the run had sent no tool request yet",
                    }
                )
                return
            op = "deliver_callback"
            args = {
                "run_id": run_id,
                "operation_id": request["operation_id"],
                "payload": {
                    k: request.get(k)
                    for k in ("operation_id", "run_id", "epoch", "resource_id", "tool")
                },
            }
        try:
            reply = self.ctx.op(ctl, op, timeout_s=OP_TIMEOUT_S, **args)
            answer = "ok" if reply.ok else f"{reply.error}"
        except Exception as exc:  # an unsupported op or a dead control plane: recorded
            answer = f"{type(exc).__name__}: {exc}"
        self.action_log.append(
            {"action": action.action, "run": action.run, "sent": True, "answer": answer}
        )

    def _first_request(self, run_id: str) -> dict[str, Any] | None:
        requests = self.ctx.env.tool.client().export().get("requests", [])
        mine = [r for r in requests if str(r.get("run_id")) == run_id and r.get("operation_id")]
        return mine[0] if mine else None

    # ------------------------------------------------------------ the end
    def unsettled(self) -> list[dict[str, Any]]:
        """Runs still on their way: not terminal or paused, and not a queued run
        waiting out a backoff longer than a second."""
        return self.ctx.env.query(
            # next_attempt_at is the reference worker's backoff column, not the
            # contract's: read through to_jsonb so another worker's schema works.
            "SELECT run_id, status, epoch FROM fencecheck_model.agent_runs r WHERE status <> ALL(%s) "
            "AND NOT (status = 'queued' AND coalesce((to_jsonb(r) ->> 'next_attempt_at')"
            "::timestamptz, '-infinity') > clock_timestamp() + interval '1 second')",
            [list(SETTLED)],
        )

    def all_processes(self) -> list[WorkerProcess]:
        return [p for s in self.slots for p in s.incarnations]
