"""``fencecheck contract``: hold a worker command to the contract v2 in seconds.

Steps, each reported as checked, as gaps, or as not checked with the reason:

1. ``migrate`` on a fresh database (done by :class:`SharedServices` when it
   builds the template): it must exit 0; a second ``migrate`` of the
   migrated database must exit 0 too (idempotent);
2. the schema against ``schema.sql`` (:mod:`harness.contract.catalog`);
3. every ``ops`` operation once on the happy path, each reply validated
   against ``schemas/ops.schema.json``, and what the database shows after
   the ones whose effect the contract pins (initial values, the grant, a
   protected write with its outbox event, completion);
4. the ``run`` workflow on one run: exit 0, succeeded, its protected writes
   with the ``current_step`` sequence of section 10, one request to the tool
   with the documented operation id and body;
5. the injection points each step passes reach the control socket;
6. every line of every worker's event history is of the documented format.

Invariants: the check never judges a worker's reply alone where the
database can say (step 3 reads the rows as superuser); a gap always names
the section to read, what was expected and what was found; a failure of
the harness itself is raised, never reported as a gap of the worker.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checking.history import read_history
from harness.contract import catalog, mapping, needs, points, spec
from harness.contract.report import ContractReport, Unjudged
from harness.engine.environment import (
    Environment,
    MigrateFailed,
    SharedServices,
    experiment_environment,
    migrate,
)
from harness.parts.control import Crash
from harness.parts.processes import ProcessError, WorkerProcess
from harness.waiting import WaitTimeout, wait_for
from mock_tool.canonical import request_digest

# Generous against a loaded machine: nothing here waits for a lease to expire.
LEASE_TTL_MS = 5000
HEARTBEAT_MS = 100
#: R's renewal bound in the workflow check (the environment's is 1 s).
R_HEARTBEAT_TIMEOUT_MS = 4000
OP_TIMEOUT_S = 20.0
RUN_TIMEOUT_S = 60.0
#: The protected writes of a run of the built-in workflow without faults and
#: without extra steps, by current_step (contract section 10).
WORKFLOW_STEPS = ["plan", "plan", "lookup", "create_label", "create_label", "notify", "finish"]
#: The points each happy-path worker passes (contract section 3): W in `ops`
#: mode on the write path asked by default (its relay and consumer pass the
#: outbox and consumer boundaries), S in `ops` mode on the stepped path, ctl's
#: reconcile once a dispatcher died holding its claim, R in `run` mode (the built-in workflow, slow enough for its
#: heartbeat to renew), L in `run` mode with a tool that answers after the
#: worker's timeout (a ledger-only outcome, then convergence by query).
POINTS = {
    "W": (
        "before_renew",
        "after_outbound_intent_commit",
        "after_dispatch_claim_commit",
        "after_tool_response_before_tx2_commit",
        "after_outbox_batch_locked",
        "after_broker_ack_before_outbox_mark",
        "after_outbox_mark_commit",
        "after_consumer_read",
        "after_consumer_dedup_commit",
    ),
    "S": ("after_lease_row_locked", "before_commit"),
    "ctl": ("after_claims_expired_commit",),
    "R": (
        "after_lease_acquired",
        "after_renew_commit",
        "after_checkpoint_commit",
        "after_outbound_intent_commit",
        "after_dispatch_claim_commit",
        "after_tool_response_before_tx2_commit",
    ),
    "L": ("after_dispatch_outcome_commit", "after_reconcile_query", "after_reconcile_converge"),
}
#: Points the check does not pass, with what it would take.
POINTS_NOT_EXERCISED = {
    "after_operator_lock": "needs a run paused in doubt and the optional resolve_indoubt",
}
#: R's work time per step: with HEARTBEAT_MS between renewals the workflow
#: outlasts a few of them, so its heartbeat commits at least one renewal.
STEP_DELAY_MS = 60
#: The dead dispatcher's claim deadline: short, so the reconciler finds it expired.
SHORT_DISPATCH_TTL_MS = 200
#: L's tool answers this late, past the worker's own call timeout.
LATE_ANSWER_MS = 600
TOOL_TIMEOUT_MS = 250
#: Optional ops the happy path cannot reach without a fault of its own.
NOT_EXERCISED = {
    "resolve_indoubt": "needs a run paused in doubt (J[operator_resolves] exercises it)",
    "decide": "needs a run paused for a human (V exercises it)",
    "converge_operation": "needs an operation in doubt (no experiment uses it)",
}


class Skip(Exception):
    """A step cannot go on because an earlier one failed (its gap is recorded)."""


@dataclass
class Ids:
    """What the happy path learnt so far, for filling op examples."""

    values: dict[str, Any]

    def fill(self, op: str, **override: Any) -> dict[str, Any]:
        example = spec.by_name()[op].example
        filled: dict[str, Any] = spec.fill(dict(example), {**self.values, **override})
        return filled


def check(
    shared: SharedServices, log_dir: Path, progress: Callable[[str], None] = lambda _m: None
) -> ContractReport:
    """Hold the worker of ``shared`` (whose template is migrated) to the contract."""
    started = time.monotonic()
    report = ContractReport(worker=shared.settings.worker_command_text())
    declaration = mapping.declared(tuple(shared.settings.worker_cmd))  # valid: migrate used it
    if declaration.own:
        report.checked.append(
            f"mapping: {declaration.system} ({declaration.layer} layer), from `{declaration.source}`"
        )
    else:
        report.notes.append(
            "the worker prints no mapping (`<worker-cmd> mapping`, section 14): the contract's "
            "own is assumed (its tables of section 6, every capability, every injection point)"
        )
    report.checked.append("migrate on a fresh database: exit 0")
    progress("schema against schema.sql")
    fatal = _schema(shared, report)
    if fatal:
        report.skipped.append(f"ops, run workflow, injection points, history: {fatal}")
    else:
        _in_environment(shared, log_dir, report, progress)
    report.wall_s = time.monotonic() - started
    return report


def mapping_invalid(worker: str, exc: mapping.MappingError, wall_s: float) -> ContractReport:
    """The report of a worker whose mapping is not valid: one gap per problem."""
    report = ContractReport(worker=worker, wall_s=wall_s)
    for problem in exc.problems:
        report.gap("14", "the mapping", "a valid mapping (schemas/mapping.schema.json)", problem)
    report.skipped.append("everything else: the system's mapping is not valid")
    return report


def migrate_failed(worker: str, exc: MigrateFailed, wall_s: float) -> ContractReport:
    """The report of a worker whose first ``migrate`` failed: one gap, nothing else checked."""
    report = ContractReport(worker=worker, migrate_failure=exc.paragraph(), wall_s=wall_s)
    report.gap("1", "migrate", "exit 0 on a fresh database", exc.short())
    report.skipped.append("everything else: nothing can be checked without the schema")
    return report


def _schema(shared: SharedServices, report: ContractReport) -> str | None:
    """Catalog comparison; a reason to stop when the basics are missing. A system
    of its own schema (section 14) is held to its mapping instead, checked when
    the model was installed after migrate, and to the group roles."""
    assert shared.primary is not None and shared.template is not None
    found = catalog.read_catalog(shared.primary, shared.template)
    if not mapping.declared(tuple(shared.settings.worker_cmd)).capabilities.contract_schema:
        report.checked.append(
            "schema: every table and column the mapping names (checked at migrate), the group roles"
        )
        lacking = [r for r in catalog.GROUP_ROLES if r not in found.roles]
        for role in lacking:
            report.gap("7.1", f"group role {role}", "created by migrate", "missing")
        return f"the worker's database lacks {', '.join(lacking)}" if lacking else None
    expected = catalog.expected_catalog(shared.primary)
    gaps, notes = catalog.compare(expected, found)
    report.gaps.extend(gaps)
    report.notes.extend(notes)
    report.checked.append(
        f"schema: {len(expected.tables)} tables of schema.sql (columns, types, NOT NULL, keys), "
        "row level security of every table with tenant_id, group roles, session_tenant()"
    )
    missing = [
        t
        for t in ("agent_runs", "agent_checkpoints", "outbox", "tenant_bindings")
        if t not in found.tables
    ]
    missing += [r for r in catalog.GROUP_ROLES if r not in found.roles]
    if missing:
        return f"the worker's database lacks {', '.join(missing)}"
    return None


def _in_environment(
    shared: SharedServices, log_dir: Path, report: ContractReport, progress: Callable[[str], None]
) -> None:
    with experiment_environment(
        shared,
        "contract",
        lease_ttl_ms=LEASE_TTL_MS,
        heartbeat_ms=HEARTBEAT_MS,
        heartbeat_timeout_ms=1000,
        dispatch_ttl_ms=LEASE_TTL_MS,
        log_dir=log_dir,
    ) as env:
        progress("migrate again (idempotent)")
        try:
            migrate(shared.settings.worker_cmd, env.db.admin_dsn, log_dir / "migrate-again")
            report.checked.append("migrate again on the migrated database: exit 0 (idempotent)")
        except MigrateFailed as exc:
            report.gap("1", "migrate is idempotent", "a second migrate exits 0", exc.short())
        happy = HappyPath(env, report)
        progress("every ops operation on the happy path")
        happy.run()
        judged = {"W", "S"} if happy.cut_short is None else set()
        if happy.caps.workflow:
            progress("the run workflow")
            if _workflow(env, report):
                judged.add("R")
        if happy.caps.workflow and happy.caps.offers("ledger_tool:query"):
            progress("the run workflow with a late tool answer")
            if _late_answer(env, report):
                judged.add("L")
        if happy.cut_short is None and happy.caps.ledger:
            progress("a dispatch claim that expired")
            if _expired_claim(env, report):
                judged.add("ctl")
        if not happy.caps.workflow:
            report.skipped.append(
                "the run workflow: not offered (the mapping declares no workflow)"
            )
        env.stop_workers()
        _points(env, report, judged)
        _history(env, report, judged)
        _unjudged(env, report, judged, happy.unsupported)


class HappyPath:
    """Every op once, in an order where each finds what it needs."""

    def __init__(self, env: Environment, report: ContractReport) -> None:
        self.env = env
        self.report = report
        declaration = mapping.declared(tuple(env.shared.settings.worker_cmd))
        self.caps = declaration.capabilities
        self.model = declaration.model
        self.ids = Ids({"event_id": str(uuid.uuid4())})
        self.done: set[str] = set()
        self.unsupported: set[str] = set()
        #: Why the path stopped early (its injection points are then not judged).
        self.cut_short: str | None = None

    # ------------------------------------------------------------ calls
    def call(self, worker: WorkerProcess, op: str, **override: Any) -> dict[str, Any] | None:
        """Send ``op`` with its example args; record gaps; the result, or None (also
        for an op the system's mapping says it does not offer: not sent)."""
        if not self.caps.offers_op(op):
            self.report.skipped.append(
                f"op {op}: not offered (the mapping declares no {mapping.OP_CAPABILITY[op]})"
            )
            self.done.add(op)
            self.unsupported.add(op)
            return None
        args = self.ids.fill(op, **override)
        try:
            reply = worker.request(op, args, timeout_s=OP_TIMEOUT_S)
        except ProcessError as exc:
            self.report.gap(
                "5", f"op {op}", "a reply line on stdout", f"{type(exc).__name__}: {exc}"
            )
            raise Skip(f"{worker.worker_id} did not answer {op}") from exc
        self.done.add(op)
        operation = spec.by_name()[op]
        if reply.unsupported:
            self.unsupported.add(op)
            if operation.required:
                self.report.gap("5", f"op {op}", "implemented", "answered Unsupported")
            else:
                self.report.notes.append(
                    f"optional op {op} answers Unsupported: {', '.join(operation.checked_by) or 'no experiment'} "
                    "then end unknown where they need it"
                )
            return None
        problems = spec.reply_problems(op, reply.raw)
        if problems:
            self.report.gap(
                "5",
                f"reply of {op}",
                f"#/$defs/{op}.result of ops.schema.json",
                "; ".join(problems) + f" (reply: {reply.raw})",
            )
        if not reply.ok:
            self.report.gap(
                "5",
                f"op {op} on the happy path",
                "ok",
                f"{reply.error}: {reply.message} (args {args})",
            )
            return None
        return reply.result

    def need(self, result: dict[str, Any] | None, what: str) -> dict[str, Any]:
        if result is None:
            raise Skip(what)
        return result

    def row(self, run_id: str) -> dict[str, Any]:
        rows = self.env.query(
            "SELECT status, revision, epoch, owner, attempt_count, lease_expires_at,"
            " lease_expires_at > clock_timestamp() AS live, current_step"
            " FROM fencecheck_model.agent_runs WHERE run_id = %s",
            [run_id],
        )
        if not rows:
            self.report.gap("6", f"run {run_id}", "a row of agent_runs", "none")
            raise Skip(f"run {run_id} is not in agent_runs")
        return rows[0]

    def expect(self, section: str, item: str, ok: bool, expected: str, found: Any) -> None:
        if not ok:
            self.report.gap(section, item, expected, str(found))

    # ------------------------------------------------------------ the path
    def run(self) -> None:
        env = self.env
        try:
            ctl = env.start_worker("ctl", "ops", role="operator")
            w = env.start_worker("W", "ops")
            s = env.start_worker("S", "ops", env={"FENCECHECK_WRITE_PATH": "stepped"})
            self._lease_and_writes(ctl, w)
            self._control_plane(ctl, s)
        except Skip as exc:
            self.cut_short = str(exc)
            self.report.skipped.append(
                f"rest of the happy path, and the injection points and history of W and S: {exc}"
            )
        for operation in spec.operations():
            if operation.op not in self.done and operation.op not in NOT_EXERCISED:
                why = (
                    "not reached"
                    if self.caps.offers_op(operation.op)
                    else f"not offered (the mapping declares no {mapping.OP_CAPABILITY[operation.op]})"
                )
                self.report.skipped.append(f"op {operation.op}: {why}")
        for name, why in NOT_EXERCISED.items():
            if self.cut_short is None and self.caps.offers_op(name) and self._offered(name):
                self.report.skipped.append(f"op {name} (optional): {why}")
        exercised = sorted(self.done - self.unsupported)
        self.report.checked.append(
            f"ops on the happy path, replies validated against ops.schema.json: {', '.join(exercised)}"
        )

    def _offered(self, op: str) -> bool:
        """Whether the control plane offers optional ``op``: asked about a run and
        an operation that do not exist, it must answer Unsupported or refuse
        (nothing to change); only Unsupported says it lacks the op."""
        nowhere = {"run_id": str(uuid.uuid4()), "operation_id": f"contract/{uuid.uuid4()}"}
        args = self.ids.fill(op, **nowhere)
        try:
            reply = self.env.workers["ctl"].request(op, args, timeout_s=OP_TIMEOUT_S)
        except ProcessError as exc:
            self.report.gap("5", f"op {op}", "a reply line on stdout", str(exc).splitlines()[0])
            return False
        if reply.unsupported:
            self.unsupported.add(op)
            self.report.notes.append(
                f"optional op {op} answers Unsupported: "
                f"{', '.join(spec.by_name()[op].checked_by) or 'no experiment'} then end unknown"
            )
            return False
        return True

    def _lease_and_writes(self, ctl: WorkerProcess, w: WorkerProcess) -> None:
        task = f"task-contract-{uuid.uuid4().hex[:8]}"
        created = self.need(self.call(ctl, "create_run", new_task_id=task), "create_run failed")
        run_id = str(created["run_id"])
        self.ids.values.update(run_id=run_id, task_id=task)
        row = self.row(run_id)
        fresh = (row["status"], row["revision"], row["epoch"], row["attempt_count"], row["owner"])
        want = ("queued", self.zero("revision"), self.zero("epoch"), 0, None)
        self.expect(
            "6",
            "a new run",
            fresh == want,
            f"(status, revision, epoch, attempt_count, owner) = {want}",
            fresh,
        )
        claim = self.need(self.call(w, "claim"), "claim failed")
        self.ids.values.update(
            epoch=claim["epoch"], owner=claim["owner"], expected_revision=claim["revision"]
        )
        row = self.row(run_id)
        epoch = self.zero("epoch", 1)
        self.expect(
            "6",
            "the grant",
            (row["epoch"], row["owner"], row["status"], bool(row["live"]))
            == (epoch, claim["owner"], "running", True),
            f"epoch {epoch}, the claim's owner, running, lease unexpired by database time",
            f"epoch {row['epoch']}, owner {row['owner']}, {row['status']}, live {row['live']}",
        )
        self.call(w, "renew")
        if self.caps.offers_op("heartbeat"):
            self.call(w, "heartbeat")
            _wait_point(self.env, "W", "before_renew", 3.0)
            self.call(w, "heartbeat", action="stop")
        event_id = self.ids.values["event_id"]
        if self.caps.checkpoints:
            saved = self.need(self.call(w, "save_checkpoint"), "save_checkpoint failed")
            self._written(run_id, 1, event_id)
            self.ids.values["expected_revision"] = saved["revision"]
        self.call(w, "read_checkpoint")
        if self.caps.ledger:
            self._ledger(w, run_id)
        self.call(w, "complete")
        row = self.row(run_id)
        step = "finish" if self.caps.checkpoints else None
        self.expect(
            "6",
            "a completed run",
            (row["status"], row["owner"], row["current_step"]) == ("succeeded", None, step),
            f"(status, owner, current_step) = ('succeeded', None, {step!r})",
            (row["status"], row["owner"], row["current_step"]),
        )
        self.call(w, "relay")
        self.call(w, "consume")
        for op in ("durability", "legacy_checkpoint", "run_state"):
            self.call(w, op)
        self.call(ctl, "reconcile")
        self.call(ctl, "deliver_callback")

    def zero(self, column: str, value: int = 0) -> int | None:
        """A run's value of a counter column the system may lack (None then)."""
        return value if self.model.maps("agent_runs", column) else None

    def _ledger(self, w: WorkerProcess, run_id: str) -> None:
        intent = self.need(self.call(w, "register_intent"), "register_intent failed")
        self.ids.values.update(
            operation_id=intent["operation_id"], expected_revision=intent["revision"]
        )
        expected_op = f"{self.env.tenant_id}/{run_id}/contract.label/v1"
        self.expect(
            "10",
            "operation_id of an intent",
            intent["operation_id"] == expected_op,
            expected_op,
            intent["operation_id"],
        )
        sent = self.call(w, "dispatch")
        if sent is not None:
            self.expect(
                "5",
                "dispatch of a prepared operation",
                sent.get("status") == "succeeded",
                "status succeeded (tool idem answered)",
                sent.get("status"),
            )
        idle = self.call(w, "dispatch")
        if idle is not None:
            self.expect(
                "5",
                "dispatch with nothing to do",
                idle.get("status") is None,
                "status null",
                idle.get("status"),
            )

    def _written(self, run_id: str, revision: int, event_id: str) -> None:
        """One checkpoint of that revision and one outbox row, both with event_id."""
        ck = self.env.query(
            "SELECT revision FROM fencecheck_model.agent_checkpoints WHERE run_id = %s AND event_id = %s",
            [run_id, event_id],
        )
        ob = self.env.query("SELECT 1 FROM fencecheck_model.outbox WHERE event_id = %s", [event_id])
        self.expect(
            "6",
            "a protected write (save_checkpoint with event_id)",
            [r["revision"] for r in ck] == [revision] and len(ob) == 1,
            f"checkpoint revision {revision} and one outbox row with event_id {event_id}",
            f"checkpoints {[r['revision'] for r in ck]}, outbox rows {len(ob)}",
        )

    def _control_plane(self, ctl: WorkerProcess, s: WorkerProcess) -> None:
        task = f"task-contract-{uuid.uuid4().hex[:8]}"
        created = self.need(self.call(ctl, "create_run", new_task_id=task), "create_run failed")
        run_id = str(created["run_id"])
        self.ids.values.update(run_id=run_id, task_id=task, event_id=str(uuid.uuid4()))
        claim = self.need(self.call(s, "claim"), "claim failed")
        self.ids.values.update(
            epoch=claim["epoch"], owner=claim["owner"], expected_revision=claim["revision"]
        )
        self.call(s, "save_checkpoint")
        self.call(s, "release")
        row = self.row(run_id)
        epoch = self.zero("epoch", 1)
        self.expect(
            "5",
            "release",
            (row["status"], row["owner"], row["epoch"]) == ("queued", None, epoch),
            f"(status, owner, epoch) = ('queued', None, {epoch}): queued again, epoch kept",
            (row["status"], row["owner"], row["epoch"]),
        )
        cancel = self.call(ctl, "cancel")
        if cancel is not None:
            self.expect(
                "5",
                "cancel",
                cancel.get("run_status") == "cancelled",
                "run_status cancelled",
                cancel.get("run_status"),
            )
        retry = self.call(ctl, "retry_run")
        if retry is not None:
            self.expect(
                "5",
                "retry_run",
                retry.get("run_id") != run_id,
                f"a run_id other than {run_id}",
                retry.get("run_id"),
            )
        self.call(ctl, "list_paused")
        self.call(ctl, "operator_actions")
        # Retention with a retention of an hour: every task here is younger, so
        # it deletes nothing (V[purge] judges what it deletes).
        purged = self.call(ctl, "purge")
        if purged is not None:
            self.expect(
                "5",
                "purge",
                purged.get("purged_tasks") == [],
                "no task purged (every task here finished within the hour)",
                purged.get("purged_tasks"),
            )


def _unconfirmed_renewals(worker: WorkerProcess) -> list[str]:
    """The renewals ``worker``'s history records unconfirmed or refused."""
    history = read_history([worker.events_path])
    return [
        f"{e.type} {e.error or ''}".strip()
        for e in history.events
        if e.op in ("renew", "heartbeat") and e.type in ("info", "fail")
    ]


def _wait_point(env: Environment, worker: str, point: str, timeout_s: float) -> None:
    with contextlib.suppress(WaitTimeout):  # a point never reached is reported by _points
        wait_for(
            lambda: env.control.hits(worker=worker, point=point),
            what=f"{worker} at {point}",
            timeout_s=timeout_s,
        )


def _workflow(env: Environment, report: ContractReport) -> bool:
    """One run of the built-in workflow in `run` mode, judged from the database and
    the tool; False when it could not be started."""
    ctl = env.workers["ctl"]
    task = f"task-contract-run-{uuid.uuid4().hex[:8]}"
    order = {"order_id": "order-c", "amount": 7}
    slow = {"step_delay_ms": STEP_DELAY_MS}
    reply = ctl.request(
        "create_run",
        {"task_id": task, "input": {"tool": "idem", **order, **slow}},
        timeout_s=OP_TIMEOUT_S,
    )
    if not reply.ok:
        report.skipped.append(
            f"run workflow and its injection points: create_run failed ({reply.error})"
        )
        return False
    run_id = str(reply.result["run_id"])
    # Renewals bounded far above a busy machine's delays: this check is about
    # the workflow, not timing (a 1 s bound ran out beside a loaded campaign).
    worker = env.start_worker(
        "R",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_HEARTBEAT_TIMEOUT_MS": str(R_HEARTBEAT_TIMEOUT_MS)},
    )
    try:
        code: int | None = worker.wait(RUN_TIMEOUT_S)
    except ProcessError:
        code = None
        worker.stop(grace_s=1.0)
    row = env.query("SELECT status FROM fencecheck_model.agent_runs WHERE run_id = %s", [run_id])
    status = row[0]["status"] if row else None
    unconfirmed = _unconfirmed_renewals(worker) if (code, status) == (10, "succeeded") else []
    if unconfirmed:
        # Cancelled by its own heartbeat after the last write committed: the
        # worker could not know it had finished; exit 10 is then its due.
        report.skipped.append(
            f"`run --run-id ID --once` exit code: 10 with the run succeeded, after renewals "
            f"its history records unconfirmed ({unconfirmed[:3]}): a timing outcome, not judged"
        )
    elif (code, status) != (0, "succeeded"):
        report.gap(
            "10",
            "`run --run-id ID --once` on a queued run",
            "exit 0, run succeeded",
            f"exit {code if code is not None else f'none within {RUN_TIMEOUT_S:.0f} s'}, "
            f"run {status}",
        )
    steps = [
        r["step"]
        for r in env.query(
            "SELECT (SELECT r.new->>'current_step' FROM fencecheck_audit.changes r"
            "  WHERE r.txid = c.txid AND r.tbl = 'agent_runs' AND r.new->>'run_id' = c.new->>'run_id'"
            "  ORDER BY r.seq DESC LIMIT 1) AS step"
            " FROM fencecheck_audit.changes c WHERE c.tbl = 'agent_checkpoints' AND c.op = 'INSERT'"
            " AND c.new->>'run_id' = %s ORDER BY (c.new->>'revision')::bigint",
            [run_id],
        )
    ]
    if steps != WORKFLOW_STEPS:
        report.gap(
            "10", "protected writes of one run, by current_step", str(WORKFLOW_STEPS), str(steps)
        )
    op_id = f"{env.tenant_id}/{run_id}/create_label/v1"
    body = {"kind": "return_label", **order, "plan_ok": True, "refundable": True}
    sent = [
        (r["operation_id"], r["body_digest"])
        for r in env.tool.client().export()["requests"]
        if r.get("run_id") == run_id
    ]
    if sent != [(op_id, request_digest(body))]:
        report.gap(
            "10",
            "the tool step's request",
            f"one create of {op_id} with body {body}",
            f"{len(sent)} request(s): "
            + "; ".join(
                f"{o} (body {'as documented' if d == request_digest(body) else 'other'})"
                for o, d in sent
            ),
        )
    report.checked.append(
        "run workflow: `run --run-id ID --once` exit 0, succeeded, current_step of every "
        "protected write, the tool step's operation id and body"
    )
    return True


def _new_run(
    env: Environment, report: ContractReport, tag: str, tool: str, step: str
) -> str | None:
    """A new run on ``tool`` from the control plane; None (the step skipped,
    with why) when it refuses."""
    task = f"task-contract-{tag}-{uuid.uuid4().hex[:8]}"
    reply = env.workers["ctl"].request(
        "create_run", {"task_id": task, "input": {"tool": tool}}, timeout_s=OP_TIMEOUT_S
    )
    if not reply.ok:
        report.skipped.append(f"{step}: create_run failed ({reply.error})")
        return None
    return str(reply.result["run_id"])


def _late_answer(env: Environment, report: ContractReport) -> bool:
    """One run of the built-in workflow whose tool answers after the worker's own
    timeout (a query tool): it passes the ledger-only outcome and the
    reconciler's query (contract section 3). Only the points are judged here
    (experiment W judges what the worker does with the answer); False when it
    could not be started."""
    run_id = _new_run(env, report, "late", "queryable", "run workflow with a late answer")
    if run_id is None:
        return False
    env.tool.client().set_fault("queryable", "answer_late", ms=LATE_ANSWER_MS)
    worker = env.start_worker(
        "L",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)},
    )
    try:
        worker.wait(RUN_TIMEOUT_S)
    except ProcessError:
        worker.stop(grace_s=1.0)
        report.skipped.append(
            f"run workflow with a late answer: the worker did not exit within {RUN_TIMEOUT_S:.0f} s"
        )
    report.checked.append(
        "run workflow with a tool answering after the worker's timeout: its injection points"
    )
    return True


