"""``fencecheck run [IDS...]``: run experiments and write the run's reports.

Order of a run: check the command line (usage errors exit 64 before anything
starts), reap what dead runs left, bring up the shared services (and write
shard.json), run the jobs, write the reports, keep the environment up with
``--keep``, tear down, then the pages and the seal (MANIFEST.sha256) last.
A stop request (SIGINT, SIGTERM, SIGHUP) at any point ends it within seconds
with reports marked interrupted; a failed start leaves a run directory whose
``error.txt`` says what failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import secrets
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness import stopping
from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    non_negative,
    positive,
    reap_and_report,
    report_root,
    seed_value,
    settings_from_args,
    shard_from_args,
    shard_option,
)
from harness.engine import waits
from harness.evidence.gate import add_gate_option
from harness.verdict import EXIT_UNKNOWN

if TYPE_CHECKING:
    from harness.contract.mapping import Declaration
    from harness.contract.report import ContractReport
    from harness.engine.environment import Environment, MigrateFailed, Settings, SharedServices
    from harness.engine.progress import Progress
    from harness.engine.runner import Job
    from harness.engine.shards import Shard
    from harness.evidence.shard_record import ShardItem, ShardRecord
    from harness.evidence.summary import ExperimentResult

NAME = "run"
HELP = "run experiments and write evidence archives"
# Experiments of one run at once by default (see add_arguments).
RUN_JOBS = 6
# One more attempt for an unknown: beside six CPU hogs, 10 of 840 runs of the
# Go worker ended unknown (a worker cancelled by its own renewal timeout
# before the fault's point), at most 4 in one matrix (docs/running.md).
RETRY_UNKNOWN = 1


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "ids",
        nargs="*",
        help="experiment ids (A..Z, see `fencecheck list`), or one variant as V[purge]; all when omitted",
    )
    run.add_argument("--repeat", type=positive, default=1, help="run each experiment N times")
    run.add_argument(
        "--seed",
        type=seed_value,
        help="seed of every random choice of every experiment (task and tenant ids, which "
        "workers Q freezes, ...); the same seed gives the same schedule (default: random, "
        "printed and recorded in every archive)",
    )
    run.add_argument(
        "--keep",
        action="store_true",
        help="leave every part of the experiments up after the run (databases, mock tools, "
        "proxies, replicated pairs, control sockets) and print how to reach each; Ctrl-C ends it",
    )
    run.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    run.add_argument("--mutant", help="start the reference worker with this named mutant")
    run.add_argument("--quiet", action="store_true", help="no per-experiment progress lines")
    run.add_argument(
        "--no-pages",
        action="store_true",
        help="write no HTML pages (the archives, summary.md, results.json and JUnit are always "
        "written and sealed; `fencecheck report DIR` builds the pages later)",
    )
    run.add_argument(
        "--skip-contract",
        action="store_true",
        help="with --worker-cmd: run the matrix without checking the worker against the "
        "contract first (`fencecheck contract`)",
    )
    run.add_argument(
        "--retry-unknown",
        type=non_negative,
        default=RETRY_UNKNOWN,
        metavar="N",
        help="run an experiment that ends unknown (it proved nothing: a fault that did not take "
        "effect, a wait a loaded machine ran out) again, up to N more times; a fail is never "
        f"retried, and every attempt's evidence is kept (default {RETRY_UNKNOWN}; 0: never)",
    )
    shard_option(run, "experiment runs")
    add_gate_option(run)
    # Six: the matrix's runs mostly wait on leases; with the harness's own CPU
    # cut (docs/running.md) four jobs left half a core idle, and six CPU hogs
    # beside six jobs left every verdict sound.
    common_env_options(run, jobs=RUN_JOBS)


def _check_mutant(worker_cmd: tuple[str, ...], mutant: str) -> None:
    from harness.mutation.named import MutantListUnavailable, list_mutants

    try:
        known = [m.name for m in list_mutants(worker_cmd)]
    except MutantListUnavailable as exc:
        raise UsageError(f"--mutant {mutant}: {exc}") from None
    if mutant not in known:
        raise UsageError(
            f"--mutant {mutant!r} is not a mutant of this worker; known: {', '.join(known)} "
            "(`fencecheck mutants` runs them all)"
        )


def main(args: argparse.Namespace) -> int:
    import scenarios
    from harness.engine.progress import Progress
    from harness.engine.runner import jobs_for
    from harness.engine.shards import ShardError
    from harness.evidence.shard_record import job_items

    try:
        modules = scenarios.select(args.ids)
        only = scenarios.variants(args.ids)
    except scenarios.UnknownExperiment as exc:
        raise UsageError(str(exc)) from exc
    settings = settings_from_args(args, mutant=args.mutant)
    if settings.mutant:
        _check_mutant(tuple(settings.worker_cmd), settings.mutant)
    declaration = _declared_mapping(tuple(settings.worker_cmd))
    if declaration is None:
        return EXIT_UNKNOWN
    shard = shard_from_args(args)
    if shard.count > 1 and args.seed is None:
        raise UsageError(
            f"--shard {shard} needs --seed: give every part the same seed "
            "(e.g. --seed $CI_PIPELINE_ID) so the merged run is one run"
        )
    root = report_root(args.report_dir)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    all_jobs = [
        j
        for j in jobs_for(modules, args.repeat)
        if j.spec.id not in only or j.variant in only[j.spec.id]
    ]
    try:
        items = job_items(all_jobs, shard.count)
    except ShardError as exc:
        raise UsageError(str(exc)) from exc
    mine = {item.label for item in items if item.shard == shard.index}
    jobs = [job for job in all_jobs if job.label in mine]
    plan = Plan(jobs=jobs, shard=shard, items=items, total=len(all_jobs))
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    with Progress(len(jobs), quiet=args.quiet) as progress:
        progress.say(
            f"fencecheck run {run_id}: {len(jobs)} experiment run(s), seed {seed}, "
            f"worker `{settings.worker_command_text()}`"
            + (f", mutant {settings.mutant}" if settings.mutant else "")
            + (f", shard {shard} of {len(all_jobs)}" if shard.count > 1 else "")
        )
        reap_and_report(settings.work_dir, progress.say)
        return _run(settings, plan, root / run_id, run_id, seed, args, progress)


def _declared_mapping(worker_cmd: tuple[str, ...]) -> Declaration | None:
    """The worker's mapping (contract §14), or None when the one it prints is not
    valid: that is said with every problem, and nothing runs (its experiments
    could not be read through it)."""
    from harness.contract.mapping import MappingError, declared

    try:
        return declared(worker_cmd)
    except MappingError as exc:
        print(f"fencecheck: the worker's mapping is not valid ({exc.source}):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        print(
            f"fencecheck: exit {EXIT_UNKNOWN}: fix the mapping (docs/worker-contract.md section "
            "14); no experiment ran",
            file=sys.stderr,
        )
        return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What this run runs: its jobs, and the part of the whole list they are."""

    jobs: list[Job]
    shard: Shard
    items: list[ShardItem]
    total: int


