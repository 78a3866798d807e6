"""S: every link x every fault kind that P, O and H do not already inject.

Cutting a link is the loud fault: connections close, new ones are refused,
every client notices at once. The quiet ones are what production meets and
what a timeout alone must catch: a link that silently black-holes (toxiproxy
``timeout`` toxic, timeout 0: the connection stays open and nothing comes
back), one that resets connections (``reset_peer``), and one that answers
later than the caller's timeout (``latency``). The table below is the whole
cross product of the three links and four kinds; each cell is a variant
here or names the experiment that covers it.

Two shapes of variant:

* **heartbeat** (``pg_*``, ``replication_blackhole``): A holds a dispatch
  claim at ``after_dispatch_claim_commit`` (the tool not called yet) when the
  fault starts. Its renewals now never answer (black hole; under synchronous
  replication, a commit waiting for a standby that hears nothing), are reset,
  or answer after the heartbeat timeout. The execution must be cancelled
  within the heartbeat timeout: judged from evidence, A's lease runs out by
  the database's clock (a renewal that answered late must not keep it
  alive), and once it has, A, released, sends nothing to the tool and writes
  nothing; a successor on a healthy link takes over and finishes.
* **blocked call** (``pg_blackhole_mid_step``): A's link black-holed right
  after a checkpoint commits, A let go at once into its next statement,
  which never answers. The heartbeat cancels the execution; A must still
  exit within its bound (a ``run --once`` worker whose run was cancelled),
  though its main thread is waiting on a dead connection: the link stays
  black-holed until A has exited.
* **tool call** (``tool_*``): A's one tool call meets the fault. A refused
  connection proves the request never left; a call that never answers, or
  whose connection is reset after the tool acted, or whose answer comes after
  A's timeout, is *unknown*: never a failure, never sent again without a
  promise (query or idempotency). With the ``plain`` tool (neither) the run
  is paused in doubt; with the ``queryable`` one A converges by query once
  the link is healthy again.

Every fault is confirmed by the harness's own probe through the link (a new
connection: refused, silent, reset, or answered after the latency) and by
what the server behind it logged (the audit trail, the tool's request log,
a backend waiting on ``SyncRep``). The global invariants judge the rest.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import Bound, ExperimentContext, ExperimentSpec, Inconclusive
from harness.parts.control import Hit, Hold
from harness.parts.link_probe import HTTP_HEALTH, PG_SSL_REQUEST, ProbeResult, probe
from harness.parts.processes import WorkerProcess
from harness.parts.toxiproxy import FaultRecord, Link
from scenarios.common import finish, finish_or_kill, new_run, seen_within, wait_claimable

LinkName = Literal["pg", "tool", "replication"]
Kind = Literal["cut", "blackhole", "reset", "latency"]
LINKS: tuple[LinkName, ...] = ("pg", "tool", "replication")
KINDS: tuple[Kind, ...] = ("cut", "blackhole", "reset", "latency")

# A's own tool-call timeout in the tool variants (FENCECHECK_TOOL_TIMEOUT_MS).
TOOL_TIMEOUT_MS = 400
# Latencies: longer than the timeout they must beat (heartbeat 300 ms, tool 400 ms).
PG_LATENCY_MS = 600
TOOL_LATENCY_MS = 1000
HOLD_POINT = "after_dispatch_claim_commit"
# pg_blackhole_mid_step holds A here before its link goes dark: its main
# thread's next act is a statement on that link.
BLOCKED_POINT = "after_checkpoint_commit"
# How long past one heartbeat interval plus the renewal timeout A is let go
# in the early variants. 0.1 s failed correct Go code twice on a loaded
# machine (its cancellation came 0.1-0.2 s late, spread over its threads'
# short waits): A gets a lease long enough for more slack, and a dispatch
# claim that is still live when it is let go and gone before its lease.
EARLY_SLACK_S = 0.35
# A's lease in the early variants: its last confirmed renewal came at most one
# interval before the fault, so it runs out no sooner than 1.45 s after it,
# well after A is let go (at most 0.8 s).
EARLY_LEASE_TTL_MS = 1600
# A's dispatch claim there: taken just before the fault, live when A is let
# go (a heartbeat that does not cancel must show as a request), expired
# before the lease (the successor meets it as before).
EARLY_DISPATCH_TTL_MS = 1200
OUTCOME_POINT = "after_dispatch_outcome_commit"
# A's dispatch claim in the tool variants: far longer than its call timeout,
# so a call bounded by the claim instead of FENCECHECK_TOOL_TIMEOUT_MS shows
# (seconds against 400 ms, not the default claim's 600 ms against 400).
TOOL_CLAIM_TTL_MS = 5000
# Past the call's timeout, for recording its outcome (one ledger write).
CALL_RECORD_SLACK_MS = 600


@dataclass(frozen=True)
class LinkFault:
    """One cell of the table: a link, a fault kind, and how the variant runs."""

    variant: str
    link: LinkName
    kind: Kind
    shape: Literal["heartbeat", "tool_call", "blocked_call"]
    fault: str
    wait_s: float
    tool: str = "idem"
    direction: str = "both"
    # Let A go on from its claim once its renewal timeout has passed, before
    # its lease can have expired: an execution the heartbeat did not cancel
    # in time sends its request then.
    release_early: bool = False

    @property
    def cell(self) -> tuple[LinkName, Kind]:
        return (self.link, self.kind)


FAULTS: tuple[LinkFault, ...] = (
    LinkFault(
        "pg_blackhole", "pg", "blackhole", "heartbeat",
        "A's link to PostgreSQL black-holed (both directions) while A holds a dispatch claim: "
        "its renewals never answer", 1.1,
    ),
    LinkFault(
        "pg_blackhole_early", "pg", "blackhole", "heartbeat",
        "A's link to PostgreSQL black-holed while A holds a dispatch claim, A let go on one "
        "heartbeat interval plus its renewal timeout later, before its lease can expire", 1.1,
        release_early=True,
    ),
    LinkFault(
        "pg_blackhole_mid_step", "pg", "blackhole", "blocked_call",
        "A's link to PostgreSQL black-holed right after a checkpoint of A's commits, A let go "
        "at once: its next statement and its renewals never answer, and the link stays "
        "black-holed until A has exited", 3.0,
    ),
    LinkFault(
        "pg_reset", "pg", "reset", "heartbeat",
        "A's link to PostgreSQL resets every connection on its next request while A holds a "
        "dispatch claim", 1.1,
    ),
    LinkFault(
        "pg_reset_early", "pg", "reset", "heartbeat",
        "A's link to PostgreSQL resets every connection on its next request while A holds a "
        "dispatch claim, A let go one heartbeat interval later, its claim still live: the "
        "renewal that met the reset failed at once", 1.1,
        release_early=True,
    ),
    LinkFault(
        "pg_latency", "pg", "latency", "heartbeat",
        f"answers on A's link to PostgreSQL delayed {PG_LATENCY_MS} ms, longer than the "
        "heartbeat timeout: each renewal lands, its answer comes too late", 1.1,
        direction="downstream",
    ),
    LinkFault(
        "replication_blackhole", "replication", "blackhole", "heartbeat",
        "the synchronous standby's replication link black-holed: A's renewal commits "
        "locally and waits for the standby forever", 1.1,
    ),
    LinkFault(
        "tool_cut", "tool", "cut", "tool_call",
        "the worker->tool link cut when A calls the tool: the connection is refused", 0.2,
        tool="plain",
    ),
    LinkFault(
        "tool_blackhole", "tool", "blackhole", "tool_call",
        f"the worker->tool link black-holed when A calls the tool: no answer within A's "
        f"{TOOL_TIMEOUT_MS} ms timeout, nothing reaches the tool", TOOL_TIMEOUT_MS / 1000,
        tool="plain",
    ),
    LinkFault(
        "tool_reset", "tool", "reset", "tool_call",
        "the worker->tool link resets the connection on the tool's answer: the tool acted, "
        "A sees only the reset", 0.0,
        tool="plain", direction="downstream",
    ),
    LinkFault(
        "tool_latency", "tool", "latency", "tool_call",
        f"the tool's answers delayed {TOOL_LATENCY_MS} ms, longer than A's "
        f"{TOOL_TIMEOUT_MS} ms timeout: the tool acted, A gave up first", TOOL_LATENCY_MS / 1000,
        tool="queryable", direction="downstream",
    ),
)  # fmt: skip

# The cells of LINKS x KINDS that another experiment injects, and why S need not.
COVERED_ELSEWHERE: dict[tuple[LinkName, Kind], str] = {
    ("pg", "cut"): "P (renewal partition) and O[request_lost] (link cut at COMMIT)",
    ("replication", "cut"): "H[async] (acknowledged writes lost) and H[sync_cancelled_wait]",
    ("replication", "latency"): "H[async_lag] (a streaming standby behind by a latency)",
    ("replication", "reset"): "a reset drops the walsender as a cut does (the primary sees the "
    "standby gone at once): H[async] and H[sync_cancelled_wait]",
}

BY_VARIANT = {f.variant: f for f in FAULTS}

SPEC = ExperimentSpec(
    id="S",
    title="link faults",
    seed_section="English seed §5.2, §7 (heartbeat timeout), §9.2, §9.3 (timeout is never "
    "failure), §10; Chinese seed §5, §6",
    invariant="a renewal that never answers, is reset, or answers after its timeout cancels "
    "the execution within the heartbeat timeout (the lease runs out, nothing written or sent "
    "afterwards, a successor finishes); a tool call that never answers is unknown, never a "
    "failure, never resent without a promise",
    fault="one link x fault kind per variant (black hole, reset, latency, cut) on the worker's "
    "link to PostgreSQL, its link to the tool, or the replication link",
    rules=(8, 5, 4, 11),
    injection_point=HOLD_POINT,
    needs=(
        *needs.capabilities("workflow", "ledger"),
        needs.point(HOLD_POINT),
        needs.point(BLOCKED_POINT, "pg_blackhole_mid_step"),
        needs.point(
            OUTCOME_POINT, *(f.variant for f in FAULTS if f.kind == "latency" and f.link == "tool")
        ),
    ),
    variants=tuple(f.variant for f in FAULTS),
    natural_wait_s=1.1,
    variant_waits=tuple((f.variant, f.wait_s) for f in FAULTS),
    variant_faults=tuple((f.variant, f.fault) for f in FAULTS),
    variant_replication=(("replication_blackhole", "sync"),),
    # A renewal that does not answer is the queue's; a tool call that does not
    # is the workflow's (its ledger says unknown).
    layer="queue",
    variant_layers=tuple((f.variant, "workflow") for f in FAULTS if f.shape == "tool_call"),
)


def run(ctx: ExperimentContext) -> None:
    fault = BY_VARIANT[ctx.variant or FAULTS[0].variant]
    if fault.shape == "heartbeat":
        _heartbeat(ctx, fault)
    elif fault.shape == "blocked_call":
        _blocked_call(ctx, fault)
    else:
        _tool_call(ctx, fault)


# ------------------------------------------------------------------ faults


def _start_fault(ctx: ExperimentContext, key: str, fault: LinkFault) -> FaultRecord:
    """Put ``fault`` on link ``key``; the toxiproxy journal keeps the record."""
    link = ctx.env.links[key]
    if fault.kind == "cut":
        record = link.cut()
    elif fault.kind == "blackhole":
        record = link.blackhole(fault.direction)
    elif fault.kind == "reset":
        record = link.reset(direction="upstream" if fault.direction == "both" else fault.direction)
    else:
        ms = PG_LATENCY_MS if fault.link == "pg" else TOOL_LATENCY_MS
        record = link.latency(ms, direction=fault.direction)
    ctx.command(f"toxiproxy: {record.detail}")
    return record


def _probe(ctx: ExperimentContext, link: Link, fault: LinkFault) -> ProbeResult:
    """The harness's own look at the link: a new connection through it."""
    request = HTTP_HEALTH if fault.link == "tool" else PG_SSL_REQUEST
    # Silence is judged after one second: a healthy server answers these in
    # microseconds, a loaded one in well under that.
    latency_ms = {"pg": PG_LATENCY_MS, "tool": TOOL_LATENCY_MS}.get(fault.link, 0)
    wait_s = 1.0 + (2 * latency_ms / 1000 if fault.kind == "latency" else 0.0)
    seen = probe(link, request, wait_s=wait_s)
    ctx.command(seen.describe())
    return seen


