"""Child processes the harness starts, pauses, kills and always cleans up.

Every server, mock tool and worker is a `ManagedProcess`: a real OS process
with its stdout/stderr in per-process log files. Faults on processes are
signals, and each one returns a `SignalRecord` holding the time the *kernel*
confirmed the effect, because psutil's `suspend()` (and a bare `kill`) return
before the state changes; a verdict that relies on "A was stopped while B took
over" needs the confirmed time, not the time we asked.

Invariants:
- Nothing outlives the harness. Children get `PR_SET_PDEATHSIG(SIGKILL)`, so
  even a SIGKILLed harness leaves no orphans; `ProcessRegistry.reap_all()`
  stops everything in reverse start order, also after an exception; and an
  `atexit` hook kills whatever a forgotten code path left running.
- A pid is signalled only while we have not reaped it (the zombie keeps the
  pid reserved), so a signal never reaches a recycled pid.
- Each child runs in its own session: a Ctrl-C aimed at the harness does not
  hit workers mid-experiment; the harness tears them down itself.

Caveat (Linux semantics): the parent-death signal fires when the *thread*
that forked the child exits, not only the process. Start children from a
long-lived thread (normally the main thread), never from a short-lived worker
thread or a thread pool.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

import psutil

from harness import stopping
from harness.parts import clock_skew
from harness.parts.os_user import OsUser, first_untraversable, give_to

if TYPE_CHECKING:
    from harness.parts.fork_server import ForkedChild, ForkServer

POLL_INTERVAL_S = 0.002
DEFAULT_SIGNAL_TIMEOUT_S = 5.0
DEFAULT_GRACE_S = 3.0
# How long an ops worker gets to exit by itself once its stdin is closed.
CLEAN_EXIT_WAIT_S = 0.5
# Non-reply lines of a worker's ops channel kept in memory (and so in its
# archive): the stdout log holds them all, a flood must not be stored twice.
KEPT_NOISE_LINES = 20

_PR_SET_PDEATHSIG = 1


class ProcessError(Exception):
    """A managed process did not do what the harness asked of it."""


class ProcessTimeout(ProcessError, TimeoutError):
    """A bounded wait on a process ran out; the message says what was awaited.

    ``pid`` names the process that did not answer or exit, given ``bound_s``
    from ``since`` (wall clock): the runner judges the missed bound against
    that process's own starvation, not any other's (runner.timing_excuse).
    """

    def __init__(
        self,
        message: str,
        *,
        pid: int | None = None,
        bound_s: float | None = None,
        since: float | None = None,
    ) -> None:
        super().__init__(message)
        self.pid = pid
        self.bound_s = bound_s
        self.since = since


class OpTimeout(ProcessTimeout):
    """An `ops` request got no reply in time."""


class ExitTimeout(ProcessTimeout):
    """A process did not exit within the time it was given."""


class WorkerChannelClosed(ProcessError):
    """The worker's stdin/stdout channel is gone (it exited or closed stdout)."""


class OpFailed(ProcessError):
    """An `ops` reply said ok=false and the caller asked for it to raise."""


@dataclass(frozen=True)
class SignalRecord:
    """What a process fault did, with the kernel-confirmed time.

    `confirmed_at` is when the harness read back the state it wanted
    (stopped, running again, reaped); None only if the process was already
    gone and nothing had to be done (`detail` says so).
    """

    process: str
    pid: int
    action: str
    signal: str
    sent_at: float
    confirmed_at: float | None
    state: str
    detail: str = ""


def _load_prctl() -> Callable[..., int] | None:
    # Resolved once in the parent: the child between fork and exec should do
    # as little as possible (no symbol lookup, no allocation-heavy work).
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    """preexec_fn arming SIGKILL-on-parent-death in the child.

    ``parent_pid`` is the pid of the process that starts the child (pass
    ``os.getpid()``); a child whose parent is already gone kills itself.

    CPython runs preexec_fn after setgid/setuid, and a credential change
    clears the parent-death signal, so setting it here is what makes it stick
    for children that run as another user.
    """

    def preexec() -> None:
        die_with_parent(parent_pid)

    return preexec


def die_with_parent(parent_pid: int) -> None:
    """Arm SIGKILL-on-parent-death in the calling process (a preexec_fn, or the
    initializer of a process pool's workers: a pool's worker holds both ends of
    its own queue's pipe, so it would wait forever for a parent SIGKILLed)."""
    sigkill = int(signal.SIGKILL)
    if _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # The parent may have died between fork and prctl: then nobody would
    # ever send the signal, so take it now.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sigkill)


