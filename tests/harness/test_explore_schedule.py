"""The schedule format: YAML round trip, errors that name the field, generated
schedules always valid, and the coverage table counting only faults in effect."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness.cli import main as cli_main
from harness.cli.explore import duration
from harness.explore import schedule as sched
from harness.explore.campaign import ScheduleResult
from harness.explore.coverage import Coverage
from harness.explore.generate import Shape, schedules
from harness.explore.nemesis import Effect
from harness.verdict import Verdict

HAND_WRITTEN = """
workers: 3
runs:
  - {tool: idem}
  - {tool: plain, extra_steps: 1}
actions:
  - {action: cancel, run: 1, at_ms: 300}
faults:
  - {kind: pause, worker: 0, at_ms: 200, duration_ms: 1500}
  - {kind: pause, worker: any, point: after_checkpoint_commit, duration_ms: 1500}
  - {kind: crash_at, worker: any, point: after_dispatch_claim_commit}
  - {kind: hold, worker: 1, point: after_lease_acquired, duration_ms: 900, then: crash}
  - {kind: link, link: pg, worker: 2, fault: blackhole, at_ms: 400, duration_ms: 600}
  - {kind: tool, mode: drop_after_act, tool: idem}
"""


def test_a_hand_written_schedule_loads_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HAND_WRITTEN)
    loaded = sched.load(path)
    assert loaded.workers == 3 and len(loaded.runs) == 2 and len(loaded.faults) == 6
    assert loaded.faults[1].point == "after_checkpoint_commit"
    assert loaded.size == 3 + 2 + 1 + 6
    again = sched.load(sched.write(tmp_path / "again.yaml", loaded))
    assert again == loaded


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("workers: 0\nruns: [{}]", "schedule.workers"),
        ("runs: []", "schedule.runs"),
        ("runs: [{tool: hammer}]", "runs[0].tool"),
        ("runs: [{}]\nfaults: [{kind: pause, worker: 7}]", "faults[0].worker"),
        ("runs: [{}]\nfaults: [{kind: crash_at, point: nowhere}]", "faults[0].point"),
        ("runs: [{}]\nfaults: [{kind: crash_at, point: before_commit}]", "stepped"),
        ("runs: [{}]\nfaults: [{kind: link, link: pg, fault: melt}]", "faults[0].fault"),
        ("runs: [{}]\nactions: [{action: cancel, run: 3}]", "actions[0].run"),
        ("runs: [{}]\nsurprise: 1", "surprise"),
        ("- just a list", "mapping"),
    ],
)
def test_a_bad_schedule_names_the_field(tmp_path: Path, text: str, names: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(sched.ScheduleError, match=names.replace("[", r"\[").replace("]", r"\]")):
        sched.load(path)


def test_replay_of_a_bad_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("runs: [{tool: hammer}]")
    assert cli_main(["replay", str(path)]) == 64
    assert "runs[0].tool" in capsys.readouterr().err


@settings(max_examples=10, suppress_health_check=list(HealthCheck), deadline=None)
@given(schedules(Shape()))
def test_every_generated_schedule_is_valid_data(schedule: sched.Schedule) -> None:
    assert sched.from_dict(sched.to_dict(schedule)) == schedule
    assert schedule.faults, "a schedule without a fault proves nothing"
    assert 2 <= schedule.workers <= 6


def test_durations() -> None:
    assert duration("90") == 90 and duration("90s") == 90
    assert duration("10m") == 600 and duration("1h") == 3600


def test_coverage_counts_only_faults_in_effect() -> None:
    cov = Coverage()
    cov.add(
        [
            Effect(
                0,
                "crash_at wany@after_checkpoint_commit",
                "crash_at",
                "after_checkpoint_commit",
                True,
                "hit",
            ),
            Effect(
                1, "pause w0", "pause", None, True, "stopped", after_point="after_lease_acquired"
            ),
            Effect(2, "tool reject_429", "tool", None, False, "never fired"),
        ]
    )
    table = cov.table()
    assert "after_checkpoint_commit" in table and "after_lease_acquired" in table
    assert "drawn but not in effect (not counted above): tool 1" in table
    assert cov.as_dict()["not_in_effect"] == {"tool": 1}


def _result(verdict: Verdict, reason: str, took: bool = True) -> ScheduleResult:
    schedule = sched.Schedule(runs=(sched.Run(),), faults=(sched.Fault(kind="kill"),))
    effect = Effect(0, "kill w0", "kill", None, took, "reaped" if took else "not running")
    return ScheduleResult("X-s0001", schedule, verdict, reason, [effect], None, 1.0)


def test_a_schedule_is_counted_by_its_verdict_and_its_faults() -> None:
    broken = "global invariant broken: write.revisions_gapless; lease.one_owner_per_epoch (the experiment itself: pass: ok)"
    fail = _result(Verdict.FAIL, broken, took=False)
    assert fail.category == "fail"  # a broken invariant is a fail even if a fault missed
    assert fail.broken == ["write.revisions_gapless", "lease.one_owner_per_epoch"]
    assert (
        _result(Verdict.UNKNOWN, "fault did not take effect: x", took=False).category == "no_effect"
    )
    assert _result(Verdict.UNKNOWN, "inconclusive: interrupted").category == "unknown"
    assert _result(Verdict.PASS, "every invariant held").category == "pass"
    assert _result(Verdict.PASS, "every invariant held").broken == []


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schedules(Shape()))
def test_a_drawn_stale_holder_always_has_a_takeover_to_speak_after(
    schedule: sched.Schedule,
) -> None:
    """A stale holder whose schedule has no fault that surely makes a takeover
    gets one (a worker frozen at a run-side point past its lease): without
    it, its lease never goes stale and the fault never takes effect."""
    from harness.explore.generate import _makes_a_takeover

    if any(f.kind == "stale" for f in schedule.faults):
        assert any(_makes_a_takeover(f, schedule.lease_ttl_ms) for f in schedule.faults)


def test_the_takeover_added_for_a_stale_holder_takes_a_free_point() -> None:
    from harness.explore.generate import _stale_needs_a_takeover

    stale = sched.Fault(kind="stale", run=0, op="renew", at_ms=300)
    short = sched.Fault(
        kind="pause", worker=sched.ANY, point="after_lease_acquired", duration_ms=200
    )
    drawn = _stale_needs_a_takeover([stale, short], 800, "fast")
    assert drawn[:2] == [stale, short]
    (added,) = drawn[2:]
    assert (added.kind, added.point, added.duration_ms) == (
        "pause",
        "after_checkpoint_commit",
        1600,
    )
    # A schedule that already makes one (a crash at a run-side point) gets none.
    crash = sched.Fault(kind="crash_at", worker=sched.ANY, point="after_outbound_intent_commit")
    assert _stale_needs_a_takeover([stale, crash], 800, "fast") == [stale, crash]
