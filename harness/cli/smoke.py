"""``fencecheck smoke``: bring up every real part once, prove it works, tear down."""

from __future__ import annotations

import argparse

from harness import stopping
from harness.cli.common import UsageError, common_env_options, reap_and_report, settings_from_args

NAME = "smoke"
HELP = (
    "bring up every real part once as local processes and prove it works "
    "(the container backend has its own: make test-containers)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_env_options(parser)


def main(args: argparse.Namespace) -> int:
    from harness.engine.smoke import smoke

    if args.backend != "local":
        raise UsageError("smoke runs local processes only; for containers use make test-containers")
    settings = settings_from_args(args)
    reap_and_report(settings.work_dir, print)
    with stopping.interruptible():
        return smoke(settings)
