"""The harness notices its own stalls, and what they could have caused.

A harness that is frozen (SIGSTOP, a swapping machine, a starved VM) answers
no barrier, reads no ops reply and sends no SIGCONT while it is frozen, and
the workers' leases keep running: a worker held at a barrier the frozen
harness cannot answer loses its 800 ms lease, and a successor the
experiment expects to finish may never get the chance, for a reason that is
the harness's own.

:class:`StallMonitor` is a thread that wakes every ``TICK_S`` and measures,
with the monotonic clock (which keeps counting while the process is
stopped), how late it woke. The control server reports the same from its
accept loop. A gap well beyond the tick is a stall: when, and how long.

What a stall can change is progress, never safety: a stall of at least
:func:`limit_s` (the least slack the protocol's timers leave a worker that
waits on the harness: a lease renewed on schedule has at worst its TTL minus
one heartbeat interval left, 800 - 150 = 650 ms by default, a dispatch claim
its whole deadline, 600 ms) inside a progress check's window excuses that
check when it is unmet, which makes the verdict *unknown* naming the stall
(harness/engine/runner.timing_excuse). A broken safety invariant stays a
fail and a pass stays a pass: the one is an outcome the protocol forbids
whatever the timing, the other had its faults confirmed by what the harness
saw. Stalls of the workers are measured too (harness/engine/starvation.py).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass

from harness.verdict import Verdict

TICK_S = 0.02
# A wake-up this much later than asked is recorded as a stall at all (the
# verdict only changes for stalls of at least the experiment's limit).
RECORD_OVER_S = 0.1
MAX_KEPT = 10_000


@dataclass(frozen=True)
class Stall:
    """The harness did not run from ``started_at`` for ``length_s`` (wall clock)."""

    started_at: float
    length_s: float
    seen_by: str

    @property
    def ended_at(self) -> float:
        return self.started_at + self.length_s

    def describe(self) -> str:
        at = dt.datetime.fromtimestamp(self.started_at, dt.UTC).isoformat(timespec="milliseconds")
        return f"{self.length_s:.2f}s from {at} (seen by {self.seen_by})"


class StallMonitor:
    """A thread measuring how late it wakes; shared by everything in the process.

    ``note(...)`` lets other loops (the control server's) report the gaps they
    see. Use :func:`monitor` for the process's one instance.
    """

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self._stalls: list[Stall] = []
        self._lock = threading.Lock()
        self._users = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start measuring (reference-counted: each start needs a stop)."""
        with self._lock:
            self._users += 1
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="stall-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        thread.join(timeout=1.0)

    def _run(self) -> None:
        stop = self._stop
        last = time.monotonic()
        while not stop.wait(self.tick_s):
            now = time.monotonic()
            self.gap(now - last - self.tick_s, seen_by="stall monitor")
            last = now

    def gap(self, late_s: float, *, seen_by: str) -> None:
        """Record that a loop woke ``late_s`` later than it should have (ending now)."""
        if late_s < RECORD_OVER_S:
            return
        stall = Stall(time.time() - late_s, late_s, seen_by)
        with self._lock:
            # Two observers of one freeze: keep the longer account of it.
            for i, known in enumerate(self._stalls):
                if known.started_at < stall.ended_at and stall.started_at < known.ended_at:
                    if stall.length_s > known.length_s:
                        self._stalls[i] = stall
                    return
            self._stalls.append(stall)
            del self._stalls[:-MAX_KEPT]

    def stalls(self, since: float, until: float) -> list[Stall]:
        """Stalls overlapping the wall-clock window [since, until]."""
        with self._lock:
            return [s for s in self._stalls if s.started_at < until and s.ended_at > since]


_MONITOR = StallMonitor()


def monitor() -> StallMonitor:
    """The process's stall monitor."""
    return _MONITOR


def limit_s(lease_ttl_ms: int, heartbeat_ms: int, dispatch_ttl_ms: int) -> float:
    """The shortest stall of the harness that can change an experiment's outcome."""
    return min(lease_ttl_ms - heartbeat_ms, dispatch_ttl_ms) / 1000


def judge(
    verdict: Verdict, reason: str, stalls: list[Stall], limit_s: float
) -> tuple[Verdict, str]:
    """``verdict`` as it is; when it is unknown and a stall of at least
    ``limit_s`` overlapped the experiment, the reason names the stall (it may
    be the cause). A stall changes no verdict: what timing could have decided
    are the progress checks, and those it excuses inside their own windows
    (harness/engine/experiment.py); a pass had its faults confirmed by what
    the harness saw, and a broken safety invariant is an outcome the protocol
    forbids whatever the timing."""
    long_ones = [s for s in stalls if s.length_s >= limit_s]
    if not long_ones or verdict is not Verdict.UNKNOWN:
        return verdict, reason
    worst = max(long_ones, key=lambda s: s.length_s)
    return verdict, f"{reason} (the harness stalled {worst.describe()} meanwhile)"
