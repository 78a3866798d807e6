"""Start, kill, restart and stop the mock tool as a real OS process.

Invariants:

* :meth:`MockToolProcess.start` returns only when the server printed its
  ``mock_tool listening on`` line *and* answered ``GET /health``; every wait is
  bounded and a timeout says what was being waited for.
* A restart reuses the same storage directory and the same port (a toxiproxy
  upstream keeps pointing at it), so the log and the address both survive.
* The process is never left behind: ``with`` stops it, an ``atexit`` hook kills
  any instance still running, and the server itself is started with
  ``--exit-with-parent`` so it stops if this process dies without cleanup.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from mock_tool.client import ToolClient
from mock_tool.constants import LISTENING_PREFIX
from mock_tool.errors import ToolError

_LIVE: weakref.WeakSet[MockToolProcess] = weakref.WeakSet()


class MockToolStartError(RuntimeError):
    """The mock tool did not become ready."""


def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        proc.kill()


atexit.register(_kill_leftovers)


class MockToolProcess:
    """One mock tool server subprocess bound to one storage directory.

    Use as a context manager (``with MockToolProcess(dir) as tool: ...``) or call
    :meth:`start` / :meth:`stop` yourself.
    """

    def __init__(
        self,
        storage: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tools: Mapping[str, str] | None = None,
        idempotency_retention_s: float | None = None,
        callback_attempts: int | None = None,
        startup_timeout_s: float = 15.0,
        stop_grace_s: float = 5.0,
        log_path: str | Path | None = None,
        python: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.storage = Path(storage).resolve()
        self.host = host
        self.tools = dict(tools) if tools else None
        self.idempotency_retention_s = idempotency_retention_s
        self.callback_attempts = callback_attempts
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        #: Where the server's stderr goes (appended across restarts).
        self.log_path = Path(log_path) if log_path else self.storage / "mock_tool.log"
        self.python = python or sys.executable
        self.extra_args = list(extra_args)
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self.starts = 0

    # -- properties -----------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (known after the first start)."""
        if not self._port:
            raise RuntimeError("the mock tool has not been started yet")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def client(self, timeout_s: float = 5.0) -> ToolClient:
        return ToolClient(self.base_url, timeout_s=timeout_s)

    def command(self) -> list[str]:
        """The exact command line this helper runs."""
        cmd = [self.python, "-m", "mock_tool.server", "--host", self.host]
        cmd += ["--port", str(self._port), "--storage", str(self.storage), "--exit-with-parent"]
        for name, capability in (self.tools or {}).items():
            cmd += ["--tool", f"{name}={capability}"]
        if self.idempotency_retention_s is not None:
            cmd += ["--idempotency-retention-s", str(self.idempotency_retention_s)]
        if self.callback_attempts is not None:
            cmd += ["--callback-attempts", str(self.callback_attempts)]
        return cmd + self.extra_args

    # -- lifecycle ------------------------------------------------------

    def start(self) -> MockToolProcess:
        """Start the server and wait until it is ready (bounded)."""
        if self.running:
            raise RuntimeError(f"mock tool already running (pid {self.pid})")
        self.storage.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self._spawn_and_wait(deadline)
            if code is None:
                self.starts += 1
                return self
            # A restart on the same port can race the old socket's release:
            # retry its exit-2 failures until the deadline, then report.
            restarting = self.starts > 0
            if not (restarting and code == 2 and time.monotonic() < deadline - 0.2):
                raise MockToolStartError(
                    f"mock tool exited with code {code} before it was ready;"
                    f" command: {' '.join(self.command())}; stderr tail:\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _spawn_and_wait(self, deadline: float) -> int | None:
        """Spawn once; None when ready, else the exit code of a failed start."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                # Its own session: a terminal's Ctrl-C reaches only the process
                # that started it, which decides when the tool stops.
                start_new_session=True,
            )
        self._proc, self._stdout = proc, proc.stdout
        _LIVE.add(self)
        try:
            line = self._read_listening_line(proc, deadline)
            if line is None:
                return self._reap(proc)
            url = line[len(LISTENING_PREFIX) :].strip()
            self._port = int(url.rsplit(":", 1)[1])
            self._wait_healthy(proc, deadline)
        except BaseException:
            self.kill()
            raise
        return None

    def _read_listening_line(self, proc: subprocess.Popen[bytes], deadline: float) -> str | None:
        """The listening line, or None if the process closed stdout (exited)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MockToolStartError(
                        f"timed out after {self.startup_timeout_s:.1f}s waiting for the"
                        f" '{LISTENING_PREFIX.strip()}' line on the stdout of pid {proc.pid};"
                        f" stderr tail:\n{self._log_tail()}"
                    )
                if not sel.select(timeout=min(left, 0.2)):
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode("utf-8", "replace")
        if not line.startswith(LISTENING_PREFIX):
            raise MockToolStartError(f"unexpected first stdout line from mock tool: {line!r}")
        return line

    def _wait_healthy(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        client = ToolClient(self.base_url, timeout_s=1.0)
        last = "no attempt"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise MockToolStartError(
                    f"mock tool exited with code {proc.returncode} before GET /health answered;"
                    f" stderr tail:\n{self._log_tail()}"
                )
            try:
                if client.health().get("ok") is True:
                    return
                last = "answered without ok=true"
            except ToolError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise MockToolStartError(
            f"timed out after {self.startup_timeout_s:.1f}s waiting for GET {self.base_url}/health"
            f" to answer 200 ok=true; last: {last}"
        )

    def _reap(self, proc: subprocess.Popen[bytes]) -> int:
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        finally:
            self._close_pipe()

    def _close_pipe(self) -> None:
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def _log_tail(self, limit: int = 2000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-limit:].decode("utf-8", "replace")

    def kill(self) -> int | None:
        """SIGKILL the server (a crash: no cleanup) and reap it; returns its exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        try:
            code = proc.wait(timeout=10)
        finally:
            self._close_pipe()
            _LIVE.discard(self)
        return code

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_grace_s``, then SIGKILL; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            # Own short poll: Popen.wait's backoff adds up to 50 ms per stop.
            deadline = time.monotonic() + self.stop_grace_s
            while proc.poll() is None:
                if time.monotonic() >= deadline:
                    return self.kill()
                time.sleep(0.005)
        self._close_pipe()
        _LIVE.discard(self)
        return proc.returncode

    def restart(self, *, crash: bool = False) -> MockToolProcess:
        """Stop (or SIGKILL when ``crash``) and start again on the same storage and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __enter__(self) -> MockToolProcess:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class MockToolHost:
    """One ``python -m mock_tool.host`` process, serving a tool per experiment
    (:class:`HostedTool`), each on its own port with its own storage and log.

    Requests are answered in order per kind; every wait is bounded and says
    what it waited for. The host dies with this process (``--exit-with-parent``
    and the ``atexit`` hook).
    """

    def __init__(
        self, log_path: Path, *, python: str | None = None, timeout_s: float = 15.0
    ) -> None:
        self.log_path = log_path
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._replies: dict[tuple[str, str], threading.Event] = {}
        self._answers: dict[tuple[str, str], dict[str, Any]] = {}
        self._reader: threading.Thread | None = None
        self.pid: int | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> MockToolHost:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [self.python, "-m", "mock_tool.host", "--exit-with-parent"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        _LIVE_HOSTS.add(self)
        assert self._proc.stdout is not None
        ready = self._read_line(self._proc.stdout, time.monotonic() + self.timeout_s)
        if not ready or ready.get("ready") is not True:
            self.kill()
            raise MockToolStartError(
                f"mock tool host did not get ready within {self.timeout_s:.0f}s; its log "
                f"{self.log_path}:\n{_tail(self.log_path)}"
            )
        self.pid = int(ready["pid"])
        self._reader = threading.Thread(target=self._read, name="mock-tool-host", daemon=True)
        self._reader.start()
        return self

    def _read_line(self, stream: IO[bytes], deadline: float) -> dict[str, Any] | None:
        with selectors.DefaultSelector() as sel:
            sel.register(stream.fileno(), selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=min(0.2, max(0.0, deadline - time.monotonic()))):
                    line = stream.readline()
                    return json.loads(line) if line else None
        return None

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            with contextlib.suppress(ValueError):
                msg = json.loads(raw)
                key = (
                    ("open", str(msg["opened"]))
                    if "opened" in msg
                    else ("close", str(msg.get("closed")))
                )
                with self._lock:
                    self._answers[key] = msg
                    event = self._replies.get(key)
                if event is not None:
                    event.set()
        with self._lock:  # the host is gone: nobody will answer
            events = list(self._replies.values())
        for event in events:
            event.set()

    def _ask(self, kind: str, name: str, request: dict[str, Any]) -> dict[str, Any]:
        key = (kind, name)
        event = threading.Event()
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                raise MockToolStartError(f"the mock tool host is not running (log {self.log_path})")
            self._replies[key] = event
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as exc:
                raise MockToolStartError(f"cannot reach the mock tool host: {exc}") from exc
        if not event.wait(self.timeout_s):
            raise MockToolStartError(
                f"the mock tool host did not answer {kind} {name!r} within {self.timeout_s:.0f}s"
            )
        with self._lock:
            self._replies.pop(key, None)
            answer = self._answers.pop(key, None)
        if answer is None:
            raise MockToolStartError(
                f"the mock tool host ended before answering {kind} {name!r}:\n{_tail(self.log_path)}"
            )
        return answer

    def open(
        self,
        name: str,
        storage: Path,
        *,
        log_path: Path,
        tools: Mapping[str, str] | None = None,
        idempotency_retention_s: float | None = None,
        callback_attempts: int | None = None,
    ) -> HostedTool:
        """A tool of its own for ``name``, serving once this returns."""
        answer = self._ask(
            "open",
            name,
            {
                "open": name,
                "storage": str(storage),
                "log": str(log_path),
                "tools": dict(tools or {}),
                "retention_s": idempotency_retention_s,
                "callback_attempts": callback_attempts,
            },
        )
        if "port" not in answer:
            raise MockToolStartError(
                f"the mock tool host could not open {name!r}: {answer.get('error')}"
            )
        return HostedTool(self, name, int(answer["port"]), storage, log_path)

    def close_tool(self, name: str) -> None:
        self._ask("close", name, {"close": name})

    def kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        _LIVE_HOSTS.discard(self)

    def stop(self, grace_s: float = 5.0) -> None:
        """Close every tool (EOF on its input), then wait; SIGKILL past ``grace_s``."""
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
        _LIVE_HOSTS.discard(self)


class HostedTool:
    """One experiment's tool in a :class:`MockToolHost`: what the harness uses of
    a :class:`MockToolProcess` (port, base_url, pid, client, stop, kill)."""

    def __init__(
        self, host: MockToolHost, name: str, port: int, storage: Path, log_path: Path
    ) -> None:
        self.host = host
        self.name = name
        self._port = port
        self.storage = storage
        self.log_path = log_path
        self._open = True

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        return self.host.pid

    @property
    def running(self) -> bool:
        return self._open and self.host.running

    def client(self, timeout_s: float = 5.0) -> ToolClient:
        return ToolClient(self.base_url, timeout_s=timeout_s)

    def stop(self) -> int | None:
        """Stop serving and release the storage (answers in flight finish first)."""
        if self._open and self.host.running:
            self.host.close_tool(self.name)
        self._open = False
        return 0

    def kill(self) -> int | None:
        """A stopping run's way: the host goes with the run; only forget it here."""
        self._open = False
        return None


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_bytes()[-limit:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"


_LIVE_HOSTS: weakref.WeakSet[MockToolHost] = weakref.WeakSet()


@atexit.register
def _kill_hosts() -> None:
    for host in list(_LIVE_HOSTS):
        host.kill()
