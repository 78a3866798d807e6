"""Worker-side client for injection points and the event history.

Imported by the reference worker (and by any Python worker under test), so it
depends on the standard library only and never imports the rest of `harness`.
The wire format it speaks is documented in docs/control-protocol.md.

Invariants:
- Outside the harness (`FENCECHECK_CONTROL` / `FENCECHECK_EVENTS` unset)
  `point()` and `record()` do nothing, and after the first call cost a
  function call and two global reads: the environment is read once, cached.
- Inside the harness, `point()` makes one connection, writes one line, reads
  one line and obeys it. A hold is simply the harness not answering yet, so
  the read has no timeout of its own (the harness bounds every hold).
- A control socket that cannot be reached, or a connection closed without an
  answer, is reported on stderr and the worker goes on: never silently.
- `record()` appends each event as one line in one `os.write` on an O_APPEND
  descriptor, so lines from several threads or processes never interleave
  and a SIGKILL can at worst tear the very last line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

CONTROL_ENV = "FENCECHECK_CONTROL"
EVENTS_ENV = "FENCECHECK_EVENTS"
WORKER_ENV = "FENCECHECK_WORKER_ID"
PROTOCOL_VERSION = 1
EVENT_TYPES = frozenset({"invoke", "ok", "fail", "info"})
# Bounded so a wedged harness cannot hang a worker before it is even held.
CONNECT_TIMEOUT_S = 5.0
MAX_REPLY_BYTES = 65536

_loaded = False
_control: str | None = None
_events_path: str | None = None
_worker = ""
_events_fd: int | None = None
_lock = threading.Lock()


def reload_environment() -> None:
    """Re-read the environment (tests change it in-process; workers never need to)."""
    global _loaded, _control, _events_path, _worker, _events_fd
    with _lock:
        if _events_fd is not None:
            os.close(_events_fd)
        _control = os.environ.get(CONTROL_ENV) or None
        _events_path = os.environ.get(EVENTS_ENV) or None
        _worker = os.environ.get(WORKER_ENV, "")
        _events_fd = None
        _loaded = True


def active() -> bool:
    """True when injection points talk to a harness."""
    if not _loaded:
        reload_environment()
    return _control is not None


def _warn(message: str) -> None:
    sys.stderr.write(f"fencecheck.injection: {message}\n")
    sys.stderr.flush()


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def point(
    name: str,
    *,
    run_id: object = None,
    epoch: int | None = None,
    revision: int | None = None,
    operation_id: object = None,
) -> None:
    """Announce injection point `name` and obey the harness's answer.

    Returns when told to continue (at once, or after a delay); never returns
    when told to crash. No-op outside the harness.
    """
    if not _loaded:
        reload_environment()
    control = _control
    if control is None:
        return
    message = {
        "v": PROTOCOL_VERSION,
        "type": "point",
        "point": name,
        "worker": _worker,
        "pid": os.getpid(),
        "run_id": _text(run_id),
        "epoch": epoch,
        "revision": revision,
        "operation_id": _text(operation_id),
    }
    reply = _exchange(control, name, json.dumps(message, separators=(",", ":")) + "\n")
    if reply is not None:
        _obey(name, reply)


def _exchange(path: str, name: str, line: str) -> dict[str, Any] | None:
    """One connection, one line out, one line in; None (after a warning) on any failure."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        _warn(f"point {name}: cannot create a socket: {exc}; continuing")
        return None
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
        sock.sendall(line.encode())
        sock.settimeout(None)  # a hold lasts as long as the harness wants
        data = b""
        while b"\n" not in data and len(data) < MAX_REPLY_BYTES:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        _warn(f"point {name}: control socket {path} unreachable: {exc}; continuing")
        return None
    finally:
        sock.close()
    if b"\n" not in data:
        _warn(f"point {name}: harness closed the connection without an answer; continuing")
        return None
    try:
        reply = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        _warn(f"point {name}: unreadable answer {data[:200]!r}; continuing")
        return None
    if not isinstance(reply, dict):
        _warn(f"point {name}: answer is not an object: {reply!r}; continuing")
        return None
    return reply


def _obey(name: str, reply: dict[str, Any]) -> None:
    action = reply.get("action")
    if action == "continue":
        return
    if action == "delay":
        ms = reply.get("ms")
        if isinstance(ms, int | float) and ms >= 0:
            time.sleep(ms / 1000.0)
        else:
            _warn(f"point {name}: delay without a valid 'ms': {reply!r}; continuing")
        return
    if action == "crash":
        # No cleanup, no flush, no rollback: exactly what a power cut does.
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)  # unreachable unless SIGKILL is somehow not delivered
    _warn(f"point {name}: unknown action in {reply!r}; continuing")


def _events_descriptor() -> int | None:
    global _events_fd
    if _events_fd is None and _events_path is not None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        _events_fd = os.open(_events_path, flags, 0o644)
    return _events_fd


def record(
    type: str,
    op: str,
    *,
    run_id: object = None,
    epoch: int | None = None,
    revision: int | None = None,
    operation_id: object = None,
    event_id: object = None,
    error: BaseException | str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one history event (worker contract section 4); no-op outside the harness.

    `type` is invoke / ok / fail / info. `error` may be an exception, whose
    class name is recorded. Values that are not JSON (UUIDs, datetimes) are
    written with str().
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {sorted(EVENT_TYPES)}, not {type!r}")
    if not _loaded:
        reload_environment()
    if _events_path is None:
        return
    if isinstance(error, BaseException):
        error = error.__class__.__name__
    event = {
        "time": time.time(),
        "worker": _worker,
        "pid": os.getpid(),
        "type": type,
        "op": op,
        "run_id": _text(run_id),
        "epoch": epoch,
        "revision": revision,
        "operation_id": _text(operation_id),
        "event_id": _text(event_id),
        "error": error,
        "detail": detail or {},
    }
    data = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
    with _lock:
        try:
            fd = _events_descriptor()
            if fd is None:
                return
            written = os.write(fd, data)
        except OSError as exc:
            _warn(f"cannot append to event history {_events_path}: {exc}")
            return
    if written != len(data):
        _warn(f"short write to event history {_events_path}: {written} of {len(data)} bytes")
