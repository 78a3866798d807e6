"""Shared helpers for the harness tests: real servers and process snapshots."""

from __future__ import annotations

import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

SCRIPTS = Path(__file__).parent / "scripts"
PYTHON = sys.executable


def descendants() -> set[tuple[int, float]]:
    """(pid, create_time) of every live descendant of this test process."""
    result: set[tuple[int, float]] = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                result.add((proc.pid, proc.create_time()))
        except psutil.NoSuchProcess:
            continue
    return result


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class EchoServer:
    """A real TCP line-echo server on a free loopback port, for proxy tests.

    Every line it receives is kept in `received`, so a test can tell "the
    request reached the server" apart from "the answer reached the client".
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    owner.received.append(line)
                    self.wfile.write(line)
                    self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        # A short poll interval keeps shutdown() quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer()
    server._thread.start()
    try:
        yield server
    finally:
        server._server.shutdown()
        server._server.server_close()


def sample_archive(**overrides: Any) -> dict[str, Any]:
    """A small archive that matches the published schema (override any field)."""
    base: dict[str, Any] = {
        "archive_version": 1,
        "experiment_id": "B",
        "title": "old owner resumes",
        "seed_section": "English seed §11 B",
        "git_commit": "abc",
        "runtime_versions": {"python": "3.11"},
        "postgres_version": "PostgreSQL 18",
        "deployment": {"kind": "local-processes"},
        "worker": {"command": "python -m reference_impl.worker", "digest": "sha256:" + "a" * 64},
        "run_id": "r1",
        "tenant_id": "t1",
        "lease_duration": "800ms",
        "heartbeat_interval": "150ms",
        "fault_injection_point": None,
        "commands_executed": [{"time": 1.0, "command": "SIGSTOP A"}],
        "worker_logs_path": "/tmp/x",
        "postgres_queries_and_results": [{"label": "l", "query": "SELECT 1", "rows": []}],
        "mock_tool_request_log": [{"request": {"card_number": "4111", "password": "pw"}}],
        "broker_messages": [],
        "expected_invariant": "x",
        "observed_result": "y",
        "pass_or_fail": "pass",
        "checks": [{"name": "c", "kind": "fault", "ok": True, "expected": "e", "observed": "o"}],
        "faults": [],
        "control_hits": [],
        "history": [],
        "started_at": "2026-11-29T00:00:00Z",
        "finished_at": "2026-11-29T00:00:01Z",
        "duration_s": 1.0,
        "natural_wait_s": 0.8,
    }
    base.update(overrides)
    return base


def fencecheck_cli(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """``fencecheck ARGS`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def assert_usage_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    """A usage error as docs/running.md promises it: exit 64, one line on stderr
    holding each of ``expected``, no traceback, nothing on stdout; the line."""
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stdout == "", f"a usage error starts and prints nothing else: {proc.stdout}"
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]
