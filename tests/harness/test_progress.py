"""A run's output: one line per event, never interleaved; a live status line on
a terminal only; a closed output never stops the run."""

from __future__ import annotations

import io
import threading
import time

from harness.engine.progress import Progress


class SlowStream(io.StringIO):
    """Writes one character at a time, yielding between: interleaving shows."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty

    def write(self, text: str) -> int:
        for char in text:
            super().write(char)
            time.sleep(0)
        return len(text)

    def isatty(self) -> bool:
        return self.tty


def test_lines_from_many_threads_never_interleave() -> None:
    stream = SlowStream()
    progress = Progress(8, stream=stream)
    expected = {f"  job-{t}: line {n} {'x' * 40}" for t in range(8) for n in range(40)}

    def emit(t: int) -> None:
        for n in range(40):
            progress.event(f"job-{t}: line {n} {'x' * 40}")

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == len(expected) and set(lines) == expected
    assert "\x1b" not in stream.getvalue()  # not a terminal: plain lines only


def test_a_terminal_gets_a_live_status_line() -> None:
    stream = SlowStream(tty=True)
    progress = Progress(3, stream=stream)
    progress.job_started("A", "continuous checkpoints")
    progress.job_started("B", "old owner resumes")
    time.sleep(0.8)  # one redraw of the status line
    progress.job_finished("A", "PASS in 1.00s")
    progress.close()
    text = stream.getvalue()
    assert "[0/3 done," in text and "running: A, B" in text
    assert "\r\x1b[K  A: PASS in 1.00s\n" in text  # the status line is cleared first
    assert "[1/3 done," in text and "running: B" in text
    assert text.endswith("\r\x1b[K")  # closed: the terminal is left on a clean line


def test_quiet_keeps_experiment_lines_and_the_status_line_out() -> None:
    stream = SlowStream(tty=True)
    progress = Progress(1, stream=stream, quiet=True)
    progress.job_started("A", "x")
    progress.say("header")
    progress.close()
    assert stream.getvalue() == "header\n"


class ClosedStream(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_silences_the_output_not_the_run() -> None:
    progress = Progress(1, stream=ClosedStream())
    progress.say("one")
    progress.job_started("A", "x")
    progress.job_finished("A", "PASS")
    progress.close()
