"""``fencecheck explore``: generated fault schedules over real parts (docs/explore.md)."""

from __future__ import annotations

import argparse
import re
import secrets
import threading
from typing import TYPE_CHECKING

from harness import stopping
from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    new_report_dir,
    positive,
    reap_and_report,
    settings_from_args,
    shard_from_args,
    shard_option,
)

if TYPE_CHECKING:
    from harness.explore.campaign import CampaignConfig

NAME = "explore"
HELP = "draw fault schedules with Hypothesis, run them on real parts, shrink a violation"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def duration(value: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` as seconds."""
    match = _DURATION.match(value)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 10m or 1h, got {value!r}")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--budget", type=duration, help="search for this long (e.g. 10m)")
    limit.add_argument("--schedules", type=positive, help="run this many schedules")
    p.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed)")
    p.add_argument("--mutant", help="start the reference worker with this named mutant")
    p.add_argument("--report-dir", default=str(REPO_ROOT / "reports" / "explore"))
    p.add_argument(
        "--shrink-budget",
        type=duration,
        default=120.0,
        help="how long to shrink a violation (default 2m; each attempt is a schedule run)",
    )
    p.add_argument("--workers", type=positive, help="fix the number of workers (default 2-6)")
    p.add_argument("--runs", type=positive, help="fix the number of runs (default 2-8)")
    p.add_argument("--quiet", action="store_true", help="no per-schedule progress lines")
    shard_option(p, "campaign (part K draws with seed + K - 1 and runs its share of --schedules)")
    common_env_options(p)


def config_from_args(args: argparse.Namespace) -> CampaignConfig:
    from harness.explore.campaign import CampaignConfig
    from harness.explore.generate import Shape

    shard = shard_from_args(args)
    if args.budget is None and args.schedules is None:
        args.budget = 600.0
    base = args.seed if args.seed is not None else secrets.randbelow(2**31)
    args.seed = base
    shape = Shape()
    if args.workers is not None:
        if not 1 <= args.workers <= 8:
            raise UsageError(f"--workers {args.workers}: give 1 to 8")
        shape = Shape(**{**vars(shape), "min_workers": args.workers, "max_workers": args.workers})
    if args.runs is not None:
        if args.runs > 24:
            raise UsageError(f"--runs {args.runs}: give 1 to 24")
        shape = Shape(**{**vars(shape), "min_runs": args.runs, "max_runs": args.runs})
    schedules = args.schedules
    if schedules is not None and shard.count > 1:
        schedules = len(range(shard.index - 1, schedules, shard.count)) or None
        if schedules is None:
            raise UsageError(f"--schedules {args.schedules} leaves nothing for shard {shard}")
    return CampaignConfig(
        seed=base + (shard.index - 1 if shard.count > 1 else 0),
        shape=shape,
        max_schedules=schedules,
        budget_s=args.budget if schedules is None else None,
        shrink_budget_s=args.shrink_budget,
        label_prefix=f"p{shard.index}s" if shard.count > 1 else "s",
        lanes=args.jobs,
    )


def main(args: argparse.Namespace) -> int:
    from harness.engine.environment import SharedServices
    from harness.explore.campaign import Campaign
    from harness.explore.report import write_report
    from harness.explore.shrink import write_violation

    config = config_from_args(args)
    settings = settings_from_args(args, mutant=args.mutant)
    run_id, report_dir = new_report_dir(args.report_dir)
    limit = (
        f"{config.max_schedules} schedules"
        if config.max_schedules
        else f"budget {config.budget_s:.0f}s"
    )
    print(
        f"fencecheck explore {run_id}: seed {config.seed}, {limit}, worker "
        f"`{settings.worker_command_text()}`"
        + (f", mutant {settings.mutant}" if settings.mutant else ""),
        flush=True,
    )
    progress = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}", flush=True))
    reap_and_report(settings.work_dir, print)
    # A signal (harness/stopping.py) ends every lane before its next schedule;
    # the running ones are torn down and the report covers what ran.
    stop = threading.Event()
    forget = stopping.on_stop(lambda _why: stop.set())
    try:
        with SharedServices(settings) as shared:
            outcome = Campaign(
                shared, config, report_dir=report_dir, stop=stop, progress=progress
            ).run()
    finally:
        forget()
    violation = None
    if outcome.minimal is not None:
        violation = write_violation(
            report_dir, outcome.minimal, mutant=settings.mutant, worker_cmd=args.worker_cmd
        )
    header = {
        "run": run_id,
        "command": "explore",
        "worker": settings.worker_command_text(),
        "mutant": settings.mutant or "none",
        "seed": str(config.seed),
        "postgres": shared.binaries.describe(),
    }
    interrupted = stopping.reason() if outcome.interrupted else None
    code = stopping.exit_status() if outcome.interrupted else outcome.exit_code()
    data = write_report(
        report_dir,
        outcome,
        header=header,
        violation=violation,
        exit_code=code,
        interrupted=interrupted,
    )
    counts = data["counts"]
    print(
        f"\nexplore: {data['schedules']} schedule(s) in {data['wall_s']}s "
        f"({data['schedules_per_minute']}/min): {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['no_effect']} fault not in effect, {counts['unknown']} unknown"
    )
    print(
        f"time per schedule (mean s; median schedule {data['median_schedule_s']}s): "
        + ", ".join(f"{k} {v}" for k, v in data["time_per_phase_s"].items())
    )
    print("coverage (injection point x fault kind reached):")
    print(outcome.coverage.table())
    if violation is not None:
        fv = data["first_violation"]
        print(
            f"\nVIOLATION after {fv['after_schedules']} schedule(s), {fv['after_s']}s: "
            f"{', '.join(fv['broken'])}"
        )
        print(f"  minimal schedule (size {data['shrunk']['size']}): {violation[0]}")
        print(f"  replay: {violation[1]}")
    print(f"reports in {report_dir} (summary.md, explore.json, results.json, junit.xml)")
    if outcome.interrupted:
        print(
            f"explore: INTERRUPTED ({stopping.reason()}); the report covers the schedules that ran"
        )
        return code
    print(
        {
            0: "exit 0: no violation",
            1: "exit 1: an invariant broke",
            2: "exit 2: nothing conclusive",
        }[code]
    )
    return code
