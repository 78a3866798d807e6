"""Run experiments: environment up, scenario, evidence gathered, archive written.

The runner, not the scenario, gathers the raw evidence every archive carries
(the mock tool's own log, the workers' histories, the control-socket hits,
the toxiproxy fault journal, the audit trail of lease changes), so no
scenario can forget it and no worker can supply it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import random
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import stopping
from harness.checking import checkers
from harness.checking.history import Shorten, id_shortener, read_history, timeline, timeline_ids
from harness.checking.invariants import experiment as invariants
from harness.contract import mapping, needs
from harness.contract.mapping import Declaration
from harness.engine import job_order, phases, stalls, starvation, waits
from harness.engine.environment import (
    CALLS_FILE,
    Environment,
    SharedServices,
    experiment_environment,
)
from harness.engine.experiment import (
    WORKER_BOUNDS,
    Bound,
    BoundExcuse,
    Excuse,
    ExperimentContext,
    ExperimentSpec,
    Inconclusive,
    SetupRefused,
)
from harness.engine.progress import Progress
from harness.evidence import archive as evidence
from harness.evidence.summary import (
    ATTEMPTS_DIR,
    ExperimentResult,
    failed_check_lines,
    label_of,
)
from harness.explore import cell_coverage
from harness.mutation.error_context import functions_in_error_context
from harness.parts import port_guard
from harness.parts.processes import ProcessTimeout
from harness.verdict import Verdict
from harness.waiting import wait_for

# After a stop request, how long the running experiments get to unwind (their
# workers are killed at once) before the run reports them and tears down.
STOP_GRACE_S = 1.5


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")


def _ms(value: int) -> str:
    return f"{value}ms"


@dataclasses.dataclass(frozen=True)
class Job:
    module: ModuleType
    variant: str | None
    repeat_index: int

    @property
    def spec(self) -> ExperimentSpec:
        spec: ExperimentSpec = self.module.SPEC
        return spec

    @property
    def label(self) -> str:
        return label_of(self.spec.id, self.variant, self.repeat_index)


def jobs_for(modules: Sequence[ModuleType], repeat: int) -> list[Job]:
    jobs: list[Job] = []
    for index in range(repeat):
        for module in modules:
            variants: Sequence[str | None] = module.SPEC.variants or (None,)
            jobs.extend(Job(module, v, index) for v in variants)
    return jobs


def job_rng(seed: int | None, job: Job) -> random.Random:
    """The job's own generator: the run's seed and the job's label decide every
    random choice, so the same seed gives the same schedule (a repetition has
    its own label, hence its own choices)."""
    return random.Random(f"{seed}/{job.label}") if seed is not None else random.Random()


def run_job(
    shared: SharedServices,
    job: Job,
    *,
    report_dir: Path,
    seed: int | None,
    progress: Progress | None = None,
) -> ExperimentResult:
    """One experiment, start to archive. Never raises for what the experiment does:
    a harness failure, an interruption or a stall of the harness that could
    have decided the outcome becomes verdict *unknown* with the reason in the
    archive."""
    spec = job.spec
    started = time.time()
    if progress is not None:
        progress.job_started(job.label, spec.title)
    archive_path = report_dir / "archives" / f"{job.label}.yaml"
    logs_dir = report_dir / "logs" / job.label
    harness_error: str | None = None
    verdict, reason = Verdict.UNKNOWN, "not run"
    archive: dict[str, Any] = {}
    interrupted: str | None = None
    declined = needs.declined(spec.needs_for(job.variant), declared_mapping(shared))
    if declined is not None:
        return _not_applicable(shared, job, seed, started, declined, report_dir, progress)
    rng = job_rng(seed, job)
    secrets: set[str] = set()
    stalls_judged = False
    called: dict[str, int] | None = None
    raised: list[str] | None = None
    clock = phases.PhaseClock()
    try:
        with (
            phases.timing(clock),
            phases.timed(
                experiment_environment(
                    shared,
                    job.label,
                    lease_ttl_ms=spec.lease_ttl_ms,
                    heartbeat_ms=spec.heartbeat_ms,
                    heartbeat_timeout_ms=spec.heartbeat_timeout_ms,
                    dispatch_ttl_ms=spec.dispatch_ttl_ms,
                    replication=spec.replication_for(job.variant),
                    tool_retention_s=dict(spec.tool_retention).get(job.variant or ""),
                    log_dir=logs_dir,
                    rng=rng,
                    write_path=spec.write_path_for(job.variant),
                ),
                "environment",
                "teardown",
            ) as env,
        ):
            ctx = ExperimentContext(spec=spec, env=env, variant=job.variant, seed=seed, rng=rng)
            ctx.excuse = timing_excuse(env, spec)
            ctx.bound_excuse = bound_excuse(label=job.label)
            with phases.phase("scenario"):
                verdict, reason, harness_error = _run_scenario(job, ctx)
            # The stop's flag is up before its callbacks ran: either says so.
            if env.interrupted or stopping.requested():
                interrupted = env.interrupted or stopping.reason()
                verdict, reason = Verdict.UNKNOWN, _interrupted_reason(interrupted, ctx)
            elif env.aborted:
                verdict, reason = Verdict.UNKNOWN, f"aborted: {env.aborted}"
            stopping.trace(f"{job.label}: scenario ended")
            # Stop the workers before reading their histories: the files are final.
            with phases.phase("stop workers"):
                env.stop_workers()
            # An unknown verdict names a long stall it saw (it may be the cause);
            # stalls never change a verdict: they excuse unmet progress checks
            # inside their windows (ExperimentContext.verdict), nothing else.
            verdict, reason = _note_stalls(spec, started, verdict, reason)
            stalls_judged = True
            # A stop that came while the workers were stopped leaves the judging
            # undone (seconds of queries the stop does not have): interrupted.
            if interrupted is None and (env.interrupted or stopping.requested()):
                interrupted = env.interrupted or stopping.reason()
                verdict, reason = Verdict.UNKNOWN, _interrupted_reason(interrupted, ctx)
            # The server's count of each function's calls, before the judging
            # (lease.acquisition_attempts_are_paced reads it) and for the reach.
            with phases.phase("server counts"):
                called = _functions_called(env) if interrupted is None else None
                env.functions_called = called
                env.statements_called = _statements_called(env) if interrupted is None else None
                if interrupted is None:
                    _read_connection_attempts(env)
            # Steps that judge the experiment after its scenario go here, one
            # call each, while the environment is still up:
            # `verdict, reason = step(ctx, verdict, reason)`.
            if interrupted is None:  # a stopping run has no time for queries
                with phases.phase("global invariants"):
                    verdict, reason = invariants.judge(ctx, verdict, reason)
                with phases.phase("state cells"):
                    cell_coverage.record(ctx)  # evidence only: never changes the verdict
            with phases.phase("archive gather"):
                archive = _archive(
                    ctx, env, job, started, verdict, reason, harness_error, logs_dir,
                    gather=interrupted is None and not stopping.requested(),
                )  # fmt: skip
                if called is not None and shared.settings.trace_calls:
                    raised = _functions_raised(env)
            secrets = env.secrets
    except Exception as exc:
        harness_error = traceback.format_exc()
        if stopping.requested():
            interrupted = stopping.reason()
            verdict, reason = Verdict.UNKNOWN, f"{interrupted} while its environment came up"
        else:
            verdict, reason = Verdict.UNKNOWN, f"environment error: {type(exc).__name__}: {exc}"
    finished = time.time()
    if not stalls_judged:
        verdict, reason = _note_stalls(spec, started, verdict, reason)
    seen_stalls = stalls.monitor().stalls(started, finished)
    starved = starvation.monitor().episodes(started, finished)
    if not archive:
        archive = _minimal_archive(
            shared, job, seed, started, verdict, reason, harness_error, logs_dir
        )
    archive.update(
        finished_at=_iso(finished),
        duration_s=round(finished - started, 3),
        pass_or_fail=verdict.value,
        verdict_reason=reason,
        harness_stalls=[
            {
                "started_at": _iso(st.started_at),
                "length_s": round(st.length_s, 3),
                "seen_by": st.seen_by,
            }
            for st in seen_stalls
        ],
        process_starvation=[
            {
                "process": st.process,
                "pid": st.pid,
                "started_at": _iso(st.started_at),
                "length_s": round(st.length_s, 3),
                "waited_s": round(st.waited_s, 3),
                "waited_for": st.waited_for,
            }
            for st in starved
            if _ours(st, job.label)
        ],
        worst_wait_window=_worst_wait_window(job, started, finished),
        interrupted=interrupted,
    )
    written: Path | None = None
    archive["phases_s"] = clock.figures()  # the archive's own writing is in results.json
    try:
        with phases.timing(clock), phases.phase("archive write"):
            written = evidence.write_archive(archive_path, archive, secrets)
    except Exception as exc:
        verdict, reason = Verdict.UNKNOWN, f"archive not written: {exc}"
    failed = failed_check_lines(archive.get("checks", []))
    result = _result(job, verdict, reason, finished - started, written, failed)
    result.phases_s = clock.figures()
    result.functions_called = called
    if shared.settings.trace_calls and interrupted is None:
        result.python_calls = _python_calls(logs_dir / CALLS_FILE)
        result.functions_raised = raised
    result.state_cells = (archive.get("state_cells") or {}).get("cells")
    stopping.trace(f"{job.label}: result ready")
    if progress is not None:
        progress.job_finished(
            job.label, f"{verdict.value.upper()} in {result.duration_s:.2f}s ({result.reason})"
        )
    return result


def declared_mapping(shared: SharedServices) -> Declaration:
    """The mapping the run's worker command declares (asked once per command)."""
    return mapping.declared(tuple(shared.settings.worker_cmd))


