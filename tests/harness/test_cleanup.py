"""A run leaves nothing behind: no process, no cluster, no proxy, no temp directory.

Both tests drive the real CLI (`fencecheck smoke`, which brings up every part)
as a subprocess and watch its whole process tree from outside.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

from harness.waiting import wait_for
from tests.harness.outside import Watcher, alive

pytestmark = pytest.mark.slow

SMOKE = [sys.executable, "-m", "harness.cli", "smoke"]


def _smoke_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "fencecheck-smoke-*")))


def test_completed_run_leaves_nothing_behind() -> None:
    dirs_before = _smoke_dirs()
    proc = subprocess.Popen(SMOKE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = Watcher(proc.pid)
    out, _ = proc.communicate(timeout=120)
    seen = watcher.stop().pids
    assert proc.returncode == 0, out
    assert any("postgres" in c for c in seen.values()), "no server was ever started"
    assert any("toxiproxy" in c for c in seen.values()), "no proxy was ever started"
    assert alive(seen) == []
    assert _smoke_dirs() - dirs_before == set(), "temp directories left behind"


def test_interrupted_run_leaves_nothing_behind() -> None:
    dirs_before = _smoke_dirs()
    proc = subprocess.Popen(SMOKE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = Watcher(proc.pid)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Interrupt while a sync commit is blocked on a cut replication link:
    # two servers, toxiproxy and a waiting backend are all up.
    wait_for(
        lambda: any("commit still waiting" in line for line in lines),
        what="the smoke run to reach its blocked sync commit",
        timeout_s=60,
    )
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    reader.join(timeout=5)
    seen = watcher.stop().pids
    assert proc.returncode == 130, "".join(lines)
    assert sum("postgres" in c for c in seen.values()) >= 2
    assert alive(seen) == []
    assert _smoke_dirs() - dirs_before == set(), "temp directories left behind"
