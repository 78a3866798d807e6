"""Harness side of the control protocol: injection-point barriers.

A worker that reaches an injection point connects to this server's Unix
socket, sends one JSON line and waits for one line back (worker contract,
section 3; wire details in docs/control-protocol.md). Experiments `arm` an
action per (worker, point) before the race they want to force, then
`wait_reached` and `release` instead of sleeping: races are forced by
barriers, not left to timing.

Invariants:
- Every hit is journaled before it is answered, with the time the harness
  received it and the connecting pid as the *kernel* reports it
  (SO_PEERCRED), so "the barrier was reached" is harness-observed evidence,
  not the worker's word, even when the answer is a crash.
- An unarmed point answers continue at once; arms are consumed in the order
  they were made, a worker-specific arm before an `ANY_WORKER` one.
- A held connection is answered exactly once: by `release`, or closed by
  `release_all`/`close`, or closed when `hold_timeout_s` runs out (the hit
  then says "expired"); a worker never waits on a server that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from harness.parts.os_user import OsUser, first_untraversable

ANY_WORKER = "*"
READ_TIMEOUT_S = 5.0
# The serving loop wakes at least this often to notice close() and expire holds.
LOOP_TICK_S = 0.1
DEFAULT_HOLD_TIMEOUT_S = 120.0
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class ControlError(Exception):
    """The control server could not do what was asked."""


class ControlTimeout(ControlError, TimeoutError):
    """A barrier was not reached in time; the message lists what was reached."""


@dataclass(frozen=True)
class Continue:
    """Answer `continue` at once."""

    def reply(self) -> dict[str, Any]:
        return {"action": "continue"}

    def label(self) -> str:
        return "continue"


@dataclass(frozen=True)
class Hold:
    """Do not answer until `release()`: the worker blocks at the point."""

    def reply(self) -> dict[str, Any]:
        raise ControlError("Hold has no reply of its own; release with Continue, Crash or Delay")

    def label(self) -> str:
        return "hold"


@dataclass(frozen=True)
class Crash:
    """Tell the worker to SIGKILL itself at the point."""

    def reply(self) -> dict[str, Any]:
        return {"action": "crash"}

    def label(self) -> str:
        return "crash"


@dataclass(frozen=True)
class Delay:
    """Tell the worker to sleep `ms` milliseconds, then go on."""

    ms: int

    def reply(self) -> dict[str, Any]:
        return {"action": "delay", "ms": self.ms}

    def label(self) -> str:
        return f"delay {self.ms}ms"


Action = Continue | Hold | Crash | Delay


@dataclass(frozen=True)
class Hit:
    """One arrival of a worker at an injection point, as the harness saw it.

    `pid` is what the worker wrote; `peer_pid`/`peer_uid` are what the kernel
    says about the connecting process. `action` is what the harness decided;
    for a hold, `released_at`/`released_with` say how the hold ended
    ("continue", "crash", "delay 500ms", "closed", "expired").
    """

    seq: int
    received_at: float
    worker: str
    pid: int | None
    peer_pid: int | None
    peer_uid: int | None
    point: str
    run_id: str | None
    epoch: int | None
    revision: int | None
    operation_id: str | None
    action: str
    released_at: float | None = None
    released_with: str | None = None


@dataclass
class _Arm:
    action: Action
    remaining: int | None  # None: every hit until disarmed


@dataclass
class _Reading:
    """A connection whose message is not read whole yet."""

    peer_pid: int | None
    peer_uid: int | None
    deadline: float  # monotonic: no whole line by then is a protocol error
    data: bytes = b""


@dataclass
class _Held:
    seq: int
    conn: socket.socket
    since: float


def _peer_credentials(conn: socket.socket) -> tuple[int | None, int | None]:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None, None
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


class ControlServer:
    """Unix-socket server answering injection points; one thread serves every connection.

    Use as a context manager; `close()` stops accepting, closes every held
    connection and removes the socket file.
    """

    def __init__(
        self,
        directory: Path,
        *,
        socket_name: str = "control.sock",
        worker_user: OsUser | None = None,
        hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S,
        on_gap: Callable[[float, str | None], None] | None = None,
    ) -> None:
        self.socket_path = Path(directory) / socket_name
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ControlError(
                f"control socket path is {len(os.fsencode(self.socket_path))} bytes, over the "
                f"{MAX_SOCKET_PATH}-byte limit of a Unix socket: {self.socket_path} (use a shorter "
                f"temporary directory)"
            )
        if worker_user is not None:
            blocked = first_untraversable(self.socket_path.parent, worker_user)
            if blocked is not None:
                raise ControlError(
                    f"workers run as {worker_user.name!r}, which cannot enter {blocked} "
                    f"to reach the control socket {self.socket_path}"
                )
        self.worker_user = worker_user
        self.hold_timeout_s = hold_timeout_s
        self._cond = threading.Condition(threading.RLock())
        self._arms: dict[tuple[str, str], deque[_Arm]] = {}
        self._hits: list[Hit] = []
        self._held: dict[tuple[str, str], deque[_Held]] = {}
        self._cursors: dict[tuple[str, str], int] = {}
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._aborted: str | None = None
        # Told how late the server answered (its accept loop woke late, or a
        # hit whose answer is immediate took long: then which worker waited):
        # the harness was stalled.
        self._on_gap = on_gap
        self.protocol_errors: list[str] = []

    # -- lifecycle -------------------------------------------------------

    def start(self) -> Self:
        if self._listener is not None:
            raise ControlError(f"control server at {self.socket_path} already started")
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from a crashed run
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        if self.worker_user is not None and os.geteuid() == 0:
            os.chown(self.socket_path, self.worker_user.uid, self.worker_user.gid)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"control-accept:{self.socket_path.name}", daemon=True
        )
        self._accept_thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, close held connections, join threads, remove the socket."""
        self._closing.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5.0)
        if self._listener is not None:
            self._listener.close()
        self.release_all()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> Self:
        if self._listener is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def accept_tid(self) -> int | None:
        """The kernel's id of the thread that accepts hits (its run-queue delay
        is how late the harness wakes to a worker's connect)."""
        thread = self._accept_thread
        return thread.native_id if thread is not None else None

    @property
    def env(self) -> dict[str, str]:
        """What a worker needs in its environment to talk to this server."""
        return {"FENCECHECK_CONTROL": str(self.socket_path)}

    # -- arming ----------------------------------------------------------

    def arm(self, worker: str, point: str, action: Action, *, times: int | None = 1) -> None:
        """Queue `action` for the next `times` hits of `point` by `worker`.

        `worker` may be ANY_WORKER; `times=None` applies it to every hit
        until `disarm`.
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None, not {times}")
        with self._cond:
            self._arms.setdefault((worker, point), deque()).append(_Arm(action, times))

    def disarm(self, worker: str, point: str) -> None:
        """Drop every arm for (worker, point); held connections stay held."""
        with self._cond:
            self._arms.pop((worker, point), None)

    def _take_action(self, worker: str, point: str) -> Action:
        for key in ((worker, point), (ANY_WORKER, point)):
            queue = self._arms.get(key)
            if not queue:
                continue
            arm = queue[0]
            if arm.remaining is not None:
                arm.remaining -= 1
                if arm.remaining == 0:
                    queue.popleft()
            return arm.action
        return Continue()

    # -- serving -----------------------------------------------------------

    def _accept_loop(self) -> None:
        """Accept, read and answer every hit in this one thread. A worker at a
        point inside its own write waits for the answer while that write
        holds the run's row: a thread started per hit made it wait for a new
        thread to be scheduled as well, 0.2 s in a 0.3 s renewal timeout on a
        loaded machine. The message is nearly always in the socket when the
        connect is accepted, so most hits are answered in one wake-up."""
        listener = self._listener
        assert listener is not None
        tick = LOOP_TICK_S
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ, None)
        reading: dict[socket.socket, _Reading] = {}
        last = time.monotonic()
        last_sweep = last
        try:
            while not self._closing.is_set():
                try:
                    events = selector.select(timeout=tick)
                except OSError:
                    if self._closing.is_set():
                        return
                    raise
                woke = time.monotonic()
                if not events:
                    self._gap(woke - last - tick)  # it woke late: the harness did not run
                last = woke
                for key, _ in events:
                    if key.data is None:
                        self._accept_all(listener, selector, reading, woke)
                    else:
                        self._read(key.fileobj, selector, reading, woke)  # type: ignore[arg-type]
                if woke - last_sweep >= tick:
                    last_sweep = woke
                    self._expire_holds()
                    self._drop_slow_readers(selector, reading, woke)
        finally:
            for conn in list(reading):
                conn.close()
            selector.close()

    def _accept_all(
        self,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        reading: dict[socket.socket, _Reading],
        woke: float,
    ) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                if self._closing.is_set():
                    return
                raise
            conn.setblocking(False)
            peer_pid, peer_uid = _peer_credentials(conn)
            reading[conn] = _Reading(peer_pid, peer_uid, woke + READ_TIMEOUT_S)
            selector.register(conn, selectors.EVENT_READ, True)
            self._read(conn, selector, reading, woke)  # usually already there

    def _read(
        self,
        conn: socket.socket,
        selector: selectors.BaseSelector,
        reading: dict[socket.socket, _Reading],
        woke: float,
    ) -> None:
        state = reading.get(conn)
        if state is None:
            return
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._done_reading(conn, selector, reading)
            self._protocol_error(f"read from pid {state.peer_pid} failed: {exc!r}", conn)
            return
        state.data += chunk
        if chunk and b"\n" not in state.data and len(state.data) < 65536:
            return  # more to come
        self._done_reading(conn, selector, reading)
        conn.setblocking(True)
        conn.settimeout(READ_TIMEOUT_S)
        self._serve_one(conn, state, woke)

    @staticmethod
    def _done_reading(
        conn: socket.socket,
        selector: selectors.BaseSelector,
        reading: dict[socket.socket, _Reading],
    ) -> None:
        reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)

    def _drop_slow_readers(
        self, selector: selectors.BaseSelector, reading: dict[socket.socket, _Reading], now: float
    ) -> None:
        for conn, state in list(reading.items()):
            if now >= state.deadline:
                self._done_reading(conn, selector, reading)
                self._protocol_error(
                    f"read from pid {state.peer_pid} failed: no whole line within "
                    f"{READ_TIMEOUT_S}s (got {state.data[:300]!r})",
                    conn,
                )

    def _gap(self, late_s: float, worker: str | None = None) -> None:
        if self._on_gap is not None and late_s > 0:
            self._on_gap(late_s, worker)

    def _serve_one(self, conn: socket.socket, state: _Reading, woke: float) -> None:
        """Answer one hit read whole; ``woke`` is when the loop woke to it."""
        peer_pid, peer_uid, data = state.peer_pid, state.peer_uid, state.data
        received_at = time.time()
        try:
            msg = json.loads(data.split(b"\n", 1)[0])
            if not isinstance(msg, dict) or msg.get("type") != "point":
                raise ValueError("not a point message")
            point = str(msg["point"])
            worker = str(msg.get("worker") or "")
        except (ValueError, KeyError) as exc:
            # No answer: the worker warns on stderr and goes on; we keep the evidence.
            self._protocol_error(f"bad message from pid {peer_pid}: {data[:300]!r} ({exc})", conn)
            return
        with self._cond:
            action = self._take_action(worker, point)
            hit = Hit(
                seq=len(self._hits),
                received_at=received_at,
                worker=worker,
                pid=_opt_int(msg.get("pid")),
                peer_pid=peer_pid,
                peer_uid=peer_uid,
                point=point,
                run_id=_opt_str(msg.get("run_id")),
                epoch=_opt_int(msg.get("epoch")),
                revision=_opt_int(msg.get("revision")),
                operation_id=_opt_str(msg.get("operation_id")),
                action=action.label(),
            )
            self._hits.append(hit)
            if isinstance(action, Hold):
                held = _Held(hit.seq, conn, received_at)
                self._held.setdefault((worker, point), deque()).append(held)
            self._cond.notify_all()
        if isinstance(action, Hold):
            return  # the connection now belongs to release()/release_all()
        with contextlib.suppress(OSError):
            conn.sendall((json.dumps(action.reply()) + "\n").encode())
        conn.close()
        # From the wake-up to the answer sent is the harness's time alone (well
        # under a millisecond): taking long means it was not running, and the
        # worker waited that long at its point.
        self._gap(time.monotonic() - woke, worker)

    def _protocol_error(self, text: str, conn: socket.socket) -> None:
        with self._cond:
            self.protocol_errors.append(text)
        conn.close()

    def _expire_holds(self) -> None:
        now = time.time()
        with self._cond:
            for queue in self._held.values():
                while queue and now - queue[0].since > self.hold_timeout_s:
                    self._finish_hold(queue.popleft(), None, "expired")

    def _finish_hold(self, held: _Held, action: Action | None, label: str) -> str | None:
        """Answer (or just close) one held connection; returns a send error, if any."""
        error: str | None = None
        if action is not None:
            try:
                held.conn.sendall((json.dumps(action.reply()) + "\n").encode())
            except OSError as exc:
                error = f"{exc!r}"
                label = f"{label} (not delivered: {exc.__class__.__name__})"
        with contextlib.suppress(OSError):
            held.conn.close()
        with self._cond:
            self._hits[held.seq] = replace(
                self._hits[held.seq], released_at=time.time(), released_with=label
            )
            self._cond.notify_all()
        return error

    # -- barriers ----------------------------------------------------------

    def wait_reached(self, worker: str, point: str, timeout_s: float) -> Hit:
        """The next hit of `point` by `worker` not returned by an earlier call.

        Returns at once if it already happened. `worker` may be ANY_WORKER.
        Raises ControlTimeout naming worker, point and timeout, and listing
        the points that worker did reach.
        """
        deadline = time.monotonic() + timeout_s
        key = (worker, point)
        with self._cond:
            while True:
                start = self._cursors.get(key, -1) + 1
                for hit in self._hits[start:]:
                    if hit.point == point and worker in (ANY_WORKER, hit.worker):
                        self._cursors[key] = hit.seq
                        return hit
                # Nothing after the cursor matched; do not scan it again.
                self._cursors[key] = max(self._cursors.get(key, -1), len(self._hits) - 1)
                if self._aborted is not None:
                    raise ControlError(
                        f"{self._aborted}: stopped waiting for worker {worker!r} at {point!r}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControlTimeout(
                        f"worker {worker!r} did not reach point {point!r} within {timeout_s}s; "
                        f"{self._reached_summary(worker)}"
                    )
                self._cond.wait(remaining)

    def _reached_summary(self, worker: str) -> str:
        counts = Counter(h.point for h in self._hits if worker in (ANY_WORKER, h.worker))
        if not counts:
            return f"worker {worker!r} reached no point at all"
        listed = ", ".join(f"{p} x{n}" for p, n in counts.items())
        return f"points worker {worker!r} reached: {listed}"

    def release(self, worker: str, point: str, action: Action | None = None) -> Hit:
        """Answer the oldest connection held at (worker, point) with `action`.

        `action` defaults to Continue; Hold is refused. Raises ControlError
        if nothing is held there, or if the answer could not be delivered
        (the worker died while held); the journal records it either way.
        """
        action = action if action is not None else Continue()
        if isinstance(action, Hold):
            raise ControlError("release() needs Continue, Crash or Delay, not Hold")
        with self._cond:
            held: _Held | None = None
            for key, queue in self._held.items():
                matches = key[1] == point and worker in (ANY_WORKER, key[0]) and queue
                if matches and (held is None or queue[0].seq < held.seq):
                    held = queue[0]
            if held is None:
                raise ControlError(
                    f"nothing held at point {point!r} for worker {worker!r}; "
                    f"held now: {[(h.worker, h.point) for h in self.held()] or 'none'}"
                )
            hit = self._hits[held.seq]
            self._held[(hit.worker, hit.point)].popleft()
            error = self._finish_hold(held, action, action.label())
            released = self._hits[held.seq]
        if error is not None:
            raise ControlError(
                f"could not release worker {hit.worker!r} at {point!r} with "
                f"{action.label()}: {error}"
            )
        return released

    def abort(self, reason: str) -> None:
        """The run is stopping: every wait for a hit ends with ControlError(reason)
        and every held worker is let go (its connection closed)."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()
        self.release_all()

    def release_all(self) -> list[Hit]:
        """Close every held connection without an answer (teardown)."""
        with self._cond:
            held = [h for queue in self._held.values() for h in queue]
            self._held.clear()
            for h in held:
                self._finish_hold(h, None, "closed")
            return [self._hits[h.seq] for h in held]

    # -- evidence ----------------------------------------------------------

    def held(self) -> list[Hit]:
        """Hits whose connection is held right now, oldest first."""
        with self._cond:
            seqs = sorted(h.seq for queue in self._held.values() for h in queue)
            return [self._hits[s] for s in seqs]

    def hits(self, worker: str | None = None, point: str | None = None) -> list[Hit]:
        """The journal of every hit, in arrival order, optionally filtered."""
        with self._cond:
            return [
                h
                for h in self._hits
                if (worker in (None, ANY_WORKER, h.worker)) and (point in (None, h.point))
            ]
