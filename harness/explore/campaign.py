"""Run schedules against real parts and judge each with the global invariants.

One schedule is one experiment run through the matrix's own runner
(harness/engine/runner.py): a database copied from the migrated template,
its own proxies, mock tool, control socket and workers, all torn down
afterwards; the runner gathers the evidence, judges the global invariants
(harness/checking/invariants/) and writes the archive. Exploration adds no
verdict logic of its own beyond what a schedule needs: which of its faults
took effect, and whether the runs settled after heal.

Verdict per schedule: *fail* when a global invariant broke (whatever else
happened); *unknown* when a fault did not take effect (counted apart as
``no_effect``, never a pass) or the runs did not settle; *pass* otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

from harness.engine.environment import SharedServices
from harness.engine.experiment import Exemption, ExperimentContext, ExperimentSpec, Inconclusive
from harness.engine.runner import Job, run_job
from harness.evidence.summary import ExperimentResult
from harness.explore import schedule as sched
from harness.explore.cell_coverage import CellCoverage
from harness.explore.coverage import Coverage
from harness.explore.generate import Shape, aimable, schedules
from harness.explore.machine import AimRecord, ContractMachine
from harness.explore.nemesis import Effect, Nemesis
from harness.explore.shrink import SearchOver, Shrinker, Violation
from harness.explore.workload import STARTUP_TIMEOUT_S, Workload
from harness.verdict import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN, Verdict

QUIET_TIMEOUT_S = 20.0
MACHINE_TIMEOUT_S = 30.0  # every aim's steps are bounded; this bounds them all
OP_STOP_S = 12.0  # a stopped machine's request in flight answers within its own bound
SPEC_ID = "X"
Progress = Callable[[str], None]


@dataclass
class ScheduleResult:
    """One schedule's outcome, as the campaign counts it."""

    label: str
    schedule: sched.Schedule
    verdict: Verdict
    reason: str
    effects: list[Effect]
    archive_path: Path | None
    duration_s: float
    timing_s: dict[str, float] = field(default_factory=dict)
    experiment: ExperimentResult | None = None
    aims: list[AimRecord] = field(default_factory=list)

    @property
    def state_cells(self) -> dict[str, int]:
        """The cells its evidence shows reached (harness/explore/cells.py)."""
        return dict((self.experiment.state_cells if self.experiment else None) or {})

    @property
    def category(self) -> str:
        """pass, fail, no_effect (a fault did not take effect) or unknown."""
        if self.verdict is Verdict.FAIL:
            return "fail"
        if self.verdict is Verdict.PASS:
            return "pass"
        if (
            "inconclusive:" in self.reason
            or "harness error" in self.reason
            or self.reason.startswith("interrupted")  # cut by a stop: nothing was judged
        ):
            return "unknown"
        if any(not e.took_effect for e in self.effects) or not self.schedule.faults:
            return "no_effect"
        return "unknown"

    @property
    def broken(self) -> list[str]:
        """The invariants the verdict names as broken (empty unless fail)."""
        if self.verdict is not Verdict.FAIL:
            return []
        text = self.reason.split(" (the experiment itself")[0]
        text = text.removeprefix("global invariant broken: ").removeprefix("invariant broken: ")
        return [part.strip() for part in text.split(";") if part.strip()]


def spec_for(schedule: sched.Schedule) -> ExperimentSpec:
    faults = ", ".join(f.label() for f in schedule.faults) or "none"
    return ExperimentSpec(
        id=SPEC_ID,
        title="explore schedule",
        seed_section="generated schedule (docs/explore.md)",
        invariant="every global invariant (docs/worker-contract.md §11) over the whole history",
        fault=f"{schedule.workers} workers, {len(schedule.runs)} runs; faults: {faults}",
        rules=(1, 2, 3, 4, 5, 6, 7, 10),
        lease_ttl_ms=schedule.lease_ttl_ms,
        timeout_s=schedule.horizon_ms() / 1000 + QUIET_TIMEOUT_S + 60,
        write_path="stepped" if schedule.write_path == "stepped" else "fast",
        replication=None if schedule.replication == "none" else schedule.replication,  # type: ignore[arg-type]
        exemptions=ASYNC_LOSS if _async_failover(schedule) else (),
    )