def _probe_shows(seen: ProbeResult, fault: LinkFault, at_least_ms: float) -> bool:
    """Did the probe meet the fault it was looking for?"""
    if fault.kind == "cut":
        return seen.outcome == "refused"
    if fault.kind == "blackhole":
        return seen.outcome == "silent"
    if fault.kind == "reset":
        return seen.outcome in ("reset", "closed")
    return seen.outcome == "answered" and seen.elapsed_ms >= at_least_ms


# --------------------------------------------------------------- heartbeat


def _heartbeat(ctx: ExperimentContext, fault: LinkFault) -> None:
    env = ctx.env
    run_id = new_run(ctx, tool="idem")
    env.add_pg_link("pg_A")
    env.add_pg_link("pg_B")
    key = "pg_A" if fault.link == "pg" else "replication"
    replication_before = env.primary.replication_status() if fault.link == "replication" else []
    ctx.arm("A", HOLD_POINT, Hold())
    early: dict[str, str | None] = {
        "FENCECHECK_LEASE_TTL_MS": str(EARLY_LEASE_TTL_MS),
        "FENCECHECK_DISPATCH_TTL_MS": str(EARLY_DISPATCH_TTL_MS),
    }
    a = env.start_worker(
        "A",
        "run",
        ["--run-id", run_id, "--once"],
        pg_link="pg_A",
        env=early if fault.release_early else None,
    )
    lease_ttl_s = (EARLY_LEASE_TTL_MS if fault.release_early else env.lease_ttl_ms) / 1000
    hit = ctx.reached("A", HOLD_POINT)
    epoch_a = checkers.run_row(ctx, run_id)["epoch"]
    record = _start_fault(ctx, key, fault)
    t0 = record.started_at
    alive = a.is_alive()
    # The probe looks while the heartbeat meets the fault (a silent link takes
    # the probe's whole wait): the two waits overlap.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
    looking = pool.submit(_probe, ctx, env.links[key], fault)
    sync_wait: list[dict[str, Any]] | None = None
    if fault.link == "replication":
        sync_wait = seen_within(
            lambda: env.query(
                "SELECT pid, wait_event, left(query, 80) AS query FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'A' "
                "AND wait_event = 'SyncRep'"
            ),
            what="a commit of A's (its renewal) to wait for the synchronous standby",
            timeout_s=10,
        )
        ctx.command(f"A's backends waiting on SyncRep: {sync_wait}")
    # The heartbeat must give up within its timeout. Its lease then runs out by
    # the database's clock; one that answered late and kept renewing would
    # keep it alive (the visible row: a renewal still waiting is not visible).
    hb_s = (env.heartbeat_ms + env.heartbeat_timeout_ms) / 1000
    # A reset fails the next renewal at once (an error, not a silence): that
    # renewal starts within one interval, and A is let go then, its dispatch
    # claim still live (blind hunt 14 #05: a renewal's error that killed the
    # heartbeat thread instead of cancelling A went unseen once the claim had
    # expired by the time A was let go).
    act_s = env.heartbeat_ms / 1000 if fault.kind == "reset" else hb_s
    released_at: float | None = None
    if fault.release_early:
        # The renewal in flight at t0 started at most one interval before; its
        # timeout has passed by now, and the lease (renewed at most then) has
        # not run out: a heartbeat that kept waiting has not cancelled A.
        time.sleep(max(0.0, t0 + act_s + EARLY_SLACK_S - time.time()))
        released_at = time.time()
        ctx.release("A", HOLD_POINT)
    bound_s = lease_ttl_s + 2 * hb_s + PG_LATENCY_MS / 1000 + 5
    ran_out = seen_within(
        lambda: env.query(
            "SELECT lease_expires_at < clock_timestamp() AS expired FROM fencecheck_model.agent_runs "
            "WHERE run_id = %s AND lease_expires_at < clock_timestamp()",
            [run_id],
        ),
        what=f"A's lease of run {run_id[:8]} to run out by database time",
        timeout_s=bound_s,
    )
    ctx.invariant(
        "A's heartbeat gave up: its lease ran out",
        bool(ran_out),
        expected=f"no renewal of A's keeps the lease alive once the fault is on (lease expired "
        f"by database time within {bound_s:.1f}s)",
        observed=f"expired: {bool(ran_out)}; {checkers.run_row(ctx, run_id, 'A lease after the fault')}",
    )
    seen = looking.result(timeout=30)
    pool.shutdown()
    if released_at is None:
        ctx.release("A", HOLD_POINT)
    code_a = finish_or_kill(ctx, a, 15)
    # A renewal sent just before the fault may land within its own call timeout.
    in_flight_s = env.heartbeat_timeout_ms / 1000
    after = checkers.changes_by(ctx, ["A"], since=t0)
    arrived = [r for r in after if not (r["renewal"] and r["at"].timestamp() <= t0 + in_flight_s)]
    confirmed = (
        alive
        and hit.epoch in (None, epoch_a)
        and _probe_shows(seen, fault, env.heartbeat_timeout_ms)
    )
    if fault.kind in ("blackhole", "reset") and fault.link == "pg":
        confirmed = confirmed and not arrived
    if fault.link == "replication":
        confirmed = (
            confirmed
            and bool(sync_wait)
            and any(r["sync_state"] == "sync" for r in replication_before)
        )
    ctx.fault(
        f"{fault.link} link {fault.kind} took effect while A held its claim",
        confirmed,
        expected=_expected_fault(fault),
        observed=f"A alive: {alive}; {seen.describe()}; changes by A after the fault "
        f"(renewals in flight aside): {[(r['seq'], r['tbl'], r['renewal']) for r in arrived]}"
        + (f"; SyncRep waits {sync_wait}" if fault.link == "replication" else ""),
    )
    late = [
        r
        for r in checkers.tool_requests(ctx, run_id=run_id)
        if r["epoch"] == epoch_a and r["received_at"] > t0
    ]
    if released_at is None:
        ctx.equal(
            "no side effect after the fault",
            [r["seq"] for r in late],
            [],
            what="tool requests with A's epoch received after the fault started",
        )
    else:
        # Timing decides here (the heartbeat had its timeout, A a CPU to act
        # on it): a stall in the window excuses, nothing else does.
        ctx.progress(
            "A's execution was cancelled within its renewal timeout",
            not late,
            expected=f"no tool request with A's epoch after the fault: A let go "
            f"{released_at - t0:.2f} s after it, past "
            + (
                f"one heartbeat interval ({act_s:.2f} s: a reset fails the renewal at once)"
                if fault.kind == "reset"
                else f"one heartbeat interval plus the renewal timeout ({act_s:.2f} s)"
            )
            + ", before its lease could run out",
            observed=f"requests {[(r['seq'], round(r['received_at'] - t0, 3)) for r in late]} "
            "(seconds after the fault)",
            since=t0,
            until=released_at,
            # A had EARLY_SLACK_S past its renewal timeout to act on it: only
            # A itself (or the harness) unable to run that long excuses it (a
            # bound excuses at half its length: runner.BOUND_SHARE).
            bound=Bound(a.pid, 2 * EARLY_SLACK_S),
        )
    _heal(ctx, key, fault)
    if not ran_out:
        return  # A still holds the lease: no successor can take over
    wait_claimable(ctx, run_id, timeout_s=15)
    b = env.start_worker("B", "run", ["--run-id", run_id, "--once"], pg_link="pg_B")
    code_b = finish(ctx, b, 30)
    row = checkers.run_row(ctx, run_id)
    ctx.progress(
        "a successor took over and finished",
        row["status"] == "succeeded" and row["epoch"] > epoch_a,
        expected=f"run succeeded at an epoch above {epoch_a}",
        observed=f"status {row['status']}, epoch {row['epoch']}, B exit {code_b}",
    )
    stray = [r for r in checkers.changes_by(ctx, ["A"], since=t0) if not r["renewal"]]
    ctx.invariant(
        "A's execution stopped at the fault",
        not stray,
        expected="no change by A in any contract table after the fault but lease renewals, "
        "until the end (link healed, the successor finished)",
        observed=f"changes by A {[(r['seq'], r['tbl'], r['op']) for r in stray]}; A exit "
        f"{code_a} (10 = cancelled)",
    )


