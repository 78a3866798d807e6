"""System V shared memory segments, as the kernel lists them, and their removal.

A PostgreSQL server keeps a small System V segment for as long as it runs
and removes it when it shuts down. A server killed with SIGKILL (as the
parent-death signal does when the harness itself is killed) leaves it behind;
the run records (``harness.engine.run_records``) find such segments through
the server's ``postmaster.pid`` and remove them here.

Invariant: a segment is removed only when the kernel still lists it with the
same id *and* the same key as recorded, so an id the kernel has since given
to someone else is never touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROC_SHM = Path("/proc/sysvipc/shm")
_IPC_RMID = 0


@dataclass(frozen=True)
class Segment:
    key: int
    shmid: int
    size: int
    creator_pid: int
    attached: int
    uid: int


def segments() -> dict[int, Segment]:
    """Every System V segment the kernel lists, by id (empty when /proc has no list)."""
    try:
        lines = PROC_SHM.read_text().splitlines()[1:]
    except OSError:
        return {}
    found: dict[int, Segment] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        key, shmid, _perms, size, cpid, _lpid, nattch, uid = (int(f) for f in fields[:8])
        found[shmid] = Segment(key, shmid, size, cpid, nattch, uid)
    return found


def _shmctl() -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        func = ctypes.CDLL(name, use_errno=True).shmctl
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    func.restype = ctypes.c_int
    shmctl: Callable[..., int] = func
    return shmctl


def remove(key: int, shmid: int) -> str | None:
    """Remove segment ``shmid`` if the kernel still lists it with ``key``.

    Returns None when it was removed (or was already gone), else why not.
    A segment still attached is only marked: the kernel frees it when the
    last process detaches.
    """
    current = segments().get(shmid)
    if current is None:
        return None
    if current.key != key:
        return f"segment {shmid} now has key {current.key}, not {key}: someone else's"
    shmctl = _shmctl()
    if shmctl is None:
        return "no shmctl in this C library"
    if shmctl(shmid, _IPC_RMID, None) != 0:
        errno = ctypes.get_errno()
        return f"shmctl({shmid}, IPC_RMID) failed with errno {errno}"
    return None
