"""A run's progress output: one writer, one line per event, never interleaved.

Experiments run in parallel threads; each event (started, verdict) is one
whole line written under one lock, so two events never share a line. On a
terminal a live status line sits under the events (experiments running now,
done/total, elapsed) and is redrawn as they change; when the output is not a
terminal (CI, a pipe, a file) only the plain event lines are written. A
closed output (a dropped terminal, ``| head``) ends the output, never the run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TextIO

REDRAW_S = 0.5
_CLEAR = "\r\x1b[K"


class Progress:
    """The run's output. ``quiet`` keeps the per-experiment lines (and the live
    line) out; :meth:`say` lines are always written."""

    def __init__(
        self,
        total: int = 0,
        *,
        stream: TextIO | None = None,
        live: bool | None = None,
        quiet: bool = False,
    ) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        self.quiet = quiet
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty())
        self.live = live and not quiet
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}
        self._done = 0
        self._started = time.monotonic()
        self._status_shown = False
        self._broken = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.live:
            self._thread = threading.Thread(target=self._redraw, name="progress", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------- writing
    def _write(self, text: str) -> None:
        # Under the lock. A write that fails (terminal closed, pipe gone)
        # silences the output for the rest of the run.
        if self._broken:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._broken = True

    def _status(self) -> str:
        elapsed = time.monotonic() - self._started
        running = ", ".join(sorted(self._running)) or "-"
        line = f"[{self._done}/{self.total} done, {elapsed:.0f}s] running: {running}"
        return line[:160]

    def say(self, text: str) -> None:
        """Write ``text`` as whole lines (above the live status line)."""
        with self._lock:
            prefix = _CLEAR if self._status_shown else ""
            self._write(prefix + text.rstrip("\n") + "\n")
            if self._status_shown:
                self._write(self._status())

    def event(self, text: str) -> None:
        """A per-experiment line (left out when quiet)."""
        if not self.quiet:
            self.say(f"  {text}")

    def job_started(self, label: str, title: str) -> None:
        with self._lock:
            self._running[label] = time.monotonic()
        self.event(f"{label}: {title} ...")

    def job_finished(self, label: str, text: str) -> None:
        with self._lock:
            self._running.pop(label, None)
            self._done += 1
        self.event(f"{label}: {text}")

    def job_again(self, label: str, attempt: int) -> None:
        """``label`` ended unknown and runs once more: not done yet."""
        with self._lock:
            self._done -= 1
        self.event(f"{label}: unknown proves nothing; attempt {attempt}")

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_S):
            with self._lock:
                self._status_shown = True
                self._write(_CLEAR + self._status())

    def close(self) -> None:
        """Stop the live line and leave the terminal on a fresh line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._lock:
            if self._status_shown:
                self._write(_CLEAR)
                self._status_shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
