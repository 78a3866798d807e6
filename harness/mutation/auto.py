"""Run generated mutants against the matrix: each until its first *fail*.

For every mutant: a copy of the reference implementation with its one edit
(:mod:`.workspace`), a preflight that proves a worker would import that copy,
a template database migrated by that copy's ``migrate`` (so a SQL mutant's
migration is what the experiments run on), then the matrix, most likely
catcher first (:mod:`.ordering`), at most ``parallel`` experiments at a
time, stopping at the first fail. A SQL mutant runs only the experiments
whose databases ran its function in the baseline (:mod:`.reach`); one no
experiment reaches survives at once, and says so. One :class:`SharedServices` (toxiproxy,
the primary, the binaries) serves every mutant; each gets only its own
template and its own worker command.

Classification (only a *fail* verdict catches):

- ``caught``: some experiment failed;
- ``survived``: no experiment failed and at least one passed;
- ``error``: the copy does not import, ``migrate`` fails, or every
  experiment it ran ended *unknown*: reported apart, never counted as caught;
- ``unconfirmed``: caught, but the catching experiment does not pass against
  the unmutated implementation either when rerun at once (``confirm``; a
  loaded machine can fail a timing-sensitive experiment, or keep its fault
  from taking effect: an *unknown* there is retried once): reported apart,
  never counted as caught;
- ``equivalent``: listed in the triage file (not run unless asked);
- ``not_run``: the time budget ran out first.

Invariant: a mutant leaves nothing behind: its copy is removed and its
template dropped, also when the run is interrupted (then by the shared
services' own teardown).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import scenarios
from harness import stopping
from harness.engine.environment import CALLS_FILE, Settings, SharedServices
from harness.engine.runner import Job, jobs_for, run_jobs, run_jobs_until_fail
from harness.evidence.summary import ExperimentResult
from harness.mutation.catalog import source_files
from harness.mutation.ordering import CatcherOrder, result_label
from harness.mutation.reach import (
    FUNCTIONS_SQL,
    SOURCES_SQL,
    Reach,
    python_functions,
    sql_callees,
)
from harness.mutation.sites import AutoMutant
from harness.mutation.traced_worker import TRACED_WORKER_CMD
from harness.mutation.triage import Triage
from harness.mutation.workspace import MutantWorkspace, PreflightFailed, slug
from harness.verdict import Verdict

Status = Literal["caught", "survived", "equivalent", "error", "unconfirmed", "not_run"]
Progress = Callable[[str], None]
JOURNAL = "outcomes.jsonl"  # one line per mutant, as it finished
RUN_FILE = "run.json"  # how the run was started (and, once done, its wall time)


class BaselineFailed(RuntimeError):
    """The unmutated implementation fails the matrix: no catch could mean anything."""


@dataclass
class AutoOptions:
    repo_root: Path
    report_dir: Path
    parallel: int = 2
    concurrent: int = 1
    budget_s: float | None = None
    baseline: bool = True
    confirm: bool = True
    run_equivalent: bool = False
    seed: int = 20261129
    learned: Path | None = None
    # Experiment ids or labels to judge against (empty: the whole matrix).
    only: tuple[str, ...] = ()


@dataclass
class AutoOutcome:
    """What one generated mutant came to."""

    mutant: AutoMutant
    status: Status
    detail: str
    caught_by: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    verdicts: dict[str, str] = field(default_factory=dict)  # job label -> verdict
    suggested: list[str] = field(default_factory=list)
    note: str | None = None  # a triage reason, or a contradiction of the triage file


@dataclass
class AutoRun:
    outcomes: list[AutoOutcome]
    wall_s: float
    baseline_s: float | None


#: How often an experiment that ended *unknown* against a mutant runs again:
#: on a loaded machine a catcher excused by a stall proved nothing, and
#: without another attempt the mutant would count as survived.
RETRY_UNKNOWN = 1


class _Runner:
    def __init__(
        self,
        shared: SharedServices,
        triage: Triage,
        order: CatcherOrder,
        options: AutoOptions,
        progress: Progress,
        total: int,
    ) -> None:
        self.shared = shared
        self.triage = triage
        self.order = order
        self.options = options
        self.progress = progress
        self.total = total
        self.jobs = [
            j
            for j in jobs_for(scenarios.all_modules(), 1)
            if not options.only or j.spec.id in options.only or j.label in options.only
        ]
        self.started = time.monotonic()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self.stop = threading.Event()  # set on Ctrl-C / SIGTERM: start nothing new
        # Experiments that failed against the unmutated implementation in this run
        # (a confirmation): under this load their fail proves nothing.
        self.unreliable: set[str] = set()
        # What the baseline ran (reach.py); None without a baseline: run all.
        self.reach: Reach | None = None

    def out_of_time(self) -> bool:
        budget = self.options.budget_s
        return budget is not None and time.monotonic() - self.started > budget

    def cut_short(self) -> bool:
        """Start nothing new: interrupted, or the --budget ran out (it bounds the
        mutants already running too, so the run ends within one experiment)."""
        return self.interrupted() or self.out_of_time()

    def interrupted(self) -> bool:
        # A signal reaches the process-wide state; the main thread, blocked on
        # the pool's results, may not have set self.stop yet.
        return self.stop.is_set() or stopping.requested()

    def one(self, mutant: AutoMutant) -> AutoOutcome:
        with self._lock:
            number = next(self._numbers)
        if self.interrupted():
            outcome = AutoOutcome(mutant, "not_run", "the run was interrupted before it")
        elif self.out_of_time():
            outcome = AutoOutcome(mutant, "not_run", "the time budget ran out before it")
        elif mutant.id in self.triage.equivalent and not self.options.run_equivalent:
            reason = self.triage.equivalent[mutant.id]
            outcome = AutoOutcome(mutant, "equivalent", "triaged equivalent, not run", note=reason)
        else:
            outcome = self.check(mutant, number)
        self.report(number, outcome)
        return outcome

    def report(self, number: int, o: AutoOutcome) -> None:
        what = {
            "caught": f"caught by {','.join(o.caught_by)}",
            "survived": "SURVIVED",
            "equivalent": "equivalent",
            "error": "error",
            "unconfirmed": "UNCONFIRMED catch",
            "not_run": "not run",
        }[o.status]
        ran = f", {len(o.verdicts)} experiment(s)" if o.verdicts else ""
        line = f"[{number}/{self.total}] {o.mutant.id}: {what} in {o.wall_s:.1f}s{ran}"
        if o.status in ("error", "unconfirmed"):
            line += f" ({o.detail.splitlines()[0][:160] if o.detail else ''})"
        self.progress(line)
        self.journal(o)

    def journal(self, o: AutoOutcome) -> None:
        """Append the outcome to the journal at once: a run stopped early (killed,
        machine lost) still leaves every verdict it reached, and the report is
        built from it (``auto_report.rebuild``)."""
        line = json.dumps(entry(o, self.options.repo_root)) + "\n"
        with self._lock:
            self.options.report_dir.mkdir(parents=True, exist_ok=True)
            with (self.options.report_dir / JOURNAL).open("a", encoding="utf-8") as f:
                f.write(line)

    def check(self, mutant: AutoMutant, number: int) -> AutoOutcome:
        """Run one mutant (see the module docstring); never raises for the mutant's sake."""
        if self.reach is not None and not self.reach.jobs_for(mutant, self.jobs):
            outcome = AutoOutcome(mutant, "survived", self.reach.unreached_reason(mutant))
            outcome.suggested = self.order.suggest(mutant, self.jobs)
            return self._with_triage(outcome)
        started = time.monotonic()
        report_dir = self.options.report_dir / "mutants" / slug(mutant.id)
        workspace = MutantWorkspace(
            mutant, self.options.repo_root, self.shared.root / "automutants"
        )
        try:
            outcome = self._run(mutant, number, workspace, report_dir)
        finally:
            workspace.remove()
        outcome.wall_s = time.monotonic() - started
        if outcome.status == "survived":
            outcome.suggested = self.order.suggest(mutant, self.jobs)
        with self._lock:
            if self.options.learned is not None:
                self.order.save(self.options.learned)
        return self._with_triage(outcome)

    def _run(
        self, mutant: AutoMutant, number: int, workspace: MutantWorkspace, report_dir: Path
    ) -> AutoOutcome:
        try:
            workspace.preflight()
        except PreflightFailed as exc:
            if self.interrupted():
                return AutoOutcome(mutant, "not_run", "the run was interrupted before it")
            return AutoOutcome(mutant, "error", f"preflight: {exc}")
        settings = dataclasses.replace(
            self.shared.settings,
            worker_cmd=workspace.worker_cmd,
            mutant=None,
            generated_mutant=mutant.id,
            keep=False,
        )
        digest = hashlib.sha256(mutant.id.encode()).hexdigest()[:8]
        template = f"fc_auto_{number}_{digest}"
        with ExitStack() as stack:
            try:
                view = stack.enter_context(
                    self.shared.worker_view(settings, template, report_dir / "logs")
                )
            except Exception as exc:
                if self.interrupted():  # the stop, not the mutant, ended its migration
                    return AutoOutcome(mutant, "not_run", "the run was interrupted before it")
                return AutoOutcome(mutant, "error", f"migrate: {type(exc).__name__}: {exc}")
            with self._lock:
                ordered = last(self.order.order(mutant, self.jobs), self.unreliable)
            if self.reach is not None:  # the experiments that run the mutated code
                ordered = self.reach.jobs_for(mutant, ordered)
            results = run_jobs_until_fail(
                view,
                ordered,
                report_dir=report_dir,
                seed=self.options.seed,
                parallel=self.options.parallel,
                stop=self.cut_short,
                retry_unknown=RETRY_UNKNOWN,
            )
        with self._lock:
            outcome = distrust(classify(mutant, results), self.unreliable)
        if outcome.status == "survived" and len(ordered) < len(self.jobs):
            outcome.detail += (
                f" (ran the {len(ordered)} of {len(self.jobs)} experiments whose databases run "
                f"{mutant.scope}; the others cannot reach it)"
            )
        cut = self.interrupted() or (self.out_of_time() and len(results) < len(ordered))
        if outcome.status != "caught" and cut:
            # Not judged: a survivor is one that ran the whole matrix without a fail.
            why = "interrupted" if self.interrupted() else "the time budget ran out"
            return AutoOutcome(
                mutant,
                "not_run",
                f"{why} after {len(results)} of {len(ordered)} experiments, none failed",
                verdicts=outcome.verdicts,
            )
        if outcome.status == "caught" and self.options.confirm:
            self.confirm(outcome, report_dir / "confirm")
            if self.interrupted() and outcome.status != "caught":
                # The stop cut the confirmation, not the correct code: not judged.
                return AutoOutcome(
                    mutant,
                    "not_run",
                    f"failed {', '.join(outcome.caught_by)}; interrupted before the catch was "
                    "confirmed against the unmutated implementation",
                    verdicts=outcome.verdicts,
                )
        with self._lock:
            if outcome.status == "caught":
                self.order.learn(mutant, results)
            else:
                self.order.learn_durations(results)
        return outcome

    def confirm(self, outcome: AutoOutcome, report_dir: Path, attempts: int = 2) -> None:
        """Rerun a catching experiment against the unmutated implementation; a
        catch none of them passes there is ``unconfirmed``. One that passes is
        enough (the quickest first: catchers that ran side by side all failed,
        and each rerun costs its whole wall time); an *unknown* there (a fault
        that did not take effect) is retried, up to ``attempts`` runs each."""
        by_time = sorted(outcome.caught_by, key=lambda label: self.order.durations.get(label, 0.0))
        bad: list[ExperimentResult] = []
        runs = itertools.count(1)
        for label in by_time:
            job = [j for j in self.jobs if j.label == label]
            if not job:  # never trivially confirmed: nothing ran
                continue
            for _ in range(attempts):
                results = run_jobs(
                    self.shared,
                    job,
                    report_dir=report_dir / f"attempt-{next(runs)}",
                    seed=self.options.seed,
                    parallel=1,
                    progress=None,
                )
                if all(r.verdict is Verdict.PASS for r in results):
                    outcome.detail += (
                        f" (confirmed: {label} passes against the unmutated implementation)"
                    )
                    return
                if any(r.verdict is Verdict.FAIL for r in results):
                    with self._lock:  # a fail of the correct code: noise at this load
                        self.unreliable.add(label)
                    break
            bad.extend(r for r in results if r.verdict is not Verdict.PASS)
        outcome.status = "unconfirmed"
        outcome.detail = (
            "; ".join(
                f"{result_label(r)} gave {r.verdict.value} against the unmutated "
                f"implementation too ({r.reason})"
                for r in bad
            )
            + f"; the mutant's own: {outcome.detail}"
        )

    def _with_triage(self, o: AutoOutcome) -> AutoOutcome:
        mid = o.mutant.id
        if mid in self.triage.equivalent:
            if o.status == "survived":
                o.status, o.note = "equivalent", self.triage.equivalent[mid]
            elif o.status == "caught":
                o.note = "the triage file calls it equivalent, but the matrix caught it"
        elif mid in self.triage.survivors:
            s = self.triage.survivors[mid]
            if o.status == "caught":
                o.note = "the triage file lists it as a survivor, but the matrix caught it"
            else:
                o.note = f"breaks: {s.breaks}; should be caught by: {s.should_catch}"
        return o


