"""Progress is not safety (harness/engine/experiment.py): an unmet progress check
is a fail only when nothing the harness measured in its window excuses it; a
broken safety invariant is a fail whatever the timing. And the kernel's
run-queue delays the harness reads (harness/engine/starvation.py) are real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from harness.engine import starvation, waits
from harness.engine.experiment import Bound, ExperimentContext, ExperimentSpec
from harness.engine.runner import bound_excuse
from harness.parts.postgres import PostgresCluster
from harness.verdict import Verdict
from harness.waiting import wait_for

SPEC = ExperimentSpec(id="X", title="x", seed_section="-", invariant="-", fault="-", rules=(1,))


def _ctx(excuse: str | None = None) -> ExperimentContext:
    ctx = ExperimentContext(spec=SPEC, env=None)  # type: ignore[arg-type]
    ctx.excuse = (lambda since, until: excuse) if excuse is not None else (lambda s, u: None)
    ctx.fault("the fault", True, expected="-", observed="-")
    return ctx


def test_unmet_progress_without_an_excuse_is_a_fail() -> None:
    ctx = _ctx()
    ctx.progress("the successor finished", False, expected="succeeded", observed="running")
    verdict, reason = ctx.verdict()
    assert verdict is Verdict.FAIL
    assert "the successor finished" in reason and "no stall or starvation" in reason


def test_unmet_progress_excused_by_timing_is_unknown_naming_it() -> None:
    ctx = _ctx("worker B (pid 7) waited 0.40s for a CPU")
    ctx.progress("the successor finished", False, expected="succeeded", observed="running")
    verdict, reason = ctx.verdict()
    assert verdict is Verdict.UNKNOWN
    assert "worker B (pid 7) waited 0.40s for a CPU" in reason
    (check,) = [c for c in ctx.checks if c.kind == "progress"]
    assert check.excused_by == "worker B (pid 7) waited 0.40s for a CPU"
    assert check.since is not None and check.at is not None and check.since <= check.at


def test_a_broken_safety_invariant_fails_whatever_the_timing() -> None:
    ctx = _ctx("the harness stalled 3.00s")
    ctx.progress("the successor finished", False, expected="succeeded", observed="running")
    ctx.invariant("no resend", False, expected="1", observed="2")
    assert ctx.verdict() == (Verdict.FAIL, "invariant broken: no resend")


def test_met_progress_passes_and_the_window_is_asked_for_unmet_ones_only() -> None:
    asked: list[tuple[float, float]] = []

    def excuse(since: float, until: float) -> str | None:
        asked.append((since, until))
        return None

    ctx = _ctx()
    ctx.excuse = excuse
    t0 = time.time()
    ctx.progress("done", True, expected="-", observed="-", since=t0)
    assert ctx.verdict()[0] is Verdict.PASS and asked == []
    ctx.progress("not done", False, expected="-", observed="-", since=t0)
    assert ctx.verdict()[0] is Verdict.FAIL
    assert asked and asked[0][0] == t0


def _pinned(code: str, cpu: int, own_session: bool = False) -> subprocess.Popen[bytes]:
    """``code`` run pinned to ``cpu``; in a session of its own when the
    process it competes with is (the kernel shares a CPU between sessions'
    autogroups first)."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); exec({code!r})"],
        start_new_session=own_session,
    )