def _thread_states(pid: int) -> list[str]:
    """Kernel scheduler state letter of every thread of `pid` (Linux /proc)."""
    states: list[str] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return states
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # The command name may contain spaces or parentheses; the state
        # letter is the first field after the last ')'.
        states.append(text.rsplit(")", 1)[1].split()[0])
    return states


# Strong references on purpose: a process whose object the caller dropped must
# still be found at exit. Entries leave when their child is reaped.
_ALL_PROCESSES: set[ManagedProcess] = set()
_ALL_LOCK = threading.Lock()


@atexit.register
def _kill_leftovers() -> None:
    # Last resort for code paths that forgot to stop something: SIGKILL, reap.
    with _ALL_LOCK:
        leftovers = list(_ALL_PROCESSES)
    for proc in leftovers:
        with contextlib.suppress(Exception):
            if proc.is_alive():
                proc.kill(timeout_s=2.0)


def proc_stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (the state) on; None when
    there is no such process or no ``/proc``. They follow the command name,
    which is in parentheses and may itself hold spaces or parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 1 :].split()


def process_start_ticks(pid: int) -> int | None:
    """Process ``pid``'s start in clock ticks since boot, as the kernel keeps it
    (field 22 of ``/proc/<pid>/stat``); None when there is no such process.
    Unlike a wall-clock start time (the boot time, which Linux gives in whole
    seconds as the wall clock minus the uptime, plus these ticks) it never
    changes: two readers a clock adjustment apart agree on it."""
    fields = proc_stat_fields(pid) or []
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None when there is
    none: with the pid, the identity of a process (a reused pid is another one)."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, ValueError):
        return None


@dataclass(frozen=True)
class Finished:
    """How a bounded command ended: ``how`` is "exited", "timeout" or "interrupted"."""

    returncode: int | None
    stdout: str
    stderr: str
    how: str


