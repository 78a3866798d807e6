"""The run's firewall table counts connection attempts per guarded port
(worker.connections_are_paced reads it): refused attempts count, a port's
count starts again from zero, and a port nobody guards is not counted."""

from __future__ import annotations

import os
import shutil
import socket
import uuid

import pytest

from harness.parts import port_guard

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or (shutil.which("nft") is None and not os.path.exists("/usr/sbin/nft")),
    reason="needs root and nft (make setup installs nft; CI runs as root)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _attempt(port: int, times: int) -> None:
    """Connect ``times`` times to a port nothing listens on: each is refused."""
    for _ in range(times):
        with socket.socket() as s, pytest.raises(OSError):
            s.connect(("127.0.0.1", port))


def test_attempts_are_counted_per_guarded_port_from_their_start() -> None:
    guard, _facts = port_guard.start(f"test{uuid.uuid4().hex[:8]}", [os.getuid()])
    assert guard is not None, _facts
    try:
        counted, unguarded = _free_port(), _free_port()
        guard.add(counted)
        assert port_guard.count_from_now(counted)
        _attempt(counted, 5)
        _attempt(unguarded, 3)
        assert port_guard.connection_attempts([counted, unguarded]) == {counted: 5, unguarded: 0}
        assert port_guard.count_from_now(counted)  # a reused port starts again
        _attempt(counted, 2)
        assert port_guard.connection_attempts([counted]) == {counted: 2}
    finally:
        assert port_guard.stop(guard) is None
    assert not port_guard.count_from_now(counted)  # no guard: nothing counted
    assert isinstance(port_guard.connection_attempts([counted]), str)
