"""Shared helpers for the harness tests: real servers and process snapshots."""

from __future__ import annotations

import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
