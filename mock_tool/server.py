"""The mock external tool: an HTTP service with its own durable request log.

Run ``python -m mock_tool.server --help``; the API is in ``docs/mock-tool.md``.

Invariants:

* Every create, query and broker publish is committed to the tool's own
  SQLite log (see :mod:`mock_tool.storage`) before any byte of the answer is
  sent. Whatever a caller saw acknowledged survives a SIGKILL of the tool.
* A request the tool refuses (bad input, 429, 422) creates no resource.
* Faults live in memory only: a restart clears them (the log stays).
* stdout carries exactly one line, ``mock_tool listening on http://HOST:PORT``,
  once the socket accepts connections; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import http.client
import itertools
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import parse_qs, unquote, urlsplit

from mock_tool import broker
from mock_tool.canonical import request_digest
from mock_tool.constants import (
    BROKER,
    CAPABILITIES,
    DEFAULT_HANG_MS,
    DEFAULT_RETENTION_S,
    DEFAULT_TOOLS,
    DELIVERY_FAULT_MODES,
    FAULT_MODES,
    LISTENING_PREFIX,
    MODES_WITH_MS,
    PUBLISH_FAULT_MODES,
    iso,
)
from mock_tool.faults import FaultBoard, Hung
from mock_tool.storage import After, Store, StoreClosed

MAX_BODY_BYTES = 1 << 20
# SQLite INTEGER is signed 64-bit: a larger epoch, or a larger ?after= or
# ?limit=, would fail inside SQLite (an answer of 500) instead of being refused.
MAX_SQLITE_INTEGER = 2**63 - 1
MAX_EPOCH = MAX_SQLITE_INTEGER
# Deeper JSON is refused before parsing: Python's parser recurses per level,
# and a 100,000-deep body would end in a RecursionError (a 500) otherwise.
MAX_JSON_DEPTH = 64
# Upper bound of any delay in ms (one hour): longer waits are a typo.
MAX_MS = 3_600_000
LOCK_FILE = "mock_tool.lock"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Names that cannot be tools: "*" selects all tools in a fault spec, "broker"
# is the target of the broker's fault modes.
_RESERVED_NAMES = frozenset({"*", BROKER})
_CREATE_MODES = frozenset(FAULT_MODES)
# Keys of requests held on the network (arrive_held): negative, never a log seq.
_HELD = itertools.count(1)
_BROKER_MODES = (*PUBLISH_FAULT_MODES, *DELIVERY_FAULT_MODES)
# How a create fault mode has the caller answered once the tool acted.
_AFTER_OF: dict[str, After] = {
    "drop_after_act": "drop",
    "error_5xx_after_act": "5xx",
    "unavailable_after_act": "503",
    "accept_without_result": "accepted",
    "answer_late": "late",
}


class HttpError(Exception):
    """An answer other than success: status, message for people, code for machines."""

    def __init__(self, status: int, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def _bad(message: str) -> HttpError:
    return HttpError(400, message)


# -- callbacks ----------------------------------------------------------


@dataclass(frozen=True)
class CallbackJob:
    tool: str
    operation_id: str
    run_id: str
    epoch: int
    resource_id: str
    url: str
    delay_ms: int

    def payload(self) -> dict[str, Any]:
        """What the receiver gets (plus ``attempt``)."""
        return {
            "operation_id": self.operation_id,
            "run_id": self.run_id,
            "epoch": self.epoch,
            "resource_id": self.resource_id,
            "tool": self.tool,
        }


#: The ``url`` logged for a callback issued by ``POST /admin/callbacks``: the
#: caller relays it (the worker contract has no HTTP callback endpoint).
RELAY_URL = "relay"


class CallbackSender:
    """Delivers callbacks on background threads, logging every attempt.

    Invariant: an attempt is logged before it is sent and its answer after,
    so the log never lacks a callback that a receiver saw. A callback still
    waiting for its delay when the tool stops is never sent.
    """

    def __init__(
        self, store: Store, stopping: threading.Event, attempts: int, timeout_s: float
    ) -> None:
        self._store = store
        self._stopping = stopping
        self._attempts = attempts
        self._timeout_s = timeout_s

    def schedule(self, job: CallbackJob) -> None:
        threading.Thread(
            target=self._deliver, args=(job, time.time()), name="callback", daemon=True
        ).start()

    def relay(self, job: CallbackJob) -> int:
        """Log a callback handed to the caller now instead of sent (one attempt,
        completed at once without a receiver's status); returns its id."""
        cb_id = self._begin_attempt(job, 1, time.time())
        self._store.finish_callback_attempt(cb_id, None, "handed to the caller to relay")
        return cb_id

    def _begin_attempt(self, job: CallbackJob, attempt: int, scheduled_at: float) -> int:
        """Log one attempt before it is sent; returns its id."""
        return self._store.begin_callback_attempt(
            tool=job.tool,
            operation_id=job.operation_id,
            run_id=job.run_id,
            epoch=job.epoch,
            resource_id=job.resource_id,
            url=job.url,
            attempt=attempt,
            delay_ms=job.delay_ms,
            scheduled_at=scheduled_at,
        )

    def _deliver(self, job: CallbackJob, scheduled_at: float) -> None:
        if self._stopping.wait(job.delay_ms / 1000):
            return
        payload = job.payload()
        for attempt in range(1, self._attempts + 1):
            try:
                cb_id = self._begin_attempt(job, attempt, scheduled_at)
            except StoreClosed:
                return
            status: int | None = None
            error: str | None = None
            try:
                status = _post_json(job.url, {**payload, "attempt": attempt}, self._timeout_s)
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
            try:
                self._store.finish_callback_attempt(cb_id, status, error)
            except StoreClosed:
                return
            if status is not None and 200 <= status < 300:
                return
            # Linear backoff; a stopping tool gives up at once.
            if attempt < self._attempts and self._stopping.wait(0.2 * attempt):
                return


def _post_json(url: str, payload: dict[str, Any], timeout_s: float) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout_s)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        body = json.dumps(payload).encode()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# -- request validation -------------------------------------------------


