"""The ``fencecheck`` command line: one module per command.

    fencecheck run [IDS...]     run experiments (all by default), write reports
    fencecheck contract         check in seconds that a worker follows the worker contract
    fencecheck init-worker DIR  write a small starting worker that passes `contract`
    fencecheck list             the matrix with its invariants
    fencecheck show ARCHIVE     one evidence archive, readably, with its timeline
    fencecheck smoke            bring up every real part once, prove it works, tear down
    fencecheck mutants [NAMES]  prove the matrix catches every protocol mutant
    fencecheck clean            remove what killed runs left behind
    fencecheck report DIR       rebuild a run's HTML pages from its archives; --compare A B
    fencecheck verify DIR       re-hash a run folder against its MANIFEST.sha256
    fencecheck merge DIR... --into DIR   the parts of a sharded run as one run

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``main(args) -> int``; a new command is a new module listed in ``COMMANDS``.

Exit codes (README, "Exit codes"), exactly:
  0   every verdict pass
  1   an invariant broke (some verdict fail); with ``--fail-on unknown`` also
      some verdict unknown (harness.evidence.gate)
  2   some verdict unknown, or a harness or environment error (one paragraph:
      what failed, its exit status, the last lines of its stderr, its log)
  64  bad usage: one line naming what to fix, never a traceback
  128+N  stopped by signal N before it finished (130 SIGINT, 143 SIGTERM,
      129 SIGHUP); the reports it wrote say "interrupted"
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from harness import stopping
from harness.cli import (
    clean,
    contract,
    explore,
    init_worker,
    listing,
    merge,
    mutants,
    replay,
    report,
    run,
    show,
    smoke,
    verify,
)
from harness.cli.common import UsageError
from harness.evidence.bounded_read import FileRefused
from harness.failures import PartFailed
from harness.verdict import EXIT_FAIL, EXIT_UNKNOWN, EXIT_USAGE

COMMANDS: tuple[ModuleType, ...] = (
    run,
    contract,
    init_worker,
    listing,
    show,
    smoke,
    mutants,
    report,
    verify,
    merge,
    clean,
    explore,
    replay,
)


# Commands that only read, build or verify: a signal ends them where they
# stand (stopping.interruptible: a blocked read gets EINTR and raises), not
# after the 3 s escalation a run's orderly stop falls back on. `replay` and
# `mutants --rebuild-report` do the same for the part of theirs that reads.
READ_ONLY = frozenset({"show", "report", "verify", "merge"})


class Parser(argparse.ArgumentParser):
    """argparse whose errors are usage errors (exit 64 with one line), not exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> Parser:
    parser = Parser(
        prog="fencecheck",
        description="Fault-injection verification of the lease + fencing token + outbox "
        "protocol on real PostgreSQL, toxiproxy and worker processes.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def _silence_stdout() -> None:
    # The reader went away (`fencecheck list | head`): nothing more can be
    # shown, and the interpreter's final flush must not fail either.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    if argv is None:  # the command line, not a caller in this process
        _exit_keeping(code)
    return code


def _exit_keeping(code: int) -> NoReturn:
    """End the process with the exit code the command printed. A signal from
    now on (a Ctrl-C just after the verdict) ends it at once with that code:
    never 130, or a death by SIGINT, under a last line that says otherwise.
    The interpreter's own shutdown would put the default handlers back, so
    the exit hooks (the safety nets that kill leftovers) run here instead."""

    def done(signum: int, frame: object) -> None:
        _flush()
        os._exit(code)

    for sig in stopping.SIGNALS:
        signal.signal(sig, done)
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stopping.install()
    began = time.time()
    forget = stopping.on_escalate(lambda why: _release_records(why, began))
    forget_handover = stopping.on_unfinished(lambda: _hand_over_records(began))
    by_name = {command.NAME: command for command in COMMANDS}
    section = stopping.interruptible() if args.command in READ_ONLY else contextlib.nullcontext()
    try:
        with section:
            code: int = by_name[args.command].main(args)
        return code
    except (UsageError, FileRefused) as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (stopping.Interrupted, KeyboardInterrupt):
        print(
            f"\nfencecheck: {stopping.reason()}; everything it started has been stopped",
            file=sys.stderr,
        )
        return stopping.exit_status()
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as exc:
        if not stopping.requested():
            return _report_error(exc)
        # A failure after a stop request is the stop's doing: interrupted.
        print(f"\nfencecheck: {stopping.reason()} ({type(exc).__name__}: {exc})", file=sys.stderr)
        return stopping.exit_status()
    finally:
        forget()
        forget_handover()
        _release_records("the command ended", began)


def _hand_over_records(began: float) -> str | None:
    # The escalation ran out of time removing them: a reaper that outlives
    # this process finishes (harness/engine/reaper.py).
    from harness.engine import reaper
    from harness.engine.run_records import unreleased_paths

    return reaper.hand_over(unreleased_paths(created_after=began))


def _report_error(exc: Exception) -> int:
    """Exit code and message for an error no command handled itself."""
    from harness.backends.base import BackendUnavailable
    from harness.parts.fork_server import ForkServerMisreports
    from harness.parts.pg_binaries import PgBinariesNotFound
    from harness.parts.postgres import ClusterError
    from harness.parts.toxiproxy import ToxiproxyNotFound

    # The worker's own launcher broke its contract, proven by the harness:
    # a fail of the system under test, not of the environment.
    if isinstance(exc, ForkServerMisreports):
        print(f"fencecheck: FAIL before any experiment ran: {exc}", file=sys.stderr)
        return EXIT_FAIL
    # A part that failed says what, why and where its log is: no traceback
    # (the run directory's error.txt has it).
    if isinstance(exc, PartFailed | ClusterError):
        print(f"fencecheck: harness/environment error: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    if isinstance(exc, PgBinariesNotFound | ToxiproxyNotFound | BackendUnavailable):
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"fencecheck: harness error: {type(exc).__name__}: {exc}\n"
        + "".join(traceback.format_exception(exc)[-6:]),
        file=sys.stderr,
    )
    return EXIT_UNKNOWN


def _release_records(why: str, began: float) -> None:
    # A stop that struck between a run record's creation and the teardown that
    # owns it must not leave the record (nor what it names) behind. Only the
    # records this command made: a caller in the same process (a test session's
    # shared services) may hold one of its own, made before, that outlives it.
    del why
    from harness.engine.run_records import release_unreleased

    release_unreleased(created_after=began)