def last(jobs: Sequence[Job], unreliable: set[str]) -> list[Job]:
    """``jobs`` with the unreliable ones moved to the end (order kept otherwise)."""
    return [j for j in jobs if j.label not in unreliable] + [
        j for j in jobs if j.label in unreliable
    ]


def distrust(outcome: AutoOutcome, unreliable: set[str]) -> AutoOutcome:
    """A catch only by experiments that already failed against the unmutated
    implementation in this run is ``unconfirmed``: a loaded machine fails them
    without a bug, and one passing rerun does not make their fail mean one."""
    if outcome.status == "caught" and set(outcome.caught_by) <= unreliable:
        outcome.status = "unconfirmed"
        outcome.detail = (
            f"caught only by {', '.join(outcome.caught_by)}, which failed against the "
            f"unmutated implementation earlier in this run; the mutant's own: {outcome.detail}"
        )
    return outcome


def entry(o: AutoOutcome, repo_root: Path) -> dict[str, Any]:
    """One mutant's line of the journal and of ``results.json``: what it is, its
    verdict, who caught it, and for a survivor, error or unconfirmed catch its diff."""
    diff = None
    if o.status in ("survived", "error", "unconfirmed"):
        diff = o.mutant.diff((repo_root / o.mutant.path).read_text(encoding="utf-8"))
    return {
        **o.mutant.as_dict(),
        "status": o.status,
        "caught_by": o.caught_by,
        "wall_s": round(o.wall_s, 2),
        "verdicts": o.verdicts,
        "detail": o.detail,
        "note": o.note,
        "should_be_caught_by": o.suggested,
        "diff": diff,
    }