def _blocked_call(ctx: ExperimentContext, fault: LinkFault) -> None:
    """A's execution is cancelled while its main thread waits on a statement
    that will never answer; A must exit within its bound anyway (blind bug
    hunt round 6, #05: a watchdog whose grace, in milliseconds, was read as
    seconds kept such a worker for twenty minutes)."""
    env = ctx.env
    run_id = new_run(ctx, tool="idem")
    env.add_pg_link("pg_A")
    ctx.arm("A", BLOCKED_POINT, Hold())
    a = env.start_worker("A", "run", ["--run-id", run_id, "--once"], pg_link="pg_A")
    ctx.reached("A", BLOCKED_POINT)
    alive = a.is_alive()
    record = _start_fault(ctx, "pg_A", fault)
    ctx.release("A", BLOCKED_POINT)
    seen = _probe(ctx, env.links["pg_A"], fault)
    # The bound of a cancelled `run --once` worker (contract: the experiment's
    # wait); missed, it is unmet progress named with its evidence.
    code = finish(ctx, a, 20.0)
    exited = time.time()
    ctx.fault(
        "A's link was black-holed from its release until it exited",
        alive and _probe_shows(seen, fault, env.heartbeat_timeout_ms),
        expected="A alive at its barrier when the black hole started; the probe through A's "
        "link silent; the link healed only after A's exit",
        observed=f"A alive: {alive}; {seen.describe()}; A exited {exited - record.started_at:.2f}s "
        f"after the fault, code {code}",
    )
    _heal(ctx, "pg_A", fault)
    stray = [
        r for r in checkers.changes_by(ctx, ["A"], since=record.started_at) if not r["renewal"]
    ]
    ctx.invariant(
        "nothing of A's reached the database after the fault",
        not stray,
        expected="no change by A in any contract table after the fault but lease renewals in "
        "flight",
        observed=f"changes by A {[(r['seq'], r['tbl'], r['op']) for r in stray]}",
    )


