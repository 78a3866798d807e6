"""Test helpers: raw HTTP and a tiny callback receiver."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


def raw_request(
    base_url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Send exactly these bytes (malformed input included); return status and JSON answer."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    decoded = json.loads(raw) if raw else {}
    assert isinstance(decoded, dict), raw
    return resp.status, decoded


def rows_for(export: dict[str, Any], table: str, operation_id: str) -> list[dict[str, Any]]:
    """Rows of one exported table that belong to ``operation_id``, in log order."""
    return [r for r in export[table] if r["operation_id"] == operation_id]


@dataclass(frozen=True)
class Received:
    at: float
    path: str
    body: dict[str, Any]


class CallbackReceiver:
    """A stdlib HTTP server in this process that records every POST it gets.

    ``statuses`` are answered in turn (the last one repeats), so a test can
    make the first delivery fail.
    """

    def __init__(self, statuses: tuple[int, ...] = (200,)) -> None:
        self.statuses = list(statuses)
        self.received: list[Received] = []
        self._cv = threading.Condition()
        receiver = self

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with receiver._cv:
                    receiver.received.append(Received(time.time(), self.path, body))
                    status = receiver.statuses[0]
                    if len(receiver.statuses) > 1:
                        receiver.statuses.pop(0)
                    receiver._cv.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        # Short poll: shutdown() waits for one poll interval (default 0.5 s).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/callback"

    def wait_for(self, n: int, timeout_s: float = 5.0) -> list[Received]:
        """Block (bounded) until at least ``n`` callbacks arrived."""
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self.received) >= n, timeout=timeout_s)
            if not ok:
                raise AssertionError(
                    f"timed out after {timeout_s}s waiting for {n} callbacks;"
                    f" got {len(self.received)}"
                )
            return list(self.received)

    def __enter__(self) -> CallbackReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
