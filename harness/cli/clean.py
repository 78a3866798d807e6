"""``fencecheck clean``: remove what killed runs left behind.

Reads the run records in the state directory (``$TMPDIR/fencecheck-state-<uid>``,
or under ``--work-dir``) and reaps each whose owner is dead: orphaned servers,
System V shared memory segments, temp directories, containers, and the
shared memory libfaketime left for ended workers. Live runs are
listed and left alone. Every ``fencecheck run`` does the same at its start.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import UsageError, reap_and_report
from harness.parts import clock_skew
from harness.verdict import EXIT_PASS, EXIT_UNKNOWN

NAME = "clean"
HELP = "remove what killed runs left behind (temp dirs, shared memory, containers)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--work-dir",
        help="the --work-dir the runs used (default: the system temp directory)",
    )


def main(args: argparse.Namespace) -> int:
    base = Path(args.work_dir) if args.work_dir else None
    if base is not None and not base.is_dir():
        raise UsageError(f"--work-dir {args.work_dir} is not a directory")
    report = reap_and_report(base, print)
    stale = clock_skew.forget_dead()
    if stale:
        print(f"  removed libfaketime shared memory of ended process(es) {stale}")
    if not report.reaped:
        print(f"fencecheck clean: nothing left behind by dead runs in {report.state_dir}")
    for live in report.live:
        print(f"  left alone (still running): {live}")
    if report.problems:
        print(f"fencecheck clean: {len(report.problems)} thing(s) could not be removed (above)")
        return EXIT_UNKNOWN
    return EXIT_PASS
