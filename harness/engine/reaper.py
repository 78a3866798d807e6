"""What an escalated stop could not remove in time, removed after it exits.

A stop promises the command ends within 5 s. Its escalation kills what the run
started and removes its temp state, but on a loaded machine removing a
mutant campaign's scratch (hundreds of MB of clusters) can take longer than
the budget left; exiting then would leave it for the next run or a manual
`fencecheck clean`. Instead the command hands the run records it still owns
to a reaper: a process of its own session (a Ctrl-C to the terminal's group
does not reach it) that waits for the command to be gone, removes what each
record names, and exits.

Invariants: the reaper only touches records whose owner has exited (the
same check as `fencecheck clean`); it waits at most ``OWNER_EXIT_TIMEOUT_S``
for that, and each removal is bounded as in :func:`reap_record`.

Run as ``python -m harness.engine.reaper OWNER_PID RECORD...``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from harness.engine.run_records import owner_alive, reap_record

OWNER_EXIT_TIMEOUT_S = 30.0
POLL_S = 0.05
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def hand_over(records: Sequence[Path]) -> str | None:
    """Start a reaper for ``records`` (the caller is about to exit); what to say."""
    if not records:
        return None
    env = dict(os.environ)
    # The reaper imports the harness the way this process did, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.engine.reaper", str(os.getpid()), *map(str, records)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    return (
        f"a reaper (pid {proc.pid}) removes the rest of {len(records)} run record(s) "
        "once this process has exited"
    )


def _exited(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")  # dead, not yet waited for


def main(argv: Sequence[str]) -> int:
    owner = int(argv[0])
    ends = time.monotonic() + OWNER_EXIT_TIMEOUT_S
    while not _exited(owner):
        if time.monotonic() > ends:
            return 1  # the owner still runs: its records are its own
        time.sleep(POLL_S)
    left = 0
    for name in argv[1:]:
        path = Path(name)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # already removed (the owner finished after all)
        if owner_alive(data.get("owner") or {}):
            continue
        left += bool(reap_record(path, data).problems)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
