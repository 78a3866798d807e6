"""Armed faults of the mock tool and the broker, and requests held by ``hang``.

A fault is armed by the harness (``POST /admin/faults``) for the next
``count`` matching requests, after letting ``skip`` of them pass untouched;
it lives in memory only, so a restart clears it (the log keeps which fault
hit which request).

Invariants:

* :meth:`FaultBoard.take` hands each armed count to exactly one request, in
  arrival order, so "the next N matching requests after the first K" means
  exactly those N.
* A fault fires only on the kind of request its mode is for: a create mode
  never fires on a broker publish or delivery, a broker mode never on a
  create (``"*"`` selects every tool, never the broker).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mock_tool.constants import BROKER, iso


@dataclass
class Fault:
    """One armed fault. ``count == 0`` means it fires until cleared; ``skip``
    matching requests pass untouched before it fires the first time."""

    fault_id: str
    tool: str
    mode: str
    count: int
    ms: int | None
    created_at: float
    skip: int = 0
    #: Only creates of this run match (None: any run's).
    run_id: str | None = None
    skipped: int = 0
    fired: int = 0
    active: bool = True
    cleared_at: float | None = None

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out["remaining"] = None if self.count == 0 else max(self.count - self.fired, 0)
        out["created_at_iso"] = iso(self.created_at)
        out["cleared_at_iso"] = iso(self.cleared_at)
        return out


@dataclass
class Hung:
    """A create held by a ``hang`` fault until released or ``max_ms`` passed."""

    seq: int
    tool: str
    operation_id: str
    since: float
    max_ms: int
    event: threading.Event = field(default_factory=threading.Event)
    # Released with drop: a request held on the network (arrive_held) is lost
    # there instead of arriving.
    dropped: bool = False


class FaultBoard:
    """Armed faults and hung requests; all state in memory, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._hung: dict[int, Hung] = {}

    def add(
        self,
        tool: str,
        mode: str,
        count: int,
        ms: int | None,
        skip: int = 0,
        run_id: str | None = None,
    ) -> Fault:
        fault = Fault(f"f-{secrets.token_hex(6)}", tool, mode, count, ms, time.time(), skip, run_id)
        with self._lock:
            self._faults.append(fault)
        return fault

    def take(self, target: str, modes: frozenset[str], run_id: str | None = None) -> Fault | None:
        """Consume one firing of the oldest active fault of one of ``modes`` that
        matches ``target`` (a tool name, or :data:`BROKER`) and, for a fault
        armed for one run, the request's ``run_id``. A request the oldest
        matching fault lets pass (its ``skip``) gets no fault at all."""
        with self._lock:
            for fault in self._faults:
                if not fault.active or fault.mode not in modes:
                    continue
                if fault.tool != target and not (fault.tool == "*" and target != BROKER):
                    continue
                if fault.run_id is not None and fault.run_id != run_id:
                    continue
                if fault.skipped < fault.skip:
                    fault.skipped += 1
                    return None
                fault.fired += 1
                if fault.count and fault.fired >= fault.count:
                    fault.active = False
                return fault
        return None

    def clear(self) -> int:
        """Deactivate every fault (hung requests stay hung); returns how many."""
        now = time.time()
        with self._lock:
            n = 0
            for fault in self._faults:
                if fault.active:
                    fault.active, fault.cleared_at = False, now
                    n += 1
            return n

    def hang(self, hung: Hung, stopping: threading.Event) -> bool:
        """Block until released, ``max_ms`` passed or the tool stops; True when released."""
        deadline = time.monotonic() + hung.max_ms / 1000
        with self._lock:
            self._hung[hung.seq] = hung
        try:
            # Short slices: a stopping tool must not sit out a 30 s hang.
            while not stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if hung.event.wait(min(left, 0.1)):
                    return True
            return False
        finally:
            with self._lock:
                self._hung.pop(hung.seq, None)

    def release(self, drop: bool = False) -> int:
        """Wake every hung request; returns how many were hung. With ``drop``,
        requests held on the network (``arrive_held``) are lost instead of
        arriving; a ``hang`` (already logged) goes on either way."""
        with self._lock:
            hung = list(self._hung.values())
            self._hung.clear()
        for h in hung:
            h.dropped = drop
            h.event.set()
        return len(hung)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "faults": [f.describe() for f in self._faults if f.active],
                "history": [f.describe() for f in self._faults],
                "hung": [
                    {
                        "seq": h.seq,
                        "tool": h.tool,
                        "operation_id": h.operation_id,
                        "since": h.since,
                        "since_iso": iso(h.since),
                        "max_ms": h.max_ms,
                    }
                    for h in self._hung.values()
                ],
            }