def _not_applicable(
    shared: SharedServices,
    job: Job,
    seed: int | None,
    started: float,
    reason: str,
    report_dir: Path,
    progress: Progress | None,
) -> ExperimentResult:
    """The result of a job the system declared it lacks what it needs for: not
    run, its archive says why (verdict not applicable)."""
    logs_dir = report_dir / "logs" / job.label
    archive = _minimal_archive(
        shared, job, seed, started, Verdict.NOT_APPLICABLE, reason, None, logs_dir
    )
    archive["observed_result"] = "not run: " + reason
    written = evidence.write_archive(report_dir / "archives" / f"{job.label}.yaml", archive, set())
    result = _result(job, Verdict.NOT_APPLICABLE, reason, time.time() - started, written, [])
    if progress is not None:
        progress.job_finished(job.label, f"NOT APPLICABLE ({result.reason})")
    return result


def _note_stalls(
    spec: ExperimentSpec, started: float, verdict: Verdict, reason: str
) -> tuple[Verdict, str]:
    """``verdict`` with a long stall of the harness since ``started`` named in
    the reason when it is unknown."""
    seen = stalls.monitor().stalls(started, time.time())
    limit = stalls.limit_s(spec.lease_ttl_ms, spec.heartbeat_ms, spec.dispatch_ttl_ms)
    return stalls.judge(verdict, reason, seen, limit)


#: Why the server's counts are not read on a replicated experiment.
FAILOVER_UNCOUNTED = (
    "a replicated experiment: a failover would leave a server that counted only what came after"
)