def _run(
    settings: Settings,
    plan: Plan,
    report_dir: Path,
    run_id: str,
    seed: int,
    args: argparse.Namespace,
    progress: Progress,
) -> int:
    from harness.engine.environment import MigrateFailed, SharedServices
    from harness.engine.runner import interrupted_result, run_jobs
    from harness.evidence.gate import gate_exit, gate_line
    from harness.evidence.run_report import (
        PAGES_BY_S,
        RunInfo,
        seal_run,
        write_pages,
        write_run_reports,
    )
    from harness.evidence.shard_record import new_record, write_record
    from harness.parts.processes import kill_all_children
    from harness.verdict import EXIT_UNKNOWN

    started = time.monotonic()
    jobs = plan.jobs
    header = {
        "run": run_id,
        "worker": settings.worker_command_text(),
        "mutant": settings.mutant or "none",
        "seed": str(seed),
        "backend": settings.backend,
    }
    if plan.shard.count > 1:
        header["shard"] = f"{plan.shard} ({len(jobs)} of {plan.total} experiment runs)"
    collected: list[ExperimentResult] = []
    record: ShardRecord | None = None  # none when the start was cut: merge names it missing

    def reports(results: list[ExperimentResult], interrupted: str | None) -> int:
        code = stopping.exit_status() if interrupted else gate_exit(results, args.fail_on)
        info = RunInfo(
            run_id,
            header,
            time.monotonic() - started,
            code,
            interrupted,
            extra={"fail_on": args.fail_on, "wait_log": waits.log().stats()},
        )
        write_run_reports(report_dir, results, info, record)
        return code

    def all_results(done: list[ExperimentResult]) -> list[ExperimentResult]:
        names = {(r.experiment_id, r.variant, r.repeat_index) for r in done}
        return done + [
            interrupted_result(j, None, None)
            for j in jobs
            if (j.spec.id, j.variant, j.repeat_index) not in names
        ]

    def on_escalate(why: str) -> None:
        # The stop escalated before the reports were written: write them now,
        # with what finished, so the run directory never looks complete.
        if not (report_dir / "results.json").exists():
            reports(all_results(list(collected)), f"{stopping.reason()}, then killed ({why})")

    with contextlib.ExitStack() as stack:
        try:
            with stopping.interruptible():
                shared: SharedServices = stack.enter_context(
                    SharedServices(
                        settings, log_dir=report_dir / "logs" / "run", report_dir=report_dir
                    )
                )
                assert shared.primary is not None
                record = new_record(
                    kind="run",
                    run_id=run_id,
                    shard=plan.shard,
                    items=plan.items,
                    seed=seed,
                    worker_cmd=settings.worker_cmd,
                    mutant=settings.mutant,
                    postgres_version=shared.primary.query("SHOW server_version")[0][
                        "server_version"
                    ],
                    backend=settings.backend,
                )
                write_record(report_dir, record)
        except Exception as exc:
            if isinstance(exc, MigrateFailed) and not stopping.requested():
                return _migrate_failed(exc, report_dir)
            # After a stop request, a failed start is the stop's doing (a
            # server killed half-way, a query cut): interrupted, not an error.
            if not isinstance(exc, stopping.Interrupted) and not stopping.requested():
                _start_failed(report_dir, exc)
                raise
            record = None
            code = reports(all_results([]), stopping.reason())
            stack.close()  # what did come up goes before the seal
            seal_run(report_dir, interrupted=True, pages="none: no experiment ran")
            progress.say(f"fencecheck: {stopping.reason()} while starting; reports in {report_dir}")
            return code
        stack.callback(stopping.on_escalate(on_escalate))
        progress.say(
            "  environment: "
            + ", ".join(f"{k} {v}" for k, v in shared.backend.deployment().items())
            + f"; toxiproxy {shared.toxiproxy_version()}"
            + f"\n  access: {shared.access}"
        )
        if args.worker_cmd and not args.skip_contract:
            report = _contract_first(shared, report_dir, progress.say)
            if not report.conformant:
                progress.say(report.text())
                progress.say(
                    f"\nthe worker does not follow the contract; the matrix was not run (its "
                    f"verdicts would not mean much). Report: {report_dir / 'contract.txt'}; "
                    "--skip-contract runs the matrix anyway."
                )
                progress.say(f"fencecheck: exit {EXIT_UNKNOWN}: not conformant, no experiment ran")
                return EXIT_UNKNOWN
        header["postgres"] = shared.binaries.describe()
        header["access"] = shared.access  # who else on this host reaches the run's parts
        header["postgres server"] = record.postgres_version
        results = run_jobs(
            shared,
            jobs,
            report_dir=report_dir,
            seed=seed,
            parallel=args.jobs,
            progress=progress,
            on_result=collected.append,
            retry_unknown=args.retry_unknown,
        )
        interrupted = stopping.reason() if stopping.requested() else None
        code = reports(results, interrupted)
        stopping.trace("reports written")
        progress.close()
        _print_outcome(progress, results, report_dir, time.monotonic() - started, interrupted)
        pages: str | None = None
        if args.no_pages:
            pages = f"not written (--no-pages; fencecheck report {report_dir} builds them)"
        elif settings.keep and not interrupted:
            pages = write_pages(report_dir)
            _keep_up(shared, progress)
    # Last resort: anything still a child of this process was started by this
    # run, whichever path forgot it (only here, where every child is ours).
    for left in kill_all_children():
        progress.say(f"fencecheck: killed a process teardown missed: {left}")
    # Pages and seal last: the servers' logs in the run directory are final now,
    # and the archives of jobs that outlasted a stop's grace are written.
    budget = None if not interrupted else PAGES_BY_S - (stopping.since_s() or 0.0)
    late = shared.wait_jobs_written(3600.0 if budget is None else max(0.0, budget))
    if late:
        progress.say(
            f"fencecheck: sealed before the archive(s) of {', '.join(late)} were written "
            "(the stop's seconds ran out): `fencecheck verify` lists them as added"
        )
    if interrupted is not None and _attach_late_archives(results, report_dir):
        reports(results, interrupted)  # results.json and the summary name them now
    pages, digest = seal_run(report_dir, interrupted=interrupted is not None, pages=pages)
    stopping.trace("pages written and run sealed")
    progress.say(f"  pages {pages}; evidence digest {digest} (fencecheck verify {report_dir})")
    kept = shared.final_reap.problems if shared.final_reap is not None else []
    gone = (
        "everything it started has been removed"
        if not kept
        else f"not removed yet ({'; '.join(kept)}): named in {shared.record.path}, "
        "the next run or `fencecheck clean` removes it"
    )
    if settings.keep and not interrupted:
        progress.say(f"fencecheck: --keep ended; {gone}")
    if interrupted:
        progress.say(
            f"fencecheck: {interrupted}: stopped in {stopping.since_s() or 0:.1f}s; {gone}; "
            f"exit {code}"
        )
    else:
        if kept:
            progress.say(f"fencecheck: {gone}")
        progress.say(gate_line(results, args.fail_on))
    return code