def _expected_fault(fault: LinkFault) -> str:
    if fault.link == "replication":
        return (
            "standby synchronous before the fault; the probe through the replication link "
            "silent; a commit of A's waiting on SyncRep"
        )
    what = {
        "blackhole": "silent (connected, nothing back)",
        "reset": "reset",
        "latency": "answered later than the heartbeat timeout",
    }[fault.kind]
    tail = "; no change by A reached the server after it" if fault.kind != "latency" else ""
    return f"A alive at its barrier when the fault started; the probe through A's link {what}{tail}"


def _heal(ctx: ExperimentContext, key: str, fault: LinkFault) -> None:
    ctx.heal(key)
    if fault.link != "replication":
        return
    # Bytes the black hole swallowed leave the old replication connection out of
    # step: drop it, let the standby connect anew, and wait until it is the
    # synchronous standby again (the waiting commits complete then).
    ctx.cut(key)
    ctx.heal(key)
    ctx.env.primary.wait_streaming("replica")
    seen_within(
        lambda: any(r["sync_state"] == "sync" for r in ctx.env.primary.replication_status()),
        what="the standby to be synchronous again",
        timeout_s=30,
    )
    ctx.command(f"replication after heal: {ctx.env.primary.replication_status()}")


# ---------------------------------------------------------------- tool call