def _functions_called(env: Environment) -> dict[str, int] | None:
    """The database functions this experiment ran, with their calls, from the
    server's own count (``track_functions``); None when the count is not the
    whole story (see FAILOVER_UNCOUNTED), with the reason in
    ``env.server_counts_unknown``."""
    if env.replication is not None:
        env.server_counts_unknown = FAILOVER_UNCOUNTED
        return None
    try:
        # A backend counts its calls into the server's statistics as it exits:
        # wait (bounded) until every session but the harness's own has gone.
        wait_for(
            lambda: (
                not env.query(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND application_name <> 'fencecheck-harness' "
                    "AND backend_type = 'client backend'"
                )
            ),
            what="the workers' database sessions to end (their function counts)",
            timeout_s=2.0,
            interval_s=0.01,
        )
        rows = env.query(
            "SELECT schemaname || '.' || funcname AS f, sum(calls)::bigint AS calls "
            "FROM pg_stat_user_functions GROUP BY 1"
        )
    except Exception as exc:  # a server gone at the end: the reach is simply not known
        env.server_counts_unknown = f"reading the function counts failed: {exc!r}"[:300]
        return None
    return {str(r["f"]): int(r["calls"]) for r in rows}


def _read_connection_attempts(env: Environment) -> None:
    """The connection attempts on each counted worker link (the run's firewall
    table's counts; harness/parts/port_guard.py), or why they are not known."""
    if not env.counted_ports:
        env.connections_unknown = (
            "no link's connection attempts are counted here (the run's firewall table needs "
            "root and nft, and the workers on this host)"
        )
        return
    counts = port_guard.connection_attempts(env.counted_ports.values())
    if isinstance(counts, str):
        env.connections_unknown = counts
        return
    env.connection_attempts = {key: counts[port] for key, port in env.counted_ports.items()}
    by_name = {link.name: key for key, link in env.links.items() if key in env.counted_ports}
    journal = env.shared.toxiproxy.journal() if env.shared.toxiproxy else []
    env.link_cuts = [
        {
            "link": by_name[f.link],
            "seconds": round(f.stopped_at - f.started_at, 3),
            "attempts": f.attempts_at_stop - f.attempts_at_start,
        }
        for f in journal
        if f.kind == "cut"
        and f.link in by_name
        and f.stopped_at is not None
        and f.attempts_at_start is not None
        and f.attempts_at_stop is not None
    ]


def _statements_called(env: Environment) -> list[dict[str, Any]] | None:
    """Each statement the experiment's own roles ran, with the server's count
    (pg_stat_statements, counted as each statement ends; read after
    _functions_called has waited for the workers' sessions to end); None when
    not known (no such count on this server, or a failover: see above)."""
    if env.replication is not None:
        env.server_counts_unknown = FAILOVER_UNCOUNTED
        return None
    try:
        counts = env.primary.statement_counts(env.db.name)
    except Exception as exc:  # a server gone at the end: simply not known
        why = f"reading the statement counts failed: {exc!r}"[:300]
        env.server_counts_unknown = env.server_counts_unknown or why
        return None
    if counts is None:
        env.server_counts_unknown = "the server does not load pg_stat_statements"
    return counts


def _functions_raised(env: Environment) -> list[str] | None:
    """The database functions the server's log names in the context of an
    error in this experiment's database (harness.mutation.error_context);
    None when the log cannot be read."""
    try:
        with open(env.primary.log_path, errors="replace") as log:
            return sorted(functions_in_error_context(log, env.db.name))
    except OSError:
        return None


