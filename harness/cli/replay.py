"""``fencecheck replay SCHEDULE.yaml [--repeat N]``: rerun one schedule file."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

from harness import stopping
from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    new_report_dir,
    positive,
    reap_and_report,
    settings_from_args,
)

NAME = "replay"
HELP = "rerun a schedule file (from explore, or written by hand) and write its evidence"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("schedule", help="a schedule YAML file (docs/explore.md)")
    p.add_argument("--repeat", type=positive, default=1, help="run it N times (default 1)")
    p.add_argument("--mutant", help="start the reference worker with this named mutant")
    p.add_argument("--report-dir", default=str(REPO_ROOT / "reports" / "replay"))
    common_env_options(p)


def main(args: argparse.Namespace) -> int:
    from harness.engine.environment import SharedServices
    from harness.evidence.summary import write_junit, write_results_json, write_summary
    from harness.explore import schedule as sched
    from harness.explore.replay import replay

    # Up to the run's start a signal ends the command where it stands; the
    # run itself then stops the way every run does.
    with stopping.interruptible():
        try:
            schedule = sched.load(Path(args.schedule))
        except sched.ScheduleError as exc:
            raise UsageError(str(exc)) from exc
        settings = settings_from_args(args, mutant=args.mutant)
    run_id, report_dir = new_report_dir(args.report_dir)
    print(
        f"fencecheck replay {run_id}: {args.schedule} x{args.repeat}, worker "
        f"`{settings.worker_command_text()}`"
        + (f", mutant {settings.mutant}" if settings.mutant else ""),
        flush=True,
    )
    if schedule.note:
        print(f"  schedule note: {schedule.note}")
    reap_and_report(settings.work_dir, print)
    stop = threading.Event()
    forget = stopping.on_stop(lambda _why: stop.set())  # no new replay after a signal
    try:
        with SharedServices(settings) as shared:
            outcome = replay(
                shared,
                schedule,
                repeat=args.repeat,
                report_dir=report_dir,
                stop=stop,
                progress=lambda m: print(f"  {m}", flush=True),
            )
    finally:
        forget()
    experiments = [r.experiment for r in outcome.results if r.experiment]
    header = {
        "run": run_id,
        "command": f"replay {args.schedule}",
        "worker": settings.worker_command_text(),
        "mutant": settings.mutant or "none",
    }
    wall = sum(r.duration_s for r in outcome.results)
    write_summary(report_dir / "summary.md", experiments, header=header, wall_s=wall)
    write_junit(report_dir / "junit.xml", experiments, suite=f"fencecheck replay {run_id}")
    write_results_json(report_dir / "results.json", experiments)
    print(
        f"\nreplay: violation reproduced in {outcome.reproduced} of {len(outcome.results)} run(s); "
        f"reports in {report_dir}"
    )
    if stopping.requested():
        print(f"replay: INTERRUPTED ({stopping.reason()}) after {len(outcome.results)} run(s)")
        return stopping.exit_status()
    return outcome.exit_code()
