"""Listener ports are picked below the kernel's ephemeral range, where no
outgoing connection takes them between the pick and the bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from harness.parts import ports


def test_a_port_below_the_ephemeral_range_bindable_and_never_given_twice() -> None:
    low = ports.ephemeral_low()
    if low is None or low - ports.LOWEST < ports.LEAST_SPAN:
        pytest.skip(f"no room below this machine's ephemeral range (starts at {low})")
    picked = [ports.free_port() for _ in range(50)]
    assert all(ports.LOWEST <= p < low for p in picked), picked
    assert len(set(picked)) == len(picked)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", picked[-1]))


def test_a_machine_without_room_gets_the_kernels_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text(f"{ports.LOWEST + 10}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", narrow)
    assert ports.ephemeral_low() == ports.LOWEST + 10
    assert ports.free_port() > 0


def test_an_unreadable_range_is_unknown(tmp_path: Path) -> None:
    assert ports.ephemeral_low(tmp_path / "missing") is None
    garbled = tmp_path / "range"
    garbled.write_text("not numbers")
    assert ports.ephemeral_low(garbled) is None


def test_only_the_latest_ports_are_remembered() -> None:
    """A long campaign must not fill the range with ports long since bound
    and freed: only the latest RECENT picks are kept out."""
    low = ports.ephemeral_low()
    if low is None or low - ports.LOWEST < ports.LEAST_SPAN:
        pytest.skip(f"no room below this machine's ephemeral range (starts at {low})")
    for _ in range(ports.RECENT + 10):
        ports.free_port()
    assert len(ports._given) == ports.RECENT
