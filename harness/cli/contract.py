"""``fencecheck contract``: is a worker command conformant to the contract v2?

Exit codes: 0 conformant, 1 not (every gap printed with the section of
docs/worker-contract.md to read), 2 the harness itself failed, 64 usage.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import common_env_options, settings_from_args
from harness.verdict import EXIT_FAIL, EXIT_PASS

if TYPE_CHECKING:
    from harness.contract.report import ContractReport
    from harness.engine.environment import Settings

NAME = "contract"
HELP = "check in seconds that a worker command follows the worker contract (v2)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report-dir",
        help="also write contract.txt, contract.json and the workers' logs into this directory",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    common_env_options(parser)


def conformance(
    settings: Settings, log_dir: Path, progress: Callable[[str], None] | None = None
) -> ContractReport:
    """Bring up a run's shared services for ``settings`` and check its worker.

    A worker whose first ``migrate`` fails is reported (not raised): that is
    the worker's gap here."""
    from harness.contract import conformance as check
    from harness.contract import mapping
    from harness.engine.environment import MigrateFailed, SharedServices

    say = progress or (lambda _m: None)
    started = time.monotonic()
    try:  # the mapping first: migrate installs the model it declares
        mapping.declared(tuple(settings.worker_cmd))
    except mapping.MappingError as exc:
        return check.mapping_invalid(
            settings.worker_command_text(), exc, time.monotonic() - started
        )
    say("migrate on a fresh database")
    try:
        with SharedServices(settings) as shared:
            return check.check(shared, log_dir, say)
    except MigrateFailed as exc:
        (log_dir / "migrate.log").parent.mkdir(parents=True, exist_ok=True)
        (log_dir / "migrate.log").write_text(exc.output(), encoding="utf-8")
        return check.migrate_failed(settings.worker_command_text(), exc, time.monotonic() - started)


def main(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    progress = None if args.quiet else (lambda m: print(f"  {m} ...", flush=True))
    print(f"fencecheck contract: worker `{settings.worker_command_text()}`", flush=True)
    if args.report_dir:
        log_dir = Path(args.report_dir) / "logs"
        report = conformance(settings, log_dir, progress)
        text, data = report.write(Path(args.report_dir))
        where = f"\nreport: {text}, {data}; logs in {log_dir}"
    else:
        with tempfile.TemporaryDirectory(prefix="fencecheck-contract-") as tmp:
            report = conformance(settings, Path(tmp), progress)
        where = ""
    print(report.text() + where)
    code = EXIT_PASS if report.conformant else EXIT_FAIL
    verdict = "conformant" if report.conformant else f"not conformant ({len(report.gaps)} gap(s))"
    print(f"fencecheck: exit {code}: {verdict}")
    return code
