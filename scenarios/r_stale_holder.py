"""R: after a takeover, every fenced operation of the contract is refused to the stale holder.

The table of cases is not written here: it is every operation of
``harness/contract/operations.json`` that changes a run, its checkpoints, its
ledger or its outbox and takes a lease epoch (:func:`cases`), so an operation
added to the contract is tried here without any change to this module. Each
is sent by A's own session, after A's lease expired and B took the run over
(B keeps its lease live with a heartbeat, so expiry never decides a case),
in every identity combination a stale holder may present: its old owner
and old epoch; the new owner with the old epoch; its old owner with the new
epoch; and, for operations that take one, at its own stale revision and at
the run's current revision. And every operation that takes a revision is
sent once more with B's own identity (the current owner and epoch) at a
revision the run has left behind: the lease would let it through, the
revision must not (a retried write racing a checkpoint). Each must change
nothing, judged from the harness's audit trail (no change by A's session,
which sends every attempt) and B's lease row, never from the reply (which
is kept as detail).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.checking import checkers
from harness.contract import spec
from harness.contract.spec import Operation
from harness.engine.experiment import ExperimentContext, ExperimentSpec, Inconclusive, plain
from harness.parts.control import Hold
from harness.parts.processes import WorkerProcess
from harness.waiting import WaitTimeout, wait_for
from scenarios.common import new_run, renewal_stopped, seen_within

SPEC = ExperimentSpec(
    id="R",
    title="stale holder, every operation",
    seed_section="English seed §1, §5, §6 (owner + epoch + expiry on every write); Chinese "
    "seed §5, §13.2 (expired fence)",
    invariant="after B's takeover, every operation of the contract that changes a run, its "
    "checkpoints, its ledger or its outbox, sent by A with (old owner, old epoch), (new owner, "
    "old epoch) or (old owner, new epoch), at its stale and at the current revision, and with "
    "B's own identity at a revision the run has left behind, changes nothing: no audited change "
    "by A's session, B's lease and revision untouched",
    fault="A's lease expires; B takes over and keeps its lease live; A's session sends every "
    "fenced operation with every stale identity",
    rules=(1, 2, 3),
    layer="queue",
    lease_ttl_ms=800,
    natural_wait_s=0.8,  # Each write path the worker declares (contract section 2): the stepped one
    # validates the lease in a statement of its own (lock_lease in the reference).
    variants=("fast", "stepped"),
    variant_write_paths=(("stepped", "stepped"),),
)

#: B's lease in R[fast] (see _stop_while_held).
B_LONG_LEASE_MS = 15_000
#: The identities a stale holder may present, as (owner, epoch) of (A, B).
IDENTITIES = ("old owner, old epoch", "new owner, old epoch", "old owner, new epoch")
#: The current holder's own identity: only the revision is stale.
HOLDER = "new owner, new epoch"
REVISIONS = ("stale", "current")
# Once one attempt changed the run, the takeover the rest need is gone.
NOT_TRIED = "not tried"

# B's heartbeat is asked for an interval other than the worker's own default
# (twice it): renewals at the default would be a value the harness asked for
# left unused (contract section 5, heartbeat: a renewal every interval_ms).
ASKED_INTERVAL_FACTOR = 2
# How long B's renewals are counted, at least, before its stop.
PACE_WINDOW_S = 2.0
# Renewals the count may have beyond the window / interval: the first and
# last at the window's ends, one of the replaced heartbeat still on its way,
# one a ticker that keeps its rate brings closer after a late one.
PACE_SLACK = 3


@dataclass(frozen=True)
class Case:
    """One attempt: an operation, the identity it presents, the revision it expects."""

    op: str
    identity: str
    revision: str | None  # None: the operation takes no expected_revision

    @property
    def label(self) -> str:
        at = f" at the {self.revision} revision" if self.revision else ""
        return f"{self.op} with {self.identity}{at}"


def cases(ops: Sequence[Operation], *, fencing_token: bool = True) -> list[Case]:
    """Every stale-holder case the contract's operations call for, in table order.
    Without a fencing token the new owner's identity is the current one (nothing
    stale to present), so a stale holder has only its own: the old owner."""
    identities = IDENTITIES if fencing_token else IDENTITIES[:1]
    out: list[Case] = []
    for o in spec.stale_holder_operations(ops):
        takes_revision = "expected_revision" in o.identity
        revisions: Sequence[str | None] = REVISIONS if takes_revision else (None,)
        out += [Case(o.op, i, r) for i in identities for r in revisions]
        if takes_revision:
            out.append(Case(o.op, HOLDER, "stale"))
    return out


@dataclass(frozen=True)
class Takeover:
    """What the stale holder knows and what the run is now."""

    run_id: str
    old: dict[str, Any]  # A's grant
    new: dict[str, Any]  # B's grant
    stale_revision: int
    current_revision: int
    # Audit position and time once B's (second) heartbeat start was answered.
    heartbeat_mark: int = 0
    heartbeat_started_at: float = 0.0
    # When B's claim was sent: from its grant, B's lease lives one TTL, and
    # whether the heartbeat's first renewal comes within it is timing (a
    # harness stall while the claim was answered once let it run out: the
    # window of B's heartbeat checks starts here, not at the start).
    claimed_at: float = 0.0
    # Seconds B's lease had left when its heartbeat's first renewal was due
    # (one asked interval after the second start was answered), by database
    # time; None without a heartbeat. Not above 0: the harness was too slow
    # between the grant and the start for any heartbeat to renew in time.
    left_at_first_renewal_s: float | None = None

    def values(self, case: Case) -> dict[str, Any]:
        """The identity and revision a case presents. A stale revision is the
        one A last wrote at; for B's own identity, one B's checkpoint moved
        the run past (the current revision less one)."""
        owner = self.new["owner"] if case.identity.startswith("new owner") else self.old["owner"]
        epoch = self.new["epoch"] if case.identity.endswith("new epoch") else self.old["epoch"]
        revision = self.current_revision if case.revision == "current" else self.stale_revision
        if case.identity == HOLDER:
            revision = self.current_revision - 1
        return {
            "run_id": self.run_id,
            "owner": owner,
            "epoch": epoch,
            "expected_revision": revision,
            "event_id": str(uuid.uuid4()),
        }


def run(ctx: ExperimentContext) -> None:
    caps = ctx.system.capabilities
    # An op the system declares it lacks (a queue has no checkpoint to save) is
    # no case here; every op it offers is tried with every stale identity.
    table = cases(
        [o for o in spec.operations() if caps.offers_op(o.op)], fencing_token=caps.fencing_token
    )
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    # Where R[fast] holds B's heartbeat against its stop, B holds a long
    # lease: a stop that waits seconds for the held thread must find it live.
    # Only there: a queue's driver may read the lease duration as its own
    # staleness timer, and B must still take A's expired run over.
    long_lease = {"FENCECHECK_LEASE_TTL_MS": str(B_LONG_LEASE_MS)} if _holds_the_stop(ctx) else {}
    b = ctx.env.start_worker("B", "ops", env=dict(long_lease))
    takeover = _take_over(ctx, run_id, a, b)
    if takeover.current_revision < 1:  # no revision the run has left behind
        table = [c for c in table if c.identity != HOLDER]
    ops = spec.by_name()
    outcomes: dict[str, list[str]] = {}
    broken_by: str | None = None
    live_at_every_attempt = True
    for case in table:
        if broken_by is not None:
            outcomes.setdefault(case.op, []).append(
                f"{case.label}: {NOT_TRIED} ({broken_by} already changed the run)"
            )
            continue
        before = _lease_state(ctx, run_id)
        live_at_every_attempt &= _held_by(before, takeover.new)
        mark = checkers.audit_mark(ctx)
        reply = _attempt(ctx, a, ops[case.op], takeover.values(case))
        after = _lease_state(ctx, run_id)
        late = checkers.changes_by(ctx, ["A"], after_seq=mark)
        moved = _moved(before, after)
        ok = not late and not moved
        outcomes.setdefault(case.op, []).append(
            f"{case.label}: {'nothing changed' if ok else 'CHANGED ' + _what(late, moved)}"
            f" (reply: {reply})"
        )
        if not ok:
            broken_by = case.label
    live = dict(
        expected=f"B holds epoch {takeover.new['epoch']} unexpired by database time whenever A "
        "sends an attempt (so only the identity can refuse it, never the expiry)",
        observed="live at every attempt" if live_at_every_attempt else "not live at some attempt",
    )
    unrenewed = caps.offers_op("heartbeat") and not any(
        c["renewal"] and c["run_id"] == run_id
        for c in checkers.changes_by(ctx, ["B"], after_seq=takeover.heartbeat_mark)
    )
    if not live_at_every_attempt and unrenewed:
        # B's heartbeat never renewed the lease: the worker's failure, not a
        # fault that did not take effect (generated 62d27323: a heartbeat
        # start that started nothing ended R unknown), unless the harness
        # started it too late for any renewal (then a fault not in effect).
        if not _too_late_for_a_renewal(ctx, takeover):
            ctx.progress(
                "B's heartbeat kept its lease live",
                False,
                expected="renewals of B's lease by B's session (audit trail) after its "
                "heartbeat was started",
                observed=f"no renewal by B; {live['observed']}",
                since=takeover.claimed_at,
            )
        ctx.probe_reached("B's lease was live at every attempt", False, judges="the stale "
                          "attempts against a live lease", **live)  # fmt: skip
    else:
        ctx.fault("B's lease was live at every attempt", live_at_every_attempt, **live)
    for op, lines in outcomes.items():
        tried = [line for line in lines if NOT_TRIED not in line]
        name = f"stale {op} refused and changed nothing"
        expected = (
            f"{len(lines)} attempt(s): no audited change by A's session of any contract "
            "table; B's owner, epoch, revision and status untouched"
        )
        if not tried:
            # Nothing of this op was sent: it held nothing and broke nothing.
            ctx.not_judged(
                name,
                expected=expected,
                observed=f"not judged: no attempt was tried; {'; '.join(lines)}",
            )
            continue
        ctx.invariant(
            name,
            all(": nothing changed" in line for line in tried),
            expected=expected,
            observed="; ".join(lines),
        )
    if caps.offers_op("heartbeat"):
        _heartbeat_stops(ctx, b, takeover)
    ctx.command(
        f"{len(table)} stale-holder case(s) from the contract: {len(outcomes)} operation(s)"
    )
    checkers.lease_history_is_sound(ctx, [run_id])


def _take_over(ctx: ExperimentContext, run_id: str, a: WorkerProcess, b: WorkerProcess) -> Takeover:
    """A claims and writes; its lease expires (A stops renewing the way the system
    renews); B claims, keeps it live and writes."""
    caps = ctx.system.capabilities
    old = ctx.ok(a, "claim", run_id=run_id)
    stale = old["revision"]
    if caps.checkpoints:
        stale = ctx.ok(
            a,
            "save_checkpoint",
            run_id=run_id,
            epoch=old["epoch"],
            expected_revision=old["revision"],
            state={"by": "A"},
        )["revision"]
    with renewal_stopped(ctx, a):
        checkers.wait_lease_expired(ctx, run_id)
        expired = checkers.run_row(ctx, run_id, "the run with A's lease expired, before B's claim")
        claimed_at = time.time()
        new = ctx.ok(b, "claim", run_id=run_id)
    left_at_first_renewal_s: float | None = None
    if caps.offers_op("heartbeat"):
        # Started twice: a start for a lease that has one replaces it (contract
        # section 5, heartbeat: one background renewal per lease), and the stop
        # at the end must leave no renewal (blind hunt 28 #09: a restart that
        # left the first loop running, untracked, renewed after the stop). The
        # first start asks the default interval, the second the longer one the
        # pace check holds B to (blind hunt 55 #07: a repeated start answered
        # ok and ignored kept renewing at the first start's interval).
        for interval_ms in (ctx.env.heartbeat_ms, ASKED_INTERVAL_FACTOR * ctx.env.heartbeat_ms):
            ctx.ok(
                b,
                "heartbeat",
                run_id=run_id,
                epoch=new["epoch"],
                action="start",
                interval_ms=interval_ms,
                timeout_ms=ctx.env.heartbeat_timeout_ms,
            )
        due_at = time.time() + ASKED_INTERVAL_FACTOR * ctx.env.heartbeat_ms / 1000
        left_s = _lease_left_s(ctx, run_id)
        left_at_first_renewal_s = None if left_s is None else left_s - (due_at - time.time())
        # A request with an action that is neither must be refused and change
        # nothing: the heartbeat just started keeps B's lease live through the
        # stale attempts below (blind hunt 65's reader: the Go worker stopped
        # the running heartbeat before it looked at the action).
        bad = ctx.op(b, "heartbeat", run_id=run_id, epoch=new["epoch"], action="pause")
        ctx.invariant(
            "a heartbeat request with an unknown action is refused",
            not bad.ok,
            expected="heartbeat action 'pause' refused (the action is start or stop)",
            observed=f"reply {'ok' if bad.ok else bad.error}",
        )
    heartbeat_mark, heartbeat_started_at = checkers.audit_mark(ctx), time.time()
    current = new["revision"]
    if caps.checkpoints:
        current = ctx.ok(
            b,
            "save_checkpoint",
            run_id=run_id,
            epoch=new["epoch"],
            expected_revision=new["revision"],
            state={"by": "B"},
        )["revision"]
    next_grant = (
        new["epoch"] == old["epoch"] + 1 if caps.fencing_token else new["owner"] != old["owner"]
    )
    ctx.fault(
        "B took the run over from A after A's lease expired",
        bool(expired["lease_expired"]) and next_grant,
        expected=f"A's lease (epoch {old['epoch']}) expired by database time, then B granted "
        + (f"epoch {old['epoch'] + 1}" if caps.fencing_token else "the run (no fencing token)"),
        observed=f"expired before B's claim: {expired['lease_expired']}; B's epoch {new['epoch']}",
    )
    if new["owner"] == old["owner"]:
        raise Inconclusive(
            f"A and B present the same owner {old['owner']!r}: nothing to tell apart"
        )
    return Takeover(
        run_id, old, new, stale, current, heartbeat_mark, heartbeat_started_at, claimed_at,
        left_at_first_renewal_s,
    )  # fmt: skip


def _lease_left_s(ctx: ExperimentContext, run_id: str) -> float | None:
    """Seconds the run's lease has left by database time (None without one)."""
    rows = ctx.env.query(
        "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS left_s "
        "FROM fencecheck_model.agent_runs WHERE run_id::text = %s",
        [run_id],
    )
    return None if not rows or rows[0]["left_s"] is None else float(rows[0]["left_s"])