def classify(mutant: AutoMutant, results: Sequence[ExperimentResult]) -> AutoOutcome:
    """caught / survived / error from the verdicts of one mutant's experiments."""
    verdicts = {result_label(r): r.verdict.value for r in results}
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    if failed:
        detail = "; ".join(f"{result_label(r)}: {r.reason}" for r in failed)
        caught_by = sorted({result_label(r) for r in failed})
        return AutoOutcome(mutant, "caught", detail, caught_by, verdicts=verdicts)
    if results and all(r.verdict is Verdict.UNKNOWN for r in results):
        first = results[0]
        detail = f"every experiment ended unknown, e.g. {result_label(first)}: {first.reason}"
        return AutoOutcome(mutant, "error", detail, verdicts=verdicts)
    unknown = [f"{result_label(r)}: {r.reason}" for r in results if r.verdict is Verdict.UNKNOWN]
    detail = "no experiment failed" + (f"; unknown: {'; '.join(unknown)}" if unknown else "")
    return AutoOutcome(mutant, "survived", detail, verdicts=verdicts)


def _baseline(
    shared: SharedServices, jobs: Sequence[Job], options: AutoOptions
) -> tuple[list[ExperimentResult], Reach]:
    """The matrix against the unmutated implementation, with what each
    experiment ran (:mod:`.reach`): the worker command is the traced one, on a
    template of its own whose ``migrate`` is traced too."""
    report_dir = options.report_dir / "baseline"
    traced = dataclasses.replace(
        shared.settings, worker_cmd=TRACED_WORKER_CMD, trace_calls=True, keep=False
    )
    with shared.worker_view(traced, "fc_auto_baseline", report_dir / "template") as view:
        results = run_jobs(
            view,
            jobs,
            report_dir=report_dir,
            seed=options.seed,
            parallel=options.parallel,
            progress=None,
        )
        assert view.primary is not None and view.template is not None
        sources = {
            str(r["f"]): str(r["src"] or "")
            for r in view.primary.query(SOURCES_SQL, dbname=view.template)
        }
        sql = [str(r["f"]) for r in view.primary.query(FUNCTIONS_SQL, dbname=view.template)]
    python_paths = [
        path for language, path in source_files(options.repo_root) if language == "python"
    ]
    migrate_calls = report_dir / "template" / CALLS_FILE
    everywhere = migrate_calls.read_text().split() if migrate_calls.exists() else []
    functions = [*sql, *python_functions(options.repo_root, python_paths)]
    return results, Reach.of(results, functions, everywhere, sql_callees(sources))