def _python_calls(path: Path) -> list[str] | None:
    """The functions of the reference implementation a traced experiment's
    processes ran (harness.mutation.traced_worker); None when none wrote."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return sorted({line for line in text.splitlines() if line})


def _ours(episode: starvation.Starvation, label: str) -> bool:
    """A starvation episode of this experiment's processes, or of the run's
    shared ones (toxiproxy) that every experiment's traffic crosses. Not of
    its control server's thread: the harness's own slowness excuses on its
    own terms (a stall of a whole timer) or inside a chain (chain_waits)."""
    return episode.process.startswith((f"{label}/", "run/")) and (
        waits.CONTROL_SERVER not in episode.process
    )


def _worst_starvation(
    episodes: list[starvation.Starvation], timer_s: float
) -> tuple[float, list[starvation.Starvation]] | None:
    """The most one process waited (for a CPU or the disk) within one timer's
    span, and the episodes that make it up. Summed, not the longest single episode: the
    sampler closes an episode at a tick without delay, and a renewal timer
    fires on the waits it spans (a CI run's worker waited 0.146 s and, 0.05 s
    later, 0.082 s: 0.23 s within one 0.3 s renewal timeout, each under the
    0.15 s the rule asked of one episode)."""
    best: tuple[float, list[starvation.Starvation]] | None = None
    for pid_episodes in group_by_pid(episodes).values():
        pid_episodes.sort(key=lambda e: e.started_at)
        for i, first in enumerate(pid_episodes):
            window = [e for e in pid_episodes[i:] if e.started_at < first.started_at + timer_s]
            waited = sum(e.waited_s for e in window)
            if window and (best is None or waited > best[0]):
                best = (waited, window)
    return best


def _waited_for(episodes: list[starvation.Starvation]) -> str:
    """What the episodes waited for: a CPU, the disk, or both in turn."""
    return " and ".join(sorted({e.waited_for for e in episodes}))


def group_by_pid(
    episodes: list[starvation.Starvation],
) -> dict[int, list[starvation.Starvation]]:
    out: dict[int, list[starvation.Starvation]] = {}
    for e in episodes:
        out.setdefault(e.pid, []).append(e)
    return out


def timing_excuse(env: Environment, spec: ExperimentSpec) -> Excuse:
    """What can excuse unmet progress in a window (ExperimentContext.verdict):
    a stall of the harness of at least the workers' shortest protocol timer
    (the renewal timeout, the lease slack, the dispatch deadline), or a
    process of this experiment whose thread waited for a CPU or the disk for
    at least half that timer: long enough that a correct worker's timer could
    fire.
    Both are the harness's own measurements. "A process of this experiment"
    includes the database backends serving its workers (a renewal is a
    statement a backend must run): until they were watched, the harness's
    stall stood for them, and a successor's 300 ms renewal that timed out
    inside a 0.56 s stall, under the 0.65 s limit, with no worker thread
    starved, failed the correct Go worker in S[pg_blackhole] under six CPU
    hogs. Third, for a worker that cancelled itself (exit 10) in the
    window: the short waits of its chain (:func:`chain_waits`) summed within
    one timer's length in the seconds before its exit, at least half of it.
    A renewal that queued behind the worker's own write waits on every
    process that write needs, the harness answering its injection points
    among them, and a correct worker whose renewal timed out cancels
    itself; no other ending is explained by it."""
    harness_limit = min(
        stalls.limit_s(spec.lease_ttl_ms, spec.heartbeat_ms, spec.dispatch_ttl_ms),
        env.heartbeat_timeout_ms / 1000,
    )
    starved_limit = (
        min(env.heartbeat_timeout_ms, env.lease_ttl_ms - env.heartbeat_ms, env.dispatch_ttl_ms)
        / 2000
    )

    def excuse(since: float, until: float) -> str | None:
        long_stalls = [
            s for s in stalls.monitor().stalls(since, until) if s.length_s >= harness_limit
        ]
        if long_stalls:
            worst = max(long_stalls, key=lambda s: s.length_s)
            return f"the harness stalled {worst.describe()}"
        ours = [e for e in starvation.monitor().episodes(since, until) if _ours(e, env.name)]
        worst_run = _worst_starvation(ours, 2 * starved_limit)
        if worst_run is not None and worst_run[0] >= starved_limit:
            waited_s, episodes = worst_run
            first, last = episodes[0], episodes[-1]
            span = last.ended_at - first.started_at
            return (
                f"{first.process} (pid {first.pid}) waited {waited_s:.2f}s for "
                f"{_waited_for(episodes)} in {len(episodes)} episode(s) within {span:.2f}s from "
                f"{first.describe()}, at least the {starved_limit:.2f}s that can fire a protocol "
                "timer"
            )
        for worker, ended in _cancelled_workers(env, since, until):
            chain = chain_waits(
                env.name, max(since, ended - CANCEL_LOOKBACK_S), ended, 2 * starved_limit, worker
            )
            if chain.waited_s >= starved_limit:
                return (
                    f"worker {worker} cancelled itself (exit {EXIT_CANCELLED}) after its chain "
                    f"(the worker, a backend, the control server answering it) waited "
                    f"{chain.describe()} for a CPU, the disk or the harness, at least the "
                    f"{starved_limit:.2f}s that can fire its renewal timer"
                )
        return None

    return excuse


def _worst_wait_window(job: Job, started: float, finished: float) -> dict[str, Any]:
    """The experiment's worst window of one timer, as archive evidence."""
    spec = job.spec
    timer_s = min(spec.lease_ttl_ms - spec.heartbeat_ms, spec.dispatch_ttl_ms) / 1000
    timer_s = min(timer_s, spec.heartbeat_timeout_ms / 1000)
    window = chain_waits(job.label, started, finished, timer_s)
    return {
        "started_at": _iso(window.start),
        "length_s": round(window.length_s, 3),
        "waited_s": round(window.waited_s, 3),
        "by_who": {who: round(s, 3) for who, s in sorted(window.by_who.items()) if s >= 0.0005},
    }


#: The exit code of a worker that cancelled itself (its renewal failed or
#: its lease was lost): the one way a timer that fired stops a correct worker.
EXIT_CANCELLED = 10
#: How far before a cancelled worker's exit (as the harness noticed it) the
#: renewal that timed out may lie: one timer, then stopping what it was doing.
CANCEL_LOOKBACK_S = 3.0


def _cancelled_workers(env: Environment, since: float, until: float) -> list[tuple[str, float]]:
    """(worker id, exit time) of every worker that exited cancelled in
    [since, until] (or up to a second after: the check may read the status
    before the harness notices the exit)."""
    return [
        (w.worker_id, w.ended_at)
        for w in env.started_workers
        if w.returncode == EXIT_CANCELLED
        and w.ended_at is not None
        and since <= w.ended_at <= until + 1.0
    ]


def chain_waits(
    label: str, since: float, until: float, timer_s: float, only: str | None = None
) -> waits.Window:
    """The worst window of one timer in [since, until] for one chain of the
    experiment ``label``: one worker's waits, one database backend's and the
    control server's answering that worker (and its accept loop), added up;
    the worst worker and backend. A renewal's timer spans such a chain when
    the worker's own write holds the run's row: the worker's threads, the
    backend running that write, and the harness answering the write's
    injection points. Each waits its share; none needs to have waited half
    the timer alone. Other workers and backends run beside the chain, not in
    it: adding theirs would excuse a quiet machine (six workers' backends
    together waited 0.28 s of a 0.3 s window in Q with no load beside it).
    ``only``: that worker's chains alone."""
    logged = waits.log().within(label, since, until)

    def source(w: waits.Wait) -> str:
        return f"{w.who} (pid {w.pid})" if "/backend " in w.who else w.who

    rows = waits.binned(logged, since, until, source)
    backends: list[dict[str, list[float]]] = [{k: r} for k, r in rows.items() if "/backend " in k]
    by_worker: dict[str, dict[str, list[float]]] = {}
    shared: dict[str, list[float]] = {}
    for k, r in rows.items():
        worker = waits.worker_of(k)
        if worker is not None:
            by_worker.setdefault(worker, {})[k] = r
        elif "/backend " not in k:
            shared[k] = r  # the control server's accept loop, the mock tool
    worst = waits.best_window(shared, since, timer_s)
    chains = [r for w, r in by_worker.items() if only is None or w == only]
    for mine in chains or [{}]:
        for backend in backends or [{}]:
            chain = shared | mine | backend
            window = waits.best_window(chain, since, timer_s)
            if window.waited_s > worst.waited_s:
                worst = window
    return worst