def _too_late_for_a_renewal(ctx: ExperimentContext, takeover: Takeover) -> bool:
    """When B's lease would run out before its heartbeat's first renewal was
    even due, the harness's own delay between the grant and the start decided
    it (seen in CI: a stall while B's claim was answered): a fault not in
    effect, never the worker's failure. True then (and recorded)."""
    left = takeover.left_at_first_renewal_s
    if left is None or left > 0:
        return False
    name = "B's heartbeat was started with time for its first renewal"
    if any(c.name == name for c in ctx.checks):
        return True
    ctx.fault(
        name,
        False,
        expected="B's lease still live when its heartbeat's first renewal is due (one asked "
        "interval after the start)",
        observed=f"the lease would have run out {-left:.3f}s before that renewal was due",
    )
    return True


def _attempt(
    ctx: ExperimentContext, a: WorkerProcess, op: Operation, values: dict[str, Any]
) -> str:
    """Send one stale attempt; what A's session answered, as text."""
    args = spec.fill(dict(op.example), values)
    if op.op == "heartbeat":
        return _stale_heartbeat(ctx, a, args)
    reply = ctx.op(a, op.op, **args)
    return "ok" if reply.ok else f"{reply.error}"


def _stale_heartbeat(ctx: ExperimentContext, a: WorkerProcess, args: dict[str, Any]) -> str:
    """Start a heartbeat under the stale identity, wait until it tried to renew
    (its ``before_renew`` point), give that renewal its timeout, stop it."""
    seen = len(ctx.env.control.hits(worker="A", point="before_renew"))
    started = ctx.op(a, "heartbeat", **{**args, "interval_ms": ctx.env.heartbeat_ms})
    tried = True
    try:
        wait_for(
            lambda: len(ctx.env.control.hits(worker="A", point="before_renew")) > seen,
            what="A's stale heartbeat to try a renewal (point before_renew)",
            timeout_s=5.0,
        )
    except WaitTimeout:
        tried = False
    time.sleep(ctx.env.heartbeat_timeout_ms / 1000)  # the renewal's own bound
    stopped = ctx.op(a, "heartbeat", **{**args, "action": "stop"})
    return (
        f"start {'ok' if started.ok else started.error}, "
        f"{'renewal tried' if tried else 'no renewal seen within 5 s'}, "
        f"stop {plain(stopped.result) if stopped.ok else stopped.error}"
    )


