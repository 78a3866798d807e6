"""Shrinking a violation to a minimal schedule, and what is written about it.

Hypothesis does the shrinking: the campaign's search keeps running after the
first violation, in Hypothesis's shrink phase, and every smaller schedule it
proposes is run against real parts. :class:`Shrinker` decides which of those
count (one that breaks at least one of the invariants the first violation
broke: the same bug, not any bug) and bounds the phase by time, since each
attempt costs a whole schedule run. The smallest schedule that still failed
is written as YAML, with a copy of its evidence archive and the one command
that replays it.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.explore import schedule as sched

if TYPE_CHECKING:
    from harness.explore.campaign import ScheduleResult


class Violation(Exception):
    """Raised inside the Hypothesis search when a schedule broke an invariant."""


class SearchOver(BaseException):
    """Raised inside the Hypothesis search to end it at once (the campaign was told
    to stop). A BaseException, like KeyboardInterrupt, so Hypothesis passes it on
    at once: as an Exception it counts as a failure that Hypothesis replays and
    shrinks first (0.5 s per lane measured, the stop's seconds)."""


@dataclass
class Shrinker:
    budget_s: float
    first: ScheduleResult | None = None
    best: ScheduleResult | None = None
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    tried: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.first is not None

    def start(self, result: ScheduleResult) -> None:
        self.first = self.best = result
        self.started_at = time.monotonic()

    def over(self) -> bool:
        return self.started_at is not None and time.monotonic() - self.started_at > self.budget_s

    def consider(self, result: ScheduleResult) -> bool:
        """Is this attempt the same bug? Keeps the smallest one seen."""
        assert self.first is not None
        self.attempts += 1
        self.tried.append(f"{result.label} size {result.schedule.size} {result.category}")
        self.finished_at = time.monotonic()
        same = bool(set(result.broken) & set(self.first.broken))
        if same and self.best is not None and result.schedule.size < self.best.schedule.size:
            self.best = result
        return same

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.finished_at or self.started_at) - self.started_at


def replay_command(path: Path, *, mutant: str | None, worker_cmd: str | None) -> str:
    """The one command that reruns a schedule file against the same code."""
    parts = [".venv/bin/fencecheck", "replay", str(path)]
    if mutant:
        parts += ["--mutant", mutant]
    if worker_cmd:
        parts += ["--worker-cmd", worker_cmd]
    return shlex.join(parts)


def write_violation(
    report_dir: Path, result: ScheduleResult, *, mutant: str | None, worker_cmd: str | None
) -> tuple[Path, str]:
    """The minimal schedule as YAML (with what it broke in its note), a copy of
    its archive beside it; returns the YAML's path and the replay command."""
    out = report_dir / "violations"
    out.mkdir(parents=True, exist_ok=True)
    note = f"breaks {', '.join(result.broken)}; found as {result.label}"
    minimal = dataclasses.replace(result.schedule, note=note)
    path = sched.write(out / f"{result.label}.yaml", minimal)
    if result.archive_path is not None and result.archive_path.exists():
        shutil.copyfile(result.archive_path, out / f"{result.label}.archive.yaml")
    return path, replay_command(path, mutant=mutant, worker_cmd=worker_cmd)
