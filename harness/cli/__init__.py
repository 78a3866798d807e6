"""The ``fencecheck`` command line: one module per command.

    fencecheck run [IDS...]     run experiments (all by default), write reports
    fencecheck list             the matrix with its invariants
    fencecheck show ARCHIVE     one evidence archive, readably, with its timeline
    fencecheck smoke            bring up every real part once, prove it works, tear down
    fencecheck mutants [NAMES]  prove the matrix catches every protocol mutant
    fencecheck report DIR       rebuild a run's HTML pages from its archives; --compare A B
    fencecheck verify DIR       re-hash a run folder against its MANIFEST.sha256
    fencecheck merge DIR... --into DIR   the parts of a sharded run as one run

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``main(args) -> int``; a new command is a new module listed in ``COMMANDS``.

Exit codes: 0 every verdict pass, 1 some fail, 2 some unknown or a harness
error, 64 bad usage (the message says what to change); ``--fail-on unknown``
makes an unknown exit 1 (harness.evidence.gate).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType

from harness.cli import explore, listing, merge, mutants, replay, report, run, show, smoke, verify
from harness.cli.common import UsageError
from harness.verdict import EXIT_UNKNOWN, EXIT_USAGE

COMMANDS: tuple[ModuleType, ...] = (
    run,
    listing,
    show,
    smoke,
    mutants,
    report,
    verify,
    merge,
    explore,
    replay,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencecheck",
        description="Fault-injection verification of the lease + fencing token + outbox "
        "protocol on real PostgreSQL, toxiproxy and worker processes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same path as Ctrl-C: unwind every context manager.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    by_name = {command.NAME: command for command in COMMANDS}
    try:
        code: int = by_name[args.command].main(args)
        return code
    except UsageError as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nfencecheck: interrupted; everything it started has been stopped", file=sys.stderr)
        return 130
    except Exception as exc:
        from harness.backends.base import BackendUnavailable
        from harness.parts.pg_binaries import PgBinariesNotFound
        from harness.parts.toxiproxy import ToxiproxyNotFound

        if isinstance(exc, PgBinariesNotFound | ToxiproxyNotFound | BackendUnavailable):
            print(f"fencecheck: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise
    return EXIT_UNKNOWN
