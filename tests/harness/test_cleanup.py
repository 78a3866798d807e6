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
import time

import psutil
import pytest

from harness.waiting import wait_for

pytestmark = pytest.mark.slow

SMOKE = [sys.executable, "-m", "harness.cli", "smoke"]


def _smoke_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "fencecheck-smoke-*")))


class TreeWatcher:
    """Collects every descendant pid of a process while it runs."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for child in self.root.children(recursive=True):
                    if child.pid not in self.seen:
                        try:
                            self.seen[child.pid] = " ".join(child.cmdline())[:120]
                        except psutil.Error:
                            self.seen[child.pid] = "?"
            except psutil.Error:
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def alive(self) -> list[str]:
        left = []
        for pid, cmd in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid} {cmd}")
            except psutil.NoSuchProcess:
                continue
        return left


def test_completed_run_leaves_nothing_behind() -> None:
    dirs_before = _smoke_dirs()
    proc = subprocess.Popen(SMOKE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = TreeWatcher(proc.pid)
    out, _ = proc.communicate(timeout=120)
    watcher.stop()
    assert proc.returncode == 0, out
    assert any("postgres" in c for c in watcher.seen.values()), "no server was ever started"
    assert any("toxiproxy" in c for c in watcher.seen.values()), "no proxy was ever started"
    assert watcher.alive() == []
    assert _smoke_dirs() - dirs_before == set(), "temp directories left behind"


def test_interrupted_run_leaves_nothing_behind() -> None:
    dirs_before = _smoke_dirs()
    proc = subprocess.Popen(SMOKE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = TreeWatcher(proc.pid)
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
    watcher.stop()
    assert proc.returncode == 130, "".join(lines)
    assert sum("postgres" in c for c in watcher.seen.values()) >= 2
    assert watcher.alive() == []
    assert _smoke_dirs() - dirs_before == set(), "temp directories left behind"
