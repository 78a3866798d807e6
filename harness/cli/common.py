"""What every ``fencecheck`` command shares: usage errors, options, settings."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.engine.environment import Settings
    from harness.engine.shards import Shard

REPO_ROOT = Path(__file__).resolve().parents[2]


class UsageError(Exception):
    """The command line asks for something that cannot be done."""


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {number}")
    return number


def common_env_options(p: argparse.ArgumentParser) -> None:
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
        default=3,
        help="experiments run at once (default 3; they mostly wait on leases)",
    )


def settings_from_args(args: argparse.Namespace, *, mutant: str | None = None) -> Settings:
    from harness.engine.environment import DEFAULT_WORKER_CMD, Settings

    worker_cmd: Sequence[str] = DEFAULT_WORKER_CMD
    if args.worker_cmd:
        worker_cmd = shlex.split(args.worker_cmd)
        if not worker_cmd:
            raise UsageError("--worker-cmd is empty; give the command that starts your worker")
    if args.work_dir and not Path(args.work_dir).is_dir():
        raise UsageError(f"--work-dir {args.work_dir} is not a directory; create it first")
    if args.toxiproxy:
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
