"""Loopback ports for the run's listeners, picked below the kernel's ephemeral range.

``bind(0)`` hands out a port from the ephemeral range, the same range the
kernel draws the local port of every outgoing connection from. Between the
moment the harness picks such a port and the moment the part it is for
binds it (a worker's metrics endpoint, a proxy, a server), any of the run's
many client connections may take it as its local port, and the bind fails
with "address already in use": a Go worker exited 1 at its start that way
under load. A port below the ephemeral range is never taken by a
connection, so the only race left is with another listener; the pick is
random over thousands of ports, checked free, and never handed out twice
by one harness process.
"""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below this, well-known and registered services (PostgreSQL's 5432,
# toxiproxy's 8474, ...) are more likely to be listening.
LOWEST = 20000
# With fewer ports than this between LOWEST and the ephemeral range, the
# range is not worth searching: fall back to the kernel's pick.
LEAST_SPAN = 1000
TRIES = 64

# The ports handed out lately: one is not handed out again before its
# listener had time to bind it. Only the latest count (a bind check covers
# older ones): a set of every port ever given would fill the range in a
# long campaign and leave every pick to the kernel's range again.
RECENT = 1024
_given: deque[int] = deque(maxlen=RECENT)
_lock = threading.Lock()
# A generator of our own: the module's global one belongs to whoever seeds it
# (explore's Hypothesis lanes watch it while they draw a schedule).
_picks = random.Random()


def ephemeral_low(path: Path | None = None) -> int | None:
    """The first port of the kernel's ephemeral range, or None where unknown."""
    try:
        return int((path or EPHEMERAL_RANGE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the ephemeral range where there is room (the
    caller still retries a bind that fails: another listener may take it)."""
    low = ephemeral_low()
    if low is None or low - LOWEST < LEAST_SPAN:
        return _kernel_pick(host)
    with _lock:
        for _ in range(TRIES):
            port = _picks.randrange(LOWEST, low)
            if port not in _given and _bindable(host, port):
                _given.append(port)
                return port
    return _kernel_pick(host)
