"""Which experiment run starts first: the longest expected one.

A run's wall time is its summed time spread over the slots (``--jobs``) plus
a tail: the slots left idle while the last jobs still run. Started in matrix
order, a 5 s experiment near the end of the list runs alone at the end; the
longest first, the tail is one of the shortest (greedy longest-first, as
the shards balance their parts).

Expected durations are the ones measured on this machine: each label's last
duration, kept in a small file in the state directory
(``run_records.state_dir``); a label never run here gets the shards' static
estimate (``shards.job_cost``), which sorts below every measured one of the
same size. Order only: every job still runs in its own environment, results
come back in job order, and no verdict depends on the order.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.engine.run_records import state_dir
from harness.engine.shards import job_cost

if TYPE_CHECKING:
    from harness.engine.runner import Job
    from harness.evidence.summary import ExperimentResult

FILE_NAME = "durations.json"


def _path(work_dir: Path | None) -> Path:
    return state_dir(work_dir) / FILE_NAME


def measured(work_dir: Path | None) -> dict[str, float]:
    """Each label's last measured duration here ({} when none is kept, or the
    file is unreadable: the order then falls back to the static estimate)."""
    try:
        data = json.loads(_path(work_dir).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
    }


def longest_first(jobs: Sequence[Job], known: dict[str, float]) -> list[int]:
    """Indices of ``jobs``, the longest expected first; ties keep job order."""

    def expected(i: int) -> float:
        job = jobs[i]
        return known.get(job.label, job_cost(job))

    return sorted(range(len(jobs)), key=lambda i: -expected(i))


def remember(results: Iterable[ExperimentResult], work_dir: Path | None) -> None:
    """Keep the durations of ``results`` (those of a run that ran to its end:
    an interrupted one says nothing of their length). Best effort: the order
    is an optimisation, a file that cannot be written changes no result."""
    ran = {r.label: round(r.duration_s, 3) for r in results if r.duration_s > 0}
    if not ran:
        return
    path = _path(work_dir)
    kept = measured(work_dir)
    kept.update(ran)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{FILE_NAME}.{os.getpid()}")
        scratch.write_text(json.dumps(kept, indent=0, sort_keys=True))
        os.replace(scratch, path)  # a reader never sees half a file
