"""The nemesis: applies a schedule's faults to the real parts, heals them, and
records which faults took effect from the harness's own observation.

What "took effect" means, per kind (never a worker's word):

* ``pause``: the kernel reported every thread stopped after SIGSTOP;
* ``kill``: the process was reaped after SIGKILL (it was alive before);
* ``crash_at``: the control socket journaled the point reached and answered
  ``crash``;
* ``hold``: the point was reached and the hold answered when its time was up;
* ``link``: toxiproxy confirmed the change and a probe saw it (a cut link
  refuses connections; a toxic is listed on the proxy);
* ``tool``: the mock tool's own fault history says the fault fired.

Invariant: :meth:`Nemesis.heal` leaves every link enabled and toxic-free,
every process running (SIGCONT), no hold waiting and no tool fault armed or
request hung, whatever was applied before.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.engine.experiment import ExperimentContext, Inconclusive
from harness.explore.schedule import ANY, TOOL_MODES_WITH_MS, Fault, Schedule
from harness.explore.workload import Workload
from harness.parts.control import ANY_WORKER, Continue, ControlError, Crash, Hit, Hold
from harness.parts.postgres import failover
from harness.parts.processes import ProcessError, WorkerProcess
from harness.parts.toxiproxy import Link

TICK_S = 0.05
POINT_WAIT_S = 8.0


@dataclass
class Effect:
    """Whether one fault of the schedule took effect, and the evidence."""

    index: int
    label: str
    kind: str
    point: str | None
    took_effect: bool = False
    evidence: str = "not applied"
    #: For a fault not tied to a point: the point the affected worker (any
    #: worker, for the tool and its link) passed last before the fault.
    after_point: str | None = None


@dataclass
class Step:
    at_ms: int
    label: str
    do: Callable[[], None]


@dataclass
class Nemesis:
    ctx: ExperimentContext
    schedule: Schedule
    workload: Workload
    stop: threading.Event
    effects: list[Effect] = field(default_factory=list)
    _holds: list[threading.Thread] = field(default_factory=list)
    _tool_fault_ids: dict[int, str] = field(default_factory=dict)
    _paused: list[WorkerProcess] = field(default_factory=list)
    _paused_by: dict[int, WorkerProcess] = field(default_factory=dict)
    #: Set once the timed steps are over: a hold whose point was not reached by
    #: then gives up waiting.
    horizon_passed: threading.Event = field(default_factory=threading.Event)
    #: Takeover watchers (stale holders) wait through the quiet wait too.
    _watchers: list[threading.Thread] = field(default_factory=list)
    _quiet_over: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.effects = [
            Effect(i, f.label(), f.kind, f.point) for i, f in enumerate(self.schedule.faults)
        ]

    # ------------------------------------------------------------ before start
    def arm_points(self) -> None:
        """Point faults (and tool faults due at 0) are armed before any worker
        starts, so none is missed."""
        for i, f in enumerate(self.schedule.faults):
            if f.kind == "tool" and f.at_ms == 0:  # from the very first create on
                self._tool_on(i, f)
            if f.kind == "stale" and f.point is not None:
                self._watchers.append(
                    threading.Thread(
                        target=self._stale_on_takeover,
                        args=(i, f),
                        name=f"explore-stale-{i}",
                        daemon=True,
                    )
                )
                continue
            if f.point is None:
                continue
            who = self._point_worker(f)
            self.ctx.arm(who, f.point, Crash() if f.kind == "crash_at" else Hold())
            if f.kind in ("hold", "pause"):
                thread = threading.Thread(
                    target=self._hold, args=(i, f, who), name=f"explore-hold-{i}", daemon=True
                )
                self._holds.append(thread)

    def start_holds(self) -> None:
        for thread in self._holds + self._watchers:
            thread.start()

    def _point_worker(self, f: Fault) -> str:
        if f.worker == ANY:
            return ANY_WORKER
        if isinstance(f.worker, int):
            return f"w{f.worker}"
        return str(f.worker)  # the relay

    def _hold(self, index: int, f: Fault, who: str) -> None:
        assert f.point is not None
        hit: Hit | None = None
        while hit is None and not (self.stop.is_set() or self.horizon_passed.is_set()):
            try:
                hit = self.ctx.env.control.wait_reached(who, f.point, timeout_s=0.2)
            except TimeoutError:
                continue
            except ControlError as exc:  # the experiment was aborted (a stop, its timeout)
                self.effects[index].evidence = f"waiting for {f.point} ended: {exc}"
                return
        if hit is None:
            self.effects[index].evidence = f"point {f.point} not reached by {who}"
            return
        if f.kind == "pause":
            self._pause_at_point(index, f, hit)
            return
        self.stop.wait(f.duration_ms / 1000)
        action = Crash() if f.then == "crash" else Continue()
        try:
            self.ctx.release(hit.worker, f.point, action)
        except Exception as exc:  # the worker may have died while held (e.g. killed)
            self.effects[index].evidence = f"{hit.worker} reached {f.point}; release failed: {exc}"
            return
        self.effects[index].took_effect = True
        self.effects[index].evidence = (
            f"{hit.worker} (pid {hit.peer_pid}) held at {f.point} for {f.duration_ms}ms "
            f"(run {str(hit.run_id)[:8]} epoch {hit.epoch}), then {action.label()}"
        )

    def _pause_at_point(self, index: int, f: Fault, hit: Hit) -> None:
        """SIGSTOP the worker held at the point, answer its barrier (it reads the
        answer once resumed), keep it stopped for the drawn time, SIGCONT."""
        assert f.point is not None
        proc = self.ctx.env.workers.get(hit.worker)
        effect = self.effects[index]
        try:
            assert proc is not None
            rec = self.ctx.pause(proc)
            self._paused.append(proc)
            self.ctx.release(hit.worker, f.point)
        except Exception as exc:
            effect.evidence = f"{hit.worker} reached {f.point}; SIGSTOP failed: {exc}"
            return
        effect.took_effect = rec.state == "stopped"
        effect.evidence = (
            f"{hit.worker} (pid {rec.pid}) SIGSTOPped at {f.point} (run {str(hit.run_id)[:8]} "
            f"epoch {hit.epoch}): kernel state {rec.state}"
        )
        self.stop.wait(f.duration_ms / 1000)
        if proc in self._paused:
            try:
                self.ctx.resume(proc)
                effect.evidence += f"; SIGCONT after {f.duration_ms}ms"
            except (ProcessError, Inconclusive) as exc:
                # Another fault of the schedule killed it while stopped.
                effect.evidence += f"; no SIGCONT after {f.duration_ms}ms: {exc}"
            with contextlib.suppress(ValueError):
                self._paused.remove(proc)

    # ------------------------------------------------------------ timed steps
    def steps(self) -> list[Step]:
        """Every timed step of the schedule (the control actions too), in time order."""
        out: list[Step] = []
        for i, f in enumerate(self.schedule.faults):
            if f.kind == "pause" and f.point is None:
                out.append(Step(f.at_ms, f"SIGSTOP w{f.worker}", self._bind(self._pause, i, f)))
                out.append(
                    Step(
                        f.at_ms + f.duration_ms,
                        f"SIGCONT w{f.worker}",
                        self._bind(self._resume, i, f),
                    )
                )
            elif f.kind == "kill":
                out.append(Step(f.at_ms, f"SIGKILL w{f.worker}", self._bind(self._kill, i, f)))
            elif f.kind == "link":
                out.append(Step(f.at_ms, f.label(), self._bind(self._link_on, i, f)))
                out.append(
                    Step(
                        f.at_ms + f.duration_ms,
                        f"heal {f.label()}",
                        self._bind(self._link_off, i, f),
                    )
                )
            elif f.kind == "failover":
                out.append(Step(f.at_ms, f.label(), self._bind(self._failover, i, f)))
            elif f.kind == "stale" and f.point is None:
                out.append(Step(f.at_ms, f.label(), self._bind(self._stale_now, i, f)))
            elif f.kind == "tool" and f.at_ms > 0:
                out.append(Step(f.at_ms, f.label(), self._bind(self._tool_on, i, f)))
        for a in self.schedule.actions:
            out.append(Step(a.at_ms, f"{a.action} run {a.run}", lambda a=a: self.workload.act(a)))  # type: ignore[misc]
        return sorted(out, key=lambda s: s.at_ms)

    @staticmethod
    def _bind(fn: Callable[[int, Fault], None], i: int, f: Fault) -> Callable[[], None]:
        return lambda: fn(i, f)

    def play(self) -> float:
        """Run the timed steps against the clock, supervising the workers between
        them; returns (the clock's start) at the schedule's horizon, or at once
        when told to stop."""
        started = time.monotonic()
        for step in self.steps():
            while not self.stop.is_set():
                due = started + step.at_ms / 1000 - time.monotonic()
                if due <= 0:
                    break
                self.workload.supervise()
                self.stop.wait(min(TICK_S, due))
            if self.stop.is_set():
                return started
            try:
                step.do()
            except Exception as exc:  # a step on a part that went away: recorded
                self.ctx.command(f"explore step {step.label!r} failed: {type(exc).__name__}: {exc}")
            self.workload.supervise()
        return started

    def _worker(self, f: Fault) -> WorkerProcess | None:
        """The fault's worker if it runs now, else the first worker that does
        (a worker done with its runs has exited: a fault aimed at it would
        take no effect and prove nothing); None when none runs. A worker held
        at a point by another fault of the schedule is passed over while
        another runs: a kill or a stop there would cut that fault short (its
        hold never answered), so neither would prove what it was drawn for."""
        assert isinstance(f.worker, int)
        held = {h.worker for h in self.ctx.env.control.held()}
        alive = [
            s.current for s in self.workload.slots if s.current is not None and s.current.is_alive()
        ]
        named = self.workload.slots[f.worker].current
        free = [p for p in alive if p.worker_id not in held]
        if named is not None and named.is_alive() and (named in free or not free):
            return named
        return free[0] if free else (alive[0] if alive else None)

    def _pause(self, i: int, f: Fault) -> None:
        proc = self._worker(f)
        if proc is None:
            self.effects[i].evidence = "no worker was running at that moment"
            return
        try:
            rec = self.ctx.pause(proc)
        except ProcessError as exc:
            self.effects[i].evidence = f"SIGSTOP not confirmed: {exc}"
            return
        self._paused.append(proc)
        self._paused_by[i] = proc
        self._note_point(i, proc.worker_id)
        self.effects[i].took_effect = rec.state == "stopped"
        self.effects[
            i
        ].evidence = f"SIGSTOP {proc.worker_id} pid {rec.pid}: kernel state {rec.state}"

    def _resume(self, i: int, f: Fault) -> None:
        proc = self._paused_by.pop(i, None)
        if proc is not None and proc in self._paused:
            with contextlib.suppress(ProcessError):
                self.ctx.resume(proc)
            self._paused.remove(proc)
            self.effects[i].evidence += f"; SIGCONT after {f.duration_ms}ms"

    def _kill(self, i: int, f: Fault) -> None:
        proc = self._worker(f)
        if proc is None:
            self.effects[i].evidence = "no worker was running at that moment"
            return
        self._note_point(i, proc.worker_id)
        rec = self.ctx.kill(proc)
        self.effects[i].took_effect = rec.confirmed_at is not None and rec.detail.startswith(
            "returncode"
        )
        self.effects[
            i
        ].evidence = f"SIGKILL {proc.worker_id} pid {rec.pid}: {rec.state} ({rec.detail})"

    def _failover(self, i: int, f: Fault) -> None:
        """Fence the primary, promote the standby, point every worker link at it
        (H's failover); took effect when the promoted server left recovery and
        toxiproxy names it as every worker link's upstream."""
        env = self.ctx.env
        if env.standby is None or env.standby is env.primary:
            self.effects[i].evidence = "no standby to promote"
            return
        self._note_point(i, None)
        record = failover(env.primary, env.standby)
        env.primary = env.standby  # every later query, the evidence too, goes to it
        upstream = env.shared.backend.inner_address("127.0.0.1", env.primary.port)
        moved = []
        for key, link in env.links.items():
            if key == "worker_pg" or key.startswith("pg_"):
                moved.append(link.client.set_upstream(link.name, upstream).upstream == upstream)
        in_recovery = env.primary.query("SELECT pg_is_in_recovery() AS r")[0]["r"]
        self.ctx.command(
            f"failover ({self.schedule.replication}): fenced {record.old_primary} in "
            f"{record.fence_seconds:.3f}s, promoted {record.new_primary} in "
            f"{record.promote_seconds:.3f}s; {sum(moved)} worker link(s) now dial {upstream}"
        )
        self.effects[i].took_effect = not in_recovery and bool(moved) and all(moved)
        self.effects[i].evidence = (
            f"{record.new_primary} promoted (in recovery: {in_recovery}), "
            f"{sum(moved)}/{len(moved)} worker links moved to it; lag before "
            f"{[r.get('flush_lag_bytes') for r in record.lag_before]} bytes"
        )

    @staticmethod
    def _link_key(f: Fault) -> str:
        if f.link == "replication":
            return "replication"
        return f"pg_w{f.worker}" if f.link == "pg" else "worker_tool"

    def _link(self, f: Fault) -> Link:
        return self.ctx.env.links[self._link_key(f)]

    def _link_on(self, i: int, f: Fault) -> None:
        link = self._link(f)
        if f.fault == "cut":
            rec = link.cut()
        elif f.fault == "blackhole":
            rec = link.blackhole()
        elif f.fault == "reset":
            rec = link.reset()
        elif f.fault == "drop_responses":  # requests arrive, answers never come back
            rec = link.drop_responses(close_after_ms=500)
        else:
            rec = link.latency(f.latency_ms)
        self.ctx.command(f"toxiproxy: {rec.detail}")
        current = self._worker(f) if f.link == "pg" else None
        self._note_point(i, current.worker_id if current else None)
        confirmed, evidence = probe(link, f.fault or "")
        self.effects[i].took_effect = confirmed
        self.effects[i].evidence = evidence

    def _link_off(self, i: int, f: Fault) -> None:
        self.ctx.heal(self._link_key(f))

    def _tool_on(self, i: int, f: Fault) -> None:
        assert f.mode is not None
        ms = f.duration_ms if f.mode in TOOL_MODES_WITH_MS else None
        fid = self.ctx.env.tool.client().set_fault(
            f.tool, f.mode, count=f.count, ms=ms, skip=f.skip
        )
        self._tool_fault_ids[i] = fid
        self._note_point(i, None)
        self.ctx.command(f"mock tool: fault {f.mode} x{f.count} on {f.tool} after {f.skip} ({fid})")
        self.effects[i].evidence = f"armed {fid}; never fired (no create of {f.tool} came)"

    def _target_runs(self, f: Fault) -> list[str]:
        ids = self.workload.run_ids
        if f.run == ANY:
            return list(ids)
        assert isinstance(f.run, int)
        return [ids[f.run]] if len(ids) > f.run else []

    def _stale_on_takeover(self, i: int, f: Fault) -> None:
        """Wait (by the control journal, holding nobody) for a second worker to
        reach after_lease_acquired on the run (``any``: on any run of the
        schedule), then speak as the holder before it."""
        while not (self.stop.is_set() or self._quiet_over.is_set()):
            hits = self.ctx.env.control.hits(point="after_lease_acquired")
            # Past the horizon, a named run that was never taken over (it
            # paused for a human, or finished first) yields to any run that
            # was: the stale holder of that one speaks instead.
            runs = self._target_runs(f)
            if self.horizon_passed.is_set():
                runs += [r for r in self.workload.run_ids if r not in runs]
            for run_id in runs:
                if len({h.seq for h in hits if h.run_id == run_id}) >= 2:
                    self._stale(i, f, run_id)
                    return
            self.stop.wait(0.01)
        self.effects[i].evidence = f"run {f.run} was not taken over"

    def _stale_now(self, i: int, f: Fault) -> None:
        """Speak at the moment as the stale holder of the named run; when it has
        no stale lease then, of any run that has one, and failing that keep
        looking (on a thread of its own, until quiet is over): a stale holder
        that never spoke proves nothing."""
        if self._stale_any(i, f):
            return
        thread = threading.Thread(
            target=self._stale_later, args=(i, f), name=f"explore-stale-{i}", daemon=True
        )
        self._watchers.append(thread)
        thread.start()

    def _stale_any(self, i: int, f: Fault) -> bool:
        runs = self._target_runs(f)
        runs += [r for r in self.workload.run_ids if r not in runs]
        return any(self._stale(i, f, run_id) for run_id in runs)

    def _stale_later(self, i: int, f: Fault) -> None:
        while not (self.stop.is_set() or self._quiet_over.is_set()):
            if self._stale_any(i, f):
                return
            self.stop.wait(0.05)

    def _stale(self, i: int, f: Fault, run_id: str) -> bool:
        """A stale holder's request: the identity comes from the harness's audit
        trail (superuser), and is stale by the database's own facts when sent."""
        rows = self.ctx.env.query(
            "SELECT r.owner, r.epoch, r.revision, r.lease_expires_at < clock_timestamp() AS expired, "
            "(SELECT a.owner FROM fencecheck_audit.run_changes a WHERE a.run_id::text = r.run_id::text "
            " AND a.epoch < r.epoch AND a.owner IS NOT NULL ORDER BY a.seq DESC LIMIT 1) AS old_owner, "
            "(SELECT a.epoch FROM fencecheck_audit.run_changes a WHERE a.run_id::text = r.run_id::text "
            " AND a.epoch < r.epoch AND a.owner IS NOT NULL ORDER BY a.seq DESC LIMIT 1) AS old_epoch "
            "FROM fencecheck_model.agent_runs r WHERE r.run_id::text = %s",
            [run_id],
        )
        row = rows[0] if rows else {}
        if row.get("old_owner") is not None:
            owner, epoch, why = (
                row["old_owner"],
                row["old_epoch"],
                f"epoch {row['epoch']} granted since",
            )
        elif row.get("owner") is not None and row.get("expired") and f.op != "release":
            # (The contract lets a holder give back its own expired lease: a
            # release is stale only after a takeover.)
            owner, epoch, why = row["owner"], row["epoch"], "its lease expired by database time"
        else:
            self.effects[i].evidence = (
                f"run {run_id[:8]} had no stale lease at that moment (owner {row.get('owner')}, "
                f"epoch {row.get('epoch')}, expired {row.get('expired')})"
            )
            return False
        args: dict[str, object] = {"run_id": run_id, "epoch": epoch, "owner": owner}
        if f.op == "save_checkpoint":
            args |= {"expected_revision": row["revision"], "state": {"stale": True}}
        proc = self.workload.stale_session(self.workload.tenant_of(run_id))
        self._note_point(i, None)
        try:
            reply = self.ctx.op(proc, f.op, timeout_s=5.0, **args)
            answer = "accepted" if reply.ok else f"refused: {reply.error}"
        except Exception as exc:  # an op the worker lacks, or no answer: sent all the same
            answer = f"{type(exc).__name__}: {exc}"
        self.effects[i].took_effect = True
        self.effects[i].evidence = f"{f.op} as {owner} epoch {epoch} on run {run_id[:8]}"
        self.effects[i].evidence += f" ({why}): {answer}"
        return True

    def _note_point(self, i: int, worker: str | None) -> None:
        hits = self.ctx.env.control.hits(worker=worker)
        self.effects[i].after_point = hits[-1].point if hits else None

    # ------------------------------------------------------------ the end
    def heal(self) -> None:
        """Undo every fault still in force (see the module's invariant). A step
        that fails is named in the archive's commands (a fault left in force
        shows there, not only as runs that never settled)."""
        env = self.ctx.env
        failed: list[str] = []

        def attempt(what: str, step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as exc:
                failed.append(f"{what}: {type(exc).__name__}: {exc}")

        def heal_link(key: str, link: Link) -> None:
            if link.active() or key.startswith("pg_w") or key == "worker_tool":
                link.heal()

        for key, link in list(env.links.items()):
            attempt(f"heal link {key}", functools.partial(heal_link, key, link))
        for proc in self._paused:
            with contextlib.suppress(ProcessError):
                self.ctx.resume(proc)
        self._paused.clear()
        for proc in env.workers.values():
            if proc.is_alive() and proc.kernel_state() == "stopped":
                with contextlib.suppress(ProcessError):
                    self.ctx.resume(proc)
        for f in self.schedule.faults:
            if f.kind in ("hold", "pause") and f.point is not None:
                env.control.disarm(self._point_worker(f), f.point)
        for hit in env.control.held():
            attempt(
                f"release {hit.worker} at {hit.point}",
                functools.partial(self.ctx.release, hit.worker, hit.point),
            )
        attempt("release the tool's held requests", lambda: env.tool.client().release())
        self.ctx.command(
            "explore: healed every link, process and hold (crash points and tool faults stay "
            "armed through the quiet wait)"
            + (f"; NOT healed: {'; '.join(failed)}" if failed else "")
        )

    def disarm_late(self) -> None:
        """Crash points, tool faults and takeover watchers stay armed through the
        quiet wait (their point, create or takeover may come late, and the
        workload recovers from them); then off."""
        self._quiet_over.set()
        for thread in self._watchers:
            thread.join(timeout=10)
        for f in self.schedule.faults:
            if f.kind == "crash_at" and f.point is not None:
                self.ctx.env.control.disarm(self._point_worker(f), f.point)
        with contextlib.suppress(Exception):
            tool = self.ctx.env.tool.client()
            tool.clear_faults()
            tool.release()

    def join_holds(self, started: float) -> None:
        """Give point faults until POINT_WAIT_S after the clock started to be
        reached (their point may come after the timed steps), supervising the
        workers meanwhile; then stop waiting and let the reached ones finish."""
        self._supervise_while_holds(started + POINT_WAIT_S)
        self.horizon_passed.set()
        longest = max((f.duration_ms for f in self.schedule.faults), default=0) / 1000
        self._supervise_while_holds(time.monotonic() + longest + 5)

    def _supervise_while_holds(self, deadline: float) -> None:
        while any(t.is_alive() for t in self._holds) and time.monotonic() < deadline:
            self.workload.supervise()
            self.stop.wait(TICK_S)

    def confirm(self) -> list[Effect]:
        """Fill in the effects only the journals can show (points, tool faults)."""
        env = self.ctx.env
        history = {}
        with contextlib.suppress(Exception):
            history = {h["fault_id"]: h for h in env.tool.client().faults().get("history", [])}
        for i, f in enumerate(self.schedule.faults):
            effect = self.effects[i]
            if f.kind == "crash_at" and f.point is not None:
                who = self._point_worker(f)
                hits = [
                    h
                    for h in env.control.hits(point=f.point)
                    if h.action == "crash" and (who == ANY_WORKER or h.worker == who)
                ]
                effect.took_effect = bool(hits)
                effect.evidence = (
                    f"{hits[0].worker} (pid {hits[0].peer_pid}) reached {f.point} and was told to crash"
                    if hits
                    else f"point {f.point} not reached by {who}"
                )
            elif f.kind == "tool" and i in self._tool_fault_ids:
                fired = history.get(self._tool_fault_ids[i], {}).get("fired", 0)
                effect.took_effect = bool(fired)
                if fired:
                    effect.evidence = (
                        f"the mock tool's fault history: {f.mode} fired {fired} time(s)"
                    )
        return self.effects


def probe(link: Link, fault: str) -> tuple[bool, str]:
    """Observe a link fault from outside the worker: a cut link refuses a new
    connection; a toxic must be listed on the proxy."""
    if fault == "cut":
        try:
            with socket.create_connection((link.listen_host, link.listen_port), timeout=0.5):
                return False, f"cut {link.name}: a probe connection was still accepted"
        except OSError as exc:
            return True, f"cut {link.name}: probe connection refused ({type(exc).__name__})"
    toxics = [t.name for t in link.client.list_toxics(link.name)]
    return bool(toxics), f"{fault} {link.name}: toxics on the proxy {toxics}"