def run_bounded(argv: Sequence[str], *, timeout_s: float, **popen: Any) -> Finished:
    """Run a short command (initdb, pg_basebackup, a worker's migrate) to its end.

    It runs in a session of its own (a terminal's Ctrl-C is the harness's to
    handle) with a parent-death signal. Past ``timeout_s``, once a stop was
    asked for, or when anything interrupts the wait (an Interrupted raised in
    the main thread), its whole process group is killed: a killed initdb must
    not leave its bootstrap server writing into a directory being removed.
    """
    stopping.check(f"`{argv[0]}`")
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(os.getpid()),
        **popen,
    )
    deadline = time.monotonic() + timeout_s
    how = "exited"
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if stopping.requested():
                    how = "interrupted"
                elif time.monotonic() >= deadline:
                    how = "timeout"
                else:
                    continue
                _kill_group(proc)
                out, err = proc.communicate()
                break
    except BaseException:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=5)
        raise
    return Finished(
        proc.returncode,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
        how,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def process_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all_children() -> list[str]:
    """SIGKILL every child of this process, with the process group it leads.

    The last resort of a stop (and of every teardown): whatever is still a
    child of the harness was started by it, whichever code path forgot it.
    A child that shares the harness's own group is killed alone, never the
    group. Returns a description of each process killed.
    """
    killed: list[str] = []
    own_group = os.getpgrp()
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue  # already dead; its Popen reaps it
            what = f"{child.pid} {' '.join(child.cmdline())[:80]}"
            group = os.getpgid(child.pid)
            if group == child.pid and group != own_group:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(child.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
        killed.append(what)
    return killed


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "process"


def _unique_log_base(log_dir: Path, name: str) -> Path:
    # A restarted worker keeps its earlier logs: evidence is never overwritten.
    base = log_dir / _safe_name(name)
    for n in itertools.count(1):
        candidate = base if n == 1 else log_dir / f"{_safe_name(name)}-{n}"
        if not candidate.with_name(candidate.name + ".stderr.log").exists():
            return candidate
    raise AssertionError("unreachable")


class ManagedProcess:
    """One child process with log files, signal faults and bounded waits.

    Construct, then `start()` (or use as a context manager, which stops it on
    exit). `env` adds to (or, with `inherit_env=False`, replaces) the
    harness's environment; a value of None removes a variable. With
    `run_as`, the child runs as that user with exactly its primary group.
    With `signal_group`, signals go to the child's whole process group (it is
    always a session leader, so its group is its pid).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str | None] | None = None,
        inherit_env: bool = True,
        cwd: Path | None = None,
        run_as: OsUser | None = None,
        signal_group: bool = False,
        pipe_stdio: bool = False,
        registry: ProcessRegistry | None = None,
        launcher: tuple[ForkServer, Sequence[str]] | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"process {name!r}: empty argv")
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_dir = Path(log_dir)
        self.cwd = cwd
        self.run_as = run_as
        self.signal_group = signal_group
        self.pipe_stdio = pipe_stdio
        self._env_overrides = dict(env or {})
        self._inherit_env = inherit_env
        self._registry = registry
        # (fork server, the arguments after the worker command): start by a
        # fork of that server instead of an exec (harness/parts/fork_server.py).
        self._launcher = launcher
        self.forked_by: int | None = None
        self._popen: subprocess.Popen[bytes] | ForkedChild | None = None
        self._lock = threading.RLock()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.stdout_log: Path = self.log_dir / f"{_safe_name(name)}.stdout.log"
        self.stderr_log: Path = self.log_dir / f"{_safe_name(name)}.stderr.log"

    # -- lifecycle -------------------------------------------------------

    def build_env(self) -> dict[str, str]:
        """The exact environment the child will get."""
        env = dict(os.environ) if self._inherit_env else {}
        if self.run_as is not None:
            env.update(self.run_as.env())
        for key, value in self._env_overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(self) -> Self:
        """Start the child; raises ProcessError naming argv if it cannot run, and
        harness.stopping.Interrupted once the run was asked to stop."""
        stopping.check(f"process {self.name!r}")
        with self._lock:
            if self._popen is not None:
                raise ProcessError(f"process {self.name!r} already started (pid {self.pid})")
            self.log_dir.mkdir(parents=True, exist_ok=True)
            base = _unique_log_base(self.log_dir, self.name)
            self.stdout_log = base.with_name(base.name + ".stdout.log")
            self.stderr_log = base.with_name(base.name + ".stderr.log")
            user_kwargs: dict[str, Any] = {}
            if self.run_as is not None:
                user_kwargs = dict(self.run_as.popen_kwargs())
            stdout_file = open(self.stdout_log, "ab")  # noqa: SIM115 - handed to the child
            stderr_file = open(self.stderr_log, "ab")  # noqa: SIM115 - handed to the child
            try:
                if self._launcher is not None and self.run_as is None:
                    self._popen = self._fork_start(stdout_file.fileno(), stderr_file.fileno())
                if self._popen is None:
                    self._popen = self._exec_start(stdout_file, stderr_file, user_kwargs)
            finally:
                # The child holds its own copies of the descriptors.
                stdout_file.close()
                stderr_file.close()
            self.started_at = time.time()
            with _ALL_LOCK:
                _ALL_PROCESSES.add(self)
            if self._registry is not None:
                self._registry.add(self)
        self._after_start()
        return self

    def _fork_start(self, stdout_fd: int, stderr_fd: int) -> ForkedChild | None:
        """Start by a fork of the launcher's server; None when it cannot (the
        caller execs instead: a fork server only ever saves time)."""
        from harness.parts.fork_server import ForkServerError

        assert self._launcher is not None
        server, args = self._launcher
        if not server.alive:
            return None
        theirs: list[int] = []
        ours: list[int] = []
        try:
            if self.pipe_stdio:
                in_r, in_w = os.pipe()
                out_r, out_w = os.pipe()
                theirs, ours = [in_r, out_w], [in_w, out_r]
                streams = (in_r, out_w, stderr_fd)
            else:
                devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                theirs = [devnull]
                streams = (devnull, stdout_fd, stderr_fd)
            pid = server.spawn(
                args,
                env=self.build_env(),
                cwd=self.cwd,
                stdin=streams[0],
                stdout=streams[1],
                stderr=streams[2],
            )
        except (ForkServerError, OSError) as exc:
            for fd in theirs + ours:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if isinstance(exc, ForkServerError) and exc.maybe_forked:
                # No answer to a request it got: a child may run, so this one
                # must not be started a second time by an exec.
                server.close()
                raise ProcessError(f"could not start process {self.name!r}: {exc}") from exc
            return None
        for fd in theirs:
            os.close(fd)
        stdin = os.fdopen(ours[0], "wb") if ours else None
        stdout = os.fdopen(ours[1], "rb") if ours else None
        self.forked_by = server.pid
        return server.adopt(pid, stdin, stdout)

    def _exec_start(
        self, stdout_file: IO[bytes], stderr_file: IO[bytes], user_kwargs: dict[str, Any]
    ) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                self.argv,
                env=self.build_env(),
                cwd=self.cwd,
                stdin=subprocess.PIPE if self.pipe_stdio else subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.pipe_stdio else stdout_file,
                stderr=stderr_file,
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(os.getpid()),
                close_fds=True,
                **user_kwargs,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            hint = ""
            if isinstance(exc, PermissionError) and self.run_as is not None:
                hint = f" (it runs as {self.run_as.name!r}: can that user reach it?)"
            raise ProcessError(
                f"could not start process {self.name!r}: {self.argv!r}: {exc}{hint}"
            ) from exc

    def _after_start(self) -> None:
        """Hook for subclasses (the ops channel starts its reader here)."""

    def _note_exit(self) -> None:
        # Runs the exit hook exactly once, whichever path noticed the exit.
        with self._lock:
            if self.ended_at is not None:
                return
            self.ended_at = time.time()
        with _ALL_LOCK:
            _ALL_PROCESSES.discard(self)
        self._after_exit()

    def _after_exit(self) -> None:
        """Hook for subclasses, called once after the child has been reaped."""

    def __enter__(self) -> Self:
        if self._popen is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state -----------------------------------------------------------

    @property
    def popen(self) -> subprocess.Popen[bytes] | ForkedChild:
        if self._popen is None:
            raise ProcessError(f"process {self.name!r} was never started")
        return self._popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once reaped (negative = killed by that signal), else None."""
        if self._popen is None:
            return None
        code = self._popen.poll()
        if code is not None:
            self._note_exit()
        return code

    def is_alive(self) -> bool:
        """True while the child has not exited (a stopped child is alive)."""
        return self._popen is not None and self.returncode is None

    def kernel_state(self) -> str:
        """psutil's status string ('running', 'sleeping', 'stopped', 'zombie', ...).

        'exited' once reaped, 'not started' before start().
        """
        if self._popen is None:
            return "not started"
        if self.returncode is not None:
            return "exited"
        try:
            return str(psutil.Process(self.pid).status())
        except psutil.NoSuchProcess:
            return "exited"

    def describe(self) -> str:
        pid = self._popen.pid if self._popen is not None else "-"
        return f"{self.name} (pid {pid}, {self.kernel_state()})"

    def log_tail(self, max_bytes: int = 2000) -> str:
        """The end of the stderr log, for error messages."""
        try:
            data = self.stderr_log.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-max_bytes:].decode("utf-8", errors="replace")

    # -- signals ---------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child (or its group); ProcessError if already reaped."""
        with self._lock:
            if self.returncode is not None:
                raise ProcessError(
                    f"cannot send {signal.Signals(sig).name} to {self.name!r}: "
                    f"it already exited with {self.returncode}"
                )
            if self.signal_group:
                # A group whose leader is a zombie still exists; members may not.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, sig)
            else:
                self.popen.send_signal(sig)

    def _poll_until(self, what: str, done: Callable[[], bool], timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            if done():
                return time.time()
            if time.monotonic() >= deadline:
                raise ProcessTimeout(
                    f"process {self.describe()}: {what} not confirmed within {timeout_s}s"
                )
            time.sleep(POLL_INTERVAL_S)

    def pause(self, timeout_s: float = DEFAULT_SIGNAL_TIMEOUT_S) -> SignalRecord:
        """SIGSTOP, then poll /proc until every thread of the child is stopped.

        Returns when the kernel says 'stopped' for all threads, so a heartbeat
        thread is provably frozen too. Raises ProcessTimeout otherwise. With
        `signal_group` the whole group gets SIGSTOP, but only the child itself
        is confirmed.
        """
        sent = time.time()
        self.send_signal(signal.SIGSTOP)
        pid = self.pid

        def stopped() -> bool:
            if self.returncode is not None:
                raise ProcessError(f"process {self.name!r} exited while being paused")
            states = _thread_states(pid)
            return bool(states) and all(s in ("T", "t") for s in states)

        confirmed = self._poll_until("SIGSTOP (kernel state 'stopped')", stopped, timeout_s)
        return SignalRecord(
            self.name, pid, "pause", "SIGSTOP", sent, confirmed, self.kernel_state(), "all threads"
        )

    def resume(self, timeout_s: float = DEFAULT_SIGNAL_TIMEOUT_S) -> SignalRecord:
        """SIGCONT, then poll until the kernel no longer reports the child stopped."""
        sent = time.time()
        self.send_signal(signal.SIGCONT)
        pid = self.pid

        def running() -> bool:
            if self.returncode is not None:
                return True
            return self.kernel_state() not in ("stopped", "tracing-stop")

        confirmed = self._poll_until("SIGCONT (kernel state not 'stopped')", running, timeout_s)
        return SignalRecord(
            self.name, pid, "resume", "SIGCONT", sent, confirmed, self.kernel_state()
        )

    def kill(self, timeout_s: float = DEFAULT_SIGNAL_TIMEOUT_S) -> SignalRecord:
        """SIGKILL and reap; `confirmed_at` is when the exit status was collected."""
        sent = time.time()
        pid = self.pid
        if self.returncode is not None:
            return SignalRecord(
                self.name, pid, "kill", "SIGKILL", sent, None, "exited",
                f"already exited with {self.returncode}",
            )  # fmt: skip
        self.send_signal(signal.SIGKILL)
        code = self.wait(timeout_s)
        if self.signal_group:
            self._kill_group_leftovers()
        return SignalRecord(
            self.name, pid, "kill", "SIGKILL", sent, time.time(), "exited", f"returncode {code}"
        )

    def wait(self, timeout_s: float) -> int:
        """Wait for exit and reap; ProcessTimeout names the process."""
        since = time.time()
        try:
            code = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ExitTimeout(
                f"process {self.describe()} did not exit within {timeout_s}s",
                pid=self.popen.pid,
                bound_s=timeout_s,
                since=since,
            ) from None
        self._note_exit()
        return code

    def stop(
        self, grace_s: float = DEFAULT_GRACE_S, kill_timeout_s: float = DEFAULT_SIGNAL_TIMEOUT_S
    ) -> int | None:
        """Escalate SIGCONT, SIGTERM, `grace_s`, SIGKILL; returns the exit status.

        SIGCONT comes first because a stopped process cannot act on SIGTERM.
        Safe to call on a process that never started or already exited.
        """
        if self._popen is None:
            return None
        if self.returncode is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                with contextlib.suppress(ProcessError, ProcessLookupError):
                    self.send_signal(sig)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessError, ProcessLookupError):
                    self.send_signal(signal.SIGKILL)
                self.wait(kill_timeout_s)
        if self.signal_group:
            self._kill_group_leftovers()
        return self.returncode

    def _kill_group_leftovers(self) -> None:
        # Children of the child that outlived it still carry its pgid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