def _expired_claim(env: Environment, report: ContractReport) -> bool:
    """A dispatcher X killed (control protocol crash) right after its dispatch
    claim committed, with a short claim deadline; once it expired by database
    time, ctl's ``reconcile`` turns it unknown and passes
    ``after_claims_expired_commit``. Only the point is judged here (T and E
    judge what comes of it); False when it could not be set up."""
    ctl = env.workers["ctl"]
    run_id = _new_run(env, report, "claim", "idem", "an expired dispatch claim")
    if run_id is None:
        return False
    x = env.start_worker("X", "ops", env={"FENCECHECK_DISPATCH_TTL_MS": str(SHORT_DISPATCH_TTL_MS)})
    claim = x.request("claim", {"run_id": run_id}, timeout_s=OP_TIMEOUT_S)
    intent = (
        x.request(
            "register_intent",
            {
                "run_id": run_id,
                "epoch": claim.result.get("epoch"),
                "expected_revision": claim.result.get("revision"),
                "step_id": "contract.claim",
                "effect_version": 1,
                "tool": "idem",
                "request": {"kind": "return_label"},
            },
            timeout_s=OP_TIMEOUT_S,
        )
        if claim.ok
        else claim
    )
    if not intent.ok:
        report.skipped.append(
            f"an expired dispatch claim: claim or register_intent failed ({intent.error})"
        )
        return False
    env.control.arm("X", "after_dispatch_claim_commit", Crash())
    x.request_async("dispatch", {"operation_id": intent.result.get("operation_id")})
    try:
        x.wait(OP_TIMEOUT_S)
        wait_for(
            lambda: env.query(
                "SELECT bool_and(dispatch_until < clock_timestamp()) AS expired "
                "FROM fencecheck_model.tool_operations WHERE run_id = %s AND status = 'dispatching'",
                [run_id],
            )[0]["expired"],
            what="the dead dispatcher's claim to expire by database time",
            timeout_s=OP_TIMEOUT_S,
        )
    except (ProcessError, WaitTimeout) as exc:
        report.skipped.append(f"an expired dispatch claim: {str(exc).splitlines()[0][:160]}")
        x.stop(grace_s=1.0)
        return False
    ctl.request("reconcile", {}, timeout_s=OP_TIMEOUT_S)
    report.checked.append(
        "reconcile of a dispatch claim whose dispatcher died: its injection point"
    )
    return True


