"""The harness's own probe of a link: what a new connection through it meets.

A link fault is only evidence once the harness has seen it take effect with
its own eyes, not through the worker under test (whose reaction is what the
experiment judges). The probe opens a fresh TCP connection through the
link's proxy, sends one small request the server behind it answers at once
(PostgreSQL's SSLRequest, one HTTP GET for the tool), and classifies what
comes back:

| outcome | seen | the fault it shows |
|---|---|---|
| ``refused`` | the connection cannot be opened | cut (proxy disabled) |
| ``reset`` | ECONNRESET / EPIPE on send or receive | reset_peer |
| ``closed`` | end of stream before any byte came back | a connection closed by the proxy |
| ``silent`` | nothing within the wait, connection still open | black hole (timeout toxic, timeout 0) |
| ``answered`` | the first byte of an answer, after ``elapsed_ms`` | healthy, or latency (elapsed >= the latency) |

Invariant: the probe never blocks longer than ``wait_s`` (plus the connect
timeout) and always closes its socket; it raises nothing for what the link
does, only for a bad argument.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from dataclasses import dataclass
from typing import Literal

from harness.parts.toxiproxy import Link

ProbeOutcome = Literal["answered", "refused", "reset", "closed", "silent"]

# PostgreSQL's SSLRequest (length 8, code 80877103): every server answers one
# byte, 'S' or 'N', before anything else, without logging in.
PG_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
# The mock tool's health check: answered at once, changes nothing, not logged.
HTTP_HEALTH = b"GET /health HTTP/1.0\r\nHost: fencecheck-probe\r\n\r\n"
CONNECT_TIMEOUT_S = 2.0
_RESET = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


@dataclass(frozen=True)
class ProbeResult:
    """What one probe met on one link."""

    link: str
    outcome: ProbeOutcome
    elapsed_ms: float
    started_at: float
    detail: str

    def describe(self) -> str:
        return (
            f"probe of {self.link}: {self.outcome} after {self.elapsed_ms:.0f} ms ({self.detail})"
        )


def probe(link: Link, request: bytes, *, wait_s: float) -> ProbeResult:
    """Send ``request`` on a new connection through ``link`` and wait up to
    ``wait_s`` for the first byte of an answer."""
    return probe_address(link.name, link.listen_host, link.listen_port, request, wait_s=wait_s)


def probe_address(name: str, host: str, port: int, request: bytes, *, wait_s: float) -> ProbeResult:
    """:func:`probe` for a plain address (the link's listening side)."""
    if wait_s <= 0:
        raise ValueError(f"wait_s must be > 0, not {wait_s}")
    started = time.time()
    t0 = time.monotonic()

    def result(outcome: ProbeOutcome, detail: str) -> ProbeResult:
        return ProbeResult(name, outcome, (time.monotonic() - t0) * 1000, started, detail)

    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except ConnectionRefusedError as exc:
        return result("refused", f"connect: {exc}")
    except OSError as exc:
        return result("reset" if exc.errno in _RESET else "refused", f"connect: {exc!r}")
    try:
        sock.settimeout(wait_s)
        try:
            sock.sendall(request)
            first = sock.recv(1)
        except TimeoutError:
            return result("silent", f"no byte back within {wait_s:.1f}s, connection open")
        except OSError as exc:
            if exc.errno in _RESET:
                return result("reset", f"{type(exc).__name__}: {exc}")
            return result("closed", f"{type(exc).__name__}: {exc}")
        if not first:
            return result("closed", "end of stream before any byte came back")
        return result("answered", f"first byte {first!r}")
    finally:
        sock.close()