def run_generated(
    settings: Settings,
    mutants: Sequence[AutoMutant],
    triage: Triage,
    order: CatcherOrder,
    options: AutoOptions,
    progress: Progress,
) -> AutoRun:
    """Run ``mutants`` (see the module docstring). Raises BaselineFailed when the
    correct implementation fails an experiment of the matrix first (``baseline``)."""
    started = time.monotonic()
    baseline_s: float | None = None
    with SharedServices(settings) as shared:
        runner = _Runner(shared, triage, order, options, progress, len(mutants))
        if options.baseline:
            progress(f"baseline: the unmutated implementation, {len(runner.jobs)} experiment runs")
            results, runner.reach = _baseline(shared, runner.jobs, options)
            baseline_s = time.monotonic() - started
            order.learn_durations(results)
            failed = [r for r in results if r.verdict is Verdict.FAIL]
            if failed:
                raise BaselineFailed(
                    "the unmutated implementation fails: "
                    + "; ".join(f"{result_label(r)} ({r.reason})" for r in failed)
                    + " (check `uptime`; rerun, or use --no-baseline knowingly)"
                )
            # An unknown proves nothing either way; each catch is confirmed anyway.
            unknown = [
                f"{result_label(r)} ({r.reason})" for r in results if r.verdict is not Verdict.PASS
            ]
            progress(
                f"baseline: no experiment failed in {baseline_s:.1f}s"
                + (f"; unknown: {'; '.join(unknown)}" if unknown else "")
            )
        runner.started = time.monotonic()
        with ThreadPoolExecutor(max_workers=options.concurrent, thread_name_prefix="auto") as pool:
            futures = [pool.submit(runner.one, m) for m in mutants]
            try:
                outcomes = [f.result() for f in futures]
            except BaseException:
                # Ctrl-C / SIGTERM: start nothing new; what runs ends within its timeouts.
                runner.stop.set()
                for f in futures:
                    f.cancel()
                raise
    return AutoRun(outcomes, time.monotonic() - started, baseline_s)
