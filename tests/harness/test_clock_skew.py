"""A worker's wall clock set back with libfaketime (harness/parts/clock_skew.py):
the real library, preloaded into a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.parts import clock_skew


def test_a_preloaded_process_reads_its_wall_clock_behind() -> None:
    seen = clock_skew.measure(30)
    assert 29.0 <= seen.behind_s <= 31.0, seen.detail


def test_its_monotonic_clock_is_left_alone() -> None:
    """Deadlines timed by the monotonic clock, as the contract asks, are not moved."""
    code = "import time; print(repr(time.monotonic()))"
    env = {**os.environ, **clock_skew.skewed_env(30)}
    before = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert before <= float(out) <= time.monotonic()


def test_a_missing_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock_skew.LIBRARY_ENV, "/nonexistent/libfaketimeMT.so.1")
    with pytest.raises(clock_skew.ClockSkewUnavailable) as err:
        clock_skew.skewed_env(5)
    assert "apt-get install libfaketime" in str(err.value)
    assert clock_skew.LIBRARY_ENV in str(err.value)
