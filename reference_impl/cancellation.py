"""Cooperative cancellation of one execution (rule 8).

Checked before every workflow step and before every side effect. Setting
it is not a remote revocation: a request already sent may still act; it
only stops new work.
"""

from __future__ import annotations

import threading

from reference_impl.errors import ExecutionCancelled


class Cancellation:
    """A one-way flag with its cause; thread-safe."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.cause: str | None = None

    def cancel(self, cause: str) -> None:
        if not self._event.is_set():
            self.cause = cause
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise ExecutionCancelled when cancelled."""
        if self._event.is_set():
            raise ExecutionCancelled(f"execution cancelled: {self.cause}", reason=self.cause)

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake and raise at once when cancelled."""
        if self._event.wait(max(0.0, seconds)):
            self.check()
