"""Watching a `fencecheck` run from outside, as an operator's tools would.

A run under test gets a private TMPDIR (its temp root, run records and data
directories all live there), so whatever it leaves behind is attributed to it
by path, never by guessing: processes whose command line names the TMPDIR,
files under it, the System V segments its servers' ``postmaster.pid`` files
named while it ran, and the /dev/shm files its servers mapped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.parts import shared_memory
from harness.parts.postgres import PostmasterPid

REPO = Path(__file__).resolve().parents[2]


def private_tmpdir() -> Path:
    """A TMPDIR of the test's own under the system's, enterable by the
    unprivileged server user (pytest's own tmp_path is not: it is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fc-out-"))
    path.chmod(0o755)
    return path


@dataclass
class Observed:
    """Everything a watcher saw while a run was alive."""

    pids: dict[int, str] = field(default_factory=dict)
    segments: dict[int, int] = field(default_factory=dict)  # shmid -> key
    dev_shm_maps: set[str] = field(default_factory=set)
    postgres_pids: set[int] = field(default_factory=set)


class Watcher:
    """Polls a run's process tree and its TMPDIR while it runs."""

    def __init__(self, pid: int, tmpdir: Path | None = None) -> None:
        self.root = psutil.Process(pid)
        self.tmpdir = tmpdir
        self.seen = Observed()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                try:
                    # Read again each time: a child caught between fork and exec
                    # still shows its parent's command line (a loaded machine
                    # widens that window); an exited one shows none.
                    cmdline = " ".join(child.cmdline())[:160]
                    if cmdline or child.pid not in self.seen.pids:
                        self.seen.pids[child.pid] = cmdline
                    if "postgres" in self.seen.pids[child.pid]:
                        self.seen.postgres_pids.add(child.pid)
                        self._note_maps(child.pid)
                except psutil.Error:
                    continue
            for dirpath, _dirs, files in os.walk(
                self.tmpdir or "/nonexistent"
            ):  # dirs vanish: fine
                if "postmaster.pid" in files:
                    parsed = PostmasterPid.read(Path(dirpath) / "postmaster.pid")
                    if parsed is not None and parsed.shm_id is not None and parsed.shm_key:
                        self.seen.segments[parsed.shm_id] = parsed.shm_key
            time.sleep(0.05)

    def _note_maps(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
                for line in maps:
                    if "/dev/shm/" in line:
                        self.seen.dev_shm_maps.add(line.split()[-1])
        except OSError:
            return

    def stop(self) -> Observed:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.seen


def alive(pids: dict[int, str]) -> list[str]:
    left = []
    for pid, cmd in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {cmd}")
        except psutil.NoSuchProcess:
            continue
    return left


def processes_naming(text: str) -> list[str]:
    """Live processes whose command line mentions ``text`` (orphans included)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if text in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']} {cmdline[:160]}")
        except psutil.Error:
            continue
    return found


# harness/engine/reaper.py: at most 30 s for the command to be gone, then one
# bounded reap of what the command's escalation could not remove in time.
REAPER_BOUND_S = 45.0


def reapers_done(tmpdir: Path) -> None:
    """Wait, bounded, for a reaper the stopped command handed its records to:
    it is part of the stop, and what it leaves (itself included) is judged
    once it has ended or run out of its bound."""
    deadline = time.monotonic() + REAPER_BOUND_S
    while time.monotonic() < deadline and any(
        "harness.engine.reaper" in p for p in processes_naming(str(tmpdir))
    ):
        time.sleep(0.1)


def leftovers(seen: Observed, tmpdir: Path) -> list[str]:
    """What a finished run left behind, attributed by its private TMPDIR."""
    reapers_done(tmpdir)
    problems = [f"process still running: {p}" for p in alive(seen.pids)]
    problems += [f"orphan naming the TMPDIR: {p}" for p in processes_naming(str(tmpdir))]
    for path in sorted(tmpdir.iterdir()):
        if path.name.startswith("fencecheck-state-"):
            records = sorted(path.iterdir())
            problems += [f"run record left: {r}" for r in records]
            if not records:  # released runs remove the emptied state directory
                problems.append(f"empty state directory left: {path}")
        else:
            problems.append(f"left in TMPDIR: {path}")
    segments = shared_memory.segments()
    problems += [
        f"shared memory segment {shmid} (key {key}) left"
        for shmid, key in seen.segments.items()
        if shmid in segments and segments[shmid].key == key
    ]
    problems += [f"a server mapped {name}" for name in sorted(seen.dev_shm_maps)]
    return problems


@dataclass
class Run:
    """A `fencecheck` command started in its own session with a private TMPDIR."""

    proc: subprocess.Popen[str]
    tmpdir: Path
    reports: Path
    watcher: Watcher
    lines: list[str] = field(default_factory=list)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_line(self, text: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {text!r}:\n{self.output}")
            time.sleep(0.02)

    def wait_file(self, pattern: str, *, contains: str = "", timeout_s: float = 90.0) -> Path:
        """A file matching ``pattern`` under the reports or TMPDIR (with ``contains``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for root in (self.reports, self.tmpdir):
                for path in root.glob(pattern):
                    try:
                        if not contains or contains in path.read_text(errors="replace"):
                            return path
                    except OSError:
                        continue
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern} containing {contains!r}:\n{self.output}")
            time.sleep(0.02)

    def signal(self, sig: int, *, group: bool = False) -> float:
        """Send ``sig`` (to the whole session's group, as a terminal's Ctrl-C does,
        with ``group``); returns the monotonic time it was sent."""
        sent = time.monotonic()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        return sent

    def close(self) -> None:
        """Test teardown: end the run if the test failed early, remove the TMPDIR."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.watcher.stop()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def finish(self, timeout_s: float = 60.0) -> tuple[int, float, Observed]:
        """Exit code, monotonic exit time, what the watcher saw."""
        code = self.proc.wait(timeout=timeout_s)
        ended = time.monotonic()
        seen = self.watcher.stop()
        return code, ended, seen


def start(args: list[str], tmp_path: Path, *, extra_env: dict[str, str] | None = None) -> Run:
    tmpdir = private_tmpdir()
    reports = tmp_path / "reports"
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args, "--report-dir", str(reports)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a "terminal" Ctrl-C reaches only it
    )
    run = Run(proc, tmpdir, reports, Watcher(proc.pid, tmpdir))
    threading.Thread(target=run._read, daemon=True).start()
    return run
