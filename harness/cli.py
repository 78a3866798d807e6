"""The ``fencecheck`` command line.

    fencecheck run [IDS...]     run experiments (all by default), write reports
    fencecheck list             the matrix with its invariants
    fencecheck show ARCHIVE     one evidence archive, readably, with its timeline
    fencecheck smoke            bring up every real part once, prove it works, tear down
    fencecheck mutants [NAMES]  prove the matrix catches every protocol mutant

Exit codes: 0 every verdict pass, 1 some fail, 2 some unknown or a harness
error, 64 bad usage (the message says what to change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from harness.verdict import EXIT_UNKNOWN, EXIT_USAGE

REPO_ROOT = Path(__file__).resolve().parent.parent


class UsageError(Exception):
    """The command line asks for something that cannot be done."""


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {number}")
    return number


def _common_env_options(p: argparse.ArgumentParser) -> None:
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
        type=_positive,
        default=3,
        help="experiments run at once (default 3; they mostly wait on leases)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencecheck",
        description="Fault-injection verification of the lease + fencing token + outbox "
        "protocol on real PostgreSQL, toxiproxy and worker processes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run experiments and write evidence archives")
    run.add_argument("ids", nargs="*", help="experiment ids (A..Q); all when omitted")
    run.add_argument("--repeat", type=_positive, default=1, help="run each experiment N times")
    run.add_argument("--seed", type=int, help="seed for generated inputs (default: random)")
    run.add_argument(
        "--keep",
        action="store_true",
        help="leave the environment up after the run and print how to connect; Ctrl-C ends it",
    )
    run.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    run.add_argument("--mutant", help="start the reference worker with this named mutant")
    run.add_argument("--quiet", action="store_true", help="no per-experiment progress lines")
    _common_env_options(run)

    sub.add_parser("list", help="the acceptance matrix with its invariants")

    show = sub.add_parser("show", help="print one evidence archive with its timeline")
    show.add_argument("archive", help="path of a YAML archive (reports/<run>/archives/X.yaml)")

    smoke = sub.add_parser(
        "smoke",
        help="bring up every real part once as local processes and prove it works "
        "(the container backend has its own: make test-containers)",
    )
    _common_env_options(smoke)

    mutants = sub.add_parser(
        "mutants", help="prove the matrix catches every protocol mutant of the reference worker"
    )
    mutants.add_argument("names", nargs="*", help="mutant names (all when omitted)")
    mutants.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    _common_env_options(mutants)

    return parser


def _settings(args: argparse.Namespace, *, mutant: str | None = None) -> object:
    from harness.environment import DEFAULT_WORKER_CMD, Settings

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


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same path as Ctrl-C: unwind every context manager.
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_list() -> int:
    import scenarios

    for module in scenarios.all_modules():
        spec = module.SPEC
        variants = f" (variants: {', '.join(spec.variants)})" if spec.variants else ""
        print(f"{spec.id}  {spec.title}{variants}")
        print(f"   fault:     {spec.fault}")
        print(f"   invariant: {spec.invariant}")
        print(f"   rules:     {', '.join(map(str, spec.rules))}   source: {spec.seed_section}")
    return 0


def cmd_show(path: str) -> int:
    from harness.evidence import ArchiveInvalid, read_archive

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


def cmd_run(args: argparse.Namespace) -> int:
    import scenarios
    from harness.environment import Settings, SharedServices
    from harness.report import (
        overall,
        terminal_table,
        write_junit,
        write_results_json,
        write_summary,
    )
    from harness.runner import jobs_for, run_jobs
    from harness.verdict import Verdict, exit_code

    try:
        modules = scenarios.select(args.ids)
    except scenarios.UnknownExperiment as exc:
        raise UsageError(str(exc)) from exc
    settings = _settings(args, mutant=args.mutant)
    assert isinstance(settings, Settings)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    report_dir = Path(args.report_dir) / run_id
    report_dir.mkdir(parents=True, exist_ok=True)
    jobs = jobs_for(modules, args.repeat)
    progress = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}", flush=True))
    print(
        f"fencecheck run {run_id}: {len(jobs)} experiment run(s), seed {seed}, "
        f"worker `{settings.worker_command_text()}`"
        + (f", mutant {settings.mutant}" if settings.mutant else ""),
        flush=True,
    )
    started = time.monotonic()
    with SharedServices(settings) as shared:
        print(
            "  environment: "
            + ", ".join(f"{k} {v}" for k, v in shared.backend.deployment().items())
            + f"; toxiproxy {shared.toxiproxy_version()}",
            flush=True,
        )
        results = run_jobs(
            shared, jobs, report_dir=report_dir, seed=seed, parallel=args.jobs, progress=progress
        )
        wall = time.monotonic() - started
        if settings.keep:
            _keep_up(shared)
    header = {
        "run": run_id,
        "worker": settings.worker_command_text(),
        "mutant": settings.mutant or "none",
        "seed": str(seed),
        "postgres": shared.binaries.describe(),
    }
    write_summary(report_dir / "summary.md", results, header=header, wall_s=wall)
    write_junit(report_dir / "junit.xml", results, suite=f"fencecheck {run_id}")
    write_results_json(report_dir / "results.json", results)
    latest = Path(args.report_dir) / "latest"
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(run_id)
    print()
    print(terminal_table(results))
    verdict = overall(results)
    not_passed = [r for r in results if r.verdict is not Verdict.PASS]
    if not_passed:
        print(f"\nnot passed ({len(not_passed)} of {len(results)}):")
        for r in not_passed:
            print(f"  {r.name} {r.verdict.value}: {r.reason}  [{r.archive_path}]")
    print(f"\noverall: {verdict.value.upper()} in {wall:.1f}s; reports in {report_dir}")
    print(
        f"  summary {report_dir / 'summary.md'}, JUnit {report_dir / 'junit.xml'}, "
        f"archives {report_dir / 'archives'}"
    )
    return exit_code(verdict)


def _keep_up(shared: object) -> None:
    from harness.environment import SharedServices

    assert isinstance(shared, SharedServices) and shared.primary is not None
    print("\n--keep: PostgreSQL and toxiproxy stay up until you press Ctrl-C.")
    for key, value in shared.describe().items():
        print(f"  {key}: {value}")
    databases = shared.primary.query(
        "SELECT datname FROM pg_database WHERE datname NOT IN "
        "('postgres', 'template0', 'template1') ORDER BY oid"
    )
    print("  experiment databases (one per experiment run, as the experiment left it):")
    for row in databases:
        print(f"    psql '{shared.primary.admin_dsn(row['datname'])}'")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("tearing down")


def cmd_smoke(args: argparse.Namespace) -> int:
    from harness.environment import Settings
    from harness.smoke import smoke

    if args.backend != "local":
        raise UsageError("smoke runs local processes only; for containers use make test-containers")
    settings = _settings(args)
    assert isinstance(settings, Settings)
    return smoke(settings)


def cmd_mutants(args: argparse.Namespace) -> int:
    from harness.environment import Settings
    from harness.mutants import MutantListUnavailable, run_mutants

    settings = _settings(args)
    assert isinstance(settings, Settings)
    try:
        return run_mutants(
            settings, args.names, report_root=Path(args.report_dir), parallel=args.jobs
        )
    except (MutantListUnavailable, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.command == "list":
            return cmd_list()
        if args.command == "show":
            return cmd_show(args.archive)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "smoke":
            return cmd_smoke(args)
        if args.command == "mutants":
            return cmd_mutants(args)
    except UsageError as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nfencecheck: interrupted; everything it started has been stopped", file=sys.stderr)
        return 130
    except Exception as exc:
        from harness.backend import BackendUnavailable
        from harness.pg_binaries import PgBinariesNotFound
        from harness.toxiproxy import ToxiproxyNotFound

        if isinstance(exc, PgBinariesNotFound | ToxiproxyNotFound | BackendUnavailable):
            print(f"fencecheck: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise
    parser.error(f"unknown command {args.command}")
    return EXIT_UNKNOWN


if __name__ == "__main__":
    sys.exit(main())