#: The share of a bound a process (or the harness) must have spent unable to
#: run for that to excuse the missed bound: with more than half of it left, a
#: correct process answers or exits (the same rule as for protocol timers).
BOUND_SHARE = 0.5


def bound_excuse(
    stalled: stalls.StallMonitor | None = None,
    starved: starvation.StarvationMonitor | None = None,
    label: str | None = None,
    logged: waits.WaitLog | None = None,
) -> BoundExcuse:
    """What can excuse a bound one process broke (it gave no answer, or did
    not exit, within ``bound_s``): the harness stalled, or that very process
    waited for a CPU or the disk, for at least half the bound in its window,
    in all. No other process's starvation: a control-plane worker starved for 0.45 s
    excused a worker that looped for 20 s. And nothing shorter: a process
    that had more than half its bound to run in and did not answer broke it.
    The process's own monitors unless others are given.

    "In all" counts its short waits too (experiment ``label``'s wait log):
    an episode needs one thread waiting half a 50 ms tick in a row, and a Go
    worker's heartbeat runs on whichever of its threads is free, so ten
    ticks of 10-20 ms each, on different threads, made no episode and still
    held its cancellation 0.1 s past S[pg_blackhole_early]'s slack (Go,
    beside six CPU hogs and a mutant campaign, load 13.6)."""
    stall_monitor = stalled or stalls.monitor()
    starvation_monitor = starved or starvation.monitor()
    wait_log = logged or waits.log()

    def excuse(since: float, until: float, bound: Bound) -> str | None:
        need = bound.bound_s * BOUND_SHARE
        gaps = stall_monitor.stalls(since, until)
        stalled_s = sum(_overlap(s.started_at, s.ended_at, since, until) for s in gaps)
        if stalled_s >= need:
            worst = max(gaps, key=lambda s: s.length_s)
            return (
                f"the harness stalled {stalled_s:.2f}s in all in the {bound.bound_s:g}s bound "
                f"(at least half of it; longest {worst.describe()})"
            )
        episodes = [e for e in starvation_monitor.episodes(since, until) if e.pid == bound.pid]
        waited_s = sum(e.waited_s for e in episodes)
        if waited_s >= need:
            return (
                f"{episodes[0].process} (pid {bound.pid}) waited {waited_s:.2f}s for "
                f"{_waited_for(episodes)} in the {bound.bound_s:g}s bound, at least half of it"
            )
        if label is not None:
            own = [w for w in wait_log.within(label, since, until) if w.pid == bound.pid]
            rows = waits.binned(own, since, until)
            short_s = sum(sum(row) for row in rows.values())
            if short_s >= need:
                who = next(iter(rows), f"pid {bound.pid}")
                return (
                    f"{who} (pid {bound.pid}) waited {short_s:.2f}s in all, in short waits for "
                    f"a CPU or the disk, in the {bound.bound_s:g}s bound, at least half of it"
                )
        return None

    return excuse


def _bound_of(exc: Exception) -> tuple[Bound | None, float | None]:
    """The bound a worker broke and when it began; a timeout names both, a
    closed channel (the worker exited, perhaps cancelled by its own timer, so
    judged like any progress) neither."""
    if isinstance(exc, ProcessTimeout) and exc.pid is not None and exc.bound_s is not None:
        return Bound(exc.pid, exc.bound_s), exc.since
    return None, None


def _overlap(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))


def _run_scenario(job: Job, ctx: ExperimentContext) -> tuple[Verdict, str, str | None]:
    """The scenario under its global timeout: verdict, reason, harness error."""
    env = ctx.env
    spec = job.spec
    watchdog = threading.Timer(spec.timeout_s, env.abort, args=(spec.timeout_s,))
    watchdog.daemon = True
    watchdog.start()
    try:
        job.module.run(ctx)
        verdict, reason = ctx.verdict()
        return verdict, reason, None
    except Inconclusive as exc:
        # As for a harness error below: an invariant that already broke, its
        # faults confirmed, stands; a later step that could not be judged
        # (a point the worker never reached) does not erase it.
        checked, why = ctx.verdict()
        if checked is Verdict.FAIL:
            return checked, f"{why} (then inconclusive: {exc})", None
        return Verdict.UNKNOWN, f"inconclusive: {exc}", None
    except SetupRefused as exc:
        # The worker turned down what the contract says it does, for a reason no
        # timing explains: progress not made, judged like any other (a stall or
        # starvation the harness measured during the experiment excuses it).
        ctx.progress(
            f"{exc.worker} carried out {exc.op!r}",
            False,
            expected=f"{exc.op!r} answered ok (the experiment's precondition; the contract "
            "says a correct worker carries it out here)",
            observed=f"refused: {exc.error}: {exc.message}"[:300],
        )
        verdict, reason = ctx.verdict()
        return verdict, reason, None
    except WORKER_BOUNDS as exc:
        # A worker that does not exit or answer within what the experiment
        # gives it broke a bound of the contract (§5, §10): progress not made,
        # judged like any other (a stall or starvation in its window excuses it).
        held = [f"{h.worker} at {h.point}" for h in env.control.held()]
        if held:  # the harness itself keeps it waiting: nothing to judge
            return Verdict.UNKNOWN, f"harness error: {exc} (held by the harness: {held})", None
        bound, since = _bound_of(exc)
        ctx.progress(
            "every worker kept its bounds (answered, exited)",
            False,
            expected="each ops request answered and each worker that must exit exited within "
            "the time the experiment gives it",
            # Every line, the worker's last stderr lines among them: the
            # first line alone hid why a worker exited at its start.
            observed=" | ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:1500],
            since=since,
            bound=bound,
        )
        verdict, reason = ctx.verdict()
        return verdict, reason, None
    except Exception as exc:
        harness_error = traceback.format_exc()
        verdict, reason = Verdict.UNKNOWN, f"harness error: {type(exc).__name__}: {exc}"
        # An invariant that already broke, with every fault confirmed, is
        # evidence of its own: a later error does not erase it (unless the
        # run was interrupted meanwhile: then nothing after the interrupt is).
        checked, why = ctx.verdict()
        if checked is Verdict.FAIL:
            verdict, reason = checked, f"{why} (then harness error: {exc})"
        return verdict, reason, harness_error
    finally:
        watchdog.cancel()


