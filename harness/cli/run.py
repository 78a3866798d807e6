"""``fencecheck run [IDS...]``: run experiments and write the run's reports."""

from __future__ import annotations

import argparse
import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    positive,
    settings_from_args,
    shard_from_args,
    shard_option,
)
from harness.evidence.gate import add_gate_option

if TYPE_CHECKING:
    from harness.contract.report import ContractReport
    from harness.engine.environment import MigrateFailed, SharedServices

NAME = "run"
HELP = "run experiments and write evidence archives"


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("ids", nargs="*", help="experiment ids (A..Q); all when omitted")
    run.add_argument("--repeat", type=positive, default=1, help="run each experiment N times")
    run.add_argument("--seed", type=int, help="seed for generated inputs (default: random)")
    run.add_argument(
        "--keep",
        action="store_true",
        help="leave the environment up after the run and print how to connect; Ctrl-C ends it",
    )
    run.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    run.add_argument("--mutant", help="start the reference worker with this named mutant")
    run.add_argument("--quiet", action="store_true", help="no per-experiment progress lines")
    run.add_argument(
        "--skip-contract",
        action="store_true",
        help="with --worker-cmd: run the matrix without checking the worker against the "
        "contract first (`fencecheck contract`)",
    )
    shard_option(run, "experiment runs")
    add_gate_option(run)
    common_env_options(run)


def main(args: argparse.Namespace) -> int:
    import scenarios
    from harness.engine.environment import MigrateFailed, SharedServices
    from harness.engine.runner import jobs_for, run_jobs
    from harness.engine.shards import ShardError
    from harness.evidence.gate import gate_exit, gate_line
    from harness.evidence.shard_record import job_items, new_record, write_record
    from harness.evidence.summary import (
        overall,
        terminal_table,
        write_junit,
        write_results_json,
        write_summary,
    )
    from harness.verdict import EXIT_UNKNOWN, Verdict

    try:
        modules = scenarios.select(args.ids)
    except scenarios.UnknownExperiment as exc:
        raise UsageError(str(exc)) from exc
    settings = settings_from_args(args, mutant=args.mutant)
    shard = shard_from_args(args)
    if shard.count > 1 and args.seed is None:
        raise UsageError(
            f"--shard {shard} needs --seed: give every part the same seed "
            "(e.g. --seed $CI_PIPELINE_ID) so the merged run is one run"
        )
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    all_jobs = jobs_for(modules, args.repeat)
    try:
        items = job_items(all_jobs, shard.count)
    except ShardError as exc:
        raise UsageError(str(exc)) from exc
    mine = {item.label for item in items if item.shard == shard.index}
    jobs = [job for job in all_jobs if job.label in mine]
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    report_dir = Path(args.report_dir) / run_id
    report_dir.mkdir(parents=True, exist_ok=True)
    progress = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}", flush=True))
    print(
        f"fencecheck run {run_id}: {len(jobs)} experiment run(s), seed {seed}, "
        f"worker `{settings.worker_command_text()}`"
        + (f", mutant {settings.mutant}" if settings.mutant else "")
        + (f", shard {shard} of {len(all_jobs)}" if shard.count > 1 else ""),
        flush=True,
    )
    started = time.monotonic()
    stack = contextlib.ExitStack()
    try:
        shared = stack.enter_context(SharedServices(settings))
    except MigrateFailed as exc:
        return _migrate_failed(exc, report_dir)
    with stack:
        print(
            "  environment: "
            + ", ".join(f"{k} {v}" for k, v in shared.backend.deployment().items())
            + f"; toxiproxy {shared.toxiproxy_version()}",
            flush=True,
        )
        if args.worker_cmd and not args.skip_contract:
            report = _contract_first(shared, report_dir, progress)
            if not report.conformant:
                print(report.text())
                print(
                    f"\nthe worker does not follow the contract; the matrix was not run (its "
                    f"verdicts would not mean much). Report: {report_dir / 'contract.txt'}; "
                    "--skip-contract runs the matrix anyway."
                )
                print(f"fencecheck: exit {EXIT_UNKNOWN}: not conformant, no experiment ran")
                return EXIT_UNKNOWN
        assert shared.primary is not None
        record = new_record(
            kind="run",
            run_id=run_id,
            shard=shard,
            items=items,
            seed=seed,
            worker_cmd=settings.worker_cmd,
            mutant=settings.mutant,
            postgres_version=shared.primary.query("SHOW server_version")[0]["server_version"],
            backend=settings.backend,
        )
        write_record(report_dir, record)
        results = run_jobs(
            shared, jobs, report_dir=report_dir, seed=seed, parallel=args.jobs, progress=progress
        )
        wall = time.monotonic() - started
        write_record(report_dir, record.finished(wall))
        if settings.keep:
            _keep_up(shared)
    header = {
        "run": run_id,
        "worker": settings.worker_command_text(),
        "mutant": settings.mutant or "none",
        "seed": str(seed),
        "postgres": shared.binaries.describe(),
        "postgres server": record.postgres_version,
    }
    if shard.count > 1:
        header["shard"] = f"{shard} ({len(jobs)} of {len(all_jobs)} experiment runs)"
    write_summary(report_dir / "summary.md", results, header=header, wall_s=wall)
    write_junit(report_dir / "junit.xml", results, suite=f"fencecheck {run_id}")
    write_results_json(report_dir / "results.json", results)
    pages, digest = _publish(report_dir)
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
    print(f"  pages {pages}; evidence digest {digest} (fencecheck verify {report_dir})")
    print(gate_line(results, args.fail_on))
    return gate_exit(results, args.fail_on)


def _contract_first(
    shared: SharedServices, report_dir: Path, progress: Callable[[str], None]
) -> ContractReport:
    """`fencecheck contract` on the run's own services, before any experiment."""
    from harness.contract.conformance import check

    started = time.monotonic()
    report = check(shared, report_dir / "logs" / "contract", progress)
    report.write(report_dir)
    progress(
        f"contract: {'conformant' if report.conformant else f'{len(report.gaps)} gap(s)'} "
        f"in {time.monotonic() - started:.1f}s"
    )
    return report


def _migrate_failed(exc: MigrateFailed, report_dir: Path) -> int:
    """A worker whose migrate fails: exit 2 with one paragraph; its output kept."""
    from harness.verdict import EXIT_UNKNOWN

    log = report_dir / "logs" / "migrate.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(exc.output(), encoding="utf-8")
    paragraph = exc.paragraph(str(log))
    (report_dir / "summary.md").write_text(
        f"# fencecheck run\n\n- **overall verdict**: harness error, no experiment ran\n\n"
        f"{paragraph}\n",
        encoding="utf-8",
    )
    print(f"\nfencecheck: {paragraph}", flush=True)
    print(f"fencecheck: exit {EXIT_UNKNOWN}: the worker's migrate failed, no experiment ran")
    return EXIT_UNKNOWN


def _publish(report_dir: Path) -> tuple[str, str]:
    """The auditor's pages, then the seal over every file the run wrote (last)."""
    from harness.evidence.html import write_run_pages
    from harness.evidence.manifest import run_digest, write_manifest

    pages = "not written"
    try:
        pages = str(write_run_pages(report_dir))
    except Exception as exc:  # the verdict stands on the archives; say why pages are missing
        pages = f"NOT WRITTEN ({type(exc).__name__}: {exc}; rebuild: fencecheck report)"
    write_manifest(report_dir)
    return pages, run_digest(report_dir)


def _keep_up(shared: SharedServices) -> None:
    assert shared.primary is not None
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