def _tool_call(ctx: ExperimentContext, fault: LinkFault) -> None:
    env = ctx.env
    run_id = new_run(ctx, tool=fault.tool)
    # The fault is on, and confirmed by the harness's own probe, before A
    # claims its call: a probe through a slow link takes its whole latency,
    # and A holding its dispatch claim meanwhile would see the claim expire
    # and rightly send nothing (contract §2, a claim's deadline binds the call).
    record = _start_fault(ctx, "worker_tool", fault)
    seen = _probe(ctx, env.links["worker_tool"], fault)
    ctx.arm("A", HOLD_POINT, Hold())
    if fault.kind == "latency":
        ctx.arm("A", OUTCOME_POINT, Hold())
    a = env.start_worker(
        "A",
        "run",
        ["--run-id", run_id, "--once"],
        env={
            "FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS),
            "FENCECHECK_DISPATCH_TTL_MS": str(TOOL_CLAIM_TTL_MS),
        },
    )
    hit = _reached_or_stuck_in_a_call(ctx, a, HOLD_POINT, env.links["worker_tool"])
    if hit is None:
        return
    op_id = hit.operation_id
    ctx.release("A", HOLD_POINT)
    released_at = time.time()
    if fault.kind == "latency":
        # A gave up on the slow answer and recorded unknown; heal before it
        # reconciles, so its query reaches the tool.
        if (
            _reached_or_stuck_in_a_call(ctx, a, OUTCOME_POINT, env.links["worker_tool"], op_id)
            is None
        ):
            return
        status_at_outcome = [o["status"] for o in checkers.ledger(ctx, run_id)]
        ctx.heal("worker_tool")
        ctx.release("A", OUTCOME_POINT)
        code_a = finish_or_kill(ctx, a, 20)
    else:
        code_a = finish_or_kill(ctx, a, 20)
        status_at_outcome = [o["status"] for o in checkers.ledger(ctx, run_id)]
        ctx.heal("worker_tool")
    creates = checkers.tool_requests(ctx, run_id=run_id)
    during = [r for r in creates if r["received_at"] >= record.started_at]
    acted = [r for r in during if r["outcome"] in ("created", "replayed")]
    confirmed = _probe_shows(seen, fault, TOOL_LATENCY_MS) and op_id is not None
    if fault.kind in ("cut", "blackhole"):
        confirmed = confirmed and not during
        tool_saw = "no create for the run reached the tool while the fault held"
    else:
        confirmed = confirmed and len(acted) == 1
        tool_saw = "the tool logged the one create and acted on it"
    if fault.kind == "latency":
        confirmed = confirmed and status_at_outcome == ["unknown"]
        tool_saw += "; A had recorded the operation unknown (its timeout came first)"
    ctx.fault(
        f"tool link {fault.kind} took effect on A's call",
        confirmed,
        expected=f"the probe through the tool link {_TOOL_PROBE[fault.kind]}; {tool_saw}",
        observed=f"{seen.describe()}; creates after the fault "
        f"{[(r['seq'], r['outcome']) for r in during]}; ledger when A's call ended "
        f"{status_at_outcome}; A exit {code_a}",
    )
    _call_ended_within_its_timeout(ctx, a, op_id, released_at)
    if fault.kind == "cut":
        _after_refused(ctx, run_id)
    elif fault.kind == "latency":
        _after_late_answer(ctx, run_id, op_id, creates)
    else:
        _after_no_answer(ctx, run_id, creates, code_a)


