"""What every ``fencecheck`` command shares: usage errors, options, settings."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.engine.environment import Settings
    from harness.engine.run_records import ReapReport
    from harness.engine.shards import Shard

REPO_ROOT = Path(__file__).resolve().parents[2]


class UsageError(Exception):
    """The command line asks for something that cannot be done."""


def seed_value(value: str) -> int:
    """A --seed: any whole number (negative ones too)."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 7, got {value!r}"
        ) from None


def report_root(path: str) -> Path:
    """The --report-dir, created if missing; a usage error when it cannot hold reports."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise UsageError(
            f"--report-dir {path} is a file, not a directory; give a directory "
            "(it is created when missing)"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".fencecheck-probe-"):
            pass
    except OSError as exc:
        raise UsageError(
            f"--report-dir {path} cannot be written ({exc.strerror or exc}); "
            "give a directory you can write to"
        ) from None
    return root


def worker_command(text: str | None) -> tuple[str, ...] | None:
    """--worker-cmd as argv (None: the reference worker); a usage error, naming
    what to fix, when it is empty, cannot be split or names no executable."""
    if text is None:
        return None
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(
            f"--worker-cmd {text!r} cannot be split into words ({exc}); check its quotes"
        ) from None
    if not argv:
        raise UsageError(
            "--worker-cmd is empty; give the command that starts your worker "
            "(docs/worker-contract.md), or leave the option out to test the reference worker"
        )
    program = argv[0]
    if "/" in program:
        path = Path(program)
        if not path.is_file():
            raise UsageError(f"--worker-cmd: {program} does not exist (or is not a file)")
        if not os.access(path, os.X_OK):
            raise UsageError(
                f"--worker-cmd: {program} is not executable; `chmod +x {program}` or run it "
                "through its interpreter"
            )
    elif shutil.which(program) is None:
        raise UsageError(f"--worker-cmd: {program!r} is not found on PATH; give its full path")
    return tuple(argv)


def positive(value: str) -> int:
    return _at_least(value, 1)


def non_negative(value: str) -> int:
    return _at_least(value, 0)


def _at_least(value: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {number}")
    return number


def common_env_options(p: argparse.ArgumentParser, *, jobs: int = 3) -> None:
    p.add_argument(
        "--worker-cmd",
        help="command of the worker under test (default: the reference implementation, "
        "`python -m reference_impl.worker`); see docs/worker-contract.md",
    )
    p.add_argument("--pg-bin", help="PostgreSQL bin directory (else $FENCECHECK_PG_BIN, ...)")
    p.add_argument("--toxiproxy", help="toxiproxy-server binary (else $FENCECHECK_TOXIPROXY, ...)")
    p.add_argument("--work-dir", help="where temporary clusters live (default: system temp)")
    p.add_argument(
        "--backend",
        choices=("local", "containers"),
        default="local",
        help="run PostgreSQL, toxiproxy and the mock tool as local processes (default) or "
        "as containers (see README: make containers-setup)",
    )
    p.add_argument(
        "--jobs",
        type=positive,
        default=jobs,
        help=f"experiments run at once (default {jobs}; they mostly wait on leases)",
    )


def reap_and_report(base: Path | None, say: Callable[[str], None]) -> ReapReport:
    """Reap the records of dead runs under ``base``'s state directory and say what
    went (nothing is said when nothing was left behind)."""
    from harness.engine.run_records import reap_dead

    report = reap_dead(base)
    for line in report.lines():
        say(f"fencecheck: {line}")
    for name in report.unreadable:
        say(f"fencecheck: run record {report.state_dir / name} is unreadable; left alone")
    return report


def settings_from_args(args: argparse.Namespace, *, mutant: str | None = None) -> Settings:
    from harness.engine.environment import DEFAULT_WORKER_CMD, Settings

    worker_cmd: Sequence[str] = worker_command(args.worker_cmd) or DEFAULT_WORKER_CMD
    if args.work_dir and not Path(args.work_dir).is_dir():
        raise UsageError(f"--work-dir {args.work_dir} is not a directory; create it first")
    # Explicit binaries are checked before anything is printed or started.
    if args.pg_bin:
        from harness.parts.pg_binaries import PgBinariesNotFound, find_pg_binaries

        try:
            find_pg_binaries(args.pg_bin)
        except PgBinariesNotFound as exc:
            raise UsageError(str(exc)) from exc
    if args.toxiproxy:
        from harness.parts.toxiproxy import ToxiproxyNotFound, find_toxiproxy_server

        try:
            find_toxiproxy_server(args.toxiproxy)
        except ToxiproxyNotFound as exc:
            raise UsageError(str(exc)) from exc
        os.environ["FENCECHECK_TOXIPROXY"] = args.toxiproxy
    return Settings(
        worker_cmd=tuple(worker_cmd),
        mutant=mutant,
        pg_bin=args.pg_bin,
        toxiproxy_bin=args.toxiproxy,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        keep=getattr(args, "keep", False),
        backend=args.backend,
    )


def shard_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--shard",
        metavar="K/N",
        help=f"run only part K of N of the {what} (parts count from 1; the split is the same "
        "on every machine, see docs/ci.md); give every part the same --seed, then "
        "`fencecheck merge`",
    )


def shard_from_args(args: argparse.Namespace) -> Shard:
    """The part asked for with --shard, or the whole list (1/1)."""
    from harness.engine.shards import Shard, ShardError

    if not args.shard:
        return Shard(1, 1)
    try:
        return Shard.parse(args.shard)
    except ShardError as exc:
        raise UsageError(str(exc)) from exc


def new_report_dir(root: str) -> tuple[str, Path]:
    """A fresh ``<root>/<UTC time>-<random>`` for one command's reports: its id
    and path; a root that cannot hold it is a usage error naming the option."""
    import secrets
    import time

    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    report_dir = Path(root) / run_id
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--report-dir {root}: cannot create {report_dir}: {exc}") from exc
    return run_id, report_dir