@dataclass(frozen=True)
class CreateBody:
    operation_id: str
    run_id: str
    epoch: int
    request: dict[str, Any]
    callback_url: str | None
    callback_delay_ms: int


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python but never a valid epoch or count.
    return isinstance(value, int) and not isinstance(value, bool)


def _nonempty_str(body: dict[str, Any], name: str) -> str:
    if name not in body:
        raise _bad(f"missing field {name!r} (a non-empty string)")
    value = body[name]
    if not isinstance(value, str) or not value:
        raise _bad(f"field {name!r} must be a non-empty string, got {json.dumps(value)}")
    return value


def _opt_ms(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_MS:
        raise _bad(
            f"field {name!r} must be an integer from 0 to {MAX_MS} (ms), got {json.dumps(value)}"
        )
    return int(value)


def parse_create(body: Any) -> CreateBody:
    """Validate a create body; raises :class:`HttpError` saying what is wrong."""
    if not isinstance(body, dict):
        raise _bad(f"body must be a JSON object, got {type(body).__name__}")
    operation_id = _nonempty_str(body, "operation_id")
    run_id = _nonempty_str(body, "run_id")
    if "epoch" not in body:
        raise _bad("missing field 'epoch' (an integer >= 0)")
    epoch = body["epoch"]
    if not _is_int(epoch) or not 0 <= epoch <= MAX_EPOCH:
        raise _bad(f"field 'epoch' must be an integer from 0 to 2**63-1, got {json.dumps(epoch)}")
    if "request" not in body:
        raise _bad("missing field 'request' (a JSON object)")
    request = body["request"]
    if not isinstance(request, dict):
        raise _bad(f"field 'request' must be a JSON object, got {json.dumps(request)}")
    callback_url = body.get("callback_url")
    if callback_url is not None:
        if not isinstance(callback_url, str):
            raise _bad("field 'callback_url' must be a string like http://127.0.0.1:8080/cb")
        parts = urlsplit(callback_url)
        if parts.scheme != "http" or not parts.hostname:
            raise _bad(f"field 'callback_url' must be an http:// URL, got {callback_url!r}")
        try:
            _ = parts.port
        except ValueError as exc:
            raise _bad(f"field 'callback_url' has a bad port: {exc}") from None
    delay = _opt_ms(body, "callback_delay_ms")
    return CreateBody(operation_id, run_id, int(epoch), request, callback_url, delay or 0)


def _salvage(body: Any) -> dict[str, Any]:
    """The well-typed fields of a refused body, so the log can name them."""
    if not isinstance(body, dict):
        return {}
    out: dict[str, Any] = {}
    for name in ("operation_id", "run_id"):
        if isinstance(body.get(name), str):
            out[name] = body[name]
    if _is_int(body.get("epoch")) and 0 <= body["epoch"] <= MAX_EPOCH:
        out["epoch"] = body["epoch"]
    if isinstance(body.get("request"), dict):
        with contextlib.suppress(ValueError):
            out["body_digest"] = request_digest(body["request"])
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests lists/dicts deeper than ``limit`` (no recursion)."""
    level: list[Any] = [value]
    for _depth in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list) for item in level)


# -- the application ----------------------------------------------------


class App:
    """Everything a request handler needs; one per server process."""

    def __init__(
        self,
        store: Store,
        tools: dict[str, str],
        retention_s: float,
        storage: Path,
        callback_attempts: int = 3,
        callback_timeout_s: float = 5.0,
        log: IO[str] | None = None,
    ) -> None:
        self.store = store
        # Where the access log goes: stderr for a process of its own, the
        # tool's own file when one host process serves several (mock_tool.host).
        self.log = log if log is not None else sys.stderr
        self.tools = dict(tools)
        self.retention_s = retention_s
        self.storage = storage
        self.faults = FaultBoard()
        self.stopping = threading.Event()
        self.callbacks = CallbackSender(store, self.stopping, callback_attempts, callback_timeout_s)
        self.started_at = time.time()
        self._active = 0
        self._active_cv = threading.Condition()

    def enter(self) -> None:
        with self._active_cv:
            self._active += 1

    def leave(self) -> None:
        with self._active_cv:
            self._active -= 1
            self._active_cv.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait (bounded) until no request is being handled."""
        with self._active_cv:
            return self._active_cv.wait_for(lambda: self._active == 0, timeout=timeout_s)

    def describe(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "boot": self.store.boot,
            "started_at": self.started_at,
            "started_at_iso": iso(self.started_at),
            "storage": str(self.storage),
            "database": str(self.store.path),
            "idempotency_retention_s": self.retention_s,
        }


class MockToolServer(ThreadingHTTPServer):
    """Threading HTTP server carrying the :class:`App`."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: App) -> None:
        self.app = app
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request; see docs/mock-tool.md for the API."""

    server: MockToolServer
    protocol_version = "HTTP/1.1"
    server_version = "mock_tool/1"
    # Idle keep-alive connections are closed after this many seconds.
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        log = self.server.app.log
        log.write(f"mock_tool: {self.address_string()} {format % args}\n")
        log.flush()

    # -- plumbing -------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The caller went away; what happened is already in the log.
            self.close_connection = True

    def _read_body(self) -> None:
        """Read the whole body up front (keeps keep-alive framing right even for
        endpoints that ignore it); a framing error is kept for :meth:`_read_json`."""
        self._body: bytes = b""
        self._body_error: HttpError | None = None
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                self._body_error = HttpError(
                    411, "send a Content-Length header; chunked bodies are not supported"
                )
            return
        try:
            length = int(length_text)
        except ValueError:
            self.close_connection = True
            self._body_error = _bad(f"Content-Length {length_text!r} is not a number")
            return
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._body_error = HttpError(
                413, f"body of {length} bytes exceeds {MAX_BODY_BYTES} bytes", "too_large"
            )
            return
        if length > 0:
            self._body = self.rfile.read(length)

    def _read_json(self) -> Any:
        if self._body_error is not None:
            raise self._body_error
        media = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise HttpError(
                415,
                f"Content-Type {media or '(none)'} is not JSON; send the body with "
                "Content-Type: application/json",
                "unsupported_media_type",
            )
        if not self._body:
            raise _bad("empty body: send a JSON object")
        too_deep = f"body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels"
        try:
            value = json.loads(
                self._body.decode("utf-8"),
                parse_constant=_reject_constant,
                parse_float=_finite_float,
            )
        except RecursionError:
            raise _bad(too_deep) from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise _bad(f"body is not valid JSON: {exc}") from None
        if _too_deep(value):
            raise _bad(too_deep)
        try:
            # JSON allows "\ud800"; UTF-8 (the log, the digest) does not.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _bad("body contains a lone UTF-16 surrogate; send valid Unicode") from None
        return value

    def _route(self, method: str) -> None:
        app = self.server.app
        app.enter()
        try:
            self._read_body()
            self._dispatch(method)
        except HttpError as exc:
            self._send_json(exc.status, {"error": exc.message, "code": exc.code})
        except StoreClosed:
            self._send_json(503, {"error": "the tool is shutting down", "code": "stopping"})
        except Exception as exc:  # a bug: answer ambiguously, keep serving
            self.log_error("internal error: %r", exc)
            self._send_json(500, {"error": f"internal error: {exc}", "code": "internal"})
        finally:
            app.leave()

    def _dispatch(self, method: str) -> None:
        received_at = time.time()
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        # Split before unquoting: an operation_id may contain an encoded "/".
        segs = [unquote(s) for s in path.split("/")[1:]]
        routes: dict[tuple[str, ...], dict[str, Any]] = {
            ("health",): {"GET": self._health},
            ("admin", "faults"): {
                "POST": self._set_fault,
                "DELETE": self._clear_faults,
                "GET": self._list_faults,
            },
            ("admin", "release"): {"POST": self._release},
            ("admin", "export"): {"GET": self._export},
            ("admin", "callbacks"): {"POST": self._callback_now},
            ("broker", "publish"): {"POST": self._publish},
            ("broker", "messages"): {"GET": lambda: self._messages(parts.query)},
        }
        if len(segs) == 3 and segs[0] == "tools" and segs[2] == "operations":
            routes[tuple(segs)] = {"POST": lambda: self._create(segs[1], received_at)}
        if len(segs) == 4 and segs[0] == "tools" and segs[2] == "operations":
            routes[tuple(segs)] = {"GET": lambda: self._query(segs[1], segs[3], received_at)}
        handlers = routes.get(tuple(segs))
        if handlers is None:
            raise HttpError(404, f"no such endpoint: {method} {parts.path}", "no_such_endpoint")
        handler = handlers.get(method)
        if handler is None:
            allowed = ", ".join(sorted(handlers))
            raise HttpError(
                405, f"{method} not allowed on {parts.path}; use {allowed}", "method_not_allowed"
            )
        handler()

    def _unknown_tool(self, tool: str) -> HttpError:
        known = ", ".join(sorted(self.server.app.tools))
        return _bad(
            f"unknown tool {tool!r}; this server has: {known}"
            " (start it with --tool NAME=CAPABILITY to add one)"
        )

    # -- endpoints ------------------------------------------------------

    def _health(self) -> None:
        app = self.server.app
        self._send_json(200, {"ok": True, "tools": app.tools, "server": app.describe()})

    def _create(self, tool: str, received_at: float) -> None:
        app = self.server.app
        body: Any = None
        try:
            body = self._read_json()
            if tool not in app.tools:
                raise self._unknown_tool(tool)
            req = parse_create(body)
            digest = request_digest(req.request)
        except HttpError as exc:
            # Logged so the refusal is visible, but it never touches resources.
            app.store.log_bad_request(
                received_at=received_at,
                http_status=exc.status,
                error=exc.message,
                tool=tool,
                **_salvage(body),
            )
            raise
        capability = app.tools[tool]
        fault = app.faults.take(tool, _CREATE_MODES, req.run_id)
        mode = fault.mode if fault else None
        if fault is not None and mode in ("arrive_late", "arrive_held"):
            # Still on the network: the tool has not seen it, so it is in no
            # log and a query meanwhile finds nothing, not even in progress.
            # arrive_held: until the harness releases it (POST /admin/release)
            # once the state it waits for is there, whatever the machine's
            # load, or its ms (the bound) passed.
            if mode == "arrive_held":
                max_ms = DEFAULT_HANG_MS if fault.ms is None else fault.ms
                held = Hung(-next(_HELD), tool, req.operation_id, time.time(), max_ms)
                app.faults.hang(held, app.stopping)
                if held.dropped:
                    # Lost on the network: the tool never sees it (no log, no
                    # resource), and the caller gets no answer.
                    self.close_connection = True
                    self.log_message(
                        '"%s" lost on the network (released with drop)', self.requestline
                    )
                    return
            else:
                app.stopping.wait((fault.ms or 0) / 1000)
            if app.stopping.is_set():
                raise HttpError(503, "the tool is shutting down; nothing was done", "stopping")
            received_at = time.time()
        seq = app.store.begin_request(
            received_at=received_at,
            tool=tool,
            capability=capability,
            operation_id=req.operation_id,
            run_id=req.run_id,
            epoch=req.epoch,
            body_digest=digest,
            fault_id=fault.fault_id if fault else None,
            fault_mode=mode,
            callback_url=req.callback_url,
        )
        if fault is not None and mode == "delay":
            app.stopping.wait((fault.ms or 0) / 1000)
        elif fault is not None and mode == "hang":
            max_ms = DEFAULT_HANG_MS if fault.ms is None else fault.ms
            app.faults.hang(Hung(seq, tool, req.operation_id, time.time(), max_ms), app.stopping)
        if app.stopping.is_set():
            app.store.finish_without_act(seq, "interrupted", 503, "the tool was stopping")
            raise HttpError(503, "the tool is shutting down; nothing was done", "stopping")
        if mode == "reject_429":
            app.store.finish_without_act(seq, "rejected_429", 429, "injected fault")
            self._send_json(
                429,
                {
                    "error": "rate limited (injected fault); nothing was done, retry later",
                    "code": "rate_limited",
                    "retry_after_ms": 100,
                },
            )
            return
        if mode == "reject_final":
            app.store.finish_without_act(seq, "rejected_final", 422, "injected fault")
            self._send_json(
                422,
                {
                    "error": "rejected (injected fault); nothing was done and it never will be",
                    "code": "rejected",
                },
            )
            return
        after: After = _AFTER_OF.get(mode or "", "answer")
        result = app.store.act(
            seq,
            tool=tool,
            capability=capability,
            operation_id=req.operation_id,
            run_id=req.run_id,
            epoch=req.epoch,
            body_digest=digest,
            request=req.request,
            retention_s=app.retention_s,
            after=after,
            other_body=mode == "conflict_other_body",
        )
        if result.created and req.callback_url is not None and result.resource_id:
            delay_ms = req.callback_delay_ms
            if fault is not None and mode == "slow_callback":
                delay_ms = fault.ms or 0
            app.callbacks.schedule(
                CallbackJob(
                    tool,
                    req.operation_id,
                    req.run_id,
                    req.epoch,
                    result.resource_id,
                    req.callback_url,
                    delay_ms,
                )
            )
        if after == "drop":
            # Acted and logged; now close without a byte of answer.
            self.close_connection = True
            self.log_message('"%s" acted, then dropped without answer (fault)', self.requestline)
            return
        if after == "5xx":
            self._send_json(
                500,
                {"error": "internal error (injected after the tool acted)", "code": "injected_5xx"},
            )
            return
        if after == "503":
            # A gateway's "come back later", although the tool behind it acted:
            # no proof of anything, unlike a 429.
            self._send_json(
                503,
                {
                    "error": "service unavailable (injected after the tool acted)",
                    "code": "injected_503",
                },
            )
            return
        if after == "accepted":
            # Acted and logged; the answer carries no result: only a later query has it.
            self._send_json(
                202, {"operation_id": req.operation_id, "status": "accepted", "seq": seq}
            )
            return
        if after == "late":
            # Acted and logged; the answer waits, past the caller's timeout if it
            # is shorter. A stopping tool closes without answering instead.
            assert fault is not None
            if app.stopping.wait((fault.ms or 0) / 1000):
                self.close_connection = True
                return
            with contextlib.suppress(StoreClosed):
                app.store.mark_answered(seq)
        common = {"operation_id": req.operation_id, "resource_id": result.resource_id, "seq": seq}
        if result.base == "created":
            self._send_json(201, {**common, "replayed": False})
        elif result.base == "replayed":
            self._send_json(200, {**common, "replayed": True})
        elif result.base in ("conflict", "conflict_other_body"):
            same = result.resource is not None and result.resource["body_digest"] == digest
            self._send_json(
                409,
                {
                    **common,
                    "error": "conflict",
                    "message": "a resource with this deterministic id already exists;"
                    " nothing new was created",
                    "same_request": same,
                    "resource": result.resource,
                },
            )
        else:
            self._send_json(
                422,
                {
                    **common,
                    "error": "idempotency key reused with a different request; nothing was done",
                    "code": "key_reuse",
                },
            )

    def _query(self, tool: str, operation_id: str, received_at: float) -> None:
        app = self.server.app
        if tool not in app.tools:
            raise self._unknown_tool(tool)
        log = app.store.log_query
        if app.tools[tool] == "none":
            log(
                received_at=received_at,
                tool=tool,
                operation_id=operation_id,
                outcome="unsupported",
                resource_id=None,
                http_status=501,
            )
            raise HttpError(501, "query not supported by this tool", "query_unsupported")
        found = app.store.find_resources(tool, operation_id)
        # An idempotent tool looks operations up by their key, which it keeps
        # for its retention window only: past it the tool no longer knows.
        forgotten = bool(found) and app.tools[tool] == "idempotent"
        forgotten = forgotten and not app.store.key_remembered(tool, operation_id)
        if not found or forgotten:
            log(
                received_at=received_at,
                tool=tool,
                operation_id=operation_id,
                outcome="not_found",
                resource_id=None,
                http_status=404,
            )
            self._send_json(
                404,
                {
                    "error": "not_found",
                    "operation_id": operation_id,
                    # A create of it arrived and is not finished (a hung request):
                    # "not found" is then no proof that it will not happen.
                    "in_progress": app.store.in_progress(tool, operation_id),
                    "retention_s": app.retention_s if app.tools[tool] == "idempotent" else None,
                },
            )
            return
        first = found[0]
        log(
            received_at=received_at,
            tool=tool,
            operation_id=operation_id,
            outcome="found",
            resource_id=first["resource_id"],
            http_status=200,
        )
        self._send_json(
            200,
            {
                "operation_id": operation_id,
                "resource_id": first["resource_id"],
                "status": "succeeded",
                "run_id": first["run_id"],
                "epoch": first["epoch"],
                "created_at": first["created_at"],
                "created_at_iso": first["created_at_iso"],
                "body_digest": first["body_digest"],
                "tool": tool,
                # A non-idempotent tool may hold several: never hide duplicates.
                "resource_ids": [r["resource_id"] for r in found],
                "count": len(found),
            },
        )

    def _set_fault(self) -> None:
        app = self.server.app
        body = self._read_json()
        if not isinstance(body, dict):
            raise _bad('body must be a JSON object like {"tool": "idem", "mode": "hang"}')
        tool = body.get("tool")
        mode = body.get("mode")
        if tool == BROKER:
            if mode not in _BROKER_MODES:
                raise _bad(
                    f"the broker's field 'mode' must be one of: {', '.join(_BROKER_MODES)};"
                    f" got {json.dumps(mode)}"
                )
        elif not isinstance(tool, str) or (tool != "*" and tool not in app.tools):
            known = ", ".join(sorted(app.tools))
            raise _bad(
                f"field 'tool' must be '*', {BROKER!r} or one of: {known}; got {json.dumps(tool)}"
            )
        elif mode not in FAULT_MODES:
            raise _bad(
                f"field 'mode' of a tool's fault must be one of: {', '.join(FAULT_MODES)}"
                f" (the broker's modes take tool {BROKER!r}); got {json.dumps(mode)}"
            )
        count, skip = body.get("count", 1), body.get("skip", 0)
        if not _is_int(count) or count < 0:
            raise _bad(
                f"field 'count' must be an integer >= 0 (0 = until cleared), got {json.dumps(count)}"
            )
        if not _is_int(skip) or skip < 0:
            raise _bad(
                "field 'skip' must be an integer >= 0 (matching requests let pass before the"
                f" fault fires), got {json.dumps(skip)}"
            )
        ms = _opt_ms(body, "ms")
        if mode in MODES_WITH_MS and ms is None:
            raise _bad(f"mode {mode!r} needs field 'ms' (milliseconds)")
        run_id = body.get("run_id")
        if run_id is not None and (tool == BROKER or not isinstance(run_id, str) or not run_id):
            raise _bad(
                "field 'run_id' (a tool's fault for one run's creates only) must be a non-empty"
                f" string, and the broker's faults take none; got {json.dumps(run_id)}"
            )
        fault = app.faults.add(tool, str(mode), int(count), ms, int(skip), run_id)
        self._send_json(200, fault.describe())

    def _clear_faults(self) -> None:
        self._send_json(200, {"cleared": self.server.app.faults.clear()})

    def _list_faults(self) -> None:
        self._send_json(200, self.server.app.faults.describe())

    def _release(self) -> None:
        body = self._read_json() if self._body else {}
        drop = body.get("drop", False) if isinstance(body, dict) else None
        if not isinstance(drop, bool):
            raise _bad('release takes {"drop": true|false} (default false)')
        self._send_json(200, {"released": self.server.app.faults.release(drop=drop)})

    def _export(self) -> None:
        app = self.server.app
        out: dict[str, Any] = dict(app.store.export())
        out["tools"] = app.tools
        out["faults"] = app.faults.describe()["history"]
        out["server"] = app.describe()
        out["exported_at"] = time.time()
        out["exported_at_iso"] = iso(out["exported_at"])
        self._send_json(200, out)

    def _publish(self) -> None:
        app = self.server.app
        body = self._read_json()
        if not isinstance(body, dict):
            raise _bad('body must be a JSON object {"event_id", "topic", "payload"}')
        event_id = _nonempty_str(body, "event_id")
        topic = _nonempty_str(body, "topic")
        if "payload" not in body:
            raise _bad("missing field 'payload' (any JSON value)")
        answer = broker.publish(
            app.store, app.faults, app.stopping, event_id, topic, body["payload"]
        )
        self._send_json(answer.status, answer.body)

    def _callback_now(self) -> None:
        """Issue the callback of an operation's resource now, for the caller to
        relay (the tool's own record, logged as an attempt with url ``relay``)."""
        app = self.server.app
        body = self._read_json()
        if not isinstance(body, dict):
            raise _bad('body must be a JSON object {"tool", "operation_id"}')
        tool = _nonempty_str(body, "tool")
        if tool not in app.tools:
            raise self._unknown_tool(tool)
        operation_id = _nonempty_str(body, "operation_id")
        found = app.store.find_resources(tool, operation_id)
        if not found:
            raise HttpError(
                404, f"the tool holds no resource for {operation_id!r}: no callback", "not_found"
            )
        job = CallbackJob(
            tool,
            operation_id,
            found[0]["run_id"],
            int(found[0]["epoch"]),
            found[0]["resource_id"],
            RELAY_URL,
            0,
        )
        callback_id = app.callbacks.relay(job)
        self._send_json(
            200, {"callback_id": callback_id, "payload": {**job.payload(), "attempt": 1}}
        )

    def _messages(self, query: str) -> None:
        params = parse_qs(query)

        def number(name: str, default: int | None) -> int | None:
            values = params.get(name)
            if not values:
                return default
            wanted = f"query parameter {name!r} must be an integer from 0 to {MAX_SQLITE_INTEGER}"
            try:
                value = int(values[-1])
            except ValueError:
                raise _bad(wanted) from None
            if not 0 <= value <= MAX_SQLITE_INTEGER:
                raise _bad(wanted)
            return value

        after = number("after", 0) or 0
        limit = number("limit", None)
        app = self.server.app
        self._send_json(200, {"messages": broker.deliver(app.store, app.faults, after, limit)})


# -- command line -------------------------------------------------------


def parse_tools(specs: Sequence[str] | None) -> dict[str, str]:
    """``NAME=CAPABILITY`` options to a tool map; raises ValueError saying what to fix."""
    if not specs:
        return dict(DEFAULT_TOOLS)
    tools: dict[str, str] = {}
    for spec in specs:
        name, sep, capability = spec.partition("=")
        if not sep:
            raise ValueError(f"--tool {spec!r}: write NAME=CAPABILITY, e.g. --tool pay=idempotent")
        if not _TOOL_NAME.match(name) or name in _RESERVED_NAMES:
            raise ValueError(f"--tool {spec!r}: name must match [A-Za-z0-9_.-]{{1,64}}")
        if capability not in CAPABILITIES:
            raise ValueError(
                f"--tool {spec!r}: capability must be one of {', '.join(CAPABILITIES)}"
            )
        if name in tools:
            raise ValueError(f"--tool {spec!r}: tool {name!r} given twice")
        tools[name] = capability
    return tools


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mock_tool.server",
        description="Mock external tool with its own durable request log (docs/mock-tool.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument(
        "--storage", required=True, help="directory for the SQLite log (created if missing)"
    )
    parser.add_argument(
        "--tool",
        action="append",
        metavar="NAME=CAPABILITY",
        help=f"a tool to offer (repeatable); capabilities: {', '.join(CAPABILITIES)};"
        " default: " + " ".join(f"{k}={v}" for k, v in DEFAULT_TOOLS.items()),
    )
    parser.add_argument(
        "--idempotency-retention-s",
        type=float,
        default=DEFAULT_RETENTION_S,
        help="how long an idempotent tool remembers an operation_id (default one day)",
    )
    parser.add_argument(
        "--callback-attempts",
        type=int,
        default=3,
        help="delivery attempts per callback when the receiver fails (default 3)",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="shut down when the parent process dies (used by mock_tool.process)",
    )
    return parser


