"""Every short wait the harness measured, kept to be added up within one timer.

A renewal that times out has a chain behind it: the worker's heartbeat
thread must run, its backend must run the statement, and when the worker's
own write holds the run's row, that write must finish first, which takes
the worker's other thread, another backend, and the harness answering the
injection points inside that write. On a busy machine each of them waits a
little: 40 ms here, 60 ms there, none long enough to be an episode of its
own (harness/engine/starvation.py records one only when a thread waited at
least half a sampling tick in a row, and the stall monitor only a wake-up
100 ms late), and the sum still fires a 300 ms timer. Two matrices side by
side failed the correct Go worker that way: its successor's renewal queued
behind its own write, which reached its first injection point 269 ms after
it began, and no process had an episode.

So every wait is kept here, however short: each watched process's run-queue
delay per sampling tick (the kernel's count, over the tick's real length,
so a tick the busy harness stretched still counts all of it), its disk
waits, and the harness's own lateness (its stall monitor's wake-ups, its
control server's time to start answering a hit). :func:`worst_window`
finds the window of one timer's length where the waits of an experiment's
processes and the harness add up most: at least half the timer, and a
correct worker's timer could have fired for reasons that are the machine's
(harness/engine/runner.timing_excuse). Only progress is ever excused by it.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CONTROL_SERVER = "control server"
# Waits are kept this long: a check is judged at most a scenario's length
# after its window, and windows are judged once the scenario ends.
RETAIN_S = 600.0
# Below this a wait is noise (a tick's own jitter): not kept.
FLOOR_S = 0.002
# The resolution at which waits are added up.
BIN_S = 0.01


@dataclass(frozen=True, slots=True)
class Wait:
    """``who`` (pid ``pid``; None for the harness) waited ``waited_s`` in all,
    spread over the wall-clock span [``start``, ``end``]."""

    who: str
    pid: int | None
    start: float
    end: float
    waited_s: float


@dataclass(frozen=True)
class Window:
    """The window [``start``, ``start`` + ``length_s``] and the waits in it."""

    start: float
    length_s: float
    waited_s: float
    by_who: dict[str, float]

    def describe(self) -> str:
        parts = sorted(self.by_who.items(), key=lambda kv: -kv[1])
        named = ", ".join(f"{who} {s:.3f}s" for who, s in parts if s >= 0.0005) or "nothing"
        at = dt.datetime.fromtimestamp(self.start, dt.UTC).isoformat(timespec="milliseconds")
        return f"{self.waited_s:.3f}s in the {self.length_s:.2f}s from {at} ({named})"


class WaitLog:
    """The process's one log of waits, one queue per experiment (the part of
    a name before its first ``/``) so that judging one reads only its own;
    threads add, judges read."""

    def __init__(self, retain_s: float = RETAIN_S) -> None:
        self.retain_s = retain_s
        self._waits: dict[str, deque[Wait]] = {}
        self._lock = threading.Lock()
        self._added = 0
        self._kept = 0
        self.peak_kept = 0
        self.wait_bytes = 0

    def add(self, who: str, pid: int | None, start: float, end: float, waited_s: float) -> None:
        if waited_s < FLOOR_S or end <= start:
            return
        wait = Wait(who, pid, start, end, min(waited_s, end - start))
        owner = who.partition("/")[0]
        with self._lock:
            self._waits.setdefault(owner, deque()).append(wait)
            self._added += 1
            self._kept += 1
            self.peak_kept = max(self.peak_kept, self._kept)
            if not self.wait_bytes:
                # A kept wait's own size, its floats and its deque slot (its
                # name is shared with the source's other waits).
                self.wait_bytes = sys.getsizeof(wait) + 3 * sys.getsizeof(start) + 8
            if self._added % 1000 == 0:
                self._forget_before(end - self.retain_s)

    def _forget_before(self, horizon: float) -> None:
        for owner in list(self._waits):
            queue = self._waits[owner]
            while queue and queue[0].end < horizon:
                queue.popleft()
                self._kept -= 1
            if not queue:
                del self._waits[owner]

    def stats(self) -> dict[str, float]:
        """The most waits kept at once, and about how many MiB they took."""
        with self._lock:
            mib = self.peak_kept * self.wait_bytes / 2**20
            return {"peak_waits": self.peak_kept, "peak_mib": round(mib, 2)}

    def within(self, owner: str, since: float, until: float) -> list[Wait]:
        """The waits of ``owner``'s processes (an experiment's name) that
        overlap [since, until]."""
        with self._lock:
            queue = self._waits.get(owner, ())
            return [w for w in queue if w.start < until and w.end > since]


def binned(
    waits: Iterable[Wait], since: float, until: float, key: Callable[[Wait], str] | None = None
) -> dict[str, list[float]]:
    """Per source (``key``, the name by default), the seconds it waited in
    each ``BIN_S`` bin of [since, until]. Each wait is spread evenly over its
    span; a source waits at most a bin's own time in it, since two reports of
    one freeze (a process's and its thread's) see the same time."""
    bins = max(1, int((until - since) / BIN_S) + 1)
    rows: dict[str, list[float]] = {}
    for w in waits:
        row = rows.setdefault(key(w) if key is not None else w.who, [0.0] * bins)
        span = w.end - w.start
        first = max(0, int((w.start - since) / BIN_S))
        last = min(bins - 1, int((w.end - since) / BIN_S))
        for b in range(first, last + 1):
            lo = max(w.start, since + b * BIN_S)
            hi = min(w.end, since + (b + 1) * BIN_S)
            if hi > lo:
                row[b] += w.waited_s * (hi - lo) / span
    for row in rows.values():
        for b, v in enumerate(row):
            row[b] = min(v, BIN_S)
    return rows


def best_window(rows: dict[str, list[float]], since: float, length_s: float) -> Window:
    """The window of ``length_s`` where the binned ``rows`` add up most."""
    bins = max((len(r) for r in rows.values()), default=1)
    width = max(1, min(bins, round(length_s / BIN_S)))
    totals = [0.0] * bins
    for row in rows.values():
        for b, v in enumerate(row):
            totals[b] += v
    running = sum(totals[:width])
    best_at, best = 0, running
    for start in range(1, bins - width + 1):
        running += totals[start + width - 1] - totals[start - 1]
        if running > best:
            best_at, best = start, running
    by_who = {who: sum(row[best_at : best_at + width]) for who, row in rows.items()}
    return Window(since + best_at * BIN_S, width * BIN_S, max(best, 0.0), by_who)


def worst_window(waits: Iterable[Wait], since: float, until: float, length_s: float) -> Window:
    """The window of ``length_s`` inside [since, until] where ``waits`` add up
    most, each source counted at most the time that passed."""
    return best_window(binned(waits, since, until), since, length_s)


def control_server(experiment: str, worker: str | None) -> str:
    """How the log names the control server of ``experiment`` answering
    ``worker`` (None: its accept loop, which any worker's connect waits on)."""
    if worker is None:
        return f"{experiment}/{CONTROL_SERVER}"
    return f"{experiment}/{CONTROL_SERVER} for {worker}"


def worker_of(who: str) -> str | None:
    """The worker a logged source belongs to alone: ``NAME/worker W`` and
    ``NAME/control server for W`` both give ``W``; a shared source None."""
    _, _, rest = who.partition("/")
    for prefix in ("worker ", f"{CONTROL_SERVER} for "):
        if rest.startswith(prefix):
            return rest[len(prefix) :]
    return None


_LOG = WaitLog()


def log() -> WaitLog:
    """The harness process's wait log."""
    return _LOG