@contextlib.contextmanager
def _one_cpu(hogs: int) -> Iterator[tuple[int, int]]:
    """A spinning victim and a sleeper, both pinned with ``hogs`` spinners to
    one CPU: their pids, once everyone runs there; all killed after."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    spin = "while True: pass"
    victim = _pinned(spin, cpu)
    sleeper = _pinned("import time; time.sleep(60)", cpu)
    procs = [*(_pinned(spin, cpu) for _ in range(hogs)), victim, sleeper]
    try:
        time.sleep(0.3)  # everyone pinned
        yield victim.pid, sleeper.pid
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(not starvation.monitor().available, reason="no schedstat in /proc")
def test_a_process_starved_of_cpu_is_measured_and_a_stopped_one_is_not() -> None:
    monitor = starvation.StarvationMonitor()
    with _one_cpu(hogs=3) as (victim, stopped):
        os.kill(stopped, signal.SIGSTOP)
        # The stop takes effect when the process next runs, and on a busy CPU it
        # waits in the run queue for that: measure only once it is stopped.
        wait_for(
            lambda: _state(stopped) == "T",
            what=f"process {stopped} to be stopped (state T)",
            timeout_s=10,
        )
        since = time.time()
        monitor.watch(victim, "X/victim")
        monitor.watch(stopped, "X/stopped")
        time.sleep(1.5)
        found = monitor.episodes(since, time.time())
    waited = {e.process: 0.0 for e in found}
    for e in found:
        waited[e.process] += e.waited_s
    # Four spinners on one CPU: the victim waits about three quarters of the time.
    assert waited.get("X/victim", 0.0) >= 0.5, found
    assert "X/stopped" not in waited  # a stopped process waits on no run queue


@pytest.mark.skipif(not starvation.monitor().available, reason="no schedstat in /proc")
def test_a_missed_bound_is_excused_only_by_its_own_process_starved_for_half_of_it() -> None:
    """A worker that loops past its 20 s bound is not excused by another
    process's starvation, nor by its own when it had most of the bound to run
    in (a control-plane worker starved 0.45 s once turned such a fail into
    unknown); a process starved for half its bound is."""
    monitor = starvation.StarvationMonitor()
    with _one_cpu(hogs=2) as (victim, bystander):
        since = time.time()
        monitor.watch(victim, "X/worker V")
        monitor.watch(bystander, "X/worker B")
        time.sleep(1.5)
        until = time.time()
    excuse = bound_excuse(starved=monitor)
    waited = sum(e.waited_s for e in monitor.episodes(since, until) if e.pid == victim)
    # Three spinners on one CPU: the victim waits about two thirds of the time.
    assert waited >= 0.6, monitor.episodes(since, until)
    short = excuse(since, until, Bound(victim, 1.0))
    assert short is not None and "X/worker V" in short and "half" in short
    assert excuse(since, until, Bound(victim, 20.0)) is None
    assert excuse(since, until, Bound(bystander, 1.0)) is None


def test_a_missed_bound_counts_its_own_short_waits_and_no_other_process_s() -> None:
    """Short waits of the process itself (no episode: each under half a
    tick) add up; another process's, however long, do not."""
    log = waits.WaitLog()
    t0 = 1000.0
    for i in range(10):  # 15 ms of every 50 ms tick: 0.15 s in 0.5 s
        log.add("S/worker A", 41, t0 + i * 0.05, t0 + (i + 1) * 0.05, 0.015)
    log.add("S/worker B", 42, t0, t0 + 0.5, 0.5)
    idle = starvation.StarvationMonitor()
    excuse = bound_excuse(starved=idle, label="S", logged=log)
    found = excuse(t0, t0 + 0.5, Bound(41, 0.2))
    assert found is not None and "S/worker A" in found and "0.15s" in found
    assert excuse(t0, t0 + 0.5, Bound(41, 0.4)) is None  # 0.15 s < half of 0.4 s
    assert excuse(t0, t0 + 0.5, Bound(43, 0.2)) is None  # B's waits are B's
    assert bound_excuse(starved=idle, logged=log)(t0, t0 + 0.5, Bound(41, 0.2)) is None


def test_a_bound_check_asks_the_bound_excuse_not_the_general_one() -> None:
    ctx = _ctx("worker ctl (pid 9) waited 0.45s for a CPU")
    asked: list[Bound] = []

    def own(since: float, until: float, bound: Bound) -> str | None:
        asked.append(bound)
        return None

    ctx.bound_excuse = own
    ctx.progress(
        "every worker kept its bounds (answered, exited)",
        False,
        expected="exited",
        observed="did not exit within 20.0s",
        bound=Bound(1234, 20.0),
    )
    verdict, reason = ctx.verdict()
    assert verdict is Verdict.FAIL, reason
    assert asked == [Bound(1234, 20.0)]