def _interrupted_reason(why: str, ctx: ExperimentContext) -> str:
    """Interrupted is a reason, never an environment error: what was cut, and how
    far the experiment had come (its checks so far prove nothing)."""
    done = len(ctx.checks)
    return f"{why} while it ran ({done} check(s) recorded before the stop; none counts)"


def _archive(
    ctx: ExperimentContext,
    env: Environment,
    job: Job,
    started: float,
    verdict: Verdict,
    reason: str,
    harness_error: str | None,
    logs_dir: Path,
    *,
    gather: bool = True,
) -> dict[str, Any]:
    """The experiment's archive. ``gather`` False (the run is stopping) keeps to
    what the harness already holds, without asking the tool or the database."""
    spec = job.spec
    settings = env.shared.settings
    tool_log: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        tool_log = checkers.tool_log(ctx) if gather else {}
    history = read_history(env.event_files())
    events = history.events
    hits = env.control.hits()
    faults = env.shared.toxiproxy.journal() if env.shared.toxiproxy else []
    faults = [f for f in faults if f.link.startswith(env.tag)]
    audit: list[dict[str, Any]] = []
    facts: dict[str, str] = {}
    if gather:
        with contextlib.suppress(Exception):
            audit = checkers.audit(ctx)
        with contextlib.suppress(Exception):
            facts = env.primary.server_facts()
    commands = sorted(ctx.commands, key=lambda c: c["time"])
    run_ids: Any = ctx.run_ids[0] if len(ctx.run_ids) == 1 else (ctx.run_ids or None)
    shorten = id_shortener([*timeline_ids(events, hits), *(str(r["run_id"]) for r in audit)])
    return {
        "archive_version": 1,
        "experiment_id": spec.id,
        "title": spec.title,
        "seed_section": spec.seed_section,
        "variant": job.variant,
        "git_commit": evidence.git_commit(),
        "runtime_versions": evidence.runtime_versions(
            go_worker=evidence.go_build_version(tuple(settings.worker_cmd)),
            toxiproxy=env.shared.toxiproxy.version if env.shared.toxiproxy else None,
        ),
        "postgres_version": facts.get("version", "unknown"),
        "postgres_settings": facts,
        "deployment": {
            **env.shared.backend.deployment(),
            "replication": env.replication,
            "scratch": env.shared.record.scratch,
            "worker_launch": env.shared.worker_launch,
            # Who else on this host could reach the run's parts (port_guard.py).
            "access": env.shared.access,
        },
        "worker": {
            "command": settings.worker_command_text(),
            "digest": evidence.worker_digest(tuple(settings.worker_cmd)),
            "mutant": settings.mutant
            or (f"generated:{settings.generated_mutant}" if settings.generated_mutant else None),
        },
        "run_id": run_ids,
        "tenant_id": env.tenant_id,
        "lease_duration": _ms(env.lease_ttl_ms),
        "heartbeat_interval": _ms(env.heartbeat_ms),
        "fault_injection_point": spec.injection_point_for(job.variant),
        "injected_fault": spec.fault_for(job.variant),
        "fencecheck_version": evidence.fencecheck_version(),
        "commands_executed": commands,
        "worker_logs_path": str(logs_dir),
        "postgres_queries_and_results": [evidence.fields_of(q) for q in ctx.queries],
        "mock_tool_request_log": tool_log.get("requests", []),
        "mock_tool_resources": tool_log.get("resources", []),
        "broker_messages": tool_log.get("messages", []),
        "expected_invariant": spec.invariant,
        "layer": spec.layer_for(job.variant),
        "observed_result": _observed(ctx),
        "pass_or_fail": verdict.value,
        "verdict_reason": reason,
        "checks": [evidence.fields_of(c) for c in ctx.checks],
        "faults": [evidence.fields_of(f) for f in faults],
        "control_hits": [evidence.fields_of(h) for h in hits],
        "history": [evidence.fields_of(e) for e in events]
        + [{"unreadable_line": str(p)} for p in history.problems],
        "signals": [evidence.fields_of(s) for s in ctx.signals],
        "audit_trail": audit,
        "timeline": timeline(
            events,
            hits,
            faults,
            signals=ctx.signals,
            notes=_audit_notes(audit, shorten),
            shorten=shorten,
        ),
        "failover": ctx.extra.get("failover"),
        "explore": ctx.extra.get("explore"),
        "worker_channel_errors": {
            w.worker_id: w.noise_lines() for w in env.workers.values() if w.protocol_errors
        },
        "metrics": env.metrics,
        "global_invariants": ctx.extra.get("global_invariants"),
        "state_cells": ctx.extra.get("state_cells"),
        "seed": ctx.seed,
        "repeat_index": job.repeat_index,
        "started_at": _iso(started),
        "finished_at": _iso(time.time()),
        "duration_s": 0.0,
        "natural_wait_s": spec.natural_wait(job.variant),
        "harness_error": harness_error,
    }