def _points(env: Environment, report: ContractReport, judged: set[str]) -> None:
    """Each point a judged step passes reached the socket from that worker, with
    its own pid; a required point not reached is a gap, any other is left to
    :func:`_unjudged`."""
    for worker, passed in POINTS.items():
        if worker not in judged:
            continue
        hits = env.control.hits(worker=worker)
        seen = {h.point for h in hits}
        caps = mapping.declared(tuple(env.shared.settings.worker_cmd)).capabilities
        for point in passed:
            if point not in seen and point in points.REQUIRED and caps.hosts(point):
                report.gap(
                    "3",
                    f"injection point {point}",
                    f"reached by {worker} on the happy path",
                    f"not reached; {worker} reached {sorted(seen) or 'none'}",
                )
        for h in hits:
            if h.worker != worker or (h.peer_pid is not None and h.pid != h.peer_pid):
                report.gap(
                    "3",
                    f"request at {h.point}",
                    f"worker {worker!r}, pid {h.peer_pid}",
                    f"worker {h.worker!r}, pid {h.pid}",
                )
    for problem in env.control.protocol_errors:
        report.gap(
            "3", "a control-socket request", "one JSON line of control-point.schema.json", problem
        )
    reached = sorted({h.point for h in env.control.hits() if h.worker in judged})
    if reached:
        report.checked.append("injection points reached the control socket: " + ", ".join(reached))


