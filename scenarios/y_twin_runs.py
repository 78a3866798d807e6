"""Y: twin runs: every operation changes only the run it names.

One worker session holds two runs at once, in lockstep: same owner, same
epoch, same revision, same status, the same step planned. Whatever an
operation's statement checks besides the run's id, its twin matches it too,
so an operation that lost its run condition (a WHERE without ``run_id``, a
join on the wrong column, a comparison turned around) changes the twin as
well. Each operation is sent for one twin, then for the other; after each,
the audit trail must show no change by the sender's session to any row of
another run (a task's row counts as its run's), and the twin's row must be
as it was. A queued run nobody claims and a cancelled one stand by
throughout and must end as they began.

Sequence (each op sent for run 1, judged, then for run 2, judged): claim
(by run id), renew, save_checkpoint, register_intent, dispatch, complete;
then a second pair for the ends of a lease: release, and the control
plane's cancel.
"""

from __future__ import annotations

from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.processes import WorkerProcess
from scenarios.common import control_plane, new_run

SPEC = ExperimentSpec(
    id="Y",
    title="twin runs",
    seed_section="English seed §4-§6, §9 (every statement names its run); Chinese seed §5, §8",
    invariant="an operation sent for one of two runs one session holds in lockstep (same "
    "owner, epoch, revision, status and plan) changes no row of the other run, nor of a "
    "queued or a cancelled run of the tenant; each twin ends in the state its own operations "
    "left it",
    fault="two runs claimed by one session and driven in lockstep; a queued and a cancelled "
    "run of the tenant stand by",
    rules=(1, 2, 4, 6),
    lease_ttl_ms=5000,
    needs=needs.capabilities("workflow", "checkpoints", "ledger", "ledger_tool:idempotent"),
    # On each write path the worker declares: each has its own statements.
    variants=("fast", "stepped"),
    variant_write_paths=(("stepped", "stepped"),),
)


def run(ctx: ExperimentContext) -> None:
    ctl = control_plane(ctx)
    queued = new_run(ctx)
    cancelled = new_run(ctx)
    ctx.ok(ctl, "cancel", run_id=cancelled)
    bystanders = {r: _row(ctx, r) for r in (queued, cancelled)}
    a = ctx.env.start_worker("A", "ops")
    twins = Twins(ctx, a, [new_run(ctx), new_run(ctx)])
    twins.each("claim", lambda run_id, ids: {"run_id": run_id}, keep=("epoch", "owner", "revision"))
    twins.each("renew", lambda run_id, ids: {"run_id": run_id, **ids.lease()})
    twins.each(
        "save_checkpoint",
        lambda run_id, ids: {**ids.write(run_id), "state": {"step": "twin"}},
        keep=("revision",),
    )
    twins.each(
        "register_intent",
        lambda run_id, ids: {
            **ids.write(run_id),
            "step_id": "twin.label",
            "effect_version": 1,
            "tool": "idem",
            "request": {"kind": "return_label", "order_id": "order-twin"},
        },
        keep=("revision", "operation_id"),
    )
    twins.each("dispatch", lambda run_id, ids: {"operation_id": ids.operation_id})
    twins.each("complete", lambda run_id, ids: {**ids.write(run_id), "result": {"label": "twin"}})
    ends = Twins(ctx, a, [new_run(ctx), new_run(ctx)], label="second pair")
    ends.each("claim", lambda run_id, ids: {"run_id": run_id}, keep=("epoch", "owner", "revision"))
    ends.once("release", ends.runs[0], {"run_id": ends.runs[0], **ends.ids[0].lease()})
    # The released twin is queued now: a cancel that lost its run condition
    # would end it too (and the queued bystander).
    ends.once(
        "cancel", ends.runs[1], {"run_id": ends.runs[1], "reason": "twin"}, by=ctl, paired=True
    )
    ctx.fault(
        "the twins stood in lockstep before each operation",
        twins.lockstep and ends.lockstep,
        expected="before each operation on a twin: both twins of the same owner, epoch, "
        "revision and status",
        observed="; ".join(twins.steps + ends.steps),
    )
    for run_id, before in bystanders.items():
        ctx.equal(
            f"the bystander {before['status']} run untouched",
            _row(ctx, run_id),
            before,
            what="(status, owner, epoch, revision, lease_expires_at)",
        )
    finished = [_row(ctx, r)["status"] for r in twins.runs]
    ctx.equal("each twin finished by its own completion", finished, ["succeeded"] * 2)
    ends_status = [_row(ctx, r)["status"] for r in ends.runs]
    ctx.equal("release queued one, cancel ended the other", ends_status, ["queued", "cancelled"])
    checkers.lease_history_is_sound(ctx)


