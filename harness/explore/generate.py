"""Hypothesis strategies that draw schedules: the schedule is the example.

Every list and number is drawn so that Hypothesis's shrinking moves towards a
simpler schedule: fewer workers, runs, actions and faults, earlier moments,
shorter durations, and the first option of each choice (the simplest tool,
the first injection point).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from harness.contract.state_space import contract_space
from harness.explore.schedule import (
    ANY,
    LINK_FAULTS,
    POINTS,
    RELAY,
    STALE_OPS,
    STEPPED_ONLY_POINTS,
    TOOL_MODES,
    TOOL_MODES_WITH_MS,
    TOOLS,
    ControlAction,
    Fault,
    Run,
    Schedule,
)

LEASE_TTL_MS = 800
HORIZON_MS = 3000  # faults and actions are drawn within the first 3 s


@dataclass(frozen=True)
class Shape:
    """The bounds a campaign draws within (the benchmark fixes workers and runs)."""

    min_workers: int = 2
    max_workers: int = 6
    min_runs: int = 2
    max_runs: int = 8
    max_faults: int = 4
    max_actions: int = 2
    #: Cells of the state space the contract machine aims at per schedule.
    max_aims: int = 4
    lease_ttl_ms: int = LEASE_TTL_MS


def _moment() -> st.SearchStrategy[int]:
    return st.integers(0, HORIZON_MS // 50).map(lambda n: n * 50)


def _pause_duration(lease_ms: int) -> st.SearchStrategy[int]:
    # Shorter than the lease (the holder must keep it) or well past it (a
    # successor must be able to take over while the holder is frozen).
    short = st.integers(max(1, lease_ms // 4 // 50), max(1, lease_ms // 2 // 50)).map(
        lambda n: n * 50
    )
    long = st.integers(lease_ms * 3 // 2 // 50, lease_ms * 3 // 50).map(lambda n: n * 50)
    return st.one_of(short, long)


@st.composite
def faults(
    draw: st.DrawFn,
    workers: int,
    runs: int,
    write_path: str,
    lease_ms: int,
    tools: dict[str, int],
    replication: str = "none",
) -> Fault:
    """One nemesis step of any kind; ``tools``: how many runs call each tool."""
    worker = st.integers(0, workers - 1)
    points = [p for p in POINTS if write_path == "stepped" or p not in STEPPED_ONLY_POINTS]
    kinds = ("pause", "crash_at", "kill", "stale", "link", "hold", "tool")
    kind = draw(st.sampled_from(kinds + (("failover",) if replication != "none" else ())))
    if kind == "failover":
        return Fault(kind="failover", at_ms=draw(_moment()))
    if kind == "stale":
        on_takeover = draw(st.booleans())
        return Fault(
            kind="stale",
            run=draw(st.one_of(st.just(ANY), st.integers(0, runs - 1))),
            op=draw(st.sampled_from(STALE_OPS)),
            point="after_lease_acquired" if on_takeover else None,
            at_ms=0 if on_takeover else draw(_moment()),
        )
    # A fault at a point goes to the first worker that reaches it: a named
    # worker may never get there (another one took the runs), and a schedule
    # whose fault never takes effect proves nothing.
    if kind == "pause":
        at_point = draw(st.sampled_from([None, *points[:6]]))
        if at_point is not None:  # frozen right where a stale holder does harm
            return Fault(
                kind="pause",
                worker=ANY,
                point=at_point,
                duration_ms=draw(_pause_duration(lease_ms)),
            )
        return Fault(
            kind="pause",
            worker=draw(worker),
            at_ms=draw(_moment()),
            duration_ms=draw(_pause_duration(lease_ms)),
        )
    if kind == "kill":
        return Fault(kind="kill", worker=draw(worker), at_ms=draw(_moment()))
    if kind == "crash_at":
        point = draw(st.sampled_from(points))
        who: int | str = ANY
        if point == "after_broker_ack_before_outbox_mark":
            who = RELAY
        return Fault(kind="crash_at", worker=who, point=point)
    if kind == "hold":
        point = draw(
            st.sampled_from([p for p in points if p != "after_broker_ack_before_outbox_mark"])
        )
        return Fault(
            kind="hold",
            worker=ANY,
            point=point,
            duration_ms=draw(_pause_duration(lease_ms)),
            then=draw(st.sampled_from(("release", "crash"))),
        )
    if kind == "link":
        fault = draw(st.sampled_from(LINK_FAULTS))
        link = draw(
            st.sampled_from(("pg", "tool", *(("replication",) if replication != "none" else ())))
        )
        return Fault(
            kind="link",
            link=link,
            fault=fault,
            worker=draw(worker) if link == "pg" else 0,
            at_ms=draw(_moment()),
            duration_ms=draw(st.integers(2, 40).map(lambda n: n * 50)),
            latency_ms=draw(st.integers(1, 20).map(lambda n: n * 50)) if fault == "latency" else 0,
        )
    mode = draw(st.sampled_from(TOOL_MODES))
    # Armed before any create, on the k-th create of a tool some run calls (k
    # at most the number of runs calling it): a fault armed at a moment after
    # the last create, or past the creates that come, never fires.
    tool = draw(st.sampled_from(("*", *tools)))
    return Fault(
        kind="tool",
        mode=mode,
        tool=tool,
        count=draw(st.integers(1, 3)),
        skip=draw(st.integers(0, max(0, (runs if tool == "*" else tools[tool]) - 1))),
        at_ms=0,
        duration_ms=draw(st.integers(1, 40).map(lambda n: n * 50))
        if mode in TOOL_MODES_WITH_MS
        else 0,
    )


@st.composite
def schedules(draw: st.DrawFn, shape: Shape = Shape()) -> Schedule:
    """A whole schedule within ``shape``."""
    workers = draw(st.integers(shape.min_workers, shape.max_workers))
    tenants = draw(st.integers(1, min(2, workers)))
    write_path = draw(st.sampled_from(("fast", "stepped")))
    # A standby of the schedule's own now and then (it costs a pair of
    # servers): failover and faults on the standby-to-primary link.
    replication = "none"
    if draw(st.integers(0, 5)) == 5:
        replication = draw(st.sampled_from(("async", "sync")))
    runs = draw(
        st.lists(
            st.builds(
                Run,
                tool=st.sampled_from(TOOLS),
                tenant=st.integers(0, tenants - 1),
                extra_steps=st.integers(0, 2),
                step_delay_ms=st.integers(0, 6).map(lambda n: n * 50),
                # A small budget now and then: a run that spends it is paused
                # for a human, a state only a running workflow reaches.
                max_attempts=st.one_of(st.none(), st.integers(1, 3)),
            ),
            min_size=shape.min_runs,
            max_size=shape.max_runs,
        )
    )
    actions = draw(
        st.lists(
            st.builds(
                ControlAction,
                action=st.sampled_from(("cancel", "retry", "late_callback")),
                run=st.integers(0, len(runs) - 1),
                at_ms=_moment(),
            ),
            max_size=shape.max_actions,
        )
    )
    drawn = draw(
        st.lists(
            faults(
                workers,
                len(runs),
                write_path,
                shape.lease_ttl_ms,
                {t: n for t in TOOLS if (n := sum(r.tool == t for r in runs))},
                replication,
            ),
            min_size=1,
            max_size=shape.max_faults,
            # One fault per injection point: a second one armed at the same
            # point replaced the first, which then never took effect.
            unique_by=_point_key,
        )
    )
    drawn = _stale_needs_a_takeover(drawn, shape.lease_ttl_ms, write_path)
    aims = draw(st.lists(st.sampled_from(aimable()), max_size=shape.max_aims, unique=True))
    return Schedule(
        workers=workers,
        tenants=tenants,
        runs=tuple(runs),
        actions=tuple(actions),
        faults=tuple(drawn),
        write_path=write_path,
        lease_ttl_ms=shape.lease_ttl_ms,
        aims=tuple(aims),
        replication=replication,
    )


def aimable() -> list[str]:
    """Every cell of the contract's state space not declared unreachable, in
    the contract's order: derived, so a new operation or state is drawn too."""
    return [c.id for c in contract_space().reachable()]