#: An async failover loses acknowledged writes by design (the durability
#: contract, experiment H): the same two exemptions as H's async variant.
ASYNC_LOSS = (
    Exemption(
        "worker.accounts_match_the_evidence",
        "async failover loses acknowledged writes by design: a worker's ok for a write the "
        "promoted standby never received is true of the fenced old primary",
    ),
    Exemption(
        "effect.sent_only_under_a_dispatch_claim",
        "async failover loses acknowledged writes by design: the dispatch claim a request "
        "was sent under may exist on the fenced old primary only",
    ),
)


def _async_failover(schedule: sched.Schedule) -> bool:
    return schedule.replication == "async" and any(f.kind == "failover" for f in schedule.faults)


def execute(
    schedule: sched.Schedule, stop: threading.Event, out: dict[str, Any], ctx: ExperimentContext
) -> None:
    """The scenario of one schedule: workload up, nemesis played, healed, quiet.

    Records a fault check per fault (took effect or not) and whether the runs
    settled after heal; the runner then judges the global invariants.
    """
    timing: dict[str, float] = {}
    mark = time.monotonic()
    out["entered"] = mark

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timing[name] = round(now - mark, 3)
        mark = now

    local_stop = threading.Event()
    workload = Workload(ctx, schedule, local_stop)
    nemesis = Nemesis(ctx, schedule, workload, local_stop)
    machine = ContractMachine(ctx, workload, schedule.aims, local_stop)
    ctx.extra["explore"] = {
        "schedule": sched.to_dict(schedule),
        "effects": [],
        "actions": [],
        "timing_s": timing,
    }
    out["effects"] = nemesis.effects
    out["aims"] = machine.records
    out["timing"] = timing
    watcher = threading.Thread(target=_follow, args=(stop, local_stop), daemon=True)
    watcher.start()
    try:
        # Workers first: their start-up overlaps the control plane's and the
        # runs' creation; they claim as soon as a run exists.
        nemesis.arm_points()
        workload.start_workers()
        nemesis.start_holds()
        workload.create_runs()
        lap("create_runs")
        if not workload.wait_working():
            if stop.is_set():
                raise Inconclusive("interrupted before the schedule's clock started")
            raise Inconclusive(
                f"no worker reached an injection point within {STARTUP_TIMEOUT_S:.0f}s of its start"
            )
        lap("start_workers")
        machine.start()
        clock = nemesis.play()
        nemesis.join_holds(clock)
        # The machine's aims run beside the nemesis; it ends before heal, so
        # its runs are settled by quiet (each aim is bounded, so is this).
        machine.join(MACHINE_TIMEOUT_S)
        lap("faults")
        nemesis.heal()
        machine.finish()
        lap("heal")
        unsettled = _wait_quiet(workload, local_stop)
        nemesis.disarm_late()
        lap("quiet_wait")
        workload.stop_relay_loop()
        workload.relay_once()  # every outbox event reaches the broker after heal
        lap("final_relay")
    finally:
        local_stop.set()
        nemesis.horizon_passed.set()
        workload.stop_relay_loop()
        machine.join(OP_STOP_S)
    for effect in nemesis.confirm():
        ctx.fault(
            f"fault {effect.index} ({effect.label})",
            effect.took_effect,
            expected="observed by the harness (kernel state, control socket, link probe, tool log)",
            observed=effect.evidence,
        )
    if not schedule.faults:
        ctx.fault("the schedule has a fault", False, expected="at least one fault", observed="none")
    if unsettled:
        ctx.fault(
            "quiet reached after heal",
            False,
            expected=f"every run terminal, paused, or waiting out a backoff within {QUIET_TIMEOUT_S:.0f}s",
            observed=f"still on their way: {[(str(r['run_id'])[:8], r['status']) for r in unsettled]}",
        )
    else:
        ctx.invariant(
            "every run settled after heal",
            True,
            expected="every run terminal, paused, or waiting out a backoff after heal",
            observed=f"all {len(workload.run_ids)} runs settled",
        )
    out["left"] = time.monotonic()
    ctx.extra["explore"]["effects"] = [vars(e) for e in nemesis.effects]
    ctx.extra["explore"]["actions"] = workload.action_log
    ctx.extra["explore"]["aims"] = [vars(r) for r in machine.records]


