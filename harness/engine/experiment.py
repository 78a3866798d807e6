"""What an experiment is, and the context it runs in.

A scenario module (``scenarios/*.py``) holds one :class:`ExperimentSpec` and a
``run(ctx)`` function. ``run`` starts workers, injects its fault, and records
two kinds of checks through the context:

* ``ctx.fault(...)``: did the fault take effect? (the worker was stopped in the
  kernel while the other took over; the barrier was reached; the link was
  down). A failed fault check makes the verdict *unknown*: a pass whose fault
  did not happen is not a pass.
* ``ctx.invariant(...)``: does the property hold, judged from evidence the
  harness gathered itself? A failed invariant makes the verdict *fail*.

Everything the experiment observes goes through the context so that it lands
in the evidence archive: SQL the harness ran and the rows it got back,
commands it executed (signals, proxy changes), and notes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import decimal
import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from harness.contract import mapping, spec
from harness.contract.needs import Need
from harness.engine import phases
from harness.parts.control import Action, Continue, ControlError, Hit, Hold
from harness.parts.processes import (
    ExitTimeout,
    OpReply,
    OpTimeout,
    PendingOp,
    ProcessError,
    SignalRecord,
    WorkerChannelClosed,
    WorkerProcess,
)
from harness.parts.toxiproxy import FaultRecord
from harness.verdict import Verdict

if TYPE_CHECKING:
    from harness.engine.environment import Environment


def plain(value: Any) -> str:
    """``value`` as an auditor reads it: timestamps in ISO 8601, uuids and
    decimals as their text, containers element by element; strings keep
    their quotes so that ``'None'`` and ``None`` stay apart. Never a Python
    object repr such as ``datetime.datetime(...)``."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return f"{value.total_seconds() * 1000:g}ms"
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{plain(k)}: {plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        inner = ", ".join(plain(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return "[" + ", ".join(plain(v) for v in items) + "]"
    return repr(value)


class Inconclusive(Exception):
    """The experiment could not reach a verdict (the worker lacks an operation, or a
    precondition the experiment needs did not come about)."""


class SetupRefused(Exception):
    """A worker refused a request the experiment needs and the contract says it
    carries out (create a run, retry a cancelled one, claim a queued one), with
    an error class no timing explains: a missing row, a constraint its own
    schema broke, a crash. The runner judges it as unmet progress."""

    def __init__(self, worker: str, op: str, error: str, message: str) -> None:
        super().__init__(f"setup op {op!r} on {worker} refused: {error}: {message}")
        self.worker, self.op, self.error, self.message = worker, op, error, message


#: Error classes a correct worker may answer a setup op with when timing went
#: against it (a lease that ran out under load, a state a slow tool call left,
#: a lost connection), or that say the worker lacks the op: those leave the
#: experiment unknown, never failed. Not ``BadRequest``: a setup op is sent as
#: the contract's table of ops defines it (the correct workers take every one),
#: so refusing it as malformed is the worker's refusal (generated 9fff1df9: a
#: ``claim`` without a TTL of its own refused, every experiment unknown).
TIMING_OR_HARNESS_ERRORS = frozenset(
    {"LeaseLost", "NotClaimable", "RevisionConflict", "CommitOutcomeUnknown", "StateConflict"}
    | {"RunNotRetryable", "DispatchClaimExpired", "ExecutionCancelled", "OperationalError"}
    | {"InterfaceError", "QueryCanceled", "LockNotAvailable", "SerializationFailure"}
    | {"DeadlockDetected", "AdminShutdown", "IdleInTransactionSessionTimeout", "Unsupported"}
    | {"ToolOutcomeUnknown"}
)


#: Refusals of a write under a lease: timing when the lease ran out or another
#: write came first; none when the harness reads the lease live at the op's
#: epoch and the run still at the revision the op expected.
LEASE_REFUSALS = frozenset({"LeaseLost", "RevisionConflict", "StateConflict"})


def timing_or_harness(error: str | None) -> bool:
    """Could a correct worker have answered a setup op with ``error``?"""
    if not error:
        return True
    lowered = error.lower()
    return error in TIMING_OR_HARNESS_ERRORS or any(
        word in lowered for word in ("timeout", "cancel", "connection", "shutdown")
    )


#: What a worker does that ends a scenario early and is the worker's own doing,
#: never the harness's: an ops request without a reply in time, a process that
#: does not exit in time, an ops channel closed before the reply (it exited).
#: The runner judges each as the progress check "every worker kept its bounds".
WORKER_BOUNDS: tuple[type[Exception], ...] = (ExitTimeout, OpTimeout, WorkerChannelClosed)


class ReplyFields(dict[str, Any]):
    """An ops reply's ``result``: a field the worker left out ends the
    experiment *unknown* naming the field (its reply broke ops.schema.json,
    contract section 5), never a KeyError in the harness."""

    def __init__(self, worker: str, op: str, result: dict[str, Any]) -> None:
        super().__init__(result)
        self.worker = worker
        self.op = op

    def __missing__(self, key: str) -> Any:
        raise Inconclusive(
            f"worker {self.worker}'s reply to {self.op} has no field {key!r} "
            "(ops.schema.json, docs/worker-contract.md section 5)"
        )


@dataclass(frozen=True)
class Exemption:
    """An experiment that produces, by design, a state a global invariant forbids
    (H[async] loses acknowledged epochs: its declared contract). The invariant
    is still judged and reported with this reason; it does not fail the run.
    ``variants`` empty: every variant."""

    invariant: str
    reason: str
    variants: tuple[str, ...] = ()


Layer = Literal["queue", "workflow"]
LAYERS: dict[Layer, str] = {
    "queue": "the queue layer: claim, renewal, takeover, stale finish and release, pause, "
    "kill, partition, claim storm (a thin driver of a queue library, no application code)",
    "workflow": "the workflow layer: checkpoints and their revision CAS, intents and the "
    "side-effect ledger, the outbox and its consumers, schema upgrades",
}


@dataclass(frozen=True)
class ExperimentSpec:
    """The static description of one acceptance-matrix experiment."""

    id: str
    title: str
    seed_section: str
    invariant: str
    fault: str
    rules: tuple[int, ...]
    injection_point: str | None = None
    replication: Literal["async", "sync"] | None = None
    lease_ttl_ms: int = 800
    heartbeat_ms: int = 150
    heartbeat_timeout_ms: int = 300
    dispatch_ttl_ms: int = 600
    # What the experiment must wait by its nature (lease expiry, heartbeat
    # timeouts); the rest of its wall time is harness overhead.
    natural_wait_s: float = 0.0
    variants: tuple[str, ...] = ()
    # Per-variant natural waits where variants differ, e.g. (("unknown", 0.8),).
    variant_waits: tuple[tuple[str, float], ...] = ()
    # Per-variant idempotency retention of the mock tool, e.g. (("retention_expired", 1.0),).
    tool_retention: tuple[tuple[str, float], ...] = ()
    # Per-variant injection point and fault text where variants differ (the
    # archive's fault_injection_point and injected_fault), and per-variant
    # replication where only some variants need a standby.
    variant_points: tuple[tuple[str, str], ...] = ()
    variant_faults: tuple[tuple[str, str], ...] = ()
    variant_replication: tuple[tuple[str, Literal["async", "sync"]], ...] = ()
    timeout_s: float = 60.0
    # The write path the workers are asked for (FENCECHECK_WRITE_PATH): the
    # production path unless the experiment needs an injection point inside
    # a protected write's transaction (after_lease_row_locked, before_commit).
    write_path: Literal["fast", "stepped"] = "fast"
    # Per-variant write paths where variants differ (a stale holder tried on
    # each path the worker declares).
    variant_write_paths: tuple[tuple[str, Literal["fast", "stepped"]], ...] = ()
    exemptions: tuple[Exemption, ...] = ()
    # What the experiment relies on beyond the required contract (injection
    # points it arms, optional ops it sends): a worker without one leaves it
    # unjudged, and `fencecheck contract` names it beforehand.
    needs: tuple[Need, ...] = ()
    # Which layer of a system it judges (contract §14, `fencecheck list`): the
    # queue (claim, renewal, takeover, stale finish and release, pause, kill,
    # partition, claim storm) or the workflow built on it (checkpoints, the
    # ledger, the outbox and its consumers, schema upgrades); per variant
    # where variants differ.
    layer: Layer = "workflow"
    variant_layers: tuple[tuple[str, Layer], ...] = ()

    def write_path_for(self, variant: str | None) -> Literal["fast", "stepped"]:
        return dict(self.variant_write_paths).get(variant or "", self.write_path)

    def layer_for(self, variant: str | None) -> Layer:
        return dict(self.variant_layers).get(variant or "", self.layer)

    def needs_for(self, variant: str | None) -> list[Need]:
        return [n for n in self.needs if n.applies_to(variant)]

    def natural_wait(self, variant: str | None) -> float:
        return dict(self.variant_waits).get(variant or "", self.natural_wait_s)

    def injection_point_for(self, variant: str | None) -> str | None:
        return dict(self.variant_points).get(variant or "", self.injection_point)

    def fault_for(self, variant: str | None) -> str:
        return dict(self.variant_faults).get(variant or "", self.fault)

    def replication_for(self, variant: str | None) -> Literal["async", "sync"] | None:
        """The replication a variant runs under: its own entry, else a variant
        named ``sync...``/``async...`` under a replicated spec, else the spec's."""
        own = dict(self.variant_replication).get(variant or "")
        if own is not None:
            return own
        if self.replication is None:
            return None
        if variant and variant.startswith("sync"):
            return "sync"
        if variant and variant.startswith("async"):
            return "async"
        return self.replication

    @property
    def slug(self) -> str:
        return self.title.lower().replace(" ", "_").replace("-", "_")


CheckKind = Literal["fault", "invariant", "progress", "not_judged"]


@dataclass(frozen=True)
class Check:
    """One check of an experiment.

    ``fault``: did the injected fault take effect (unknown when not).
    ``invariant``: a safety property, an outcome the protocol forbids whatever
    the timing (fail when broken). ``progress``: something the protocol
    expects to happen only when no timer fired on the way (a successor
    finishing, every run succeeding): unmet, it is fail only when the
    harness measured nothing in its window [``since``, ``at``] that excuses
    it (a stall of the harness, a watched process starved of CPU), else
    unknown with ``excused_by`` naming what it measured. ``not_judged``: a
    property the experiment meant to judge but could not try (what it needed
    was already gone); it decides nothing and is never counted as held
    (``ok`` is true only so that nothing reads it as broken).
    """

    name: str
    kind: CheckKind
    ok: bool
    expected: str
    observed: str
    since: float | None = None
    at: float | None = None
    excused_by: str | None = None
    # Set for a bound one process broke (it did not answer or exit in time):
    # only that process's slowness, or the harness's, can excuse it.
    bound: Bound | None = None


@dataclass(frozen=True)
class Bound:
    """Process ``pid`` was given ``bound_s`` seconds to answer or exit, and did not."""

    pid: int
    bound_s: float


# What the harness measured about timing in a wall-clock window that could
# have kept a correct worker from progressing (None: nothing).
Excuse = Callable[[float, float], str | None]
# The same for a missed bound: what kept that one process (or the harness)
# from running for a large part of the time it was given.
BoundExcuse = Callable[[float, float, Bound], str | None]


@dataclass
class QueryRecord:
    time: float
    label: str
    query: str
    rows: list[dict[str, Any]]
    params: list[Any] | None = None


@dataclass
class ExperimentContext:
    """Handed to a scenario's ``run``; collects checks and raw evidence."""

    spec: ExperimentSpec
    env: Environment
    variant: str | None = None
    seed: int | None = None
    # Every random choice of the experiment (task ids, event ids, which
    # workers to freeze) comes from here; the runner seeds it from the run's
    # seed and the job's label, so the same seed gives the same schedule.
    rng: random.Random = field(default_factory=random.Random)
    checks: list[Check] = field(default_factory=list)
    queries: list[QueryRecord] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    signals: list[SignalRecord] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # Every ops request sent through :meth:`op`, with the audit trail's last
    # seq before it and after its answer: what the state-space coverage
    # (harness/explore/cells.py) reads the state it started from by.
    ops_log: list[dict[str, Any]] = field(default_factory=list)
    # Requests sent with :meth:`op_async` not logged yet (their answer not read).
    pending_ops: list[LoggedOp] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    # Set by the runner: what it measured about timing in a window.
    excuse: Excuse | None = None
    bound_excuse: BoundExcuse | None = None

    # -------------------------------------------------------------- checks
    def fault(self, name: str, ok: bool, *, expected: str, observed: str) -> bool:
        """Record whether the injected fault really took effect."""
        self.checks.append(Check(name, "fault", bool(ok), expected, observed))
        return bool(ok)

    def probe_reached(
        self, fault: str, reached: bool, *, judges: str, expected: str, observed: str
    ) -> bool:
        """For a probe of its own inside an experiment (a second case beside the
        experiment's fault): reached, its fault is recorded as in effect; not
        reached, the property it ``judges`` is recorded not judged, with why,
        and the experiment's own verdict stands (a fault check not in effect
        would turn the whole run unknown and hide a fail found before)."""
        if not reached:
            self.not_judged(judges, expected=expected, observed=f"not reached: {observed}")
            return False
        return self.fault(fault, True, expected=expected, observed=observed)

    def invariant(self, name: str, ok: bool, *, expected: str, observed: str) -> bool:
        """Record one property of the protocol, judged from harness evidence."""
        self.checks.append(Check(name, "invariant", bool(ok), expected, observed))
        return bool(ok)

    def not_judged(self, name: str, *, expected: str, observed: str) -> None:
        """Record a property that was not tried, and why (``observed``): shown as
        not judged, neither held nor broken, and no part of the verdict."""
        self.checks.append(Check(name, "not_judged", True, expected, observed))

    def progress(
        self,
        name: str,
        ok: bool,
        *,
        expected: str,
        observed: str,
        since: float | None = None,
        until: float | None = None,
        bound: Bound | None = None,
    ) -> bool:
        """Record something the protocol expects only when no timer fired on the
        way (see :class:`Check`); its window runs from ``since`` (default: the
        experiment's start) to ``until`` (default: now), where timing decided.
        With ``bound``, the check is one process's bound and only that
        process's slowness or the harness's can excuse it."""
        at = until or time.time()
        self.checks.append(
            Check(
                name, "progress", bool(ok), expected, observed, since or self.started, at,
                bound=bound,
            )
        )  # fmt: skip
        return bool(ok)

    def equal(self, name: str, actual: Any, wanted: Any, *, what: str = "") -> bool:
        """Invariant ``actual == wanted`` with both values in the archive."""
        prefix = f"{what}: " if what else ""
        return self.invariant(
            name,
            actual == wanted,
            expected=f"{prefix}{plain(wanted)}",
            observed=f"{prefix}{plain(actual)}",
        )

    def progress_equal(
        self, name: str, actual: Any, wanted: Any, *, what: str = "", since: float | None = None
    ) -> bool:
        """Progress ``actual == wanted`` with both values in the archive."""
        prefix = f"{what}: " if what else ""
        return self.progress(
            name,
            actual == wanted,
            expected=f"{prefix}{plain(wanted)}",
            observed=f"{prefix}{plain(actual)}",
            since=since,
        )

    def verdict(self) -> tuple[Verdict, str]:
        """Unknown if a fault did not take effect (whatever else was seen: without
        the fault the experiment tested nothing); else fail if a safety
        invariant broke; else, for unmet progress, fail when nothing the
        harness measured excuses one of them and unknown when timing excuses
        every one (each excuse recorded on its check); unknown if nothing was
        checked; pass otherwise.

        Fault checks observe what the harness did (kernel state, barrier hit,
        link cut, lease expired by database time), never the protocol's
        response, so a broken implementation cannot turn its fail into unknown;
        excuses are the harness's own measurements (its stalls, the kernel's
        run-queue delays), never what a worker says.
        """
        broken = [c.name for c in self.checks if c.kind == "invariant" and not c.ok]
        missed = [c.name for c in self.checks if c.kind == "fault" and not c.ok]
        unmet = self._judge_unmet_progress()
        if missed:
            failed = len(broken) + len(unmet)
            also = f" ({failed} other check(s) also broke)" if failed else ""
            return Verdict.UNKNOWN, "fault did not take effect: " + "; ".join(missed) + also
        if broken:
            return Verdict.FAIL, "invariant broken: " + "; ".join(broken)
        unexcused = [c.name for c in unmet if c.excused_by is None]
        if unexcused:
            return Verdict.FAIL, (
                "progress not made, and no stall or starvation the harness measured excuses it: "
                + "; ".join(unexcused)
            )
        if unmet:
            return Verdict.UNKNOWN, "progress not made while timing could decide: " + "; ".join(
                f"{c.name} ({c.excused_by})" for c in unmet
            )
        if not any(c.kind in ("invariant", "progress") for c in self.checks):
            return Verdict.UNKNOWN, "no invariant was checked"
        if not any(c.kind == "fault" for c in self.checks):
            return Verdict.UNKNOWN, "the experiment did not confirm its fault"
        reason = "every invariant held and every fault took effect"
        skipped = [c.name for c in self.checks if c.kind == "not_judged"]
        if skipped:
            reason += f" ({len(skipped)} not judged: {'; '.join(skipped)})"
        return Verdict.PASS, reason

    def _excuse(self, check: Check) -> str | None:
        """What the harness measured in the check's window that excuses it."""
        since, until = check.since or self.started, check.at or time.time()
        if check.bound is not None:
            if self.bound_excuse is None:
                return None
            return self.bound_excuse(since, until, check.bound)
        return self.excuse(since, until) if self.excuse is not None else None

    def _judge_unmet_progress(self) -> list[Check]:
        """The unmet progress checks, each with its excuse (if any) filled in."""
        unmet: list[Check] = []
        for i, c in enumerate(self.checks):
            if c.kind != "progress" or c.ok:
                continue
            if c.excused_by is None:
                why = self._excuse(c)
                if why is not None:
                    c = dataclasses.replace(c, excused_by=why)
                    self.checks[i] = c
            unmet.append(c)
        return unmet

    def _lease_live_after(self, args: dict[str, Any]) -> bool:
        """After a refusal for the lease: is the lease the op named still live at
        its epoch, by database time, and the run still at the revision the op
        expected? Then both held when the op came (a lease is only ever extended
        while live, never revived; a revision only grows), and no timing can
        explain the refusal."""
        if "run_id" not in args or "epoch" not in args:
            return False
        try:
            rows = self.env.query(
                "SELECT epoch, revision, lease_expires_at > clock_timestamp() AS live "
                "FROM fencecheck_model.agent_runs WHERE run_id::text = %s",
                [str(args["run_id"])],
            )
        except psycopg.Error:
            return False
        live = bool(rows) and bool(rows[0]["live"]) and rows[0]["epoch"] == args["epoch"]
        if live and "expected_revision" in args:
            live = rows[0]["revision"] == args["expected_revision"]
        if live:
            self.command(
                f"after the refusal, run {args['run_id']}'s lease is live at epoch "
                f"{args['epoch']} by database time (and at the revision expected): no timing "
                "explains it"
            )
        return live

    def _claimable_after(self, args: dict[str, Any]) -> bool:
        """After a claim of a named run refused as not claimable: is that run
        claimable now, and was it due (queued) or expired (holding a lease)
        already when the claim was sent? Then no timing explains the refusal:
        the only other way out of those states is a grant, which would have
        left it held."""
        if "run_id" not in args or not self.ops_log:
            return False
        sent = float(self.ops_log[-1]["at"])
        try:
            rows = self.env.query(
                "SELECT (status = 'queued' AND next_attempt_at <= to_timestamp(%s)) OR "
                "(status IN ('running', 'waiting_tool') AND lease_expires_at <= to_timestamp(%s))"
                " AS claimable FROM fencecheck_model.agent_runs WHERE run_id::text = %s",
                [sent, sent, str(args["run_id"])],
            )
        except psycopg.Error:
            return False
        claimable = bool(rows) and bool(rows[0]["claimable"])
        if claimable:
            self.command(
                f"after the refusal, run {args['run_id']} is claimable by database time: no "
                "timing explains it"
            )
        return claimable

    # ------------------------------------------------------------ the system
    @property
    def system(self) -> mapping.Declaration:
        """What the system under test declares about itself (its mapping)."""
        return mapping.declared(tuple(self.env.shared.settings.worker_cmd))

    # ------------------------------------------------------------ evidence
    def sql(
        self, label: str, statement: str, params: Sequence[Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run a query as the harness (superuser) on the experiment database and
        keep the query with its rows as evidence."""
        with phases.phase("scenario.sql"):
            try:
                rows = self.env.query(statement, params)
            except psycopg.Error as exc:
                # The worker's database refused what the harness reads (a column
                # or table it lacks, a lock it holds past a timeout): the full
                # error is evidence, the reason one line.
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.queries.append(
                    QueryRecord(
                        time.time(),
                        f"{label}: refused ({exc.sqlstate} {type(exc).__name__})",
                        " ".join(statement.split()),
                        [{"error": str(exc)}],
                        list(params) if params is not None else None,
                    )
                )
                raise Inconclusive(
                    f"the harness could not read {label!r} from the worker's database: "
                    f"{exc.sqlstate} {first}"
                ) from exc
        self.queries.append(
            QueryRecord(
                time.time(),
                label,
                " ".join(statement.split()),
                rows,
                list(params) if params is not None else None,
            )
        )
        return rows

    def command(self, text: str) -> None:
        """Record something the harness did (a signal, a proxy change, a promote)."""
        self.commands.append({"time": time.time(), "command": text})

    def uuid(self) -> str:
        """A random (version 4) UUID drawn from the experiment's seeded generator."""
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def note_run(self, run_id: str) -> str:
        if run_id not in self.run_ids:
            self.run_ids.append(run_id)
        return run_id

    # ------------------------------------------------------ faults (logged)
    def pause(self, worker: WorkerProcess) -> SignalRecord:
        """SIGSTOP, returning once the kernel reports the process stopped. A worker
        that exited before it could be stopped leaves the fault undone: a failed
        fault check and *unknown*, never a harness error."""
        try:
            rec = worker.pause()
        except ProcessError as exc:
            self._signal_missed(worker, "SIGSTOP", exc)
        self.signals.append(rec)
        self.command(f"SIGSTOP {worker.worker_id} (pid {rec.pid}): kernel state {rec.state!r}")
        return rec

    def resume(self, worker: WorkerProcess) -> SignalRecord:
        try:
            rec = worker.resume()
        except ProcessError as exc:
            self._signal_missed(worker, "SIGCONT", exc)
        self.signals.append(rec)
        self.command(f"SIGCONT {worker.worker_id} (pid {rec.pid}): kernel state {rec.state!r}")
        return rec

    def kill(self, worker: WorkerProcess) -> SignalRecord:
        rec = worker.kill()
        self.signals.append(rec)
        self.command(f"SIGKILL {worker.worker_id} (pid {rec.pid}): {rec.state}")
        return rec

    def _signal_missed(self, worker: WorkerProcess, signal_name: str, exc: ProcessError) -> Any:
        """A signal the harness could not deliver or confirm: the worker's doing
        when it had exited (recorded as the fault not taking effect), else the
        harness's (raised as it is)."""
        if worker.is_alive():
            raise exc
        self.fault(
            f"{signal_name} reached {worker.worker_id}",
            False,
            expected=f"{worker.worker_id} alive for the harness's {signal_name}",
            observed=f"it had exited (code {worker.returncode}): {exc}",
        )
        raise Inconclusive(
            f"{worker.worker_id} exited (code {worker.returncode}) before the harness's "
            f"{signal_name}"
        ) from exc

    def cut(self, link: str) -> FaultRecord:
        rec = self.env.links[link].cut()
        self.command(f"toxiproxy: {rec.detail or 'cut ' + link}")
        return rec

    def heal(self, link: str) -> None:
        healed = self.env.links[link].heal()
        self.command(f"toxiproxy: heal {link} ({len(healed)} fault(s) removed)")

    # ---------------------------------------------------------- barriers
    def arm(self, worker: str, point: str, action: Action, *, times: int | None = 1) -> None:
        self.env.control.arm(worker, point, action, times=times)
        self.command(f"arm {point} for {worker}: {action.label()}")

    def reached(
        self, worker: str, point: str, timeout_s: float = 15.0, *, held: bool = False
    ) -> Hit:
        """Wait for a worker to reach an armed point; a timeout is inconclusive.
        ``held``: the next arrival the barrier holds, passing over those it let
        through (a point a worker passes often, armed while it runs)."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                hit = self.env.control.wait_reached(worker, point, remaining)
                if not held or hit.action == Hold().label():
                    return hit
        except TimeoutError as exc:
            raise Inconclusive(str(exc)) from exc

    def release(self, worker: str, point: str, action: Action | None = None) -> Hit | None:
        """Open a held barrier. A worker that already left on its own (it may
        exit when it gives up its lease) is recorded, not an error: None."""
        label = (action or Continue()).label()
        try:
            hit = self.env.control.release(worker, point, action or Continue())
        except ControlError:
            proc = self.env.workers.get(worker)
            if proc is None or proc.is_alive():
                raise
            self.command(
                f"release {worker} at {point}: worker already exited (code {proc.returncode})"
            )
            return None
        self.command(f"release {worker} at {point}: {label}")
        return hit

    # --------------------------------------------------------------- ops
    def op(self, worker: WorkerProcess, op: str, timeout_s: float = 15.0, **args: Any) -> OpReply:
        """One ops request; an op the worker does not implement is inconclusive."""
        seq_before, at = self.audit_seq(), time.time()
        with phases.phase("scenario.ops"):
            reply = worker.request(op, args, timeout_s=timeout_s)
        self.log_op(worker.worker_id, op, args, reply, at, seq_before, worker.tenant_id)
        reply = dataclasses.replace(reply, result=ReplyFields(worker.worker_id, op, reply.result))
        outcome = "ok" if reply.ok else f"{reply.error}: {reply.message}"
        self.command(f"{worker.worker_id}: {op} {json.dumps(args, default=str)} -> {outcome}")
        if reply.unsupported:
            raise Inconclusive(f"worker {worker.worker_id} does not implement op {op!r}")
        if reply.ok and isinstance(reply.result.get("run_id"), str):
            self.note_run(reply.result["run_id"])
        return reply

    def op_async(
        self, worker: WorkerProcess, op: str, args: dict[str, Any], *, worker_async: bool = False
    ) -> LoggedOp:
        """Send one ops request and return at once (``.result(timeout_s)`` waits):
        logged in :attr:`ops_log` like :meth:`op` when its answer is read, or
        by :meth:`flush_ops` (no answer) when the experiment ends first."""
        seq_before, at = self.audit_seq(), time.time()
        pending = worker.request_async(op, args, worker_async=worker_async)
        self.command(f"{worker.worker_id}: {op} {json.dumps(args, default=str)} (sent)")
        logged = LoggedOp(self, worker, op, args, pending, at, seq_before)
        self.pending_ops.append(logged)
        return logged

    def flush_ops(self) -> None:
        """Log every :meth:`op_async` request whose answer nobody read: with its
        answer when it came, else as unanswered (its worker died, say)."""
        for logged in list(self.pending_ops):
            reply = None
            if logged.pending.done():
                with contextlib.suppress(Exception):  # the channel closed: no answer
                    reply = logged.pending.result(0)
            logged.log(reply)

    def log_op(
        self,
        worker: str,
        op: str,
        args: Any,
        reply: OpReply | None,
        at: float,
        seq_before: int | None,
        tenant: str | None = None,
    ) -> None:
        """One entry of :attr:`ops_log`, once the request is answered (``reply``
        None: it never was)."""
        self.ops_log.append(
            {
                "worker": worker,
                "tenant": tenant,
                "op": op,
                "args": args,
                "ok": reply.ok if reply is not None else False,
                "error": reply.error if reply is not None else "no answer",
                # The run a create_run or retry_run answered with (judged
                # globally: run.created_with_its_initial_values).
                "run_id": _created_run(op, reply),
                "at": at,
                "done": time.time(),
                "seq_before": seq_before,
                "seq_after": self.audit_seq(),
                # What a reconcile cycle says it changed (judged globally
                # against the audit trail: worker.reconcile_lists_every_change).
                "changes": _listed_changes(op, reply),
                # What a relay cycle says it marked (worker.relay_lists_what_it_marked).
                "published": _listed_published(op, reply),
                # What a consume cycle says it applied (worker.consume_counts_what_it_applied).
                "consumed": _counted_consumed(op, reply),
                # The status an ok cancel says the run has (worker.cancel_reports_the_runs_status).
                "run_status": _reported_run_status(op, reply),
                # The reply line against ops.schema.json (judged globally:
                # worker.replies_match_the_contract).
                "schema_problems": spec.reply_problems(op, reply.raw)
                if reply is not None and reply.raw
                else [],
            }
        )

    def audit_seq(self) -> int | None:
        """The audit trail's last seq now (None before it exists or when the
        primary does not answer: that op's start state is then not judged)."""
        try:
            rows = self.env.query(
                "SELECT coalesce(max(seq), 0) AS seq FROM fencecheck_audit.changes"
            )
        except Exception:
            return None
        return int(rows[0]["seq"]) if rows else None

    def ok(
        self,
        worker: WorkerProcess,
        op: str,
        timeout_s: float = 15.0,
        *,
        definite: Iterable[str] = (),
        **args: Any,
    ) -> dict[str, Any]:
        """An op that must succeed for the experiment to go on: a refusal timing
        could explain is inconclusive, any other :class:`SetupRefused`.
        ``definite``: error classes timing cannot explain here, because the
        scenario read what rules them out from the database (a retry refused as
        "still running" after the harness saw the run cancelled)."""
        reply = self.op(worker, op, timeout_s, **args)
        if not reply.ok:
            definite = set(definite)
            if reply.error in LEASE_REFUSALS and self._lease_live_after(args):
                definite.add(str(reply.error))
            if reply.error == "NotClaimable" and op == "claim" and self._claimable_after(args):
                definite.add(str(reply.error))
            if reply.error not in definite and timing_or_harness(reply.error):
                raise Inconclusive(
                    f"setup op {op!r} on {worker.worker_id} failed: {reply.error}: {reply.message}"
                )
            raise SetupRefused(worker.worker_id, op, str(reply.error), str(reply.message))
        return reply.result


@dataclass
class LoggedOp:
    """An ops request sent by :meth:`ExperimentContext.op_async`: the pending
    reply, logged in the context's ops log once (when read, or flushed)."""

    ctx: ExperimentContext
    worker: WorkerProcess
    op: str
    args: dict[str, Any]
    pending: PendingOp
    at: float
    seq_before: int | None
    logged: bool = False

    @property
    def sent_at(self) -> float:
        return self.pending.sent_at

    @property
    def answered_at(self) -> float | None:
        """When the reply arrived (None: not yet), by the harness's clock."""
        return self.pending.answered_at

    def done(self) -> bool:
        return self.pending.done()

    def result(self, timeout_s: float) -> OpReply:
        """The reply (as :meth:`PendingOp.result`), logged."""
        try:
            reply = self.pending.result(timeout_s)
        except Exception:
            self.log(None)
            raise
        self.log(reply)
        return dataclasses.replace(
            reply, result=ReplyFields(self.worker.worker_id, self.op, reply.result)
        )

    def log(self, reply: OpReply | None) -> None:
        if self.logged:
            return
        self.logged = True
        if self in self.ctx.pending_ops:
            self.ctx.pending_ops.remove(self)
        self.ctx.log_op(
            self.worker.worker_id, self.op, self.args, reply, self.at, self.seq_before,
            self.worker.tenant_id,
        )  # fmt: skip


def _reported_run_status(op: str, reply: OpReply | None) -> str | None:
    """The ``run_status`` an ok cancel reply gives (None for any other reply,
    or one without it)."""
    if op != "cancel" or reply is None or not reply.ok or not isinstance(reply.result, dict):
        return None
    status = reply.result.get("run_status")
    return status if isinstance(status, str) else None


def _listed_published(op: str, reply: OpReply | None) -> list[str] | None:
    """The event ids an ok relay reply lists in its ``published`` (None for
    any other reply, or one without such a list)."""
    if op != "relay" or reply is None or not reply.ok or not isinstance(reply.result, dict):
        return None
    published = reply.result.get("published")
    if not isinstance(published, list):
        return None
    return [str(p) for p in published]


def _counted_consumed(op: str, reply: OpReply | None) -> int | None:
    """The count an ok consume reply gives as ``consumed`` (None for any other
    reply, or one without a whole number there)."""
    if op != "consume" or reply is None or not reply.ok or not isinstance(reply.result, dict):
        return None
    consumed = reply.result.get("consumed")
    return consumed if isinstance(consumed, int) and not isinstance(consumed, bool) else None


def _created_run(op: str, reply: OpReply | None) -> str | None:
    """The run_id an ok create_run or retry_run reply names."""
    if op not in ("create_run", "retry_run") or reply is None or not reply.ok:
        return None
    run_id = (reply.result or {}).get("run_id")
    return run_id if isinstance(run_id, str) else None


def _listed_changes(op: str, reply: OpReply | None) -> list[str] | None:
    """The operation ids an ok reconcile reply lists in its ``changes`` (None
    for any other reply, or one without such a list)."""
    if op != "reconcile" or reply is None or not reply.ok or not isinstance(reply.result, dict):
        return None
    changes = reply.result.get("changes")
    if not isinstance(changes, list):
        return None
    return [str(c.get("operation_id")) for c in changes if isinstance(c, dict)]
