"""Where an experiment's wall time goes: exclusive phases, per job.

Every job carries a :class:`PhaseClock`; code on the job's thread marks what
it is doing with ``with phases.phase("environment.database"):``. Phases nest
and are exclusive: time spent in an inner phase is not counted in the outer
one, so a job's phases add up to its wall time (what no phase covers is
``other``). The archive keeps the clock's figures and ``make bench-harness``
adds them up over a run, which is how the harness's own overhead is found and
kept down (docs/running.md, "Where the time goes").

Outside a job (no clock on the thread) ``phase`` costs a thread-local lookup
and does nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_LOCAL = threading.local()


class PhaseClock:
    """Exclusive wall-time phases of one job, in seconds."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._stack: list[str] = []
        self._since = time.perf_counter()
        self.started = self._since

    def _charge(self, now: float) -> None:
        name = self._stack[-1] if self._stack else "other"
        self.spent[name] = self.spent.get(name, 0.0) + (now - self._since)
        self._since = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._charge(time.perf_counter())
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge(time.perf_counter())
            self._stack.pop()

    def figures(self) -> dict[str, float]:
        """Seconds per phase so far (``other``: the job's time in no phase)."""
        self._charge(time.perf_counter())
        return {name: round(s, 4) for name, s in sorted(self.spent.items())}


@contextlib.contextmanager
def timing(clock: PhaseClock) -> Iterator[PhaseClock]:
    """Phases marked on this thread go to ``clock`` until the block ends."""
    previous = getattr(_LOCAL, "clock", None)
    _LOCAL.clock = clock
    try:
        yield clock
    finally:
        _LOCAL.clock = previous


def current() -> PhaseClock | None:
    clock: PhaseClock | None = getattr(_LOCAL, "clock", None)
    return clock


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """Mark a phase of the job running on this thread (a no-op outside a job)."""
    clock = current()
    return clock.phase(name) if clock is not None else contextlib.nullcontext()


@contextlib.contextmanager
def timed(cm: contextlib.AbstractContextManager[T], enter_as: str, exit_as: str) -> Iterator[T]:
    """``cm`` with its entry charged to phase ``enter_as`` and its exit (also
    on an exception) to ``exit_as``; the block itself to whatever it marks."""
    with phase(enter_as):
        value = cm.__enter__()
    try:
        yield value
    except BaseException:
        with phase(exit_as):
            if not cm.__exit__(*sys.exc_info()):
                raise
    else:
        with phase(exit_as):
            cm.__exit__(None, None, None)
