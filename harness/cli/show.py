"""``fencecheck show ARCHIVE``: one evidence archive, readably, with its timeline."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import UsageError

NAME = "show"
HELP = "print one evidence archive with its timeline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", help="path of a YAML archive (reports/<run>/archives/X.yaml)")


def main(args: argparse.Namespace) -> int:
    path: str = args.archive
    from harness.evidence.archive import ArchiveInvalid, read_archive

    archive_path = Path(path)
    if not archive_path.is_file():
        raise UsageError(f"no archive at {path}; archives are in reports/<run>/archives/")
    try:
        archive = read_archive(archive_path)
    except ArchiveInvalid as exc:
        raise UsageError(str(exc)) from exc
    print(f"{archive['experiment_id']}: {archive['title']}  [{archive.get('variant') or '-'}]")
    print(f"verdict:    {str(archive['pass_or_fail']).upper()} ({archive.get('verdict_reason')})")
    print(f"invariant:  {archive['expected_invariant']}")
    print(f"source:     {archive['seed_section']}")
    print(f"worker:     {archive['worker']['command']}  {archive['worker']['digest'][:19]}")
    if archive["worker"].get("mutant"):
        print(f"mutant:     {archive['worker']['mutant']}")
    print(f"postgres:   {archive['postgres_version']}")
    print(f"lease:      {archive['lease_duration']}, heartbeat {archive['heartbeat_interval']}")
    print(f"run_id:     {archive['run_id']}   tenant {archive['tenant_id']}")
    print(f"duration:   {archive['duration_s']}s (natural wait {archive['natural_wait_s']}s)")
    print("\nchecks:")
    for check in archive["checks"]:
        mark = "ok " if check["ok"] else "NOT"
        print(f"  [{mark}] ({check['kind']}) {check['name']}")
        print(f"         expected: {check['expected']}")
        print(f"         observed: {check['observed']}")
    print("\ntimeline (* = observed by the harness itself):")
    for line in archive.get("timeline") or ["  (empty)"]:
        print(f"  {line}")
    print(
        f"\ncommands executed: {len(archive['commands_executed'])}, "
        f"queries: {len(archive['postgres_queries_and_results'])}, "
        f"tool requests: {len(archive['mock_tool_request_log'])}, "
        f"broker messages: {len(archive['broker_messages'])}"
    )
    print(f"worker logs: {archive['worker_logs_path']}")
    if archive.get("harness_error"):
        print(f"\nharness error:\n{archive['harness_error']}")
    return 0