def _heartbeat_stops(ctx: ExperimentContext, b: WorkerProcess, takeover: Takeover) -> None:
    """``heartbeat stop`` ends the renewals: once its reply came, and a renewal
    already on its way had its own timeout to end, B's session renews the lease
    no more (judged over two intervals, by the audit trail: a lease its holder
    stopped renewing must be able to run out). Before the stop, the renewals
    kept the interval B's heartbeat was asked for."""
    run_id, epoch = takeover.run_id, takeover.new["epoch"]

    def renewals(after: int = 0) -> list[dict[str, Any]]:
        return [
            c
            for c in checkers.changes_by(ctx, [b.worker_id], after_seq=after)
            if c["renewal"] and c["run_id"] == run_id
        ]

    try:
        before = wait_for(
            renewals,
            what="B's heartbeat to renew its lease once before the stop (audit trail)",
            timeout_s=5.0 + 2 * ctx.env.heartbeat_ms / 1000,
        )
    except WaitTimeout:
        before = []
    if not before and _too_late_for_a_renewal(ctx, takeover):
        return
    # A heartbeat started must renew (contract section 5): one that never
    # does is the worker's failure, not a fault that did not take effect
    # (generated 62d27323: a start that started nothing ended R unknown).
    if not ctx.progress(
        "B's heartbeat renewed the lease before it was stopped",
        bool(before),
        expected="at least one renewal of B's lease by B's session (audit trail) within 5 s "
        "and two intervals of its start",
        observed=f"{len(before)} renewal(s) by B before the stop",
        since=takeover.claimed_at,
    ):
        return
    _renewals_keep_the_asked_interval(ctx, takeover, renewals)
    # Two intervals, at least a second: a busy machine's stall must not hide one.
    window_s = max(2 * ctx.env.heartbeat_ms / 1000, 1.0)
    stop: dict[str, Any] = {"run_id": run_id, "epoch": epoch, "action": "stop"}
    if _holds_the_stop(ctx) and _stop_while_held(ctx, b, stop, renewals, window_s):
        return
    stopped_at = time.time()
    reply = ctx.ok(b, "heartbeat", **stop)
    _stop_reports_no_cancel(ctx, reply, before, since=stopped_at - window_s)
    time.sleep(ctx.env.heartbeat_timeout_ms / 1000)  # a renewal already on its way
    mark = checkers.audit_mark(ctx)
    time.sleep(window_s)
    after = renewals(mark)
    ctx.invariant(
        "no renewal after heartbeat stop",
        not after,
        expected=f"no renewal of the lease by B's session from one renewal timeout after the "
        f"stop's reply for {window_s:.1f} s (two heartbeat intervals, at least 1 s)",
        observed=f"{len(after)} renewal(s): {[(c['seq'], str(c['at'])) for c in after] or 'none'}",
    )