class ProcessRegistry:
    """Everything an environment started, so it can all be stopped.

    `reap_all()` stops processes in reverse start order (workers before the
    proxies and databases they use), keeps going when one stop fails, and
    returns the problems it met instead of hiding them.
    """

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []
        self._lock = threading.Lock()

    def add(self, proc: ManagedProcess) -> None:
        with self._lock:
            if proc not in self._procs:
                self._procs.append(proc)

    def processes(self) -> list[ManagedProcess]:
        with self._lock:
            return list(self._procs)

    def alive(self) -> list[ManagedProcess]:
        return [p for p in self.processes() if p.is_alive()]

    def reap_all(self, grace_s: float = DEFAULT_GRACE_S) -> list[str]:
        """Stop every registered process, newest first; returns problems met."""
        problems: list[str] = []
        for proc in reversed(self.processes()):
            try:
                proc.stop(grace_s=grace_s)
            except Exception as exc:
                problems.append(f"stopping {proc.describe()}: {exc!r}")
                with contextlib.suppress(Exception):
                    proc.kill(timeout_s=2.0)
        return problems

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        problems = self.reap_all()
        if problems and exc is None:
            raise ProcessError("; ".join(problems))


# -- workers -----------------------------------------------------------------


@dataclass(frozen=True)
class OpReply:
    """One `ops` reply (worker contract section 5), matched to its request."""

    worker: str
    id: int | None
    op: str
    ok: bool
    result: dict[str, Any]
    error: str | None
    message: str | None
    sent_at: float
    received_at: float
    raw: dict[str, Any] = field(repr=False)

    @property
    def unsupported(self) -> bool:
        """The worker does not implement this op (verdict must be unknown)."""
        return not self.ok and self.error == "Unsupported"

    def raise_for_error(self) -> Self:
        """Return self when ok, else raise OpFailed naming worker, op and error."""
        if not self.ok:
            raise OpFailed(
                f"op {self.op!r} on worker {self.worker!r} failed: {self.error}: {self.message}"
            )
        return self


