"""Hypothesis strategies that draw schedules: the schedule is the example.

Every list and number is drawn so that Hypothesis's shrinking moves towards a
simpler schedule: fewer workers, runs, actions and faults, earlier moments,
shorter durations, and the first option of each choice (the simplest tool,
the first injection point).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from harness.explore.schedule import (
    ANY,
    LINK_FAULTS,
    POINTS,
    RELAY,
    STALE_OPS,
    STEPPED_ONLY_POINTS,
    TOOL_MODES,
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
    draw: st.DrawFn, workers: int, runs: int, write_path: str, lease_ms: int, tools: tuple[str, ...]
) -> Fault:
    """One nemesis step of any kind."""
    worker = st.integers(0, workers - 1)
    points = [p for p in POINTS if write_path == "stepped" or p not in STEPPED_ONLY_POINTS]
    kind = draw(st.sampled_from(("pause", "crash_at", "kill", "stale", "link", "hold", "tool")))
    if kind == "stale":
        on_takeover = draw(st.booleans())
        return Fault(
            kind="stale",
            run=draw(st.one_of(st.just(ANY), st.integers(0, runs - 1))),
            op=draw(st.sampled_from(STALE_OPS)),
            point="after_lease_acquired" if on_takeover else None,
            at_ms=0 if on_takeover else draw(_moment()),
        )
    if kind == "pause":
        at_point = draw(st.sampled_from([None, *points[:6]]))
        if at_point is not None:  # frozen right where a stale holder does harm
            return Fault(
                kind="pause",
                worker=draw(st.one_of(st.just(ANY), worker)),
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
        who = draw(st.one_of(st.just(ANY), worker))
        if point == "after_broker_ack_before_outbox_mark":
            who = RELAY
        return Fault(kind="crash_at", worker=who, point=point)
    if kind == "hold":
        point = draw(
            st.sampled_from([p for p in points if p != "after_broker_ack_before_outbox_mark"])
        )
        return Fault(
            kind="hold",
            worker=draw(st.one_of(st.just(ANY), worker)),
            point=point,
            duration_ms=draw(_pause_duration(lease_ms)),
            then=draw(st.sampled_from(("release", "crash"))),
        )
    if kind == "link":
        fault = draw(st.sampled_from(LINK_FAULTS))
        link = draw(st.sampled_from(("pg", "tool")))
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
    return Fault(
        kind="tool",
        mode=mode,
        tool=draw(st.sampled_from(("*", *tools))),  # a tool some run calls
        count=draw(st.integers(1, 3)),
        at_ms=draw(st.one_of(st.just(0), _moment())),
        duration_ms=draw(st.integers(1, 40).map(lambda n: n * 50))
        if mode in ("hang", "delay")
        else 0,
    )


@st.composite
def schedules(draw: st.DrawFn, shape: Shape = Shape()) -> Schedule:
    """A whole schedule within ``shape``."""
    workers = draw(st.integers(shape.min_workers, shape.max_workers))
    tenants = draw(st.integers(1, min(2, workers)))
    write_path = draw(st.sampled_from(("fast", "stepped")))
    runs = draw(
        st.lists(
            st.builds(
                Run,
                tool=st.sampled_from(TOOLS),
                tenant=st.integers(0, tenants - 1),
                extra_steps=st.integers(0, 2),
                step_delay_ms=st.integers(0, 6).map(lambda n: n * 50),
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
                tuple(t for t in TOOLS if any(r.tool == t for r in runs)),
            ),
            min_size=1,
            max_size=shape.max_faults,
        )
    )
    return Schedule(
        workers=workers,
        tenants=tenants,
        runs=tuple(runs),
        actions=tuple(actions),
        faults=tuple(drawn),
        write_path=write_path,
        lease_ttl_ms=shape.lease_ttl_ms,
    )