def _reached_or_stuck_in_a_call(
    ctx: ExperimentContext, a: WorkerProcess, point: str, link: Link, op_id: str | None = None
) -> Hit | None:
    """A reaching ``point``; or, when it does not, whether its tool call
    outlived FENCECHECK_TOOL_TIMEOUT_MS: its connection to the tool's link
    still open across the check (the kernel's socket table), or its claim
    ended by the slow answer recorded as its result, later than the timeout
    after the claim (the audit trail). Then the bound it broke is judged
    (progress: a stall or starvation in the window excuses it) and None is
    returned; otherwise not reaching the point stays inconclusive."""
    try:
        return ctx.reached("A", point, timeout_s=15)
    except Inconclusive:
        stuck = checkers.calls_outliving(ctx, a, link.listen_port, TOOL_TIMEOUT_MS)
        waited = _answer_taken_late(ctx, op_id) if op_id and not stuck else None
        if not stuck and waited is None:
            raise
    ctx.progress(
        "A's tool call ended within its timeout",
        False,
        expected=f"a call without an answer ends (unknown) within FENCECHECK_TOOL_TIMEOUT_MS = "
        f"{TOOL_TIMEOUT_MS} ms (contract: S)",
        observed=f"A did not reach {point} in 15 s; "
        + (
            f"it still held {stuck} to the tool's link, open across the check (kernel socket table)"
            if stuck
            else f"it recorded the tool's answer as its result {waited:.0f} ms after its claim "
            "(audit trail): it waited past its timeout"
        ),
    )
    return None


