"""The environment an experiment runs in, and the services a whole run shares.

:class:`SharedServices` lives for one ``fencecheck run`` (or one pytest
session): the PostgreSQL binaries, one toxiproxy server, one primary cluster
with a migrated template database. :class:`Environment` lives for one
experiment: a fresh database copied from the template, its own proxies (so
cutting one experiment's link never touches another's), its own mock tool with
its own storage, its own control socket and its own workers. An experiment
that needs replication gets its own primary and standby.

Both are context managers whose exit tears down everything they started, in
reverse order, also on an exception or Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import random
import re
import shlex
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg

from harness import stopping
from harness.backends.base import Backend, make_backend
from harness.contract import mapping
from harness.engine import phases, stalls, starvation, waits
from harness.engine.janitor import Janitor
from harness.engine.run_records import Reaped, RunRecord
from harness.evidence import metrics as worker_metrics
from harness.failures import PartFailed
from harness.model.install import install as install_model
from harness.model.install import set_lease_ttl
from harness.mutation.traced_worker import CALLS_FILE_ENV
from harness.parts import port_guard
from harness.parts.control import ControlServer
from harness.parts.fork_server import ForkServer, ForkServerMisreports
from harness.parts.os_user import unprivileged_user
from harness.parts.pg_auth import PgAuth
from harness.parts.pg_binaries import PgBinaries, find_pg_binaries
from harness.parts.ports import free_port
from harness.parts.postgres import Database, PostgresCluster
from harness.parts.processes import (
    ManagedProcess,
    ProcessRegistry,
    WorkerProcess,
    kill_all_children,
    run_bounded,
)
from harness.parts.toxiproxy import Link, ToxiproxyServer
from mock_tool.process import HostedTool, MockToolProcess

DEFAULT_WORKER_CMD = (sys.executable, "-m", "reference_impl.worker")
TEMPLATE_NAME = "fencecheck_template"
# The harness's GIL switch interval while a run is up (see SharedServices).
SWITCH_INTERVAL_S = 0.001
# Where a traced worker lists the functions it ran (Settings.trace_calls).
CALLS_FILE = "python-calls.txt"
# The group roles a worker's `migrate` creates (worker contract v2): a login
# role of the harness is made a member of one and bound to one tenant.
GROUP_ROLES = {"worker": "fencecheck_worker", "operator": "fencecheck_operator"}
RoleKind = Literal["worker", "operator"]
_ROLE_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


class EnvironmentError_(RuntimeError):
    """The experiment environment could not be brought up."""


@dataclass
class Settings:
    """How a run is configured: which worker, which binaries, where to write."""

    worker_cmd: Sequence[str] = DEFAULT_WORKER_CMD
    mutant: str | None = None
    # The id of the generated mutant the worker command runs (`mutants --auto`):
    # recorded in archives, never passed to the worker.
    generated_mutant: str | None = None
    pg_bin: str | None = None
    toxiproxy_bin: str | None = None
    work_dir: Path | None = None
    keep: bool = False
    backend: str = "local"
    # Start workers from the worker command's fork server (contract §1):
    # None decides by the command (see wants_fork_server).
    fork_server: bool | None = None
    # Ask the worker command to list the functions it ran in each experiment's
    # logs (harness.mutation.traced_worker: the baseline of `mutants --auto`).
    trace_calls: bool = False

    def worker_command_text(self) -> str:
        return shlex.join(self.worker_cmd)

    def wants_fork_server(self) -> bool:
        """Whether to ask the worker command for its fork server. A command the
        harness knows (the reference worker, a generated mutant's launcher) is
        asked; any other only on FENCECHECK_FORK_SERVER=1, since a wrapper that
        does something per start (sets a variable, prints, changes directory)
        would pass ``fork-server`` to what it wraps and lose that for every
        worker. FENCECHECK_FORK_SERVER=0 asks none."""
        forced = os.environ.get("FENCECHECK_FORK_SERVER")
        if forced in ("0", "1"):
            return forced == "1"
        if self.fork_server is not None:
            return self.fork_server
        return tuple(self.worker_cmd) == tuple(DEFAULT_WORKER_CMD) or bool(self.generated_mutant)


# How long `<worker-cmd> migrate` may take (FENCECHECK_MIGRATE_TIMEOUT_S overrides).
MIGRATE_TIMEOUT_S = 60.0


def migrate_timeout_s() -> float:
    try:
        return float(os.environ.get("FENCECHECK_MIGRATE_TIMEOUT_S", MIGRATE_TIMEOUT_S))
    except ValueError:
        return MIGRATE_TIMEOUT_S


class MigrateFailed(PartFailed):
    """The worker's ``migrate`` exited non-zero, did not finish in time, or
    exited 0 without the contract's tables.

    For ``fencecheck run`` a harness / environment error (exit 2: no
    experiment can run); for ``fencecheck contract`` the worker's gap. Keeps
    the command, the exit code and the whole output for the report."""

    def __init__(
        self,
        command: str,
        exit_code: int | None,
        stdout: str,
        stderr: str,
        timeout_s: float,
        *,
        log: Path | None = None,
        why: str = "",
    ) -> None:
        self.command = command
        self.exit_code = exit_code
        self.stdout = stdout
        self.timeout_s = timeout_s
        self.why = why
        super().__init__(
            f"the worker's `{command}` {self._how()}",
            status="killed" if exit_code is None else f"exit status {exit_code}",
            stderr=stderr,
            log=log,
            hint="fix migrate, then run `fencecheck contract --worker-cmd ...` "
            "(docs/worker-contract.md sections 1, 6 and 7)",
        )

    def _how(self) -> str:
        if self.why:
            return self.why
        if self.exit_code is None:
            return f"did not finish within {self.timeout_s:.0f}s"
        return f"failed with exit code {self.exit_code}"

    def short(self) -> str:
        """One line: how it ended and its last stderr line."""
        if self.why:
            return self.why
        how = (
            f"exit {self.exit_code}"
            if self.exit_code is not None
            else f"not finished within {self.timeout_s:.0f}s"
        )
        last = [line for line in self.stderr.strip().splitlines() if line.strip()][-1:]
        return how + (f": {last[0].strip()}" if last else " (nothing on stderr)")

    def paragraph(self, log: str | None = None) -> str:
        """The one-paragraph account: command, exit code, the last stderr lines."""
        tail = [line.rstrip() for line in self.stderr.strip().splitlines() if line.strip()][-5:]
        said = (
            "; its last stderr lines: " + " | ".join(tail)
            if tail
            else "; it wrote nothing on stderr"
        )
        where = f" Its whole output: {log}." if log else ""
        return (
            f"The worker's `{self.command}` {self._how()} on a fresh database{said}. No "
            "experiment can run without the contract's schema (docs/worker-contract.md "
            "sections 1, 6 and 7); fix migrate, then run `fencecheck contract --worker-cmd "
            f"...` to check the rest.{where}"
        )

    def output(self) -> str:
        return migrate_transcript(self.command, self.stdout, self.stderr)


def migrate_transcript(command: str, stdout: str, stderr: str) -> str:
    """What ``migrate.log`` holds: the command, its stdout, then its stderr."""
    return f"$ {command}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"


def run_migrate(
    worker_cmd: Sequence[str],
    admin_dsn: str,
    log: Path,
    timeout_s: float,
    mutant: str | None = None,
    trace_calls: bool = False,
) -> tuple[str, str, str]:
    """The worker's ``migrate`` command run once against ``admin_dsn``, its
    transcript in ``log``: (command, stdout, stderr). Raises
    MigrateFailed when it cannot start, fails or hangs past ``timeout_s``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FENCECHECK_ADMIN_DSN": admin_dsn}
    for key in ("FENCECHECK_CONTROL", "FENCECHECK_EVENTS", "FENCECHECK_MUTANT"):
        env.pop(key, None)
    if mutant:  # the reference worker's migrate applies the mutant's SQL overlays
        env["FENCECHECK_MUTANT"] = mutant
    if trace_calls:
        env[CALLS_FILE_ENV] = str(log.parent / CALLS_FILE)
    command = shlex.join([*worker_cmd, "migrate"])
    stopping.check(f"`{command}`")
    try:
        done = run_bounded([*worker_cmd, "migrate"], timeout_s=timeout_s, env=env)
    except OSError as exc:  # the command itself cannot be started
        raise MigrateFailed(
            command, 127, "", f"cannot start it: {exc.strerror or exc}", timeout_s, log=None
        ) from exc
    out, err, status = done.stdout, done.stderr, done.how
    log.write_text(migrate_transcript(command, out, err))
    if status == "interrupted":
        raise stopping.Interrupted(f"{stopping.reason()}: `{command}` was killed")
    if status == "timeout":
        raise MigrateFailed(command, None, out, err, timeout_s, log=log)
    if done.returncode != 0:
        raise MigrateFailed(command, done.returncode, out, err, timeout_s, log=log)
    return command, out, err


def migrate(
    worker_cmd: Sequence[str],
    admin_dsn: str,
    log_dir: Path,
    timeout_s: float | None = None,
    mutant: str | None = None,
    trace_calls: bool = False,
) -> None:
    """Run ``<worker-cmd> migrate`` against ``admin_dsn``, check it made the
    contract's tables, then add the audit trigger.

    Raises MigrateFailed (a PartFailed: what failed, its exit status, its
    stderr's last lines, the whole output; ``migrate.log`` in ``log_dir``) when
    the command fails, hangs past ``timeout_s`` or creates no schema;
    harness.stopping.Interrupted (after killing it) on a stop request.
    """
    timeout_s = timeout_s if timeout_s is not None else migrate_timeout_s()
    log = log_dir / "migrate.log"
    command, out, err = run_migrate(worker_cmd, admin_dsn, log, timeout_s, mutant, trace_calls)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        # The model of the worker's mapping (harness/model): its views and the
        # audit trail, or what the database lacks of what the mapping names.
        problems = install_model(conn, mapping.declared(tuple(worker_cmd)).model)
        missing = [p.table.removeprefix("public.") for p in problems if p.table]
        if problems:
            why = (
                f"exited 0 but created no table {', '.join(dict.fromkeys(missing))} (migrate "
                "must create the tables its mapping names, docs/worker-contract.md sections 6 "
                "and 14: is --worker-cmd a worker?)"
                if missing
                else "exited 0 but the database lacks what its mapping names (docs/worker-"
                f"contract.md section 14): {'; '.join(str(p) for p in problems)}"
            )
            raise MigrateFailed(command, 0, out, err, timeout_s, log=log, why=why)


# A database nothing listens on: the fork server's probe child waits for
# requests instead of connecting (port 1 is never a PostgreSQL server's).
UNREACHABLE_DSN = "postgresql://fencecheck-probe@127.0.0.1:1/none"


def start_fork_server(
    settings: Settings, log_dir: Path, stack: contextlib.ExitStack
) -> tuple[ForkServer | None, str]:
    """The worker command's fork server (worker contract §1, optional), closed
    with ``stack``, and how workers are started, for the archives; no server
    when it is not asked for (Settings.wants_fork_server) or the command does
    not offer one. Start it from a long-lived thread: it dies with the thread
    that started it."""
    if not settings.wants_fork_server():
        return None, "exec (no fork server asked for; FENCECHECK_FORK_SERVER=1 asks any command)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCECHECK_")}
    env["PYTHONUNBUFFERED"] = "1"
    server = ForkServer(settings.worker_cmd, log_path=log_dir / "fork-server.log", env=env)
    stopping.check("the worker's fork server")
    if not server.start():
        return None, f"exec ({server.why_not})"
    stack.callback(server.close)
    # Its exit reports decide every crash fault: check one it cannot fake.
    probe_env = {**env, "FENCECHECK_DSN": UNREACHABLE_DSN}
    problem = server.check_kill_report(probe_env) or server.check_sigterm_ends(probe_env)
    if problem is not None:
        raise ForkServerMisreports(
            f"the worker's fork server (`{shlex.join(server.argv)}`) breaks the mode's contract: "
            f"{problem}. Fix the server, or run without it (FENCECHECK_FORK_SERVER=0); its log: "
            f"{log_dir / 'fork-server.log'}"
        )
    return server, f"fork of `{shlex.join(server.argv)}` (pid {server.pid})"