class PendingOp:
    """An `ops` request in flight; `result()` waits for its reply."""

    def __init__(
        self, worker: WorkerProcess, request_id: int | None, op: str, sent_at: float
    ) -> None:
        self.worker = worker
        self.id = request_id
        self.op = op
        self.sent_at = sent_at
        self._event = threading.Event()
        self._reply: OpReply | None = None
        self._error: BaseException | None = None
        #: When the reply arrived, by the harness's clock (None: not yet).
        self.answered_at: float | None = None

    def _resolve(self, reply: OpReply) -> None:
        self._reply = reply
        self.answered_at = time.time()
        self._event.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout_s: float) -> OpReply:
        """The reply; OpTimeout names op, id, worker and the worker's kernel state."""
        since = time.time()
        if not self._event.wait(timeout_s):
            raise OpTimeout(
                f"op {self.op!r} (id {self.id}) on worker {self.worker.worker_id!r} got no "
                f"reply within {timeout_s}s (process {self.worker.describe()})"
                + self.worker.channel_noise(),
                pid=self.worker.popen.pid,
                bound_s=timeout_s,
                since=since,
            )
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply


class WorkerProcess(ManagedProcess):
    """A worker under test started as `<worker_cmd> <mode> [mode_args]`.

    Sets the contract's identity variables: FENCECHECK_WORKER_ID, PGAPPNAME
    (so every libpq connection carries the worker id as application_name),
    FENCECHECK_CONTROL (removed when no socket is given, so an outer value
    never leaks in) and FENCECHECK_EVENTS (a per-worker file, created here and
    owned by the worker's user). In `ops` mode stdin/stdout carry JSON lines;
    every raw stdout line is also copied to the stdout log as evidence.
    """

    def __init__(
        self,
        worker_id: str,
        worker_cmd: Sequence[str],
        mode: str,
        mode_args: Sequence[str] = (),
        *,
        log_dir: Path,
        control_socket: Path | None = None,
        events_path: Path | None = None,
        env: Mapping[str, str | None] | None = None,
        inherit_env: bool = True,
        cwd: Path | None = None,
        run_as: OsUser | None = None,
        registry: ProcessRegistry | None = None,
        fork_server: ForkServer | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.mode = mode
        self.events_path = events_path or Path(log_dir) / f"{_safe_name(worker_id)}.events.jsonl"
        # (size, sha256) of the history file when this process started, if not empty.
        self.history_before: tuple[int, str] | None = None
        self.control_socket = control_socket
        worker_env: dict[str, str | None] = dict(env or {})
        worker_env.update(
            {
                "FENCECHECK_WORKER_ID": worker_id,
                "PGAPPNAME": worker_id,
                "FENCECHECK_EVENTS": str(self.events_path),
                "FENCECHECK_CONTROL": str(control_socket) if control_socket else None,
            }
        )
        super().__init__(
            f"worker-{worker_id}",
            [*worker_cmd, mode, *mode_args],
            log_dir=log_dir,
            env=worker_env,
            inherit_env=inherit_env,
            cwd=cwd,
            run_as=run_as,
            pipe_stdio=(mode == "ops"),
            registry=registry,
            launcher=(fork_server, [mode, *mode_args]) if fork_server is not None else None,
        )
        self._ids = itertools.count(1)
        self._pending: dict[int | None, PendingOp] = {}
        self._write_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._channel_closed = False
        self.protocol_errors: list[str] = []  # the first KEPT_NOISE_LINES
        self.protocol_error_count = 0

    @property
    def tenant_id(self) -> str | None:
        """The tenant its login is bound to (FENCECHECK_TENANT), when it was given one."""
        return self._env_overrides.get("FENCECHECK_TENANT")

    @property
    def lease_ttl_ms(self) -> int | None:
        """The lease duration it was started with (FENCECHECK_LEASE_TTL_MS), if given."""
        return self._given_ms("FENCECHECK_LEASE_TTL_MS")

    @property
    def dispatch_ttl_ms(self) -> int | None:
        """The dispatch claim duration it was started with (FENCECHECK_DISPATCH_TTL_MS), if given."""
        return self._given_ms("FENCECHECK_DISPATCH_TTL_MS")

    def _given_ms(self, name: str) -> int | None:
        value = self._env_overrides.get(name)
        return int(value) if value and value.isdigit() else None

    def start(self) -> Self:
        self._prepare_files()
        return super().start()

    def history_kept(self) -> bool | None:
        """Whether the history file still begins with what earlier processes
        of this worker left in it when this one started (contract section 4:
        appended to, never truncated). None: the file was empty then."""
        if self.history_before is None:
            return None
        size, digest = self.history_before
        try:
            with open(self.events_path, "rb") as f:
                return hashlib.sha256(f.read(size)).hexdigest() == digest
        except OSError:
            return False

    def _prepare_files(self) -> None:
        self.events_path.parent.mkdir(parents=True, exist_ok=True)
        # A worker started again under its id (explore, a restart) finds its
        # earlier lives' lines here; what they were is kept to judge later.
        try:
            earlier = self.events_path.read_bytes()
        except FileNotFoundError:
            earlier = b""
        self.history_before = (
            (len(earlier), hashlib.sha256(earlier).hexdigest()) if earlier else None
        )
        fd = os.open(self.events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        os.close(fd)
        if self.run_as is None:
            return
        give_to(self.events_path, self.run_as)
        for path in (self.events_path.parent, self.control_socket and self.control_socket.parent):
            if path is None:
                continue
            blocked = first_untraversable(path, self.run_as)
            if blocked is not None:
                raise ProcessError(
                    f"worker {self.worker_id!r} runs as {self.run_as.name!r}, which cannot "
                    f"enter {blocked} (needed to reach {path})"
                )

    def _after_start(self) -> None:
        if self.pipe_stdio:
            self._reader = threading.Thread(
                target=self._read_replies, name=f"ops-reader-{self.worker_id}", daemon=True
            )
            self._reader.start()

    def _read_replies(self) -> None:
        stdout = self.popen.stdout
        assert stdout is not None
        with open(self.stdout_log, "ab") as log:
            for raw in stdout:
                log.write(raw)
                log.flush()
                self._dispatch_reply(raw, time.time())
        with self._pending_lock:
            self._channel_closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        if pending:
            # Usually the worker exited: give it a moment so the message can say how.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=CLEAN_EXIT_WAIT_S)
        for op in pending:
            op._fail(
                WorkerChannelClosed(
                    f"worker {self.worker_id!r} closed stdout before answering op {op.op!r} "
                    f"(id {op.id}): {self.how_it_ended()}{self.channel_noise()}"
                )
            )

    def how_it_ended(self) -> str:
        """How the process ended, for a message: its exit status, how long after
        its start (``at once`` within a second), the last lines of its stderr;
        its kernel state while it still runs."""
        code = self.returncode
        if code is None:
            return f"process {self.describe()}"
        lived = (self.ended_at or time.time()) - (self.started_at or time.time())
        when = "at once" if lived < 1.0 else f"after {lived:.1f}s"
        status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        tail = "\n".join(f"    {line}" for line in self.log_tail(1200).strip().splitlines()[-6:])
        return (
            f"it exited {when} with {status} ({lived:.2f}s after it started); last lines of its "
            f"stderr ({self.stderr_log}):\n{tail or '    (nothing)'}"
        )

    def channel_noise(self) -> str:
        """What the worker printed on its ops channel that is not a reply, for a message."""
        if not self.protocol_errors:
            return ""
        shown = "; ".join(self.protocol_errors[:3])
        count = self.protocol_error_count
        more = f" (and {count - 3} more)" if count > 3 else ""
        return (
            f"; it printed {count} line(s) on its ops channel (stdout) "
            f"that are not JSON replies: {shown}{more} (logs go to stderr, see "
            f"docs/worker-contract.md section 5)"
        )

    def _noise(self, line: str) -> None:
        self.protocol_error_count += 1
        if len(self.protocol_errors) < KEPT_NOISE_LINES:
            self.protocol_errors.append(line)

    def noise_lines(self) -> list[str]:
        """The non-reply lines kept, and one line counting those that were not."""
        left = self.protocol_error_count - len(self.protocol_errors)
        tail = [f"(and {left} more line(s), all in {self.stdout_log.name})"] if left else []
        return [*self.protocol_errors, *tail]

    def _dispatch_reply(self, raw: bytes, received_at: float) -> None:
        try:
            obj = json.loads(raw)
            request_id = obj["id"]
        except (ValueError, KeyError, TypeError):
            self._noise(f"not a reply: {raw[:200]!r}")
            return
        with self._pending_lock:
            pending = self._pending.pop(request_id, None)
        if pending is None:
            self._noise(f"reply to unknown id {request_id!r}: {raw[:200]!r}")
            return
        result = obj.get("result")
        pending._resolve(
            OpReply(
                worker=self.worker_id,
                id=request_id,
                op=pending.op,
                ok=obj.get("ok") is True,
                result=result if isinstance(result, dict) else {"value": result},
                error=obj.get("error"),
                message=obj.get("message"),
                sent_at=pending.sent_at,
                received_at=received_at,
                raw=obj,
            )
        )

    def request_async(
        self, op: str, args: Mapping[str, Any] | None = None, *, worker_async: bool = False
    ) -> PendingOp:
        """Send one request and return at once; `.result(timeout_s)` waits.

        `worker_async=True` sets the contract's `"async": true`, so the worker
        runs it on its own thread instead of in order with other requests.
        """
        if not self.pipe_stdio:
            raise ProcessError(f"worker {self.worker_id!r} runs mode {self.mode!r}, not 'ops'")
        request_id = next(self._ids)
        message: dict[str, Any] = {"id": request_id, "op": op, "args": dict(args or {})}
        if worker_async:
            message["async"] = True
        line = json.dumps(message, separators=(",", ":"), default=str)
        return self._send(request_id, op, line)

    def send_line(self, text: str) -> PendingOp:
        """Send one line that is no request (hostile input). The contract
        answers it with ``id`` null: one such line at a time, its reply awaited
        before the next is sent."""
        if not self.pipe_stdio:
            raise ProcessError(f"worker {self.worker_id!r} runs mode {self.mode!r}, not 'ops'")
        return self._send(None, "(no request)", text)

    def _send(self, request_id: int | None, op: str, text: str) -> PendingOp:
        line = (text + "\n").encode()
        with self._pending_lock:
            if self._channel_closed:
                raise WorkerChannelClosed(
                    f"worker {self.worker_id!r} channel closed; cannot send op {op!r}: "
                    f"{self.how_it_ended()}{self.channel_noise()}"
                )
            pending = PendingOp(self, request_id, op, time.time())
            self._pending[request_id] = pending
        stdin: IO[bytes] | None = self.popen.stdin
        try:
            with self._write_lock:
                assert stdin is not None
                stdin.write(line)
                stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            with self._pending_lock:
                self._pending.pop(request_id, None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=CLEAN_EXIT_WAIT_S)
            raise WorkerChannelClosed(
                f"could not send op {op!r} to worker {self.worker_id!r} ({exc!r}): "
                f"{self.how_it_ended()}{self.channel_noise()}"
            ) from exc
        return pending

    def request(
        self, op: str, args: Mapping[str, Any] | None = None, *, timeout_s: float
    ) -> OpReply:
        """Send one request and wait for its reply (ok or not; see OpReply)."""
        return self.request_async(op, args).result(timeout_s)

    def close_stdin(self) -> None:
        """Close the request channel; an `ops` worker then exits 0."""
        if self._popen is not None and self._popen.stdin is not None:
            with self._write_lock, contextlib.suppress(OSError, ValueError):
                self._popen.stdin.close()

    def stop(
        self, grace_s: float = DEFAULT_GRACE_S, kill_timeout_s: float = DEFAULT_SIGNAL_TIMEOUT_S
    ) -> int | None:
        """Close stdin (an idle `ops` worker then exits 0), then the signal ladder."""
        if self._popen is not None and self.returncode is None and self.pipe_stdio:
            self.close_stdin()
            if self.kernel_state() == "stopped":
                return super().stop(grace_s, kill_timeout_s)  # it cannot read EOF anyway
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=min(grace_s, CLEAN_EXIT_WAIT_S))
        return super().stop(grace_s, kill_timeout_s)

    def _after_exit(self) -> None:
        super()._after_exit()
        if clock_skew.preloaded(self._env_overrides):
            clock_skew.forget(self.pid)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=2.0)
            if self._popen is not None and self._popen.stdout is not None:
                with contextlib.suppress(OSError):
                    self._popen.stdout.close()
        self.close_stdin()
