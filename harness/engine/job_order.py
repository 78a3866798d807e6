"""Which experiment run starts first: the longest expected one.

A run's wall time is its summed time spread over the slots (``--jobs``) plus
a tail: the slots left idle while the last jobs still run. Started in matrix
order, a 5 s experiment near the end of the list runs alone at the end; the
longest first, the tail is one of the shortest (greedy longest-first, as
the shards balance their parts).

Expected durations are measured ones, kept with the code
(``expected_durations.json`` beside this module: the median duration of
each label over the matrices it was made from, rewritten with
``python -m harness.engine.job_order RUN_DIR...``). A label it does not
know gets the shards' static estimate (``shards.job_cost``). The file is
read, never written by a run: the order is the same on every machine, and
a run leaves nothing behind for it. Order only: every job still runs in its
own environment, results come back in job order, and no verdict depends on
the order.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.engine.shards import job_cost
from harness.evidence.run_dir import NotARunDirectory, load_entries
from harness.verdict import Verdict

if TYPE_CHECKING:
    from harness.engine.runner import Job

EXPECTED = Path(__file__).with_name("expected_durations.json")


@functools.cache
def expected_durations(path: Path = EXPECTED) -> dict[str, float]:
    """Each label's expected seconds ({} when the file is missing or not a
    map of numbers: the order then falls back to the static estimate)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
    }


def expected_seconds(job: Job, known: dict[str, float] | None = None) -> float:
    """One run's expected seconds: measured where ``known`` (default: the file
    kept with the code) has its label, else the shards' static estimate."""
    known = expected_durations() if known is None else known
    return known.get(job.label, job_cost(job))


def longest_first(jobs: Sequence[Job], known: dict[str, float]) -> list[int]:
    """Indices of ``jobs``, the longest expected first; ties keep job order."""
    return sorted(range(len(jobs)), key=lambda i: -expected_seconds(jobs[i], known))


def measured(run_dirs: Sequence[Path]) -> dict[str, float]:
    """The median ``duration_s`` of each label over the archives of ``run_dirs``
    (runs that passed only: a failing or stalled run's length is no norm, and
    an unreadable archive reads as unknown). NotARunDirectory names a
    directory without archives."""
    seen: dict[str, list[float]] = {}
    for run_dir in run_dirs:
        for entry in load_entries(run_dir):
            if entry.verdict is Verdict.PASS and entry.duration_s is not None:
                seen.setdefault(entry.label, []).append(entry.duration_s)
    return {label: round(statistics.median(s), 2) for label, s in sorted(seen.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.engine.job_order",
        description="Rewrite the expected durations the matrix's order uses from the "
        "archives of finished runs (each a `fencecheck run` directory).",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        durations = measured(args.run_dirs)
    except NotARunDirectory as exc:
        print(f"job_order: {exc}; nothing written", file=sys.stderr)
        return 2
    EXPECTED.write_text(json.dumps(durations, indent=1, sort_keys=True) + "\n")
    print(f"job_order: {len(durations)} label(s) written to {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
