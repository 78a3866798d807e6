"""Bounded waits."""

from __future__ import annotations

import time

import pytest

from harness.waiting import WaitTimeout, wait_for


def test_empty_results_keep_waiting_and_the_timeout_names_what() -> None:
    calls: list[int] = []

    def probe() -> list[int]:
        calls.append(1)
        return [] if len(calls) < 3 else [42]

    assert wait_for(probe, what="three calls", timeout_s=5) == [42]
    with pytest.raises(WaitTimeout, match="waiting for the impossible"):
        wait_for(lambda: [], what="the impossible", timeout_s=0.05)


def test_last_probe_error_is_reported() -> None:
    def probe() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout, match="refused"):
        wait_for(probe, what="a server", timeout_s=0.05)


def test_a_fatal_probe_error_is_raised_at_once() -> None:
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        raise LookupError("gone for good")

    started = time.monotonic()
    with pytest.raises(LookupError, match="gone for good"):
        wait_for(probe, what="a server", timeout_s=30, fatal=(LookupError,))
    # One probe, and no wait towards the 30 s timeout (a tenth of it leaves
    # a busy machine room).
    assert calls == [1]
    assert time.monotonic() - started < 3.0


def test_errors_not_named_fatal_still_keep_waiting() -> None:
    def probe() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout, match="refused"):
        wait_for(probe, what="a server", timeout_s=0.05, fatal=(LookupError,))
