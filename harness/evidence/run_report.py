"""Everything a run writes at its end, in one place.

Two calls, in this order: :func:`write_run_reports` as soon as the results
are known (summary, results, JUnit, the shard record, the ``latest`` link),
and :func:`seal_run` once the run's last file is written (after teardown:
the servers' logs live in the run directory): the auditor's pages, then the
MANIFEST that seals every file. The same two calls write an interrupted
run's reports (each page marks it interrupted, the shard record says what
cut it), so a new page is one more line here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import stopping
from harness.evidence.shard_record import ShardRecord, write_record
from harness.evidence.summary import (
    ExperimentResult,
    write_junit,
    write_results_json,
    write_summary,
)

# A stopping run builds pages only until this long after the stop request:
# the seal must still be written before the stop escalates (kill-all and
# exit at stopping.HARD_DEADLINE_S). Pages are views `fencecheck report`
# rebuilds from the evidence at any time; the seal over the evidence as the
# run left it cannot be made later.
# 1.8 s: at load 25-40 an orderly stop's teardown alone took 1.6-2.4 s, and the
# stop must not run into the escalation for the sake of views.
PAGES_BY_S = stopping.HARD_DEADLINE_S - 1.2


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
    report_dir: Path,
    results: Sequence[ExperimentResult],
    run: RunInfo,
    record: ShardRecord | None = None,
) -> list[Path]:
    """Write the run's reports into ``report_dir`` and point ``latest`` at it.

    Each file is written atomically; an interrupted run's pages say so at the
    top, and its cut experiments carry their "interrupted" reason. ``record``
    (the run's ``shard.json``, when its services came up) is rewritten as
    finished, or as interrupted and never finished: ``fencecheck merge`` lists
    such a part as unfinished and every item it did not complete as unknown.
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
    if record is not None:
        final = (
            record.cut(run.interrupted, run.wall_s)
            if run.interrupted
            else record.finished(run.wall_s)
        )
        written.append(write_record(report_dir, final))
    latest = report_dir.parent / "latest"
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(report_dir.name)
    return written


def write_pages(report_dir: Path, *, interrupted: bool = False) -> str:
    """The auditor's pages of ``report_dir``; returns what to say about them.

    The verdict stands on the archives: pages that cannot be built are named
    with the reason and the command that builds them. A stopping run builds
    pages only until ``PAGES_BY_S`` after its stop.
    """
    from harness.evidence.html import PagesCut, write_run_pages

    deadline = None
    if interrupted or stopping.requested():
        deadline = time.monotonic() + max(0.0, PAGES_BY_S - (stopping.since_s() or 0.0))
    rebuild = f"rebuild: fencecheck report {report_dir}"
    try:
        return str(write_run_pages(report_dir, deadline=deadline, sealed=True))
    except PagesCut as exc:
        return f"NOT ALL WRITTEN ({exc}; {rebuild})"
    except Exception as exc:
        return f"NOT WRITTEN ({type(exc).__name__}: {exc}; {rebuild})"


def seal_run(
    report_dir: Path, *, interrupted: bool = False, pages: str | None = None
) -> tuple[str, str]:
    """The pages (unless ``pages`` says they were written already: ``--keep``
    writes them before it waits, since its end is a stop with seconds to go),
    then the seal (MANIFEST.sha256) over every file of ``report_dir``; returns
    what to say about the pages, and the evidence digest. Call it last.
    """
    from harness.evidence.manifest import run_digest, write_manifest

    if pages is None:
        pages = write_pages(report_dir, interrupted=interrupted)
    write_manifest(report_dir)
    return pages, run_digest(report_dir)