def _fail(message: str) -> int:
    print(f"mock_tool: error: {message}", file=sys.stderr, flush=True)
    return 2


def _lock_storage(storage: Path) -> IO[str]:
    """Hold an exclusive lock on the storage dir for the process lifetime.

    Two servers on one log would make it worthless as evidence. The kernel
    drops the lock when the process dies, so a restart after SIGKILL works.
    """
    handle = (storage / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RuntimeError(
            f"storage directory {storage} is in use by another mock_tool (pid {holder});"
            " stop that process or pass a different --storage"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class ServeError(RuntimeError):
    """A tool could not be opened; the message says what to fix."""


@dataclass
class Served:
    """One tool serving: its app, its HTTP server, the lock on its storage."""

    app: App
    httpd: MockToolServer
    lock: IO[str]

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    def serve(self) -> None:
        """Serve until :meth:`close` (or a signal handler's shutdown)."""
        self.httpd.serve_forever(poll_interval=0.02)

    def stop(self) -> None:
        """Refuse new work, let held faults go, and stop serving (from any
        thread but the serving one)."""
        self.app.stopping.set()
        self.app.faults.release()
        self.httpd.shutdown()

    def close(self) -> None:
        """After serving ended: finish what is being answered, then release
        the socket, the log and the storage lock."""
        self.app.stopping.set()
        self.app.faults.release()
        self.app.drain(timeout_s=3.0)
        self.httpd.server_close()
        self.app.store.close()
        self.lock.close()


def open_tool(
    storage: Path,
    tools: dict[str, str],
    retention_s: float,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    callback_attempts: int = 3,
    log: IO[str] | None = None,
) -> Served:
    """Lock ``storage``, open its log and bind the HTTP server (not serving
    yet); ServeError says what to fix."""
    storage = storage.resolve()
    try:
        storage.mkdir(parents=True, exist_ok=True)
        lock = _lock_storage(storage)
    except RuntimeError as exc:
        raise ServeError(str(exc)) from exc
    except OSError as exc:
        raise ServeError(
            f"cannot use storage directory {storage}: {exc}; pass a writable --storage"
        ) from exc
    try:
        store = Store(storage)
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        lock.close()
        raise ServeError(f"cannot open the log in {storage}: {exc}") from exc
    app = App(store, tools, retention_s, storage, callback_attempts, log=log)
    try:
        httpd = MockToolServer((host, port), app)
    except OSError as exc:
        store.close()
        lock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is already in use; stop whatever holds it,"
                " pick another --port, or use --port 0 for a free one"
            ) from exc
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from exc
    store.start_boot(os.getpid(), tools, retention_s)
    return Served(app, httpd, lock)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; exit 0 clean, 2 on bad options."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with usage on a bad option
    try:
        tools = parse_tools(args.tool)
    except ValueError as exc:
        parser.error(str(exc))
    if args.idempotency_retention_s < 0:
        parser.error("--idempotency-retention-s must be >= 0")
    if args.callback_attempts < 1:
        parser.error("--callback-attempts must be >= 1")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")

    try:
        served = open_tool(
            Path(args.storage),
            tools,
            args.idempotency_retention_s,
            host=args.host,
            port=args.port,
            callback_attempts=args.callback_attempts,
        )
    except ServeError as exc:
        return _fail(str(exc))
    app, httpd = served.app, served.httpd

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        if app.stopping.is_set():
            return
        print(f"mock_tool: signal {signum}, shutting down", file=sys.stderr, flush=True)
        app.stopping.set()
        app.faults.release()
        # shutdown() blocks until serve_forever returns: never call it on the serving thread.
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.exit_with_parent:
        parent = os.getppid()

        def watch_parent() -> None:
            while not app.stopping.wait(0.2):
                if os.getppid() != parent:  # re-parented: our owner died
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    print(f"{LISTENING_PREFIX}http://{args.host}:{httpd.server_port}", flush=True)
    try:
        served.serve()
    finally:
        served.close()
    print("mock_tool: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
