"""Run one schedule file again, ``repeat`` times, with the same evidence as a
campaign writes (an archive per run, the schedule beside it).

Steps tied to injection points replay exactly (the control socket forces
them); steps at a moment replay at the same offset from the first point a
worker reached, so timing can differ under load: the count of runs that
failed again is the measure of reproduction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.engine.environment import SharedServices
from harness.explore import schedule as sched
from harness.explore.campaign import ScheduleResult, run_schedule


@dataclass
class ReplayOutcome:
    schedule: sched.Schedule
    results: list[ScheduleResult]

    @property
    def reproduced(self) -> int:
        return sum(1 for r in self.results if r.category == "fail")

    def exit_code(self) -> int:
        """1 when any replay broke an invariant, 0 when every one passed, else 2."""
        if self.reproduced:
            return 1
        return 0 if all(r.category == "pass" for r in self.results) else 2


def replay(
    shared: SharedServices,
    schedule: sched.Schedule,
    *,
    repeat: int,
    report_dir: Path,
    stop: threading.Event,
    progress: Callable[[str], None] = lambda _m: None,
) -> ReplayOutcome:
    results: list[ScheduleResult] = []
    for i in range(repeat):
        if stop.is_set():
            break
        result = run_schedule(shared, schedule, f"r{i + 1:02d}", report_dir=report_dir, stop=stop)
        results.append(result)
        progress(
            f"replay {i + 1}/{repeat}: {result.category.upper()} in {result.duration_s:.1f}s"
            + (f": {result.reason}" if result.category != "pass" else "")
        )
    return ReplayOutcome(schedule, results)
