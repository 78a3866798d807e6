"""Bounded waits: every wait has a timeout and names what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from harness import stopping

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A bounded wait ran out of time."""


def wait_for(
    probe: Callable[[], T | None],
    *,
    what: str,
    timeout_s: float,
    interval_s: float = 0.01,
    max_interval_s: float = 0.1,
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``probe`` until it returns something truthy (an empty list is not).

    The interval grows from ``interval_s`` to ``max_interval_s`` so that short
    waits answer fast and long ones do not hammer what they poll. The last
    exception the probe raised, if any, is chained to the timeout so the
    reader sees why the condition never came. An exception of a type in
    ``fatal`` says the condition can never come (the server it waits for has
    exited, say): it is raised at once instead of waiting out the timeout.
    A stop request (``harness.stopping``) ends the wait at once with
    :class:`harness.stopping.Interrupted`.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    delay = interval_s
    while True:
        if stopping.requested():
            raise stopping.Interrupted(f"{stopping.reason()}: stopped waiting for {what}")
        try:
            value = probe()
        except fatal:
            raise
        except Exception as exc:  # the probe's failure is what we report on timeout
            last_error = exc
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise WaitTimeout(f"timed out after {timeout_s:.1f}s waiting for {what}{detail}") from (
                last_error
            )
        stopping.wait(delay)
        delay = min(delay * 1.5, max_interval_s)