def test_a_check_not_tried_is_not_judged_never_held() -> None:
    """R's attempts after one already changed the run are not tried: such a check
    shows as not judged, decides nothing and is not one that held."""
    from harness.engine.runner import check_mark

    ctx = _ctx()
    ctx.not_judged("stale release refused", expected="-", observed="not judged: no attempt")
    assert ctx.verdict()[0] is Verdict.UNKNOWN  # no invariant was checked: nothing held
    ctx.invariant("stale renew refused", True, expected="-", observed="-")
    verdict, reason = ctx.verdict()
    assert verdict is Verdict.PASS and "1 not judged: stale release refused" in reason
    (skipped,) = [c for c in ctx.checks if c.kind == "not_judged"]
    assert check_mark(skipped.kind, skipped.ok) == "not judged"


class _Refusing:
    """A scenario module whose worker turns a setup op down with ``error``."""

    SPEC = SPEC

    def __init__(self, error: str) -> None:
        self.error = error

    def run(self, ctx: ExperimentContext) -> None:
        from harness.engine.experiment import Inconclusive, SetupRefused, timing_or_harness

        ctx.fault("the fault", True, expected="-", observed="-")
        if timing_or_harness(self.error):
            raise Inconclusive(f"setup op 'claim' on A failed: {self.error}: -")
        raise SetupRefused("ctl", "create_run", self.error, "insert or update violates ...")


class _FailThenStuck:
    """A scenario module whose invariant breaks, then whose worker never
    reaches a later point (the bug that broke it skipped the point too)."""

    SPEC = SPEC

    def __init__(self, broken: bool) -> None:
        self.broken = broken

    def run(self, ctx: ExperimentContext) -> None:
        from harness.engine.experiment import Inconclusive

        ctx.fault("the fault", True, expected="-", observed="-")
        ctx.invariant("one request sent", not self.broken, expected="1", observed="0")
        raise Inconclusive("worker 'D2' did not reach point 'after_dispatch_claim_commit'")


@pytest.mark.parametrize(("broken", "verdict"), [(True, Verdict.FAIL), (False, Verdict.UNKNOWN)])
def test_a_later_inconclusive_step_leaves_a_broken_invariant_failed(
    broken: bool, verdict: Verdict
) -> None:
    from harness.engine.runner import Job, _run_scenario

    class Env:
        def abort(self, timeout_s: float) -> None: ...

    ctx = ExperimentContext(spec=SPEC, env=Env())  # type: ignore[arg-type]
    job = Job(module=_FailThenStuck(broken), variant=None, repeat_index=0)  # type: ignore[arg-type]
    got, reason, harness_error = _run_scenario(job, ctx)
    assert (got, harness_error) == (verdict, None), reason
    assert "did not reach point" in reason


def test_a_probe_not_reached_is_not_judged_and_leaves_the_fail_before_it() -> None:
    ctx = _ctx()
    ctx.invariant("both writes committed", False, expected="2", observed="0")
    assert not ctx.probe_reached("rows queued", False, judges="pipelined", expected="-",
                                 observed="nothing waited")  # fmt: skip
    assert ctx.verdict() == (Verdict.FAIL, "invariant broken: both writes committed")
    assert [(c.name, c.kind) for c in ctx.checks][-1] == ("pipelined", "not_judged")
    reached = _ctx()
    assert reached.probe_reached("rows queued", True, judges="pipelined", expected="-",
                                 observed="2 waiting")  # fmt: skip
    reached.invariant("pipelined", True, expected="-", observed="-")
    assert reached.verdict()[0] is Verdict.PASS