def _attach_late_archives(results: list[ExperimentResult], report_dir: Path) -> bool:
    """Point the results of jobs whose teardown outlasted the stop's grace at the
    archives they wrote meanwhile; True when one was found."""
    found = False
    for result in results:
        if result.archive_path is None and result.duration_s > 0:
            path = report_dir / "archives" / f"{result.label}.yaml"
            if path.is_file():
                result.archive_path, found = path, True
    return found


def _contract_first(
    shared: SharedServices, report_dir: Path, progress: Callable[[str], None]
) -> ContractReport:
    """`fencecheck contract` on the run's own services, before any experiment."""
    from harness.contract.conformance import check

    started = time.monotonic()
    progress("  contract: migrate on a fresh database (done while the run started)")
    report = check(
        shared, report_dir / "logs" / "contract", lambda m: progress(f"  contract: {m} ...")
    )
    report.write(report_dir)
    progress(
        f"  contract: {'conformant' if report.conformant else f'{len(report.gaps)} gap(s)'} "
        f"in {time.monotonic() - started:.1f}s"
    )
    return report


def _migrate_failed(exc: MigrateFailed, report_dir: Path) -> int:
    """A worker whose migrate fails: exit 2 with one paragraph naming its output,
    which migrate() kept once, in ``logs/run/migrate.log``."""
    from harness.verdict import EXIT_UNKNOWN

    paragraph = exc.paragraph(str(exc.log) if exc.log else None)
    # Like every start that failed: error.txt says the run did not start, and
    # stderr carries the part's account (what, exit status, stderr, full log).
    (report_dir / "error.txt").write_text(
        f"fencecheck run did not start: no experiment ran.\n\n{paragraph}\n", encoding="utf-8"
    )
    print(f"fencecheck: harness/environment error: {exc}", file=sys.stderr)
    (report_dir / "summary.md").write_text(
        f"# fencecheck run\n\n- **overall verdict**: harness error, no experiment ran\n\n"
        f"{paragraph}\n",
        encoding="utf-8",
    )
    print(f"\nfencecheck: {paragraph}", flush=True)
    print(f"fencecheck: exit {EXIT_UNKNOWN}: the worker's migrate failed, no experiment ran")
    return EXIT_UNKNOWN


