"""``fencecheck mutants [NAMES]``: prove the matrix catches every protocol mutant."""

from __future__ import annotations

import argparse
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    reap_and_report,
    settings_from_args,
    shard_from_args,
    shard_option,
)
from harness.cli.explore import duration
from harness.evidence.gate import add_gate_option

if TYPE_CHECKING:
    from harness.engine.environment import Settings

NAME = "mutants"
HELP = "prove the matrix catches every protocol mutant of the reference worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="mutant names (all when omitted)")
    parser.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    parser.add_argument(
        "--explore",
        action="store_true",
        help="instead of the matrix, run an exploration campaign per mutant (docs/explore.md) "
        "and print found or not, schedules and seconds to the first violation, shrunk size",
    )
    parser.add_argument(
        "--budget",
        type=duration,
        default=300.0,
        help="with --explore: search budget per mutant (default 5m)",
    )
    parser.add_argument(
        "--shrink-budget",
        type=duration,
        default=60.0,
        help="with --explore: shrink budget per found mutant (default 1m)",
    )
    parser.add_argument("--seed", type=int, default=1, help="with --explore: Hypothesis seed")
    shard_option(parser, "mutants")
    add_gate_option(parser)
    common_env_options(parser)


def main(args: argparse.Namespace) -> int:
    from harness.mutation.named import MutantListUnavailable, run_mutants

    settings = settings_from_args(args)
    reap_and_report(settings.work_dir, print)
    if args.explore:
        return _explore(args, settings)
    try:
        return run_mutants(
            settings,
            args.names,
            report_root=Path(args.report_dir),
            parallel=args.jobs,
            shard=shard_from_args(args),
            fail_on=args.fail_on,
        )
    except (MutantListUnavailable, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _explore(args: argparse.Namespace, settings: Settings) -> int:
    from harness.explore.mutants import run_explore_mutants
    from harness.mutation.named import MutantListUnavailable, list_mutants

    try:
        known = {m.name: m for m in list_mutants(settings.worker_cmd)}
    except MutantListUnavailable as exc:
        raise UsageError(str(exc)) from exc
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise UsageError(f"unknown mutant(s) {unknown}; known: {', '.join(sorted(known))}")
    chosen = [known[n] for n in args.names] if args.names else list(known.values())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    report_dir = Path(args.report_dir) / f"explore-mutants-{stamp}"
    report_dir.mkdir(parents=True, exist_ok=True)
    return run_explore_mutants(
        settings,
        chosen,
        report_dir=report_dir,
        budget_s=args.budget,
        shrink_budget_s=args.shrink_budget,
        seed=args.seed,
        lanes=args.jobs,
    )