def _call_ended_within_its_timeout(
    ctx: ExperimentContext, a: WorkerProcess, op_id: str | None, released_at: float
) -> None:
    """A's first record of the call's outcome (the audit trail's first change
    of the operation by A that ends its claim) within FENCECHECK_TOOL_TIMEOUT_MS
    of A being let go to make the call, plus room for that one write: a call
    bounded by anything longer (the claim's deadline, a default) breaks the
    contract's bound on tool calls. A's own slowness in that window excuses
    it (progress); a stuck call that never ended was judged on the way."""
    rows = ctx.sql(
        "A's first record of the call's outcome (audit trail)",
        "SELECT extract(epoch FROM at)::float8 AS at, new->>'status' AS status "
        "FROM fencecheck_audit.changes WHERE tbl = 'tool_operations' AND app = 'A' "
        "AND new->>'operation_id' = %s AND old->>'status' = 'dispatching' "
        "AND new->>'status' <> 'dispatching' ORDER BY seq LIMIT 1",
        [op_id],
    )
    if not rows:
        ctx.not_judged(
            "A's tool call ended within FENCECHECK_TOOL_TIMEOUT_MS",
            expected="judged once A records the call's outcome",
            observed=f"A recorded no outcome of {op_id}",
        )
        return
    ended_at, status = float(rows[0]["at"]), rows[0]["status"]
    took_ms = (ended_at - released_at) * 1000
    limit_ms = TOOL_TIMEOUT_MS + CALL_RECORD_SLACK_MS
    ctx.progress(
        "A's tool call ended within FENCECHECK_TOOL_TIMEOUT_MS",
        took_ms <= limit_ms,
        expected=f"the call's outcome recorded within {TOOL_TIMEOUT_MS} ms (its timeout) + "
        f"{CALL_RECORD_SLACK_MS} ms (the record) of A being let go to make it; its claim "
        f"lasts {TOOL_CLAIM_TTL_MS} ms and must not be what ends the call",
        observed=f"{status} recorded {took_ms:.0f} ms after A was let go",
        since=released_at,
        until=ended_at,
        bound=Bound(a.pid, limit_ms / 1000),
    )