def _grace(normal_s: float) -> float:
    """How long a server gets to stop politely: much less once a stop was asked for."""
    return min(normal_s, 0.3) if stopping.requested() else normal_s


class SharedServices:
    """What one run shares across experiments: binaries, toxiproxy, one primary.

    It also owns the run's footprint: a run record (``run_records``) naming
    everything it creates, kept current and released at exit; the stall
    monitor; and the environments alive right now, so that a stop request
    aborts them all at once (:meth:`interrupt`) and an escalated stop kills
    everything (:meth:`hard_stop`).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        log_dir: Path | None = None,
        report_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.binaries: PgBinaries = find_pg_binaries(settings.pg_bin)
        stopping.check("the run's servers")
        # The backend first: when it cannot run here, no temp directory is left.
        self.backend: Backend = make_backend(
            settings.backend, self.binaries, settings.toxiproxy_bin
        )
        try:
            self.record = RunRecord.create(
                base=settings.work_dir,
                kind="run",
                report_dir=report_dir,
                prefer_memory=settings.backend == "local",
            )
            self.record.set_backend(self.backend.footprint())
            if self.backend.clones_data_directories:  # a local backend: its servers ask
                self.backend.auth = PgAuth.create(self.record.temp_root)
                self.port_guard, self.access = port_guard.start(
                    self.record.temp_root.name.rsplit("-", 1)[-1],
                    [os.geteuid(), unprivileged_user().uid],
                )
                if self.port_guard is not None:
                    self.record.add_firewall_table(self.port_guard.table)
            else:
                self.port_guard, self.access = None, self.backend_access()
        except BaseException:
            # Interrupted or failed half-way: nothing of this run may stay.
            with contextlib.suppress(Exception):
                self.record.release()
            self.backend.close()
            raise
        # From here until __enter__ registers its teardown, a stop leaves the
        # record to run_records.release_unreleased() (the command's last step),
        # the firewall table with it.
        self.root = self.record.temp_root
        self.log_dir = log_dir or self.root / "logs"
        self.registry = ProcessRegistry()
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()
        self._environments: list[Environment] = []
        self._kept: list[tuple[Environment, contextlib.ExitStack]] = []
        self._running_jobs: set[str] = set()
        self._jobs_idle = threading.Condition()
        self.closed = threading.Event()
        self.final_reap: Reaped | None = None
        self._aborter: threading.Thread | None = None
        self.toxiproxy: ToxiproxyServer | None = None
        self.primary: PostgresCluster | None = None
        self.template: str | None = None
        self.fork_server: ForkServer | None = None
        self.worker_launch = "exec"
        self.janitor = Janitor()
        # Stopped, migrated data directories that replicated pairs are copied
        # from, per worker command and mutant (see pair_seed); shared by views.
        self._seeds: dict[tuple[tuple[str, ...], str | None], Path] = {}
        self._seed_lock = threading.Lock()

    def __enter__(self) -> SharedServices:
        try:
            # Until everything is gone, an escalated stop must still find the
            # kill-all: its hook leaves last.
            self._stack.callback(stopping.on_escalate(self.hard_stop))
            self._stack.callback(self._release_record)
            # The run's ports stay guarded until every part is gone.
            self._stack.callback(self._remove_port_guard)
            self._stack.callback(self.backend.close)
            self._stack.callback(self._join_aborter)
            self._stack.callback(self._release_local_if_stopping)
            self._stack.callback(self._reap_processes)
            stalls.monitor().start()
            self._stack.callback(stalls.monitor().stop)
            # A worker at an injection point waits for a harness thread to get
            # the GIL; by default a busy thread keeps it 5 ms per wake-up, and
            # the points inside a write add those waits to the time the write
            # holds the run's row (a renewal queued behind it can time out).
            previous_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._stack.callback(sys.setswitchinterval, previous_interval)
            self._stack.callback(stopping.on_stop(self.interrupt))
            self.toxiproxy = self.backend.start_toxiproxy(self.log_dir, self.registry)
            toxiproxy = self.toxiproxy
            if toxiproxy.port is not None:
                port_guard.guard_port(toxiproxy.port)
            self._stack.callback(lambda: toxiproxy.stop(grace_s=_grace(3.0)))
            if isinstance(toxiproxy.process, ManagedProcess) and toxiproxy.process.is_alive():
                starvation.monitor().watch(toxiproxy.process.pid, "run/toxiproxy")
            self.primary = self.backend.start_primary(self.root / "pg", "primary")
            self._stack.callback(self.primary.remove)
            self.record.add_cluster(self.primary.datadir)
            self._stack.callback(self._close_kept)
            # Deferred experiment teardowns end before the servers they talk to.
            self._stack.callback(self.janitor.close)
            self.template = self.primary.create_template(TEMPLATE_NAME, self.migrate_database)
            self.fork_server, self.worker_launch = start_fork_server(
                self.settings, self.log_dir, self._stack
            )
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        # --keep is honoured by the caller blocking before this exit; the
        # environment itself is always torn down in the end.
        stopping.trace("tearing down the shared services")
        try:
            self._stack.close()
        finally:
            self.closed.set()

    def migrate_database(self, admin_dsn: str, log_dir: Path | None = None) -> None:
        """Migrate the database at ``admin_dsn`` with this run's worker (and mutant)
        and add the audit trigger; ``migrate.log`` goes to ``log_dir``."""
        migrate(
            self.settings.worker_cmd,
            admin_dsn,
            log_dir or self.log_dir,
            mutant=self.settings.mutant,
            trace_calls=self.settings.trace_calls,
        )

    def pair_seed(self, log_dir: Path) -> Path | None:
        """The data directory replicated pairs' primaries are copied from: made
        once per worker command and mutant (initdb, the template migrated by
        this run's worker, a clean stop), so that a pair costs a copy instead
        of an initdb and a migrate. None where the backend cannot copy one."""
        if not self.backend.clones_data_directories:
            return None
        key = (tuple(self.settings.worker_cmd), self.settings.mutant)
        with self._seed_lock:
            if key in self._seeds:
                return self._seeds[key]
            with phases.phase("environment.pair seed"):
                seed = self.backend.start_primary(
                    self.root / "seeds" / f"s{len(self._seeds)}", "seed"
                )
                self.record.add_cluster(seed.datadir)
                try:
                    seed.create_template(
                        self.template or TEMPLATE_NAME,
                        lambda dsn: self.migrate_database(dsn, log_dir=log_dir),
                    )
                    seed.stop("fast")
                except BaseException:
                    seed.remove()
                    raise
            self._seeds[key] = seed.datadir
            return seed.datadir

    def backend_access(self) -> str:
        """What the run's parts expose when the harness cannot guard them."""
        return (
            f"the {self.backend.kind} backend publishes its servers on 127.0.0.1 with trust "
            "authentication and unguarded ports: every local user reaches them"
        )

    def _remove_port_guard(self) -> None:
        problem = port_guard.stop(self.port_guard)
        if problem is not None:
            stopping.trace(f"firewall table not removed: {problem}")

    def _reap_processes(self) -> None:
        stopping.trace("stopping the registered processes")
        self.registry.reap_all(grace_s=_grace(3.0))
        stopping.trace("registered processes stopped")

    @contextlib.contextmanager
    def worker_view(
        self, settings: Settings, template: str, log_dir: Path
    ) -> Iterator[SharedServices]:
        """These services for another worker command (a generated mutant): the
        same binaries, toxiproxy and primary, with ``settings`` and a template
        database of its own, ``template``, migrated by that worker
        (``migrate.log`` in ``log_dir``). The view owns only its template, which
        is dropped when the block ends; these services stay up."""
        assert self.primary is not None
        primary = self.primary
        view = copy.copy(self)
        view.settings = settings
        view._stack = contextlib.ExitStack()  # owns nothing of the base's
        try:
            view.template = primary.create_template(
                template, lambda dsn: view.migrate_database(dsn, log_dir)
            )
            view.fork_server, view.worker_launch = start_fork_server(settings, log_dir, view._stack)
            yield view
        finally:
            view._stack.close()
            with contextlib.suppress(Exception):  # the cluster may be what failed
                primary.drop_template(template)

    def _release_local_if_stopping(self) -> None:
        # A stopping run removes what is on this machine's disk first: a
        # container engine may need longer than the stop has.
        if stopping.requested():
            stopping.trace("removing temp directories and shared memory")
            self.record.release_local()
            stopping.trace("temp directories and shared memory removed")

    def _release_record(self) -> None:
        # Whatever teardown could not remove (a segment of a server that had
        # to be killed, a directory still in use) goes now, then the record.
        stopping.trace("releasing the run record")
        self.final_reap = self.record.release()
        stopping.trace("run record released")

    # ------------------------------------------------------- environments
    def register(self, env: Environment) -> None:
        """An environment came up: a stop request must reach it."""
        with self._lock:
            self._environments.append(env)
        if stopping.requested():
            env.interrupt(stopping.reason())

    def forget(self, env: Environment) -> None:
        with self._lock:
            if env in self._environments:
                self._environments.remove(env)

    def environments(self) -> list[Environment]:
        with self._lock:
            return list(self._environments)

    @contextlib.contextmanager
    def job_running(self, label: str) -> Iterator[None]:
        """Mark ``label`` as running until its archive is written (see
        :meth:`wait_jobs_written`)."""
        with self._jobs_idle:
            self._running_jobs.add(label)
        try:
            yield
        finally:
            with self._jobs_idle:
                self._running_jobs.discard(label)
                self._jobs_idle.notify_all()

    def wait_jobs_written(self, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for every job to have written its archive; the
        labels still writing. A stopped run's jobs may outlast its grace period
        (their results then say so) and write their archives during teardown:
        the seal must come after them."""
        ends = time.monotonic() + timeout_s
        with self._jobs_idle:
            while self._running_jobs and time.monotonic() < ends:
                self._jobs_idle.wait(max(0.0, ends - time.monotonic()))
            return sorted(self._running_jobs)

    def keep(self, env: Environment, stack: contextlib.ExitStack) -> None:
        """--keep: the environment's parts stay up until this run's exit."""
        with self._lock:
            self._kept.append((env, stack))

    def kept(self) -> list[Environment]:
        with self._lock:
            return [env for env, _ in self._kept]

    def _close_kept(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for _env, stack in reversed(kept):
            with contextlib.suppress(Exception):
                stack.close()

    def interrupt(self, reason: str) -> None:
        """A stop was asked for: abort every running experiment at once (kill its
        workers, release its barriers, wake whatever waits on them), and let the
        backend end its servers its fastest way, alongside."""
        with self._lock:
            if self._aborter is None:
                self._aborter = threading.Thread(
                    target=self.backend.abort, name="backend-abort", daemon=True
                )
                self._aborter.start()
        for env in self.environments():
            env.interrupt(reason)

    def _join_aborter(self) -> None:
        # Waiting past the stop's deadline gains nothing: what the engine has
        # not removed by then, the run record keeps for the next run.
        if self._aborter is not None:
            left = stopping.HARD_DEADLINE_S - (stopping.since_s() or 0.0) - 0.5
            self._aborter.join(timeout=max(0.1, left))

    def hard_stop(self, why: str) -> None:
        """The stop escalated: kill every process this run started (every child
        of this process, with its group), remove containers, reap the record.

        Only called in the `fencecheck` process itself, where every child is
        this run's; it must finish well within a second or two.
        """
        del why
        kill_all_children()
        stopping.trace("hard stop: every child killed")
        closer = threading.Thread(target=self.backend.close, daemon=True)
        closer.start()
        closer.join(timeout=1.0)
        self.record.release()

    # ------------------------------------------------------------- access
    def toxiproxy_server(self) -> ToxiproxyServer:
        if self.toxiproxy is None:
            raise EnvironmentError_("toxiproxy is not running")
        return self.toxiproxy

    def toxiproxy_version(self) -> str:
        return self.toxiproxy.version or "unknown" if self.toxiproxy else "not started"

    def describe(self) -> dict[str, Any]:
        assert self.primary is not None and self.toxiproxy is not None
        return {
            "binaries": self.binaries.describe(),
            "primary": self.primary.admin_dsn(),
            "toxiproxy": self.toxiproxy.url,
            "work_dir": str(self.root),
        }


@dataclass(eq=False)
class Environment:
    """One experiment's world. Build with :func:`experiment_environment`."""

    name: str
    shared: SharedServices
    work_dir: Path
    db: Database
    primary: PostgresCluster
    links: dict[str, Link]
    tool: MockToolProcess | HostedTool
    control: ControlServer
    tenant_id: str
    other_tenant_id: str
    lease_ttl_ms: int
    heartbeat_ms: int
    heartbeat_timeout_ms: int
    dispatch_ttl_ms: int
    tag: str
    log_dir: Path
    standby: PostgresCluster | None = None
    replication: Literal["async", "sync"] | None = None
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    #: Every worker process started, in order (``workers`` keeps the last per id).
    started_workers: list[WorkerProcess] = field(default_factory=list)
    #: The database functions the experiment ran, with the server's own count
    #: of calls (read once the workers are stopped; None: not known).
    functions_called: dict[str, int] | None = None
    #: How many times each role but the harness's ran each statement here
    #: (role, query, calls; read with functions_called; None: not known).
    statements_called: list[dict[str, Any]] | None = None
    #: Why a server count above is None (the judges name it when not judging).
    server_counts_unknown: str = ""
    #: The workers' links whose connection attempts the run's firewall table
    #: counts (link key -> its port; harness/parts/port_guard.py), and the
    #: counts, read with the server's (None: not known, ``connections_unknown``
    #: says why).
    counted_ports: dict[str, int] = field(default_factory=dict)
    connection_attempts: dict[str, int] | None = None
    connections_unknown: str = ""
    #: Each cut of a counted link that ended: its link key, how long it lasted
    #: and the connection attempts made against the closed port meanwhile.
    link_cuts: list[dict[str, Any]] = field(default_factory=list)
    aborted: str | None = None
    interrupted: str | None = None
    extra_links: list[str] = field(default_factory=list)
    roles: dict[tuple[str, RoleKind], str] = field(default_factory=dict)
    #: Every worker's metrics: scraped before it is stopped, or the snapshot
    #: it wrote when it exited on its own (harness/evidence/metrics.py).
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    #: Values the harness knows to be secret (the data key it hands workers,
    #: sensitive inputs it plants): masked wherever they appear in an archive.
    secrets: set[str] = field(default_factory=set)
    data_key: str = field(default_factory=lambda: base64.b64encode(os.urandom(32)).decode())
    write_path: str = "fast"

    @contextlib.contextmanager
    def fresh_cluster(self, name: str) -> Iterator[PostgresCluster]:
        """A PostgreSQL cluster of the experiment's own straight from initdb: no
        role or database of the contract's (what a first deployment meets).
        Recorded for reaping at once, removed when the block ends."""
        stopping.check(f"PostgreSQL cluster {name}")
        cluster = self.shared.backend.start_primary(self.work_dir / name, name)
        try:
            self.shared.record.add_cluster(cluster.datadir)
            yield cluster
        finally:
            cluster.remove()

    def migrate_into(self, dsn: str, log_name: str) -> None:
        """The worker's ``migrate`` against another database (``dsn``, a
        superuser's); its transcript goes to ``log_name``. Raises MigrateFailed."""
        settings = self.shared.settings
        run_migrate(
            settings.worker_cmd,
            dsn,
            self.log_dir / log_name,
            migrate_timeout_s(),
            settings.mutant,
        )

    def migrate_again(self) -> None:
        """The worker's ``migrate`` run once more against this experiment's
        database, already migrated (the contract: migrate is idempotent, an
        upgrade run against an up-to-date database). Raises MigrateFailed;
        the transcript goes to ``migrate-again.log``."""
        settings = self.shared.settings
        run_migrate(
            settings.worker_cmd,
            self.db.admin_dsn,
            self.log_dir / "migrate-again.log",
            migrate_timeout_s(),
            settings.mutant,
        )

    def abort(self, timeout_s: float) -> None:
        """The experiment's global timeout: kill its workers and release its
        barriers so that whatever the scenario waits on fails at once."""
        self.aborted = f"experiment exceeded its global timeout of {timeout_s:.0f}s"
        self.stop_workers()

    def interrupt(self, reason: str) -> None:
        """The run was asked to stop: end the experiment now. Barrier waits end
        with an error, held workers are let go, every worker is SIGKILLed (no
        grace: the run has seconds to exit), so what the scenario waits on
        fails at once. Safe to call from any thread, more than once."""
        self.interrupted = self.interrupted or reason
        with contextlib.suppress(Exception):
            self.control.abort(reason)
        for worker in reversed(list(self.workers.values())):
            with contextlib.suppress(Exception):
                worker.kill(timeout_s=2.0)

    def stop_workers(self) -> None:
        # Release held barriers first so no worker sits in a read we then wait on.
        with contextlib.suppress(Exception):
            self.control.release_all()
        workers = list(self.workers.values())

        def stop(worker: WorkerProcess) -> None:
            with contextlib.suppress(Exception):
                self._keep_metrics(worker)
                worker.stop(grace_s=2.0)

        # All at once: each may wait out its clean-exit window and its grace.
        threads = [
            threading.Thread(target=stop, args=(w,), name=f"stop {w.worker_id}", daemon=True)
            for w in workers[1:]
        ]
        for thread in threads:
            thread.start()
        if workers:
            stop(workers[0])
        for thread in threads:
            thread.join(timeout=10.0)  # bounded by grace + kill timeout inside
        for worker in self.workers.values():  # those that wrote a snapshot at exit
            with contextlib.suppress(Exception):
                self._keep_metrics(worker)

    def _keep_metrics(self, worker: WorkerProcess) -> None:
        """Scrape a live worker; read the exit snapshot of one that ended."""
        wid = worker.worker_id
        # A stopping run has no time to ask (its workers are killed anyway).
        if worker.is_alive() and wid in self.metrics_ports and not stopping.requested():
            text = worker_metrics.scrape(self.metrics_ports[wid])
            if text is not None:
                self.metrics[wid] = {"source": "scrape", "samples": worker_metrics.samples(text)}
                return
        if self.metrics.get(wid, {}).get("source") != "scrape":
            text = worker_metrics.read_snapshot(self.metrics_file(wid))
            if text is not None:
                self.metrics[wid] = {"source": "exit", "samples": worker_metrics.samples(text)}

    def metrics_file(self, worker_id: str) -> Path:
        return self.log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', worker_id)}.metrics.txt"

    def query(self, statement: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        return self.primary.query(statement, params, dbname=self.db.name)

    def add_pg_link(self, key: str) -> Link:
        """A proxy of its own to the primary, so one worker's link can be cut alone."""
        link = self.shared.toxiproxy_server().link(
            f"{self.tag}_{key}", self.shared.backend.inner_address("127.0.0.1", self.primary.port)
        )
        self.links[key] = link
        self.extra_links.append(link.name)
        _count_connections(self.shared, self.counted_ports, key, link)
        return link

    def login_role(self, tenant_id: str, kind: RoleKind = "worker") -> str:
        """The experiment's login role for ``tenant_id`` in group ``kind``, made on
        first use (see login_roles)."""
        return self.login_roles([(tenant_id, kind)])[0]

    def login_roles(self, keys: Sequence[tuple[str, RoleKind]]) -> list[str]:
        """The experiment's login roles for each ``(tenant_id, kind)``, the missing
        ones made together: ``CREATE ROLE ... LOGIN IN ROLE <group>`` on the
        primary and a row each in the experiment database's ``tenant_bindings``
        (worker contract v2). Names are unique per experiment (roles are
        cluster-wide and experiments share a cluster); they are dropped at
        teardown."""
        missing: dict[tuple[str, RoleKind], str] = {}
        for tenant_id, kind in keys:
            if (tenant_id, kind) in self.roles or (tenant_id, kind) in missing:
                continue
            name = f"fc{kind[0]}_{self.tag}_{tenant_id[:8]}".lower()[:63]
            if not _ROLE_NAME.match(name):
                raise EnvironmentError_(f"cannot make a role name of {name!r}")
            missing[(tenant_id, kind)] = name
        if missing:
            made = [(name, GROUP_ROLES[kind]) for (_, kind), name in missing.items()]
            try:
                self.primary.create_login_roles(made)
            except psycopg.Error as exc:
                raise EnvironmentError_(
                    f"cannot create login roles {', '.join(n for n, _ in made)} in groups "
                    f"{', '.join(sorted({g for _, g in made}))} ({exc}): the worker's `migrate` "
                    "must create the group roles fencecheck_worker and "
                    "fencecheck_operator (docs/worker-contract.md, roles and tenant binding)"
                ) from exc
            self.roles.update(missing)
            if self._keeps_no_bindings():
                return [self.roles[key] for key in keys]
            rows = [(name, tenant_id) for (tenant_id, _), name in missing.items()]
            try:
                self.query(
                    "INSERT INTO public.tenant_bindings (role_name, tenant_id) VALUES "
                    + ", ".join(["(%s, %s)"] * len(rows)),
                    [v for row in rows for v in row],
                )
            except psycopg.Error as exc:
                raise EnvironmentError_(
                    f"cannot bind {', '.join(n for n, _ in rows)} to their tenants ({exc}): the "
                    "worker's `migrate` must create public.tenant_bindings "
                    "(docs/worker-contract.md)"
                ) from exc
        return [self.roles[key] for key in keys]

    def _keeps_no_bindings(self) -> bool:
        """A system that declares no tenants and has no ``tenant_bindings`` table
        keeps no binding (contract §14); one that has the table (the reference
        worker declaring less) still checks its role's binding."""
        declared = mapping.declared(tuple(self.shared.settings.worker_cmd))
        if declared.capabilities.tenants != "none":
            return False
        found = self.query("SELECT to_regclass('public.tenant_bindings') IS NOT NULL AS kept")
        return not found[0]["kept"]

    def worker_dsn(
        self, pg_link: str = "worker_pg", *, tenant_id: str | None = None, role: RoleKind = "worker"
    ) -> str:
        link = self.links[pg_link]
        user = self.login_role(tenant_id or self.tenant_id, role)
        auth = self.primary.auth
        secret = f" passfile={auth.passfile}" if auth is not None else ""
        return (
            f"host={link.listen_host} port={link.listen_port} dbname={self.db.name} "
            f"user={user}{secret} connect_timeout=3"
        )

    def worker_env(
        self, tenant_id: str | None = None, pg_link: str = "worker_pg", role: RoleKind = "worker"
    ) -> dict[str, str | None]:
        tool = self.links["worker_tool"]
        tool_url = f"http://{tool.listen_host}:{tool.listen_port}"
        tenant = tenant_id or self.tenant_id
        return {
            "FENCECHECK_DSN": self.worker_dsn(pg_link, tenant_id=tenant, role=role),
            "FENCECHECK_ADMIN_DSN": None,
            "FENCECHECK_TENANT": tenant,
            "FENCECHECK_TOOL_URL": tool_url,
            "FENCECHECK_BROKER_URL": tool_url,
            "FENCECHECK_LEASE_TTL_MS": str(self.lease_ttl_ms),
            "FENCECHECK_HEARTBEAT_MS": str(self.heartbeat_ms),
            "FENCECHECK_HEARTBEAT_TIMEOUT_MS": str(self.heartbeat_timeout_ms),
            "FENCECHECK_DISPATCH_TTL_MS": str(self.dispatch_ttl_ms),
            "FENCECHECK_MUTANT": self.shared.settings.mutant,
            "FENCECHECK_DATA_KEY": self.data_key,
            "FENCECHECK_WRITE_PATH": self.write_path,
            # The run's secret, by where it is (also in the DSN's passfile=).
            "PGPASSFILE": str(self.primary.auth.passfile) if self.primary.auth else None,
            "PYTHONUNBUFFERED": "1",
        }

    def start_worker(
        self,
        worker_id: str,
        mode: Literal["run", "ops"],
        args: Sequence[str] = (),
        *,
        tenant_id: str | None = None,
        env: dict[str, str | None] | None = None,
        pg_link: str = "worker_pg",
        role: RoleKind = "worker",
    ) -> WorkerProcess:
        """Start a worker process under test; it is stopped when the environment ends.

        ``role`` is the group its login role belongs to: ``worker``, or
        ``operator`` for a control-plane ``ops`` process."""
        if worker_id in self.workers and self.workers[worker_id].is_alive():
            raise EnvironmentError_(f"worker {worker_id!r} is already running")
        self.metrics_ports[worker_id] = free_port()
        metrics_env = {
            "FENCECHECK_METRICS_PORT": str(self.metrics_ports[worker_id]),
            "FENCECHECK_METRICS_FILE": str(self.metrics_file(worker_id)),
        }
        if self.shared.settings.trace_calls:
            metrics_env[CALLS_FILE_ENV] = str(self.log_dir / CALLS_FILE)
        proc = WorkerProcess(
            worker_id,
            list(self.shared.settings.worker_cmd),
            mode,
            list(args),
            log_dir=self.log_dir,
            control_socket=self.control.socket_path,
            env={**self.worker_env(tenant_id, pg_link, role), **metrics_env, **(env or {})},
            registry=self.shared.registry,
            # A preloaded library (harness/parts/clock_skew.py) takes effect
            # at exec only: such a worker is never a fork of the server.
            fork_server=None if env and env.get("LD_PRELOAD") else self.shared.fork_server,
        )
        with phases.phase("scenario.worker start"):
            proc.start()
        starvation.monitor().watch(proc.pid, f"{self.name}/worker {worker_id}")
        self.workers[worker_id] = proc
        self.started_workers.append(proc)
        return proc

    def event_files(self) -> list[Path]:
        return sorted({w.events_path for w in self.workers.values() if w.events_path.exists()})


@contextlib.contextmanager
def experiment_environment(
    shared: SharedServices,
    name: str,
    *,
    lease_ttl_ms: int,
    heartbeat_ms: int,
    heartbeat_timeout_ms: int,
    dispatch_ttl_ms: int,
    replication: Literal["async", "sync"] | None = None,
    tools: dict[str, str] | None = None,
    tool_retention_s: float | None = None,
    log_dir: Path,
    rng: random.Random | None = None,
    write_path: str = "fast",
) -> Iterator[Environment]:
    """Bring up one experiment's world and tear all of it down afterwards.

    Tenant ids come from ``rng`` (seeded by the run's seed and the job), so a
    rerun with the same seed uses the same ones. Once a stop was asked for,
    nothing more starts and teardown takes the short way (kill, no polite
    shutdown, no database drop: the run's servers go next anyway). With
    ``--keep`` the parts stay up until the run's end (``SharedServices.keep``).
    """
    assert shared.primary is not None and shared.toxiproxy is not None
    assert shared.template is not None
    rng = rng or random.Random()
    stack = contextlib.ExitStack()
    with stack:
        stopping.check(f"experiment {name}")
        work_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared.root))
        log_dir.mkdir(parents=True, exist_ok=True)
        tag = f"{name}_{uuid.uuid4().hex[:6]}".replace("-", "_")
        primary = shared.primary
        standby: PostgresCluster | None = None
        replication_link: Link | None = None
        if replication is not None:
            with phases.phase("environment.replicated pair"):
                primary, standby, replication_link = _replicated_pair(
                    shared, stack, work_dir, log_dir, tag, replication
                )
            db = Database(cluster=primary, name=shared.template)
        else:
            with phases.phase("environment.database"):
                db = primary.create_database(template=shared.template, prefix=name.lower())
            if not shared.settings.keep:  # kept databases are listed by `run --keep`
                stack.callback(_drop_database, primary, db.name)
        for server in (primary, standby):
            if server is not None:
                _watch_backends(stack, server, db.name, name)
        toxi = shared.toxiproxy
        links: dict[str, Link] = {}

        counted: dict[str, int] = {}

        def add_link(key: str, upstream: str) -> None:
            link = toxi.link(f"{tag}_{key}", upstream)
            links[key] = link
            stack.callback(_delete_link, toxi, link.name)
            _count_connections(shared, counted, key, link)

        add_link("worker_pg", shared.backend.inner_address("127.0.0.1", primary.port))
        stopping.check(f"the mock tool of experiment {name}")
        with phases.phase("environment.tool"):
            tool = shared.backend.start_mock_tool(
                work_dir / "tool", log_dir / "mock_tool.log", tools, tool_retention_s
            )
        stack.callback(_stop_tool, tool)
        if tool.pid is not None:  # a local process (a container's is the engine's)
            hosted = isinstance(tool, HostedTool)  # one host serves every experiment's tool
            starvation.monitor().watch(
                tool.pid, "run/mock tool host" if hosted else f"{name}/mock tool"
            )
        add_link("worker_tool", shared.backend.inner_address("127.0.0.1", tool.port))
        control = stack.enter_context(ControlServer(work_dir, on_gap=_control_gap(name)))
        if control.accept_tid is not None:
            starvation.monitor().watch(
                os.getpid(), waits.control_server(name, None), tids=[control.accept_tid]
            )
        env = Environment(
            name=name,
            shared=shared,
            work_dir=work_dir,
            db=db,
            primary=primary,
            links=links,
            tool=tool,
            control=control,
            tenant_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            other_tenant_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            lease_ttl_ms=lease_ttl_ms,
            heartbeat_ms=heartbeat_ms,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            dispatch_ttl_ms=dispatch_ttl_ms,
            tag=tag,
            log_dir=log_dir,
            standby=standby,
            replication=replication,
            write_path=write_path,
            counted_ports=counted,
        )
        stack.callback(_remove_links, toxi, env.extra_links)
        env.secrets.add(env.data_key)
        if primary.auth is not None:  # never in a DSN; masked should it show anywhere
            env.secrets.add(primary.auth.password)
        stack.callback(_drop_roles, primary, env.roles)
        # The lease duration a mapped expiry reads (harness/model), before any worker.
        set_lease_ttl(env.query, lease_ttl_ms)
        # Every role the experiment's tenants need, made before any fault (a
        # role made after the replication link is cut would not reach the standby).
        with phases.phase("environment.roles"):
            env.login_roles(
                [
                    (t, k)
                    for t in (env.tenant_id, env.other_tenant_id)
                    for k in ("worker", "operator")
                ]
            )
        stack.callback(env.stop_workers)
        if replication_link is not None:
            links["replication"] = replication_link
        shared.register(env)
        stack.callback(shared.forget, env)
        yield env
        if shared.settings.keep and not stopping.requested():
            env.stop_workers()  # workers end with the experiment; the parts stay
            shared.keep(env, stack.pop_all())
        elif not stopping.requested():
            # The evidence is gathered: the rest only has to go (harness/engine/janitor.py).
            shared.janitor.defer(name, stack.pop_all())


def _control_gap(name: str) -> Callable[[float, str | None], None]:
    """Where the control server of experiment ``name`` reports how late it
    answered: a long gap is a stall of the harness, and every gap is a wait
    in a chain (the worker that hit the point waited that long; a late
    accept loop, any worker of the experiment)."""
    monitor = stalls.monitor()

    def gap(late_s: float, worker: str | None) -> None:
        monitor.gap(late_s, seen_by=f"control server of {name}")
        end = time.time()
        who = waits.control_server(name, worker)
        waits.log().add(who, os.getpid(), end - late_s, end, late_s)

    return gap


def _drop_database(primary: PostgresCluster, name: str) -> None:
    if not stopping.requested():  # stopping: the whole server goes next
        primary.drop_database(name)


def _stop_tool(tool: MockToolProcess | HostedTool) -> None:
    if stopping.requested():
        tool.kill()  # its log is on disk already; no time for a drain
    else:
        tool.stop()


def _drop_roles(cluster: PostgresCluster, roles: dict[tuple[str, RoleKind], str]) -> None:
    """Drop the experiment's login roles (after its workers stopped).

    Roles are rows of the cluster's catalog, and every cluster is the run's
    own: a stopping run skips the queries (it has seconds, the server may be
    going down already), its roles go with the data directory it removes, and
    a dead run's go with the data directory its record names. The commit does
    not wait for a synchronous standby: an experiment can end with its standby
    stopped or cut off (seen: H[sync_cancelled_wait] under a generated mutant,
    the DROP ROLE waiting on SyncRep for 20 minutes)."""
    if stopping.requested():
        return
    for name in roles.values():
        with contextlib.suppress(Exception):
            cluster.query(
                "DO $$BEGIN SET LOCAL synchronous_commit = local; "
                f"DROP ROLE IF EXISTS {name}; END$$"
            )


def _count_connections(
    shared: SharedServices, counted: dict[str, int], key: str, link: Link
) -> None:
    """Count the connection attempts on a worker's link from now, where the
    workers are this host's processes: a container's address rewriting
    happens before the firewall's output chain sees the attempt."""
    if shared.backend.kind == "local-processes" and port_guard.count_from_now(link.listen_port):
        counted[key] = link.listen_port


def _delete_link(toxi: ToxiproxyServer, name: str) -> None:
    if stopping.requested():
        return  # toxiproxy itself stops next
    with contextlib.suppress(Exception):
        toxi.remove_link(name)


def _remove_links(toxi: ToxiproxyServer, names: list[str]) -> None:
    for name in names:
        _delete_link(toxi, name)


def _watch_backends(
    stack: contextlib.ExitStack, server: PostgresCluster, database: str, name: str
) -> None:
    """Measure the CPU starvation of the backends ``server`` forks for the
    experiment's database (harness/engine/starvation.py): a local server's,
    and a container's whose postmaster this host sees."""
    postmaster = server.postmaster_pid()
    if postmaster is None:
        return
    starvation.monitor().watch_backends(postmaster, database, name, {server.superuser})
    stack.callback(starvation.monitor().forget_backends, postmaster, database)


def _replicated_pair(
    shared: SharedServices,
    stack: contextlib.ExitStack,
    work_dir: Path,
    log_dir: Path,
    tag: str,
    mode: Literal["async", "sync"],
) -> tuple[PostgresCluster, PostgresCluster, Link]:
    """A primary of its own and a standby streaming through a proxy.

    The primary gets a migrated database named like the shared template, and
    the experiment uses that database itself: the primary is its alone.
    """
    assert shared.toxiproxy is not None and shared.template is not None
    seed = shared.pair_seed(log_dir)
    if seed is not None:
        primary = shared.backend.clone_primary(seed, work_dir / "pg", "primary", [shared.template])
    else:
        primary = shared.backend.start_primary(work_dir / "pg", "primary")
    stack.callback(primary.remove)
    shared.record.add_cluster(primary.datadir)
    primary.create_template(  # migrates only when the primary is not a copy of the seed
        shared.template, lambda dsn: shared.migrate_database(dsn, log_dir=log_dir)
    )
    link = shared.toxiproxy.link(
        f"{tag}_replication", shared.backend.inner_address("127.0.0.1", primary.port)
    )
    stack.callback(_delete_link, shared.toxiproxy, link.name)
    standby = shared.backend.start_standby(
        primary,
        work_dir / "pg",
        upstream_host=link.listen_host,
        upstream_port=link.listen_port,
        name="replica",
    )
    stack.callback(standby.remove)
    shared.record.add_cluster(standby.datadir)
    primary.wait_streaming("replica")
    if mode == "sync":
        primary.set_sync_standby("replica")
    return primary, standby, link
