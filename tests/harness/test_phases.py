"""Phases of a job are exclusive and add up to its wall time (harness/engine/phases.py)."""

from __future__ import annotations

import threading
import time

from harness.engine import phases


def test_nested_phases_are_exclusive_and_add_up() -> None:
    clock = phases.PhaseClock()
    with phases.timing(clock):
        with phases.phase("outer"):
            time.sleep(0.05)
            with phases.phase("inner"):
                time.sleep(0.1)
            time.sleep(0.05)
        time.sleep(0.02)
    spent = clock.figures()
    assert 0.09 <= spent["outer"] < 0.2, spent  # its own 0.1 s, not the inner 0.1 s
    assert 0.09 <= spent["inner"] < 0.2, spent
    assert spent["other"] >= 0.015, spent
    total = time.perf_counter() - clock.started
    assert abs(sum(spent.values()) - total) < 0.01


def test_a_phase_outside_a_job_does_nothing_and_threads_do_not_mix() -> None:
    with phases.phase("nowhere"):  # no clock on this thread: a no-op
        pass
    clock = phases.PhaseClock()
    seen: list[dict[str, float]] = []

    def other_thread() -> None:
        with phases.phase("not mine"):
            time.sleep(0.01)
        seen.append(clock.figures())

    with phases.timing(clock):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert "not mine" not in seen[0]
    assert phases.current() is None


def test_timed_charges_entry_and_exit_also_on_an_exception() -> None:
    class Slow:
        def __enter__(self) -> str:
            time.sleep(0.03)
            return "value"

        def __exit__(self, *exc: object) -> None:
            time.sleep(0.03)

    clock = phases.PhaseClock()
    with phases.timing(clock):
        try:
            with phases.timed(Slow(), "up", "down") as value:
                assert value == "value"
                raise RuntimeError("in the block")
        except RuntimeError:
            pass
    spent = clock.figures()
    assert spent["up"] >= 0.025 and spent["down"] >= 0.025, spent