def _audit_notes(audit: list[dict[str, Any]], shorten: Shorten) -> list[tuple[float, str]]:
    """The database's own account of who held which epoch when, for the timeline."""
    notes: list[tuple[float, str]] = []
    for r in audit:
        at = r["at"].timestamp() if hasattr(r["at"], "timestamp") else 0.0
        change = []
        if r["op"] == "INSERT":
            change.append(f"created {r['status']}")
        else:
            if r["old_status"] != r["status"]:
                change.append(f"{r['old_status']}->{r['status']}")
            if r["old_epoch"] != r["epoch"]:
                change.append(f"epoch {r['old_epoch']}->{r['epoch']} owner {r['owner']}")
            elif r["old_owner"] != r["owner"]:
                change.append(f"owner {r['old_owner']}->{r['owner']}")
            if r["old_revision"] != r["revision"]:
                change.append(f"rev {r['old_revision']}->{r['revision']}")
            if not change:
                change.append("lease renewed")
        notes.append(
            (at, f"db run={shorten(str(r['run_id']))} {', '.join(change)} (by {r['app']})")
        )
    return notes


def _observed(ctx: ExperimentContext) -> str:
    if not ctx.checks:
        return "nothing was checked"
    return "; ".join(f"[{check_mark(c.kind, c.ok)}] {c.name}: {c.observed}" for c in ctx.checks)


def check_mark(kind: str, ok: bool) -> str:
    """How a check reads in a line: ok, NOT OK, or not judged (never tried)."""
    if kind == "not_judged":
        return "not judged"
    return "ok" if ok else "NOT OK"


def _minimal_archive(
    shared: SharedServices,
    job: Job,
    seed: int | None,
    started: float,
    verdict: Verdict,
    reason: str,
    harness_error: str | None,
    logs_dir: Path,
) -> dict[str, Any]:
    """An archive for an experiment whose environment never came up."""
    spec = job.spec
    deployment: dict[str, Any] = {"kind": shared.backend.kind}
    with contextlib.suppress(Exception):  # the backend may be what failed
        deployment = shared.backend.deployment()
    deployment["replication"] = spec.replication_for(job.variant)
    # The worker is known even when its environment never came up (a compare of
    # two runs must not show a placeholder as the worker's digest).
    settings = shared.settings
    worker = {"command": settings.worker_command_text(), "digest": "sha256:" + "0" * 64}
    with contextlib.suppress(Exception):
        worker["digest"] = evidence.worker_digest(tuple(settings.worker_cmd))
    return {
        "archive_version": 1,
        "experiment_id": spec.id,
        "title": spec.title,
        "seed_section": spec.seed_section,
        "variant": job.variant,
        "git_commit": evidence.git_commit(),
        "runtime_versions": evidence.runtime_versions(go_worker=None, toxiproxy=None),
        "postgres_version": "unknown",
        "deployment": deployment,
        "worker": worker,
        "run_id": None,
        "tenant_id": None,
        "lease_duration": _ms(spec.lease_ttl_ms),
        "heartbeat_interval": _ms(spec.heartbeat_ms),
        "fault_injection_point": spec.injection_point_for(job.variant),
        "injected_fault": spec.fault_for(job.variant),
        "fencecheck_version": evidence.fencecheck_version(),
        "commands_executed": [],
        "worker_logs_path": str(logs_dir),
        "postgres_queries_and_results": [],
        "mock_tool_request_log": [],
        "broker_messages": [],
        "expected_invariant": spec.invariant,
        "layer": spec.layer_for(job.variant),
        "observed_result": "the environment did not come up",
        "pass_or_fail": verdict.value,
        "verdict_reason": reason,
        "checks": [],
        "faults": [],
        "control_hits": [],
        "history": [],
        "seed": seed,
        "repeat_index": job.repeat_index,
        "started_at": _iso(started),
        "finished_at": _iso(time.time()),
        "duration_s": 0.0,
        "natural_wait_s": spec.natural_wait(job.variant),
        "harness_error": harness_error,
    }


def run_jobs(
    shared: SharedServices,
    jobs: Sequence[Job],
    *,
    report_dir: Path,
    seed: int | None,
    parallel: int,
    progress: Progress | None = None,
    on_result: Callable[[ExperimentResult], None] | None = None,
    retry_unknown: int = 0,
) -> list[ExperimentResult]:
    """Run ``jobs``, ``parallel`` at a time, the longest expected first
    (:mod:`harness.engine.job_order`); one result per job, in job order
    (``on_result`` gets each as it comes, from the experiment's thread). A job
    that ends *unknown* runs again, up to ``retry_unknown`` more times
    (:func:`again_while_unknown`); a *fail* never does.

    Invariants: once a stop was asked for (``harness.stopping``) no job starts,
    and each job that never started gets an *interrupted* result; the running
    ones are aborted by the stop itself (``SharedServices.interrupt``), and
    this returns within ``STOP_GRACE_S`` of the stop request even when one's
    teardown hangs (its result then says so). The experiment threads stay
    alive until the run's services close: a child's parent-death signal fires
    when the thread that started it exits, and ``--keep`` keeps children up.
    """
    results: list[ExperimentResult | None] = [None] * len(jobs)
    queue = collections.deque(job_order.longest_first(jobs, job_order.expected_durations()))
    started_at: dict[int, float] = {}
    cond = threading.Condition()
    finished_threads = 0

    def work() -> None:
        nonlocal finished_threads
        try:
            while True:
                with cond:
                    if stopping.requested() or not queue:
                        break
                    index = queue.popleft()
                    started_at[index] = time.time()
                job = jobs[index]
                with shared.job_running(job.label):
                    result = again_while_unknown(
                        functools.partial(
                            run_job,
                            shared,
                            job,
                            report_dir=report_dir,
                            seed=seed,
                            progress=progress,
                        ),
                        job.label,
                        report_dir,
                        retry_unknown,
                        progress,
                    )
                with cond:
                    results[index] = result
                    cond.notify_all()
                if on_result is not None:
                    on_result(result)
        finally:
            with cond:
                finished_threads += 1
                cond.notify_all()
        shared.closed.wait()

    count = max(1, min(parallel, len(jobs)))
    for n in range(count):
        threading.Thread(target=work, name=f"experiment-{n + 1}", daemon=True).start()
    with cond:
        while finished_threads < count and not stopping.requested():
            cond.wait(0.2)
    if stopping.requested():
        grace_ends = time.monotonic() + max(0.0, STOP_GRACE_S - (stopping.since_s() or 0.0))
        with cond:
            while finished_threads < count and time.monotonic() < grace_ends:
                cond.wait(max(0.0, grace_ends - time.monotonic()))
        stopping.trace(f"{finished_threads} of {count} experiment thread(s) done")
    with cond:
        return [
            r if r is not None else interrupted_result(jobs[i], started_at.get(i), progress)
            for i, r in enumerate(results)
        ]


