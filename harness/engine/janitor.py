"""Experiment teardowns off the critical path.

Once an experiment's evidence is gathered, what is left of its world (its
database, login roles, proxies, mock tool, control socket) only has to go;
nothing the verdict rests on is read from it again. Dropping it inline cost
each experiment 0.2 s of wall time in which its slot could have run the next
one. The :class:`Janitor` is one thread that closes such teardowns in the
order they were handed over; :meth:`Janitor.drain` waits for all of them,
and the run's services call it before they stop the servers those
teardowns talk to, so a run still ends with nothing left.

A stopping run does not defer: its teardowns take the short way inline
(harness/engine/environment.py), and a drain during a stop gives each
remaining one the stop's short grace.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

from harness import stopping

# How long a drain waits for what was handed over (a teardown is a few
# queries and process stops, each bounded on its own).
DRAIN_TIMEOUT_S = 60.0


class Janitor:
    """Closes handed-over teardowns (ExitStacks) on a thread of its own."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, contextlib.ExitStack] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self.problems: list[str] = []

    def defer(self, name: str, teardown: contextlib.ExitStack) -> None:
        """Close ``teardown`` soon, off the caller's thread."""
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="janitor", daemon=True)
                self._thread.start()
        self._queue.put((name, teardown))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, teardown = item
            try:
                teardown.close()
            except Exception as exc:  # one teardown's failure must not stop the rest
                with self._lock:
                    self.problems.append(f"teardown of {name}: {type(exc).__name__}: {exc}")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> list[str]:
        """Wait until every handed-over teardown is closed; the names of what is
        still pending when ``timeout_s`` ran out (shorter once a stop was asked)."""
        ends = time.monotonic() + (min(timeout_s, 2.0) if stopping.requested() else timeout_s)
        with self._idle:
            while self._pending and time.monotonic() < ends:
                self._idle.wait(max(0.0, min(0.2, ends - time.monotonic())))
            left = self._pending
        return [f"{left} teardown(s) not finished"] if left else []

    def close(self) -> None:
        """Drain, then end the thread."""
        self.drain()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=2.0)
