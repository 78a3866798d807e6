"""Stop when told: one process-wide "stop requested" state.

``install()`` makes SIGINT, SIGTERM and SIGHUP set it (a terminal's Ctrl-C, a
CI runner's or container engine's stop, a closed terminal or dropped ssh).

* The first signal asks for an orderly stop. Nothing new starts: every start
  of a server, worker or experiment calls :func:`check`, every bounded wait
  polls :func:`requested`. What was registered with :func:`on_stop` runs at
  once on the watcher thread (it aborts the running experiments: kills their
  workers, releases their barriers). In the main thread, code inside
  :func:`interruptible` gets :class:`Interrupted` raised where it stands.
* A second signal, or an orderly stop that has not ended the process within
  ``HARD_DEADLINE_S`` of the first signal, escalates: what was registered with
  :func:`on_escalate` runs (kill everything the run started, remove its temp
  state, mark its reports interrupted) and the process exits at once with
  :func:`exit_status`.

Invariants: the signal handler itself only raises (in an interruptible
section of the main thread) or returns; every other step runs on the watcher
thread, woken by the byte ``signal.set_wakeup_fd`` writes, so no lock a
handler could interrupt is ever taken twice. The state only goes forward
(requested, then escalated); :func:`reset` exists for tests that run
in-process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# From the first signal to the forced exit: the orderly stop gets this long,
# the escalation the rest of the 5 s the harness promises.
HARD_DEADLINE_S = 3.0
# What the escalation itself may take (kill, remove, write) before the exit:
# what is left of the promised stop time after the first signal (a second
# signal soon after the first leaves it most of it: on a loaded machine the
# removal of a run's temp state takes seconds), never less than this; what
# it could not finish, the run record keeps for the next run to reap.
ESCALATION_BUDGET_S = 0.8
STOP_PROMISE_S = 5.0
EXIT_MARGIN_S = 0.6
# What a `fencecheck` command exits with when a signal stopped it: the shell's
# own convention, 128 + the signal's number (130 SIGINT, 143 SIGTERM, 129 SIGHUP).
SIGNAL_EXIT_BASE = 128


class Interrupted(Exception):
    """The run was asked to stop; the message says by which signal and what was
    not done because of it."""


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.signum: int | None = None
        self.reason: str | None = None
        self.requested_at: float | None = None  # time.monotonic()
        self.signals = 0
        self.escalated = False
        self.stop_callbacks: list[Callable[[str], None]] = []
        self.escalate_callbacks: list[Callable[[str], None]] = []
        self.unfinished_callbacks: list[Callable[[], str | None]] = []
        self.main_depth = 0  # how deep the main thread is in interruptible()
        self.main_raised = False
        # The signal the handler raised Interrupted for: the watcher thread may
        # not have recorded it yet when the command reports how it ended.
        self.main_signum: int | None = None
        self.expected: str | None = None  # what to say when a stop is the way out
        # The expected message as it stood when the signal arrived: the handler
        # may end the expected section before the watcher announces the stop.
        self.expected_at_signal: str | None = None


_state = _State()
_installed: dict[int, object] = {}
_wakeup: tuple[int, int] | None = None


def requested() -> bool:
    """True once a stop was asked for (by a signal or :func:`request`)."""
    return _state.event.is_set()


def reason() -> str:
    """``interrupted by SIGTERM`` (or the reason given to :func:`request`)."""
    if _state.reason is None and _state.main_signum is not None:
        return f"interrupted by {signal.Signals(_state.main_signum).name}"
    return _state.reason or "not interrupted"


def signal_name() -> str | None:
    return signal.Signals(_state.signum).name if _state.signum is not None else None


def since_s() -> float | None:
    """Seconds since the stop was asked for, None when it was not."""
    at = _state.requested_at
    return None if at is None else time.monotonic() - at


def exit_status() -> int:
    """The exit code of an interrupted command: 128 + the signal's number
    (130 for SIGINT when no signal but :func:`request` stopped it)."""
    return SIGNAL_EXIT_BASE + (_state.signum or _state.main_signum or int(signal.SIGINT))


def check(what: str) -> None:
    """Raise :class:`Interrupted` when a stop was asked for; ``what`` names what
    would have started (it goes into the message)."""
    if _state.event.is_set():
        raise Interrupted(f"{reason()}: not starting {what}")


def wait(timeout_s: float) -> bool:
    """Sleep up to ``timeout_s``; True (at once) when a stop is asked for."""
    return _state.event.wait(timeout_s)


def on_stop(callback: Callable[[str], None]) -> Callable[[], None]:
    """Run ``callback(reason)`` when a stop is asked for (at once if it already
    was). Returns a function that unregisters it."""
    with _state.lock:
        already = _state.event.is_set()
        if not already:
            _state.stop_callbacks.append(callback)
    if already:
        _call(callback, reason())
    return lambda: _remove(_state.stop_callbacks, callback)


def on_escalate(callback: Callable[[str], None]) -> Callable[[], None]:
    """Run ``callback(why)`` when the stop escalates, just before the forced exit."""
    with _state.lock:
        _state.escalate_callbacks.append(callback)
    return lambda: _remove(_state.escalate_callbacks, callback)


def on_unfinished(callback: Callable[[], str | None]) -> Callable[[], None]:
    """Run ``callback()`` when the escalation's own steps did not finish within
    its budget, just before the forced exit: hand what is left to a process
    that outlives this one. It returns what to say (or None)."""
    with _state.lock:
        _state.unfinished_callbacks.append(callback)
    return lambda: _remove(_state.unfinished_callbacks, callback)


def _remove(callbacks: list[Any], callback: Any) -> None:
    with _state.lock, contextlib.suppress(ValueError):
        callbacks.remove(callback)


def _call(callback: Callable[[str], None], text: str) -> None:
    try:
        callback(text)
    except Exception as exc:  # one failing step must not keep the others from running
        _say(f"while stopping: {type(exc).__name__}: {exc}")


def trace(step: str) -> None:
    """With FENCECHECK_TRACE_STOP=1: print a step of a stop with its time since the
    signal (what made a stop slow, when one is)."""
    at = since_s()
    if at is not None and os.environ.get("FENCECHECK_TRACE_STOP"):
        _say(f"stop +{at:.3f}s [{threading.current_thread().name}] {step}")


def _say(text: str) -> None:
    # The terminal may be gone (SIGHUP): a failed write must not stop the stop.
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"fencecheck: {text}\n")
        sys.stderr.flush()


def request(signum: int | None = None, why: str | None = None) -> None:
    """Ask for a stop (what a signal does); a second request escalates."""
    with _state.lock:
        _state.signals += 1
        first = not _state.event.is_set()
        if first:
            _state.signum = signum
            _state.reason = why or (
                f"interrupted by {signal.Signals(signum).name}" if signum else "interrupted"
            )
            _state.requested_at = time.monotonic()
        callbacks: list[Callable[[str], None]] = []
        if first:
            callbacks, _state.stop_callbacks = _state.stop_callbacks, []
    if not first:
        escalate(f"second signal ({signal.Signals(signum).name if signum else 'request'})")
        return
    # Read before the event wakes the waiter: a section that expected this
    # stop (--keep) leaves at once and clears its message.
    announcement = (
        _state.expected
        or _state.expected_at_signal
        or f"{reason()}: stopping (nothing new starts; running experiments are aborted); "
        "a second signal kills everything at once"
    )
    # Said before the event wakes anyone: a waiter that then exits at once
    # (os._exit, a test's script) must not leave the stop unannounced.
    _say(announcement)
    _state.event.set()
    for callback in callbacks:
        _call(callback, reason())
    if _wakeup is None:
        return  # in-process (tests): no forced exit
    timer = threading.Timer(
        HARD_DEADLINE_S,
        escalate,
        args=(f"the orderly stop did not finish within {HARD_DEADLINE_S}s",),
    )
    timer.daemon = True
    timer.start()


def escalate(why: str) -> None:
    """Kill everything now (the :func:`on_escalate` callbacks) and exit the process."""
    with _state.lock:
        if _state.escalated:
            return
        _state.escalated = True
        callbacks = list(_state.escalate_callbacks)
        if not _state.event.is_set():
            _state.reason = _state.reason or "interrupted"
            _state.requested_at = time.monotonic()
    _state.event.set()
    _say(f"{why}: killing everything this run started")

    def run_all() -> None:
        for callback in reversed(callbacks):
            _call(callback, why)

    first = _state.requested_at if _state.requested_at is not None else time.monotonic()
    left = STOP_PROMISE_S - EXIT_MARGIN_S - (time.monotonic() - first)
    budget = max(ESCALATION_BUDGET_S, left)
    worker = threading.Thread(target=run_all, name="escalation", daemon=True)
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        handed = [_handed_over(callback) for callback in list(_state.unfinished_callbacks)]
        said = "; ".join(text for text in handed if text)
        _say(
            f"could not finish removing everything within {budget:.1f}s; "
            + (said or "the next run (or `fencecheck clean`) reaps what is left")
        )
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(exit_status())


def _handed_over(callback: Callable[[], str | None]) -> str | None:
    try:
        return callback()
    except Exception as exc:  # the exit comes next whatever happens here
        return f"could not hand over the rest ({type(exc).__name__}: {exc})"


# ------------------------------------------------------------------ signals
def _handler(signum: int, frame: object) -> None:
    del frame
    # The watcher thread does the work (it got the byte set_wakeup_fd wrote);
    # here only the main thread's interruptible section is ended. Raising leaves
    # an expected() section at once, so its message is kept for the watcher.
    if not _state.event.is_set() and _state.expected_at_signal is None:
        _state.expected_at_signal = _state.expected
    if _state.main_depth > 0 and not _state.main_raised:
        _state.main_raised = True
        _state.main_signum = signum
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}")


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in SIGNALS:
                request(signum)


def install() -> None:
    """Make SIGINT, SIGTERM and SIGHUP request a stop (main thread only; idempotent)."""
    global _wakeup
    if _wakeup is not None:
        return
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(read_fd, True)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    _wakeup = (read_fd, write_fd)
    for sig in SIGNALS:
        _installed[sig] = signal.signal(sig, _handler)
    threading.Thread(target=_watch, args=(read_fd,), name="stop-watcher", daemon=True).start()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """In the main thread: a signal raises :class:`Interrupted` where the code stands
    (start-up, waiting with --keep). Raises at once if a stop was already asked for."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.main_depth += 1
    try:
        if _state.event.is_set() and not _state.main_raised:
            _state.main_raised = True
            raise Interrupted(reason())
        yield
    finally:
        _state.main_depth -= 1


@contextlib.contextmanager
def expected(message: str) -> Iterator[None]:
    """A stop is the normal way out of this section (``--keep`` waits for Ctrl-C):
    announce it with ``message`` instead of as an interruption."""
    _state.expected = message
    try:
        yield
    finally:
        _state.expected = None


def reset() -> None:
    """Forget a stop request (tests that exercise it in-process)."""
    global _state
    _state = _State()
