"""``fencecheck mutants [NAMES]``: prove the matrix catches every protocol mutant."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    reap_and_report,
    settings_from_args,
    shard_from_args,
    shard_option,
)
from harness.evidence.gate import add_gate_option

NAME = "mutants"
HELP = "prove the matrix catches every protocol mutant of the reference worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="mutant names (all when omitted)")
    parser.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    shard_option(parser, "mutants")
    add_gate_option(parser)
    common_env_options(parser)


def main(args: argparse.Namespace) -> int:
    from harness.mutation.named import MutantListUnavailable, run_mutants

    settings = settings_from_args(args)
    reap_and_report(settings.work_dir, print)
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