def _answer_taken_late(ctx: ExperimentContext, op_id: str) -> float | None:
    """Milliseconds from A's dispatch claim of ``op_id`` to A's recording of
    the tool's answer, when A recorded one more than the timeout (plus 200 ms
    of slack) after its claim; else None."""
    rows = ctx.sql(
        "A's claim and result of the operation (audit trail)",
        "SELECT extract(epoch FROM at)::float8 AS at, app, new->>'status' AS status "
        "FROM fencecheck_audit.changes WHERE tbl = 'tool_operations' "
        "AND new->>'operation_id' = %s ORDER BY seq",
        [op_id],
    )
    claimed = [r["at"] for r in rows if r["app"] == "A" and r["status"] == "dispatching"]
    recorded = [r["at"] for r in rows if r["app"] == "A" and r["status"] == "succeeded"]
    if not claimed or not recorded:
        return None
    waited_ms = (recorded[0] - claimed[-1]) * 1000
    return waited_ms if waited_ms > TOOL_TIMEOUT_MS + 200 else None


_TOOL_PROBE = {
    "cut": "refused",
    "blackhole": "silent",
    "reset": "reset",
    "latency": f"answered after at least {TOOL_LATENCY_MS} ms",
}


def _after_no_answer(
    ctx: ExperimentContext, run_id: str, creates: list[dict[str, Any]], code_a: int | str
) -> None:
    """Black hole or reset, tool without query or idempotency: in doubt for good."""
    ledger = checkers.ledger(ctx, run_id)
    row = checkers.run_row(ctx, run_id)
    ctx.equal(
        "a call without an answer is unknown, never a failure",
        [(o["step_id"], o["status"]) for o in ledger],
        [("create_label", "unknown")],
        what="the tool step's ledger",
    )
    ctx.invariant(
        "nothing can learn the outcome: the run is paused in doubt",
        row["status"] == "paused_indoubt",
        expected="paused_indoubt (the tool offers neither query nor idempotency)",
        observed=f"status {row['status']}; A exit {code_a} (11 = frozen in doubt)",
    )
    ctx.invariant(
        "never resent without a promise",
        len(creates) <= 1,
        expected="at most the one create A sent",
        observed=f"creates {[(r['seq'], r['epoch'], r['outcome']) for r in creates]}",
    )


def _after_refused(ctx: ExperimentContext, run_id: str) -> None:
    """A refused connection proves nothing was sent: whatever the worker made of
    it, the run ends with the effect done once (or in doubt with none done)."""
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b, 30)
    row = checkers.run_row(ctx, run_id)
    resources = checkers.tool_resources(ctx, run_id=run_id)
    done = row["status"] == "succeeded" and len(resources) == 1
    held = row["status"] == "paused_indoubt" and not resources
    ctx.invariant(
        "after the link healed the effect happened exactly once",
        done or held,
        expected="run succeeded with one real resource (or paused in doubt with none)",
        observed=f"status {row['status']}, resources {len(resources)}, B exit {code_b}",
    )


def _after_late_answer(
    ctx: ExperimentContext, run_id: str, op_id: str | None, creates: list[dict[str, Any]]
) -> None:
    """The tool acted, A's timeout came first: converged by query, never resent."""
    row = checkers.run_row(ctx, run_id)
    ledger = checkers.ledger(ctx, run_id)
    resources = checkers.tool_resources(ctx, run_id=run_id)
    queries = [q for q in checkers.tool_log(ctx)["queries"] if q.get("operation_id") == op_id]
    ctx.invariant(
        "the late outcome converged by query, never by a resend",
        len(creates) == 1
        and [(o["status"], o["remote_id"]) for o in ledger]
        == [("succeeded", r["resource_id"]) for r in resources]
        and any(q.get("outcome") == "found" for q in queries),
        expected="one create; the operation succeeded with the tool's resource id after a "
        "query that found it",
        observed=f"creates {[(r['seq'], r['outcome']) for r in creates]}; "
        f"ledger {[(o['status'], o['remote_id']) for o in ledger]}; resources "
        f"{[r['resource_id'] for r in resources]}; queries "
        f"{[(q.get('seq'), q.get('outcome')) for q in queries]}",
    )
    # The run's end is progress, not safety: on a loaded machine (CI, the
    # container stage beside the suite) A ran past its wait with the run still
    # running, the convergence right; that was judged a broken invariant.
    ctx.progress_equal(
        "the run succeeded after the convergence", row["status"], "succeeded", what="run status"
    )


def table_gaps() -> list[str]:
    """Cells of LINKS x KINDS that are neither a variant here nor covered
    elsewhere, or that are both (empty when the table is whole)."""
    here = {f.cell for f in FAULTS}
    elsewhere = set(COVERED_ELSEWHERE)
    gaps = [
        f"{lk} x {k}: nowhere" for lk in LINKS for k in KINDS if (lk, k) not in here | elsewhere
    ]
    gaps += [f"{lk} x {k}: here and elsewhere" for lk, k in sorted(here & elsewhere)]
    return gaps