def _start_failed(report_dir: Path, exc: Exception) -> None:
    """A failed start leaves a run directory that says so, with the full story
    (not for what is a usage error: then nothing was started at all)."""
    from harness.backends.base import BackendUnavailable
    from harness.parts.pg_binaries import PgBinariesNotFound
    from harness.parts.toxiproxy import ToxiproxyNotFound

    if isinstance(exc, BackendUnavailable | PgBinariesNotFound | ToxiproxyNotFound):
        return
    with contextlib.suppress(OSError):
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "error.txt").write_text(
            "fencecheck run did not start: no experiment ran.\n\n"
            f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        )


def _print_outcome(
    progress: Progress,
    results: list[ExperimentResult],
    report_dir: Path,
    wall: float,
    interrupted: str | None,
) -> None:
    from harness.evidence.summary import overall, terminal_table
    from harness.verdict import Verdict

    progress.say("")
    progress.say(terminal_table(results))
    not_passed = [r for r in results if r.verdict in (Verdict.FAIL, Verdict.UNKNOWN)]
    if not_passed:
        progress.say(f"\nnot passed ({len(not_passed)} of {len(results)}):")
        for r in not_passed:
            progress.say(f"  {r.name} {r.verdict.value}: {r.reason}  [{r.archive_path or '-'}]")
    apart = [r for r in results if r.verdict is Verdict.NOT_APPLICABLE]
    if apart:
        # Apart from the judged ones, one line per reason: what the system lacks.
        progress.say(f"\nnot applicable ({len(apart)} of {len(results)}, by the system's mapping):")
        by_reason: dict[str, list[str]] = {}
        for r in apart:
            by_reason.setdefault(r.reason, []).append(r.name)
        for reason, names in by_reason.items():
            progress.say(f"  {', '.join(names)}: {reason}")
    state = f"INTERRUPTED ({interrupted})" if interrupted else overall(results).value.upper()
    progress.say(f"\noverall: {state} in {wall:.1f}s; reports in {report_dir}")
    progress.say(
        f"  summary {report_dir / 'summary.md'}, JUnit {report_dir / 'junit.xml'}, "
        f"archives {report_dir / 'archives'}"
    )


