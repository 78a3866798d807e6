"""A worker whose wall clock runs behind the database's: libfaketime.

Every part of a run shares one host and so one clock; a worker on another
machine does not (an NTP step back, a VM restored from a snapshot). A
worker that compares a database timestamp with its own wall clock (a claim's
``dispatch_until`` against ``time.time()``) is right on one host and wrong on
two. libfaketime, preloaded into the worker's process, moves what the C
library answers for the wall clock (``clock_gettime(CLOCK_REALTIME)``,
``time``, ``gettimeofday``) by a fixed offset, and leaves the monotonic clock
alone (``FAKETIME_DONT_FAKE_MONOTONIC``): a worker that times its deadlines
by its own monotonic readings, as the contract asks, behaves exactly as
before.

Limits, said where they bite:
* A preload takes effect at ``exec``: such a worker is exec'd, never forked
  from the run's fork server (harness/parts/fork_server.py).
* A program that reads the clock without the C library (a Go binary reads
  the kernel's vDSO itself) is not moved. Its mapping declares
  ``clock_skew: false`` and the experiments that need it are not applicable;
  one that does not declare it is caught by the experiment's own check of
  the skew in the worker's history, and its run is unknown, never a pass.

Invariants: :func:`skewed_env` raises :class:`ClockSkewUnavailable` (what to
install, and how) when the library is missing; :func:`measure` runs one
short process under the same preload and reports the offset it saw, bounded
by a timeout. libfaketime 0.9.10 makes a POSIX shared memory segment and a
semaphore per process (``/dev/shm/faketime_shm_<pid>``) and leaves both
behind even when the process exits normally: :func:`forget` removes them
once the process has ended, so a run leaves nothing in ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: Where Debian's ``libfaketime`` package puts the library (the multi-threaded
#: build: workers have threads), and the variable that names another.
LIBRARY_ENV = "FENCECHECK_LIBFAKETIME"
DEBIAN_LIBRARIES = "/usr/lib/*-linux-gnu/faketime/libfaketimeMT.so.1"
PROBE_TIMEOUT_S = 10.0
SHARED_MEMORY_DIR = Path("/dev/shm")


class ClockSkewUnavailable(RuntimeError):
    """libfaketime is not installed where the harness looks."""


def library() -> Path:
    """The libfaketime library to preload, or :class:`ClockSkewUnavailable`."""
    named = os.environ.get(LIBRARY_ENV)
    candidates = [Path(named)] if named else sorted(Path("/").glob(DEBIAN_LIBRARIES[1:]))
    for path in candidates:
        if path.is_file():
            return path
    raise ClockSkewUnavailable(
        f"libfaketime not found (looked for {named or DEBIAN_LIBRARIES}): a worker "
        "with a clock behind the database's needs it. Install it with `apt-get install "
        f"libfaketime` (`make setup` does, as root), or set {LIBRARY_ENV} to the path of "
        "libfaketimeMT.so.1"
    )


def skewed_env(behind_s: float) -> dict[str, str]:
    """The environment that sets a process's wall clock ``behind_s`` seconds back."""
    return {
        "LD_PRELOAD": str(library()),
        "FAKETIME": f"-{behind_s:g}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@dataclass(frozen=True)
class SkewMeasurement:
    """What one process under the preload read, against the harness's clock."""

    behind_s: float  # how far its wall clock was behind the harness's
    detail: str


def measure(behind_s: float) -> SkewMeasurement:
    """Run one short process under the preload; how far behind its clock was.

    The harness's own evidence that the library moves the clock on this host
    (the worker's history then shows that it moved the worker's)."""
    env = {**os.environ, **skewed_env(behind_s)}
    before = time.time()
    probe = subprocess.Popen(
        [sys.executable, "-S", "-c", "import time; print(repr(time.time()))"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = probe.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return SkewMeasurement(0.0, f"the probe did not answer within {PROBE_TIMEOUT_S:g} s")
    finally:
        forget(probe.pid)
    after = time.time()
    if probe.returncode != 0:
        return SkewMeasurement(0.0, f"the probe exited {probe.returncode}: {stderr.strip()}")
    seen = float(stdout.strip())
    # The probe read its clock between before and after: the skew is at least
    # before - seen and at most after - seen; the lower bound is the claim.
    return SkewMeasurement(
        before - seen, f"the probe read {seen:.3f}, the harness {before:.3f}..{after:.3f}"
    )


def preloaded(env: Mapping[str, str | None]) -> bool:
    """Whether ``env`` preloads libfaketime (the process will leave shared memory)."""
    return "faketime" in (env.get("LD_PRELOAD") or "")


def forget(pid: int) -> None:
    """Remove the shared memory and semaphore libfaketime made for ``pid`` (call
    once the process has ended: a live one still uses them)."""
    for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            (SHARED_MEMORY_DIR / name).unlink()


def forget_dead() -> list[int]:
    """Remove what libfaketime left for processes that no longer exist (a run
    killed before it could call :func:`forget`); the pids it removed."""
    removed = []
    for path in sorted(SHARED_MEMORY_DIR.glob("faketime_shm_*")):
        pid = path.name.rsplit("_", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            forget(int(pid))
            removed.append(int(pid))
    return removed
