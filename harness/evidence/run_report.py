"""Everything a run writes at its end, in one place: summary, results, JUnit,
the ``latest`` link. The same call writes an interrupted run's reports (each
page marks it interrupted), so a new page is one more line here."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.evidence.summary import (
    ExperimentResult,
    write_junit,
    write_results_json,
    write_summary,
)


@dataclass
class RunInfo:
    """What the reports say about the run as a whole."""

    run_id: str
    header: dict[str, str]
    wall_s: float
    exit_code: int
    interrupted: str | None = None  # "interrupted by SIGTERM", when a stop cut the run
    extra: dict[str, object] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.run_id,
            "status": "interrupted" if self.interrupted else "complete",
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 3),
            **self.header,
            **self.extra,
        }


def write_run_reports(
    report_dir: Path, results: Sequence[ExperimentResult], run: RunInfo
) -> list[Path]:
    """Write the run's pages into ``report_dir`` and point ``latest`` at it.

    Each file is written atomically; an interrupted run's pages say so at the
    top, and its cut experiments carry their "interrupted" reason.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    written = [
        write_summary(
            report_dir / "summary.md",
            results,
            header=run.header,
            wall_s=run.wall_s,
            interrupted=run.interrupted,
        ),
        write_results_json(report_dir / "results.json", results, run=run.as_json()),
        write_junit(
            report_dir / "junit.xml",
            results,
            suite=f"fencecheck {run.run_id}",
            interrupted=run.interrupted,
        ),
    ]
    latest = report_dir.parent / "latest"
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(report_dir.name)
    return written