def _keep_up(shared: SharedServices, progress: Progress) -> None:
    """Print how to reach every part that stayed up, then wait for a stop."""
    assert shared.primary is not None and shared.toxiproxy is not None
    # A stop is the way out from the first line on: a Ctrl-C sent as soon as
    # the instructions appear must read as the end of --keep, not an interrupt.
    with (
        stopping.expected("ending --keep: tearing everything down"),
        contextlib.suppress(stopping.Interrupted),
        stopping.interruptible(),
    ):
        progress.say("\n--keep: everything stays up until you press Ctrl-C (or send SIGTERM).")
        progress.say(f"  shared primary (superuser): psql '{shared.primary.admin_dsn()}'")
        progress.say(f"  toxiproxy API: {shared.toxiproxy.url}")
        progress.say(f"  logs: {shared.log_dir}; temp root: {shared.root}")
        for env in shared.kept():
            for line in describe_environment(env):
                progress.say(line)
        while not stopping.wait(3600):
            pass


def describe_environment(env: Environment) -> list[str]:
    """How to reach one kept experiment's parts: databases, tool, proxies, socket."""
    lines = [f"  {env.name}:"]
    lines.append(f"    database (superuser): psql '{env.primary.admin_dsn(env.db.name)}'")
    if env.standby is env.primary:
        lines.append("    standby: promoted by the experiment, now the database above")
    elif env.standby is not None:
        lines.append(f"    standby (superuser):  psql '{env.standby.admin_dsn(env.db.name)}'")
    lines.append(f"    worker DSN (through its proxy): {env.worker_dsn()}")
    lines.append(f"    tenant: {env.tenant_id}")
    lines.append(f"    mock tool: {env.tool.base_url} (log {env.tool.log_path})")
    for key, link in sorted(env.links.items()):
        lines.append(f"    proxy {link.name} ({key}): {link.listen} -> {link.upstream}")
    lines.append(f"    control socket: {env.control.socket_path}")
    lines.append(f"    logs: {env.log_dir}")
    return lines