def _unjudged(
    env: Environment, report: ContractReport, judged: set[str], unsupported: set[str]
) -> None:
    """Every injection point an experiment needs that no worker of the check
    reached, and every optional op the worker answered Unsupported, each with
    the experiment runs it leaves unjudged (they end unknown, never pass)."""
    import scenarios

    specs = [m.SPEC for m in scenarios.all_modules()]
    caps = mapping.declared(tuple(env.shared.settings.worker_cmd)).capabilities
    # What the system says it lacks makes experiments not applicable, not unknown.
    lacked: list[tuple[needs.NeedKind, str]] = [("capability", c) for c in caps.lacks()]
    lacked += [("point", p) for p in sorted(needs.needed(specs, "point")) if not caps.hosts(p)]
    for (kind, name), runs in needs.consequences(specs, lacked).items():
        if runs:
            what = "capability" if kind == "capability" else "injection point"
            report.not_applicable.append(
                Unjudged(f"{what} {name}", "declared absent by the mapping", runs)
            )
    reached = {h.point for h in env.control.hits() if h.worker in judged}
    passes = {p: w for w, ps in POINTS.items() if w in judged for p in ps}
    missing: list[tuple[needs.NeedKind, str]] = []
    why: dict[tuple[needs.NeedKind, str], str] = {}
    for point in sorted({p for p in needs.needed(specs, "point") if caps.hosts(p)} - reached):
        missing.append(("point", point))
        if point in passes:
            why["point", point] = f"never reached ({passes[point]}'s step of this check passes it)"
        else:
            # Not a finding about the worker: said as what the check did not do.
            missing.pop()
            users = needs.format_runs(needs.consequences(specs, [("point", point)])["point", point])
            how = POINTS_NOT_EXERCISED.get(point, "an earlier step stopped short")
            report.skipped.append(
                f"injection point {point}: not exercised by this check ({how}); {users} need it"
            )
    for op in sorted(needs.needed(specs, "op") & unsupported):
        missing.append(("op", op))
        why["op", op] = "answers Unsupported"
    for key, runs in needs.consequences(specs, missing).items():
        kind, name = key
        what = "injection point" if kind == "point" else "optional op"
        report.unjudged.append(Unjudged(f"{what} {name}", why[key], runs))


def _history(env: Environment, report: ContractReport, judged: set[str]) -> None:
    lines = 0
    for w in env.workers.values():
        if not w.events_path.exists():
            continue
        for number, raw in enumerate(w.events_path.read_bytes().splitlines(), start=1):
            lines += 1
            try:
                obj = json.loads(raw)
            except ValueError:
                report.gap(
                    "4",
                    f"history of {w.worker_id}, line {number}",
                    "one JSON object",
                    raw[:200].decode("utf-8", "replace"),
                )
                continue
            problems = spec.history_problems(obj) if isinstance(obj, Mapping) else ["not an object"]
            if problems:
                report.gap(
                    "4",
                    f"history of {w.worker_id}, line {number}",
                    "history-event.schema.json",
                    "; ".join(problems),
                )
    for wid in sorted(judged & {"W", "R"}):
        worker = env.workers.get(wid)
        if worker is not None and not read_history([worker.events_path]).events:
            report.gap(
                "4",
                f"history of {wid}",
                "one line per invoke and per outcome",
                f"no event in {worker.events_path.name}",
            )
    report.checked.append(
        f"event history: {lines} line(s) validated against history-event.schema.json"
    )