@pytest.mark.parametrize(
    ("error", "excuse", "verdict"),
    [
        ("ForeignKeyViolation", None, Verdict.FAIL),  # its own schema broken: no timing explains it
        ("RunNotFound", None, Verdict.FAIL),
        ("ForeignKeyViolation", "the harness stalled 0.80s", Verdict.UNKNOWN),
        ("LeaseLost", None, Verdict.UNKNOWN),  # a lease that ran out under load
        ("StateConflict", None, Verdict.UNKNOWN),  # a state a slow tool call left
        ("OperationalError", None, Verdict.UNKNOWN),
        ("Unsupported", None, Verdict.UNKNOWN),  # the worker lacks the op
        ("BadRequest", None, Verdict.FAIL),  # a request the contract defines, refused
    ],
)
def test_a_setup_op_refused_for_no_timing_reason_is_unmet_progress(
    error: str, excuse: str | None, verdict: Verdict
) -> None:
    from harness.engine.runner import Job, _run_scenario

    class Env:
        def abort(self, timeout_s: float) -> None: ...

    ctx = ExperimentContext(spec=SPEC, env=Env())  # type: ignore[arg-type]
    ctx.excuse = lambda since, until: excuse
    job = Job(module=_Refusing(error), variant=None, repeat_index=0)  # type: ignore[arg-type]
    got, reason, harness_error = _run_scenario(job, ctx)
    assert (got, harness_error) == (verdict, None), reason
    if verdict is Verdict.FAIL:
        assert "ctl carried out 'create_run'" in reason


def test_a_backend_title_names_its_user_and_database() -> None:
    assert starvation.backend_of("postgres: worker_a fc_b_1 127.0.0.1(4242) idle") == (
        "worker_a",
        "fc_b_1",
    )
    for other in (
        "postgres: checkpointer",
        "postgres: autovacuum worker fc_b_1",
        "postgres: walsender rep 127.0.0.1(4242) streaming 0/3000060",
        "/usr/lib/postgresql/16/bin/postgres -D /tmp/pg -p 5432 -k",
    ):
        assert starvation.backend_of(other) is None, other


@pytest.mark.skipif(not starvation.monitor().available, reason="no schedstat in /proc")
def test_the_backends_serving_an_experiment_are_watched_and_their_starvation_measured(
    pg_cluster: PostgresCluster,
) -> None:
    """A worker's renewal is a statement its backend must run: the backend
    forked for the experiment's database (not the harness's superuser
    session, not another database's) is found by its process title and its
    wait for a CPU measured under the experiment's name."""
    db = pg_cluster.create_database(prefix="starved")
    other = pg_cluster.create_database(prefix="bystander")
    role = f"starved_{os.getpid()}"
    pg_cluster.execute(f"CREATE ROLE {role} LOGIN")
    assert pg_cluster.process is not None
    postmaster = pg_cluster.process.pid
    monitor = starvation.StarvationMonitor()
    monitor.watch_backends(postmaster, db.name, "X", {pg_cluster.superuser})
    cpu = sorted(os.sched_getaffinity(0))[-1]
    # The server runs in a session of its own: so does each hog.
    hogs = [_pinned("while True: pass", cpu, own_session=True) for _ in range(2)]
    time.sleep(0.3)  # the hogs pinned
    try:
        with (
            pg_cluster.connect(db.name, user=role) as conn,
            pg_cluster.connect(other.name, user=role) as bystander,
            pg_cluster.connect(db.name) as harness_session,
        ):
            pids = {
                c: c.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
                for c in (conn, bystander, harness_session)
            }
            os.sched_setaffinity(pids[conn], {cpu})
            since = time.time()
            # Spins in the backend on the hogs' CPU for about 1.5 s.
            conn.execute(
                "DO $$ BEGIN PERFORM pg_sleep(0); "
                "WHILE clock_timestamp() < now() + interval '1.5 s' LOOP END LOOP; END $$"
            )
            found = monitor.episodes(since, time.time())
            watched = {w.pid: w.name for w in monitor._watched.values()}
    finally:
        for p in hogs:
            p.kill()
            p.wait()
        monitor.forget_backends(postmaster, db.name)
        pg_cluster.execute(f"DROP ROLE {role}")
    assert watched.get(pids[conn]) == f"X/backend {role}", watched
    assert pids[bystander] not in watched and pids[harness_session] not in watched
    waited = sum(e.waited_s for e in found if e.pid == pids[conn])
    # Three spinners on one CPU: the backend waits about two thirds of the time.
    assert waited >= 0.5, found


def _state(pid: int) -> str:
    """The process's state letter from /proc/<pid>/stat (R, S, T, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat.rsplit(")", 1)[1].split()[0]