def _follow(outer: threading.Event, inner: threading.Event) -> None:
    """Pass a campaign's stop on to one schedule's loops."""
    while not inner.is_set():
        if outer.wait(0.1):
            inner.set()


def _wait_quiet(workload: Workload, stop: threading.Event) -> list[dict[str, Any]]:
    """Keep the workers going until every run settled or the bound ran out; the
    runs still on their way (empty when quiet)."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while True:
        workload.supervise()
        unsettled = workload.unsettled()
        if not unsettled or stop.is_set() or time.monotonic() > deadline:
            return unsettled
        stop.wait(0.1)


def run_schedule(
    shared: SharedServices,
    schedule: sched.Schedule,
    label: str,
    *,
    report_dir: Path,
    stop: threading.Event,
) -> ScheduleResult:
    """One schedule, start to archive; the schedule's YAML is written beside it."""
    out: dict[str, Any] = {}
    module = types.ModuleType(f"explore_{label}")
    module.SPEC = spec_for(schedule)  # type: ignore[attr-defined]
    module.run = functools.partial(execute, schedule, stop, out)  # type: ignore[attr-defined]
    job = Job(module, label, 0)
    sched.write(report_dir / "schedules" / f"{job.label}.yaml", schedule)
    started = time.monotonic()
    result = run_job(shared, job, report_dir=report_dir, seed=schedule.seed)
    total = time.monotonic() - started
    timing = dict(out.get("timing", {}))
    # Outside the schedule itself: the experiment's environment coming up
    # (database from the template, proxies, mock tool, roles, control socket),
    # and after it: workers stopped, evidence gathered, invariants judged,
    # archive written, everything torn down.
    entered, left = out.get("entered"), out.get("left")
    if isinstance(entered, float) and isinstance(left, float):
        timing["environment_up"] = round(entered - started, 3)
        timing["stop_judge_archive_teardown"] = round(started + total - left, 3)
    else:
        timing["outside_schedule"] = round(total - sum(timing.values()), 3)
    return ScheduleResult(
        label=job.label,
        schedule=schedule,
        verdict=result.verdict,
        reason=result.reason,
        effects=list(out.get("effects", [])),
        archive_path=result.archive_path,
        duration_s=total,
        timing_s=timing,
        experiment=result,
        aims=list(out.get("aims", [])),
    )


# ---------------------------------------------------------------- the search


@dataclass
class CampaignConfig:
    """What one campaign draws and for how long."""

    seed: int
    shape: Shape = field(default_factory=Shape)
    max_schedules: int | None = None
    budget_s: float | None = None
    shrink_budget_s: float = 120.0
    label_prefix: str = "s"
    #: Searches run side by side, each its own Hypothesis search (seed + lane).
    lanes: int = 1
    #: Aim each drawn schedule's contract machine at cells the campaign has not
    #: reached yet (the least aimed first), instead of the drawn ones.
    steer_aims: bool = True


#: A steered schedule aims at least this many unreached cells (at most the
#: shape's max_aims), and a cell is aimed at this many times before the
#: campaign gives up on it (its reason is then the last aim's).
MIN_STEERED_AIMS = 2
MAX_AIMS_PER_CELL = 3


@dataclass
class CampaignOutcome:
    results: list[ScheduleResult]
    shrink_runs: list[ScheduleResult]
    coverage: Coverage
    wall_s: float
    cells: CellCoverage = field(default_factory=CellCoverage)
    first_violation: ScheduleResult | None = None
    first_violation_after_s: float | None = None
    minimal: ScheduleResult | None = None
    shrink_s: float = 0.0
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        counted = Counter(r.category for r in self.results)
        return {k: counted.get(k, 0) for k in ("pass", "fail", "no_effect", "unknown")}

    def exit_code(self) -> int:
        """0 no violation (and something conclusive), 1 a violation, 2 nothing conclusive."""
        counts = self.counts()
        if counts["fail"]:
            return EXIT_FAIL
        return EXIT_PASS if counts["pass"] else EXIT_UNKNOWN