def _point_key(f: Fault) -> object:
    """What makes two faults collide: the same injection point of a fault the
    control socket answers there (a pause, a hold, a crash); nothing else."""
    if f.point is not None and f.kind in ("pause", "hold", "crash_at"):
        return ("point", f.point)
    if f.kind == "failover":  # the old primary is gone after the first
        return ("failover",)
    return object()


#: Run-side points: a worker there holds a lease (the relay's point is not one).
_LEASE_POINTS = tuple(p for p in POINTS if p != "after_broker_ack_before_outbox_mark")


def _makes_a_takeover(f: Fault, lease_ms: int) -> bool:
    """A fault that, once it takes effect, lets another worker take a run over:
    a holder frozen or held at a run-side point past its lease, or crashing
    there. (A kill, a timed pause or a link fault may land while the worker
    holds nothing, so they make no takeover for certain.)"""
    if f.point not in _LEASE_POINTS:
        return False
    if f.kind == "crash_at" or (f.kind == "hold" and f.then == "crash"):
        return True
    return f.kind in ("pause", "hold") and f.duration_ms > lease_ms


def _stale_needs_a_takeover(drawn: list[Fault], lease_ms: int, write_path: str) -> list[Fault]:
    """A stale holder speaks with a lease a takeover made stale (or one that
    expired with nobody renewing): in a schedule where no other fault surely
    makes a takeover, the first worker to reach a free run-side point is
    frozen past its lease, so a successor takes its run over (the stale
    holder's own takeover)."""
    if not any(f.kind == "stale" for f in drawn):
        return drawn
    if any(_makes_a_takeover(f, lease_ms) for f in drawn):
        return drawn
    used = {f.point for f in drawn if f.point is not None and f.kind != "stale"}
    free = [
        p
        for p in _LEASE_POINTS
        if p not in used and (write_path == "stepped" or p not in STEPPED_ONLY_POINTS)
    ]
    if not free:
        return drawn
    frozen = Fault(kind="pause", worker=ANY, point=free[0], duration_ms=lease_ms * 2)
    return [*drawn, frozen]
