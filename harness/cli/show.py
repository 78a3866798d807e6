"""``fencecheck show ARCHIVE``: one evidence archive, readably, with its timeline.

The file is checked against the published archive schema first: a truncated
file, bad YAML, a binary file or a mapping that is not an archive is a usage
error (exit 64) that says what is wrong with it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.cli.common import UsageError

NAME = "show"
HELP = "print one evidence archive with its timeline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", help="path of a YAML archive (reports/<run>/archives/X.yaml)")


def main(args: argparse.Namespace) -> int:
    path: str = args.archive
    from harness.evidence.archive import ArchiveInvalid, load_archive

    archive_path = Path(path)
    if not archive_path.exists():
        raise UsageError(f"no archive at {path}; archives are in reports/<run>/archives/")
    try:
        archive = load_archive(archive_path)
    except ArchiveInvalid as exc:
        raise UsageError(str(exc)) from exc
    variant = f"[{archive['variant']}]" if archive.get("variant") else ""
    print(f"{archive['experiment_id']}{variant}: {archive['title']}")
    print(f"verdict:    {str(archive['pass_or_fail']).upper()} ({archive.get('verdict_reason')})")
    if archive.get("interrupted"):
        print(f"INTERRUPTED: {archive['interrupted']}")
    print(f"invariant:  {archive['expected_invariant']}")
    print(f"source:     {archive['seed_section']}")
    print(f"worker:     {archive['worker']['command']}  {archive['worker']['digest'][:19]}")
    if archive["worker"].get("mutant"):
        print(f"mutant:     {archive['worker']['mutant']}")
    print(f"postgres:   {archive['postgres_version']}")
    print(f"lease:      {archive['lease_duration']}, heartbeat {archive['heartbeat_interval']}")
    print(f"run_id:     {archive['run_id']}   tenant {archive['tenant_id']}")
    print(f"seed:       {archive.get('seed')}")
    print(f"duration:   {archive['duration_s']}s (natural wait {archive['natural_wait_s']}s)")
    for stall in archive.get("harness_stalls") or []:
        print(
            f"stall:      harness did not run for {stall['length_s']}s from {stall['started_at']}"
        )
    window = archive.get("worst_wait_window")
    if window:
        most = sorted(window["by_who"].items(), key=lambda kv: -kv[1])[:3]
        named = ", ".join(f"{who} {s}s" for who, s in most) or "nothing"
        print(
            f"busy:       one chain waited {window['waited_s']}s within one "
            f"{window['length_s']}s timer at worst ({named})"
        )
    print("\nchecks:")
    for check in archive["checks"]:
        mark = "n/j" if check["kind"] == "not_judged" else "ok " if check["ok"] else "NOT"
        print(f"  [{mark}] ({check['kind']}) {check['name']}")
        print(f"         expected: {check['expected']}")
        print(f"         observed: {check['observed']}")
        if check.get("excused_by"):
            print(f"         excused:  {check['excused_by']}")
    print("\ntimeline (* = observed by the harness itself):")
    for line in archive.get("timeline") or ["  (empty)"]:
        print(f"  {line}")
    print(
        f"\ncommands executed: {len(archive['commands_executed'])}, "
        f"queries: {len(archive['postgres_queries_and_results'])}, "
        f"tool requests: {len(archive['mock_tool_request_log'])}, "
        f"broker messages: {len(archive['broker_messages'])}"
    )
    for worker, lines in (archive.get("worker_channel_errors") or {}).items():
        # The archive keeps the first lines and counts the rest in a last one.
        more = re.match(r"\(and (\d+) more", lines[-1]) if lines else None
        count = len(lines) - 1 + int(more.group(1)) if more else len(lines)
        print(f"worker {worker} printed {count} non-reply line(s) on its ops channel")
    print(f"worker logs: {archive['worker_logs_path']}")
    if archive.get("harness_error"):
        print(f"\nharness error:\n{archive['harness_error']}")
    return 0