class Ids:
    """What one twin's operations present: its lease and its last revision."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def lease(self) -> dict[str, Any]:
        return {"epoch": self.values["epoch"], "owner": self.values["owner"]}

    def write(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, **self.lease(), "expected_revision": self.values["revision"]}

    @property
    def operation_id(self) -> str:
        return str(self.values["operation_id"])


class Twins:
    """Two runs driven by one session, each operation judged on the other."""

    def __init__(
        self, ctx: ExperimentContext, worker: WorkerProcess, runs: list[str], label: str = "pair"
    ) -> None:
        self.ctx, self.worker, self.runs, self.label = ctx, worker, runs, label
        self.ids = [Ids(), Ids()]
        self.steps: list[str] = []
        self.lockstep = True

    def each(
        self,
        op: str,
        args: Any,
        *,
        keep: tuple[str, ...] = (),
    ) -> None:
        """``op`` for run 1, judged on run 2, then for run 2, judged on run 1."""
        for n in (0, 1):
            # Before the second twin's turn the first has moved ahead, as meant.
            result = self.once(op, self.runs[n], args(self.runs[n], self.ids[n]), paired=n == 1)
            for key in keep:
                if key in result:
                    self.ids[n].values[key] = result[key]

    def once(
        self,
        op: str,
        run_id: str,
        args: dict[str, Any],
        *,
        by: WorkerProcess | None = None,
        paired: bool = False,
    ) -> dict[str, Any]:
        sender = by or self.worker
        if not paired:
            rows = [_row(self.ctx, r) for r in self.runs]
            same = {(r["owner"], r["epoch"], r["revision"], r["status"]) for r in rows}
            self.lockstep &= len(same) == 1
            self.steps.append(f"{self.label} before {op}: {sorted(same, key=str)}")
        other = next(r for r in self.runs if r != run_id)
        twin_before = _row(self.ctx, other)
        mark = checkers.audit_mark(self.ctx)
        result = self.ctx.ok(sender, op, **args)
        task = str(_row(self.ctx, run_id, task=True)["task_id"])
        stray = [
            c
            for c in checkers.changes_by(self.ctx, [sender.worker_id], after_seq=mark)
            if not _belongs(self.ctx, c, run_id, task)
        ]
        twin_after = _row(self.ctx, other)
        self.ctx.invariant(
            f"{op} for one twin changed only its own run ({self.label})",
            not stray and twin_after == twin_before,
            expected=f"no change by {sender.worker_id}'s session to a row of another run than "
            f"{run_id}; its twin {other} as it was",
            observed=f"changes elsewhere: {[(c['seq'], c['tbl'], c['op'], c['run_id']) for c in stray]}"
            + (
                "; twin as it was"
                if twin_after == twin_before
                else f"; twin {_key(twin_after)} (was {_key(twin_before)})"
            ),
        )
        return result


def _belongs(ctx: ExperimentContext, change: dict[str, Any], run_id: str, task: str) -> bool:
    """A change is the op's own: a row of its run, or its run's task's row."""
    if change["tbl"] == "agent_tasks":
        rows = ctx.env.query(
            "SELECT coalesce(new, old)->>'task_id' AS task_id FROM fencecheck_audit.changes "
            "WHERE seq = %s",
            [change["seq"]],
        )
        return bool(rows) and str(rows[0]["task_id"]) == task
    return bool(change["run_id"] == run_id)


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("status"), row.get("owner"), row.get("epoch"), row.get("revision"))


def _row(ctx: ExperimentContext, run_id: str, *, task: bool = False) -> dict[str, Any]:
    columns = "task_id" if task else "status, owner, epoch, revision, lease_expires_at"
    rows = ctx.env.query(
        f"SELECT {columns} FROM fencecheck_model.agent_runs WHERE run_id = %s", [run_id]
    )
    return dict(rows[0]) if rows else {}