def run_jobs_until_fail(
    shared: SharedServices,
    jobs: Sequence[Job],
    *,
    report_dir: Path,
    seed: int,
    parallel: int,
    stop: Callable[[], bool] | None = None,
    retry_unknown: int = 0,
) -> list[ExperimentResult]:
    """Run ``jobs`` in the order given, ``parallel`` at a time; start none after
    the first *fail* or once ``stop()`` is true (the ones already running finish
    and are kept). One result per job started, in the order they ended: a
    mutant needs one catch, so the caller puts its likeliest or cheapest
    catchers first. An *unknown* runs again up to ``retry_unknown`` times."""
    queue = list(jobs)
    results: list[ExperimentResult] = []
    failed = False

    def more() -> bool:
        return bool(queue) and not failed and not (stop is not None and stop())

    def attempt(job: Job) -> ExperimentResult:
        return again_while_unknown(
            lambda: run_job(shared, job, report_dir=report_dir, seed=seed),
            job.label,
            report_dir,
            retry_unknown,
        )

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="until-fail") as pool:
        running: set[Future[ExperimentResult]] = set()
        while running or more():
            while more() and len(running) < parallel:
                running.add(pool.submit(attempt, queue.pop(0)))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                results.append(result)
                failed = failed or result.verdict is Verdict.FAIL
    return results


def again_while_unknown(
    attempt: Callable[[], ExperimentResult],
    label: str,
    report_dir: Path,
    retries: int,
    progress: Progress | None = None,
) -> ExperimentResult:
    """``attempt`` once, and again while it ends *unknown*, up to ``retries``
    more times. An unknown proves nothing either way (a fault that did not
    take effect, progress a measured stall excuses, a wait that ran out on a
    loaded machine), so another attempt loses nothing; a *fail* is never
    retried, and a stop ends the retries. Each earlier attempt's archive and
    logs move to ``earlier-attempts/<label>/attempt-N*`` (sealed with the run),
    and the last result names them in ``earlier_attempts`` and its reason."""
    result = attempt()
    earlier: list[str] = []
    while result.verdict is Verdict.UNKNOWN and len(earlier) < retries and not stopping.requested():
        n = len(earlier) + 1
        kept = _set_aside(report_dir, label, n)
        earlier.append(f"attempt {n}: unknown: {result.reason} (evidence {kept or 'none'})")
        if progress is not None:
            progress.job_again(label, n + 1)
        result = attempt()
    if earlier:
        result.earlier_attempts = earlier
        result.reason = (
            f"{result.reason} (attempt {len(earlier) + 1}; the earlier one(s) ended unknown: "
            f"{ATTEMPTS_DIR}/{label}/)"
        )
    return result


def _set_aside(report_dir: Path, label: str, n: int) -> str | None:
    """Move attempt ``n``'s archive and logs out of the way of the next one;
    the archive's path relative to the run's folder (None: it wrote none)."""
    into = report_dir / ATTEMPTS_DIR / label
    into.mkdir(parents=True, exist_ok=True)
    archive = report_dir / "archives" / f"{label}.yaml"
    logs = report_dir / "logs" / label
    if logs.exists():
        logs.rename(into / f"attempt-{n}-logs")
    if not archive.exists():
        return None
    moved = archive.rename(into / f"attempt-{n}.yaml")
    return str(moved.relative_to(report_dir))


def interrupted_result(
    job: Job, started_at: float | None, progress: Progress | None
) -> ExperimentResult:
    """The result of a job the stop cut: never started, or whose teardown did
    not end within the grace period (its archive, if any, is written later)."""
    if started_at is None:
        why, took = f"{stopping.reason()} before it started", 0.0
    else:
        why = f"{stopping.reason()} while it ran; its teardown did not end within {STOP_GRACE_S}s"
        took = time.time() - started_at
        if progress is not None:
            progress.job_finished(job.label, f"UNKNOWN ({why})")
    return _result(job, Verdict.UNKNOWN, why, took, None, [])


def _result(
    job: Job,
    verdict: Verdict,
    reason: str,
    duration_s: float,
    archive_path: Path | None,
    failed_checks: list[str],
) -> ExperimentResult:
    spec = job.spec
    return ExperimentResult(
        experiment_id=spec.id,
        title=spec.title,
        variant=job.variant,
        repeat_index=job.repeat_index,
        verdict=verdict,
        reason=reason,
        duration_s=duration_s,
        natural_wait_s=spec.natural_wait(job.variant),
        archive_path=archive_path,
        invariant=spec.invariant,
        failed_checks=failed_checks,
        layer=spec.layer_for(job.variant),
    )
