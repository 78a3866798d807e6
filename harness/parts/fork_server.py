"""Workers forked from a pre-started process of the same command (contract §1).

A Python worker spends about 0.25 s of CPU importing its driver and code before
it does anything: 150 worker starts in a matrix run were a third of the
machine's CPU, and every experiment waited on them in turn. A worker command
may offer the optional mode ``fork-server``: the harness starts it once per
run, it imports everything and waits; each worker is then a ``fork()`` of it
with the worker's own arguments, environment and standard streams. Each is
still its own OS process with its own pid, session and memory (copy on
write): SIGSTOP, SIGCONT and SIGKILL reach it exactly as they reach a process
the harness exec'd, and its exit status comes from the ``waitpid`` of its
parent, the fork server.

The wire (language-neutral, docs/worker-contract.md §1): the server's
standard input is one end of a ``SOCK_SEQPACKET`` Unix socket pair; every
message is one JSON object.

* server → harness, once: ``{"ready": true, "pid": N}`` when it can fork.
* harness → server: ``{"spawn": ID, "args": [...], "env": {...}, "cwd": DIR}``
  with three descriptors attached (``SCM_RIGHTS``): the child's stdin,
  stdout and stderr.
* server → harness: ``{"spawned": ID, "pid": N}`` or ``{"spawned": ID,
  "error": TEXT}``; later ``{"exited": ID, "pid": N, "status": S}`` with S as
  :attr:`subprocess.Popen.returncode` (negative: killed by that signal).

A command that does not offer the mode exits (or says nothing) within the
start timeout and every worker is exec'd as before: the mode only saves time.
Each child arms a parent-death signal for its fork server, which has one for
the harness, so a harness killed with SIGKILL still leaves nothing behind.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from harness.parts.processes import pdeathsig_preexec

MAX_MESSAGE = 1 << 20
READY_TIMEOUT_S = 20.0
SPAWN_TIMEOUT_S = 10.0


class ForkServerError(RuntimeError):
    """The fork server is gone or refused a spawn: the caller execs instead,
    unless ``maybe_forked`` (it got the request and never answered: a child
    may run, and its fork server must be closed so that it dies)."""

    def __init__(self, message: str, *, maybe_forked: bool = False) -> None:
        super().__init__(message)
        self.maybe_forked = maybe_forked


class ForkServerMisreports(RuntimeError):
    """The worker's fork server broke its wire contract where the harness can
    prove it (a child it stopped, then killed, reported as anything but
    killed): a failure of the system under test, found before any experiment."""


class ForkedChild:
    """The harness's handle on one process a fork server started: the part of
    :class:`subprocess.Popen` that :class:`~harness.parts.processes.ManagedProcess`
    uses (``pid``, ``stdin``, ``stdout``, ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited = threading.Event()
        self.args = f"pid {pid} (forked)"
        # Signals go through a pidfd: it names this very process, so a signal
        # can never reach a recycled pid between the fork server's waitpid and
        # the harness hearing of it. None: the child was already gone.
        self._pidfd: int | None = None
        self._pidfd_lock = threading.Lock()
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(pid)

    def _set_exit(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
        self._exited.set()
        with self._pidfd_lock:
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._pidfd)
                self._pidfd = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the child; ProcessLookupError once it is gone (as os.kill)."""
        with self._pidfd_lock:
            if self.returncode is not None or self._pidfd is None:
                raise ProcessLookupError(f"forked child {self.pid} has exited")
            signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One ``<worker-cmd> fork-server`` process and the children it forked."""

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str]) -> None:
        self.argv = [*argv, "fork-server"]
        self.log_path = log_path
        self._env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ids = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._spawns: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._children: dict[int, ForkedChild] = {}
        # Exits that came before their child was adopted: pid -> (status, the
        # last spawn id asked for when the exit came).
        self._early: dict[int, tuple[int, int]] = {}
        self._closed = False
        self.pid: int | None = None
        self.why_not = ""

    # -------------------------------------------------------------- lifecycle
    def start(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Start the server; False (with :attr:`why_not`) when the command does
        not offer the mode or did not get ready in time."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log, contextlib.suppress(OSError):
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=theirs.fileno(),
                    stdout=log,
                    stderr=log,
                    env=self._env,
                    start_new_session=True,
                    preexec_fn=pdeathsig_preexec(os.getpid()),
                    close_fds=True,
                )
            except OSError as exc:
                self.why_not = f"cannot start `{' '.join(self.argv)}`: {exc}"
        theirs.close()
        if self._proc is None:
            ours.close()
            self.why_not = self.why_not or f"cannot start `{' '.join(self.argv)}`"
            return False
        ours.settimeout(timeout_s)
        closed = False
        try:
            data = ours.recv(MAX_MESSAGE)
            closed = not data
            hello = json.loads(data) if data else {}
        except (OSError, ValueError):
            hello = {}
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            code = self._proc.poll()
            if code is None and closed:
                # Its end closed as it exits; on a busy machine it may not be
                # reaped yet when we look.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self._proc.wait(timeout=2.0)
            self.why_not = (
                f"`{' '.join(self.argv)}` exited with {code}: the worker does not offer it"
                if code is not None
                else f"`{' '.join(self.argv)}` was not ready within {timeout_s:.0f}s"
            )
            ours.close()
            self._stop_process()
            return False
        ours.settimeout(None)
        self._sock = ours
        self.pid = int(hello.get("pid") or self._proc.pid)
        threading.Thread(target=self._read, name="fork-server-reader", daemon=True).start()
        return True

    def close(self) -> None:
        """Stop the server; children still running die with it (parent-death signal)."""
        with self._lock:
            self._closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._stop_process()

    def _stop_process(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._closed

    # ---------------------------------------------------------------- spawning
    def spawn(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | None,
        stdin: int,
        stdout: int,
        stderr: int,
        timeout_s: float = SPAWN_TIMEOUT_S,
    ) -> int:
        """Fork one child running ``<worker-cmd> *args``; its pid. The descriptors
        are the child's standard streams (the caller keeps and closes its copies)."""
        if self._sock is None or not self.alive:
            raise ForkServerError("the fork server is not running")
        with self._lock:
            self._ids += 1
            spawn_id = self._ids
            done = threading.Event()
            answer: list[Any] = []
            self._spawns[spawn_id] = (done, answer)
        message = json.dumps(
            {
                "spawn": spawn_id,
                "args": list(args),
                "env": dict(env),
                "cwd": str(cwd or os.getcwd()),
            }
        ).encode()
        if len(message) > MAX_MESSAGE:
            raise ForkServerError(f"spawn request of {len(message)} bytes is too large")
        fds = array.array("i", [stdin, stdout, stderr])
        try:
            with self._send_lock:
                self._sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as exc:
            raise ForkServerError(f"cannot reach the fork server: {exc}") from exc
        if not done.wait(timeout_s):
            raise ForkServerError(
                f"the fork server did not answer a spawn within {timeout_s}s", maybe_forked=True
            )
        reply = answer[0]
        if "pid" not in reply:
            raise ForkServerError(f"the fork server refused: {reply.get('error', reply)}")
        return int(reply["pid"])

    def adopt(self, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> ForkedChild:
        """The handle of child ``pid`` (an exit already reported is applied)."""
        child = ForkedChild(pid, stdin, stdout)
        with self._lock:
            self._children[pid] = child
            early = self._early.pop(pid, None)
        if early is not None:
            child._set_exit(early[0])
        return child

    def _probe_child(self, env: Mapping[str, str], timeout_s: float) -> tuple[ForkedChild, int]:
        """An ``ops`` child waiting for requests on a pipe (its output discarded)
        and the pipe's write end, which the caller closes to end its input."""
        read_end, write_end = os.pipe()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            pid = self.spawn(["ops"], env=env, cwd=None, stdin=read_end, stdout=devnull,
                             stderr=devnull, timeout_s=timeout_s)  # fmt: skip
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
            os.close(devnull)
        return self.adopt(pid, None, None), write_end

    def check_kill_report(self, env: Mapping[str, str], timeout_s: float = 5.0) -> str | None:
        """Whether the server reports a child a signal killed as killed (wire:
        minus the signal). Every crash fault is judged by that report, so a
        server that says "exited 0" for a killed worker turns each into "did
        not take effect". The probe forks an ``ops`` child (its database
        unreachable: it waits for requests on stdin), stops it with SIGSTOP (a
        stopped process cannot end by itself), then kills it with SIGKILL: -9
        is the one true report. The problem, said for a reader; None when the
        report is right or the probe could not be made (the child ended
        before it was stopped: nothing is proven either way)."""
        child, write_end = self._probe_child(env, timeout_s)
        pid = child.pid
        try:
            try:
                child.send_signal(signal.SIGSTOP)
            except ProcessLookupError:
                return None
            deadline = time.monotonic() + timeout_s
            while _state(pid) not in ("T", "t", "Z", "X", None):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.005)
            if _state(pid) not in ("T", "t"):
                return None  # it ended before the stop: proves nothing
            child.kill()
            try:
                status = child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return (
                    f"the fork server did not report the end of child {pid} within {timeout_s}s "
                    "of the harness killing it with SIGKILL"
                )
        finally:
            os.close(write_end)
            if child.poll() is None:  # a probe left unjudged: not left stopped
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
        if status != -int(signal.SIGKILL):
            return (
                f"the fork server reported status {status} for child {pid}, which the harness "
                "had stopped (SIGSTOP) and then killed with SIGKILL: the wire says minus the "
                "signal, -9 (worker contract section 1, fork server). Every crash fault is "
                "judged by that report"
            )
        return None

    def check_sigterm_ends(self, env: Mapping[str, str], timeout_s: float = 5.0) -> str | None:
        """Whether a forked ``ops`` child ends on SIGTERM, as the process the
        command would have exec'd does (worker contract section 1: SIGTERM
        drains a worker, then it exits; a child is exactly that process, with
        nothing of the server's state, its signal handlers included). The
        probe child waits for requests (its database unreachable); SIGTERM
        must end it within ``timeout_s``, by any status. The problem, said for
        a reader; None when it ended."""
        child, write_end = self._probe_child(env, timeout_s)
        pid = child.pid
        try:
            # Signalled once it waits for requests (asleep for a while), not
            # in the instant between its fork and its own start.
            if not _settled_asleep(pid, timeout_s):
                return None  # it ended, or never settled: nothing is proven
            try:
                child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                return None
            try:
                child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return (
                    f"the fork server's child {pid} (an `ops` worker waiting for requests) was "
                    f"still running {timeout_s:g}s after SIGTERM: a forked worker must be the "
                    "process the command would have exec'd, which SIGTERM ends (worker contract "
                    "section 1); reset the server's signal handlers in the child"
                )
        finally:
            os.close(write_end)
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
        return None

    # ----------------------------------------------------------------- reading
    def _read(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            with contextlib.suppress(ValueError, TypeError, KeyError):
                self._dispatch(json.loads(data))
        self._server_gone()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "spawned" in msg:
            with self._lock:
                entry = self._spawns.pop(int(msg["spawned"]), None)
                # An exit on record for this pid that came before this spawn
                # was even asked for is an older child's (one never adopted).
                # Pids wrap (pid_max is often 32768): left, it would report
                # this new child dead at once while it runs.
                if "pid" in msg:
                    pid = int(msg["pid"])
                    stale = self._early.get(pid)
                    if stale is not None and stale[1] < int(msg["spawned"]):
                        del self._early[pid]
            if entry is not None:
                entry[1].append(msg)
                entry[0].set()
        elif "exited" in msg:
            pid, status = int(msg["pid"]), int(msg["status"])
            with self._lock:
                child = self._children.pop(pid, None)
                if child is None:
                    self._early[pid] = (status, self._ids)
            if child is not None:
                child._set_exit(status)

    def _server_gone(self) -> None:
        """The server ended: its children die with it (parent-death signal); each
        is reported killed once the kernel no longer has it."""
        with self._lock:
            pending = list(self._spawns.values())
            self._spawns.clear()
            children = list(self._children.values())
            self._children.clear()
            self._closed = True
        for done, answer in pending:
            answer.append({"error": "the fork server ended"})
            done.set()
        deadline = time.monotonic() + 5.0
        for child in children:
            while _exists(child.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            child._set_exit(-int(signal.SIGKILL))


def _state(pid: int) -> str | None:
    """The process's state letter in /proc (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _settled_asleep(pid: int, timeout_s: float, polls: int = 5) -> bool:
    """Whether process ``pid`` was seen asleep ``polls`` times in a row, 20 ms
    apart, within ``timeout_s`` (a child waiting for its input)."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        state = _state(pid)
        if state in ("Z", "X", None):
            return False
        seen = seen + 1 if state == "S" else 0
        if seen >= polls:
            return True
        time.sleep(0.02)
    return False


def _exists(pid: int) -> bool:
    return _state(pid) not in ("Z", "X", None)