class Campaign:
    """Draws schedules with Hypothesis, runs each, and on the first violation lets
    Hypothesis shrink it (bounded by ``shrink_budget_s``).

    ``lanes`` searches run side by side (threads, seeds ``seed``, ``seed+1``,
    ...), since a schedule mostly waits on leases and processes. Invariants:
    each lane runs one schedule at a time; once a violation is found only the
    lane that found it goes on (shrinking), the others start nothing new; a
    set ``stop`` ends every lane before its next schedule.
    """

    def __init__(
        self,
        shared: SharedServices,
        config: CampaignConfig,
        *,
        report_dir: Path,
        stop: threading.Event,
        progress: Progress = lambda _m: None,
    ) -> None:
        self.shared = shared
        self.config = config
        self.report_dir = report_dir
        self.stop = stop
        self.progress = progress
        self.results: list[ScheduleResult] = []
        self.shrink_runs: list[ScheduleResult] = []
        self.coverage = Coverage()
        self.cells = CellCoverage()
        self.shrinker = Shrinker(config.shrink_budget_s)
        self.started = time.monotonic()
        self.first_after_s: float | None = None
        self._lock = threading.Lock()
        self._issued = 0
        self._owner: int | None = None  # the lane that found the violation
        self.errors: list[str] = []
        self._seen: set[str] = set()
        self._aimed: Counter[str] = Counter()
        self._aimable = aimable()

    def _claim_slot(self, schedule: sched.Schedule) -> str | None:
        """A label for the next schedule, or None when the budget is spent or the
        schedule already ran (every lane starts from the same simplest ones)."""
        key = sched.dump(dataclasses.replace(schedule, seed=None))
        with self._lock:
            if key in self._seen:
                return None
            self._seen.add(key)
            over = self.stop.is_set() or self._owner is not None
            if self.config.max_schedules is not None:
                over = over or self._issued >= self.config.max_schedules
            if self.config.budget_s is not None:
                over = over or time.monotonic() - self.started >= self.config.budget_s
            if over:
                return None
            self._issued += 1
            return f"{self.config.label_prefix}{self._issued:04d}"

    def on_example(self, lane: int, schedule: sched.Schedule) -> None:
        """Hypothesis's test function: run the schedule unless the budget is over."""
        if self.stop.is_set():  # ends the search at once (no more draws)
            raise SearchOver("stopped")
        schedule = dataclasses.replace(schedule, seed=self.config.seed + lane)
        if self._owner == lane:
            self._shrink_step(schedule)
            return
        label = self._claim_slot(schedule)
        if label is None:
            return
        schedule = self._steer(schedule)
        result = run_schedule(
            self.shared, schedule, label, report_dir=self.report_dir, stop=self.stop
        )
        with self._lock:
            self.results.append(result)
            self.coverage.add(result.effects)
            self.add_cells(result)
            self._report(result)
            found = result.category == "fail" and self._owner is None
            if found:
                self._owner = lane
                self.first_after_s = time.monotonic() - self.started
                self.shrinker.start(result)
        if found:
            raise Violation(result.reason)

    def _steer(self, schedule: sched.Schedule) -> sched.Schedule:
        """The schedule with its aims replaced by cells this campaign has not
        reached (nor found without a rule), the least aimed first, so lanes
        share the work; as drawn when every cell was reached or tried enough.
        The schedule that runs (and its file) holds the aims it had."""
        if not self.config.steer_aims:
            return schedule
        wanted = min(max(len(schedule.aims), MIN_STEERED_AIMS), max(self.config.shape.max_aims, 1))
        with self._lock:
            open_cells = [
                c
                for c in self._aimable
                if not self.cells.reached.get(c)
                and c not in self.cells.no_recipe
                and self._aimed[c] < MAX_AIMS_PER_CELL
            ]
            open_cells.sort(key=lambda c: self._aimed[c])  # stable: the contract's order
            picked = open_cells[:wanted]
            self._aimed.update(picked)
        return dataclasses.replace(schedule, aims=tuple(picked)) if picked else schedule

    def add_cells(self, result: ScheduleResult) -> None:
        """The schedule's reached cells, and what its aims could not do (why a
        cell aimed at may stay unreached)."""
        self.cells.add(result.state_cells, result.label, time.monotonic() - self.started)
        for aim in result.aims:
            self.cells.aimed[aim.cell] += 1
            if aim.outcome == "no_recipe":
                self.cells.no_recipe[aim.cell] = f"the contract machine has no rule: {aim.detail}"

    def _shrink_step(self, schedule: sched.Schedule) -> None:
        if self.stop.is_set() or self.shrinker.over():
            return
        assert self.shrinker.first is not None
        if self.config.steer_aims:  # the violation's aims were steered, not drawn
            schedule = dataclasses.replace(schedule, aims=self.shrinker.first.schedule.aims)
        label = f"{self.shrinker.first.label.removeprefix(SPEC_ID + '-')}k{self.shrinker.attempts + 1:02d}"
        result = run_schedule(
            self.shared, schedule, label, report_dir=self.report_dir, stop=self.stop
        )
        self.shrink_runs.append(result)
        same = self.shrinker.consider(result)
        best = self.shrinker.best.schedule.size if self.shrinker.best else "-"
        self.progress(
            f"shrink {result.label}: size {schedule.size} {result.category}"
            + (" (same bug)" if same else "")
            + f"; smallest so far {best}"
        )
        if same:
            raise Violation(result.reason)

    def _report(self, result: ScheduleResult) -> None:
        counts = Counter(r.category for r in self.results)
        elapsed = time.monotonic() - self.started
        rate = len(self.results) / elapsed * 60 if elapsed else 0.0
        faults = ", ".join(f.label() for f in result.schedule.faults)
        self.progress(
            f"{result.label} {result.category.upper()} in {result.duration_s:.1f}s "
            f"(size {result.schedule.size}: {result.schedule.workers} workers, "
            f"{len(result.schedule.runs)} runs, {faults})"
            + (f" {result.reason}" if result.category != "pass" else "")
            + f" | {len(self.results)} done, {counts['fail']} violation(s), "
            f"{counts['no_effect'] + counts['unknown']} unknown, {rate:.1f}/min, "
            f"{self.coverage.brief()}, {self.cells.brief()}"
        )

    def _search(self, lane: int) -> None:
        """One lane: a Hypothesis search whose examples are schedule runs."""
        phases = [Phase.generate] + ([Phase.shrink] if self.config.shrink_budget_s > 0 else [])
        if self.config.max_schedules is not None:
            examples = self.config.max_schedules
        else:  # no schedule takes under 5 s: a bound the budget ends first
            examples = max(1, int((self.config.budget_s or 5) / 5))

        @seed(self.config.seed + lane)
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            verbosity=Verbosity.quiet,
            print_blob=False,
        )
        @given(schedules(self.config.shape))
        def search(schedule: sched.Schedule) -> None:
            self.on_example(lane, schedule)

        try:
            search()
        except SearchOver:
            pass
        except Exception as exc:
            # The violation (or Hypothesis saying its last replay of the
            # minimal example did not fail again): what counts was recorded.
            if self._owner != lane:
                self.progress(f"lane {lane} ended with {type(exc).__name__}: {exc}")
                if not isinstance(exc, Violation):
                    self.errors.append(f"lane {lane}: {type(exc).__name__}: {exc}")

    def run(self) -> CampaignOutcome:
        """Search until the budget or a violation (then shrink); never raises for
        what a schedule does. Interrupted, it returns what was run so far
        (``interrupted`` set) once the running schedules are torn down."""
        threads = [
            threading.Thread(
                target=self._search, args=(lane,), name=f"explore-lane-{lane}", daemon=True
            )
            for lane in range(max(1, self.config.lanes))
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: every lane ends its search
            self.stop.set()
            for t in threads:
                t.join(timeout=120)
        return CampaignOutcome(
            results=self.results,
            shrink_runs=self.shrink_runs,
            coverage=self.coverage,
            cells=self.cells,
            wall_s=time.monotonic() - self.started,
            first_violation=self.shrinker.first,
            first_violation_after_s=self.first_after_s,
            minimal=self.shrinker.best,
            shrink_s=self.shrinker.seconds,
            interrupted=self.stop.is_set(),
            errors=self.errors,
        )