def _renewals_keep_the_asked_interval(
    ctx: ExperimentContext,
    takeover: Takeover,
    renewals: Callable[[int], list[dict[str, Any]]],
) -> None:
    """B's renewals since its heartbeat start come no more often than the
    interval it was asked for: at most one per interval over the span from the
    first to the last (database time), and PACE_SLACK more. Load only delays
    a renewal, so a busy machine never makes a correct count higher; a
    heartbeat that renews at its own default, or a replaced one still
    running, exceeds it."""
    asked_ms = ASKED_INTERVAL_FACTOR * ctx.env.heartbeat_ms
    time.sleep(max(0.0, takeover.heartbeat_started_at + PACE_WINDOW_S - time.time()))
    seen = renewals(takeover.heartbeat_mark)
    name = "B's heartbeat renews at the interval it was asked for"
    if len(seen) < 2:
        ctx.not_judged(
            name,
            expected=f"renewals of B's lease by B's session at most one per {asked_ms} ms",
            observed=f"not judged: {len(seen)} renewal(s) since the start, no span to count",
        )
        return
    span_s = (seen[-1]["at"] - seen[0]["at"]).total_seconds()
    allowed = int(span_s * 1000 // asked_ms) + PACE_SLACK
    ctx.invariant(
        name,
        len(seen) <= allowed,
        expected=f"at most {allowed} renewal(s) of B's lease by B's session in {span_s:.2f} s "
        f"(database time, first to last): one per the {asked_ms} ms interval_ms B's heartbeat "
        f"was started with, and {PACE_SLACK} more (contract section 5, heartbeat)",
        observed=f"{len(seen)} renewal(s), gaps (ms) "
        + str(
            [
                round((b["at"] - a["at"]).total_seconds() * 1000)
                for a, b in itertools.pairwise(seen)
            ][:40]
        ),
    )


def _stop_reports_no_cancel(
    ctx: ExperimentContext, reply: dict[str, Any], before: list[dict[str, Any]], since: float
) -> None:
    """The stop's ``cancelled`` (where the system answers one) says whether a
    refused or unconfirmed renewal cancelled the lease's work. B's renewals
    were confirmed (the audit trail has them and the lease is B's): true
    there is a worker that reports its own stop as a cancel. A renewal can
    time out on a busy machine, so this is progress, excused by a measured
    stall or starvation within the interval before the stop."""
    if "cancelled" not in reply:
        return
    ctx.progress(
        "B's heartbeat stop reports no cancelled work",
        reply["cancelled"] is False,
        expected="cancelled false: B's renewals were confirmed (renewals by B's session in the "
        "audit trail, its lease live) and none was refused (contract section 5, heartbeat)",
        observed=f"stop answered {plain(reply)}; {len(before)} renewal(s) by B before it",
        since=since,
        until=time.time(),
    )


def _holds_the_stop(ctx: ExperimentContext) -> bool:
    """R[fast] holds B's heartbeat at before_renew while its stop arrives where
    the system offers the heartbeat op and hosts the point (every contract
    worker does; a mapped system may not, and is judged on the plain stop,
    with no need declared)."""
    caps = ctx.system.capabilities
    return ctx.variant == "fast" and caps.offers_op("heartbeat") and caps.hosts("before_renew")


def _stop_while_held(
    ctx: ExperimentContext,
    b: WorkerProcess,
    stop: dict[str, Any],
    renewals: Callable[[int], list[dict[str, Any]]],
    window_s: float,
) -> bool:
    """The stop arrives while B's heartbeat has woken for its next renewal but
    not begun it (held at ``before_renew``, as a descheduled thread would be):
    once the stop has answered, that renewal must never be sent; a heartbeat
    that renews without looking again at its stop flag extends a lease its
    holder gave up (B's lease is long enough to be live still, whatever the
    stop waited). False when the state was not reached (the caller judges
    the plain stop instead)."""
    ctx.arm(b.worker_id, "before_renew", Hold(), times=1)
    try:
        ctx.reached(b.worker_id, "before_renew", timeout_s=5.0, held=True)
    except Inconclusive:
        ctx.command("B's heartbeat never reached before_renew within 5 s: a plain stop")
        return False
    pending = ctx.op_async(b, "heartbeat", stop)
    # A stop that waits for the heartbeat's thread answers only once it goes on.
    answered = seen_within(
        pending.done, what="B's heartbeat stop to answer while its heartbeat is held", timeout_s=8
    )
    mark = checkers.audit_mark(ctx)
    ctx.release(b.worker_id, "before_renew")
    reply = pending.result(15)
    if not answered:
        ctx.command("B's heartbeat stop answered only once its heartbeat went on: a plain stop")
        return False
    time.sleep(ctx.env.heartbeat_timeout_ms / 1000 + window_s)
    after = renewals(mark)
    ctx.invariant(
        "no renewal after heartbeat stop",
        reply.ok and not after,
        expected="the stop answered while B's heartbeat was held before a renewal; no renewal of "
        f"the lease by B's session from that answer, for one renewal timeout and {window_s:.1f} s "
        "after the heartbeat was let go",
        observed=f"stop {'ok' if reply.ok else reply.error}; {len(after)} renewal(s): "
        f"{[(c['seq'], str(c['at'])) for c in after] or 'none'}",
    )
    return True


def _lease_state(ctx: ExperimentContext, run_id: str) -> dict[str, Any]:
    rows = ctx.env.query(
        "SELECT owner, epoch, revision, status, lease_expires_at > clock_timestamp() AS live,"
        " (SELECT count(*) FROM fencecheck_model.agent_checkpoints c WHERE c.run_id = r.run_id) AS checkpoints,"
        " (SELECT count(*) FROM fencecheck_model.outbox o WHERE o.run_id = r.run_id) AS events,"
        " (SELECT count(*) FROM fencecheck_model.tool_operations t WHERE t.run_id = r.run_id) AS operations"
        " FROM fencecheck_model.agent_runs r WHERE r.run_id = %s",
        [run_id],
    )
    if not rows:
        raise Inconclusive(f"run {run_id} is not in agent_runs")
    return rows[0]


def _held_by(state: dict[str, Any], grant: dict[str, Any]) -> bool:
    return bool(state["live"]) and (state["owner"], state["epoch"]) == (
        grant["owner"],
        grant["epoch"],
    )


_KEPT = ("owner", "epoch", "revision", "status", "checkpoints", "events", "operations")


def _moved(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (before[k], after[k]) for k in _KEPT if before[k] != after[k]}


def _what(late: list[dict[str, Any]], moved: dict[str, tuple[Any, Any]]) -> str:
    parts = [f"{c['op']} {c['tbl']} (audit seq {c['seq']})" for c in late]
    parts += [f"{k} {a} -> {b}" for k, (a, b) in moved.items()]
    return ", ".join(parts)
