"""Run records: what a run created, written where the next run finds it.

A run that ends normally removes everything it started. A run killed with
SIGKILL (or whose machine lost power) cannot: its servers die with it (they
get a parent-death signal) but their System V shared memory segments, its
temp directory with the data directories (hundreds of MB) and its containers
stay. So every run first writes a record of what it creates, in a state
directory under the temp directory root it uses
(``$TMPDIR/fencecheck-state-<uid>/``, or the ``--work-dir``'s), and keeps it
current; at its end it removes what it created and then the record.

At the start of every ``fencecheck`` run, and by ``fencecheck clean``, the
records whose owner is dead are reaped: their leftover servers killed, their
System V segments (found in the record and in each ``postmaster.pid``)
removed, their temp directories deleted, their containers removed, and the
reaping is reported.

Invariant: nothing of a live run is ever touched. A record's owner is its
pid *and* that process's start time (a reused pid is another process); a
record of another host, or one that cannot be read, is left alone. Only
paths a record names are removed, never anything found by a name pattern.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.parts import port_guard, shared_memory
from harness.parts.files import remove_tree
from harness.parts.postgres import PostmasterPid
from harness.parts.processes import process_running, process_start_ticks, process_started

RECORD_VERSION = 1
# A pid's wall-clock start time as psutil reads it and as recorded agree to
# within this, for a record without start ticks: the boot time under it is
# whole seconds and moves by one when the wall clock is adjusted, so one
# second was too tight (a live test session's temp root was reaped by a
# `fencecheck clean` beside it, its owner read a second off).
START_TIME_TOLERANCE_S = 2.0


#: Between a release's reap that met a problem and its one more pass.
RETRY_PAUSE_S = 0.2


def state_dir(base: Path | None = None) -> Path:
    """Where run records live: ``<base or the system temp dir>/fencecheck-state-<uid>``."""
    root = Path(base) if base is not None else Path(tempfile.gettempdir())
    return root / f"fencecheck-state-{os.getuid()}"


# A tmpfs with at least this much free space holds a run's clusters (the
# replicated pairs of H are about 400 MB each, several at a time).
MEMORY_SCRATCH = Path("/dev/shm")
MEMORY_SCRATCH_MIN_FREE = 4 << 30


def scratch_base(base: Path | None, *, prefer_memory: bool) -> tuple[Path, str]:
    """Where a run's temp root goes, and why: ``base`` when given; else the
    system temp directory when TMPDIR names one; else a roomy tmpfs
    (``/dev/shm``) when ``prefer_memory`` and there is one, because clusters
    on a disk mounted with ``discard`` spent seconds of kernel time per run
    writing WAL and trimming the files a teardown unlinks; else the system
    temp directory."""
    if base is not None:
        return Path(base), "--work-dir"
    if prefer_memory and not os.environ.get("TMPDIR") and _roomy_tmpfs(MEMORY_SCRATCH):
        return MEMORY_SCRATCH, "tmpfs"
    return Path(tempfile.gettempdir()), "system temp directory"


def _roomy_tmpfs(path: Path) -> bool:
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            on_tmpfs = any(
                line.split()[1] == str(path) and line.split()[2] == "tmpfs"
                for line in mounts
                if len(line.split()) > 2
            )
        stat = os.statvfs(path)
    except OSError:
        return False
    return (
        on_tmpfs
        and os.access(path, os.W_OK | os.X_OK)
        and (stat.f_bavail * stat.f_frsize >= MEMORY_SCRATCH_MIN_FREE)
    )


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process that wrote a record still runs (same pid, same start).

    Another host's record counts as alive: nothing here can tell.
    """
    if owner.get("host") != socket.gethostname():
        return True
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    ticks = owner.get("start_ticks")
    if isinstance(ticks, int):  # the kernel's own start of the process: exact
        return process_start_ticks(pid) == ticks
    try:
        started = float(owner["started"])
    except (KeyError, TypeError, ValueError):
        return False
    actual = process_started(pid)
    return actual is not None and abs(actual - started) < START_TIME_TOLERANCE_S


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader sees the old record or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(3)}.tmp")
    text = json.dumps(data, indent=2, default=str)
    try:
        tmp.write_text(text)
    except FileNotFoundError:
        # Another run's release removed the state directory as it emptied.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(text)
    os.replace(tmp, path)


# Records this process created and has not released yet.
_UNRELEASED: set[RunRecord] = set()
_UNRELEASED_LOCK = threading.Lock()


def unreleased_paths(created_after: float | None = None) -> list[Path]:
    """The files of the records this process created and has not released yet
    (with ``created_after``, only those created since then)."""
    with _UNRELEASED_LOCK:
        records = list(_UNRELEASED)
    return [
        r.path
        for r in records
        if created_after is None or float(r.as_dict()["created_at"]) >= created_after
    ]


def release_unreleased(created_after: float | None = None) -> list[Reaped]:
    """Release every record this process created and never released (with
    ``created_after``, only those created since then): the last step of a
    command, for a stop that struck between a record's creation and the
    teardown that owns it. Only called where those records are done with."""
    with _UNRELEASED_LOCK:
        records = list(_UNRELEASED)
    if created_after is not None:
        records = [r for r in records if float(r.as_dict()["created_at"]) >= created_after]
    return [record.release() for record in records]


class RunRecord:
    """The record of one live run. Create with :meth:`create`, add to it as the
    run creates things, :meth:`release` at the end."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self._data = data
        self._lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._released: Reaped | None = None

    @classmethod
    def create(
        cls,
        *,
        base: Path | None,
        kind: str,
        report_dir: Path | None = None,
        prefer_memory: bool = False,
        released_by_command: bool = True,
    ) -> RunRecord:
        """Write the record, then make the run's temp root it names (so no moment
        exists where the root is there and no record says whose it is). The
        record stays in ``state_dir(base)`` wherever the root goes
        (:func:`scratch_base`), so ``fencecheck clean`` finds it.
        ``released_by_command``: :func:`release_unreleased` (a command's last
        step) releases it too; False for a record that outlives the commands
        its process runs (a test session's, whose tests run commands in it)."""
        directory = state_dir(base)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_hex(4)
        me = os.getpid()
        scratch, why = scratch_base(base, prefer_memory=prefer_memory)
        root = scratch / f"fencecheck-{kind}-{token}"
        data: dict[str, Any] = {
            "version": RECORD_VERSION,
            "owner": {
                "pid": me,
                "started": process_started(me),
                "start_ticks": process_start_ticks(me),
                "host": socket.gethostname(),
                "argv": sys.argv[:8],
            },
            "kind": kind,
            "created_at": time.time(),
            "report_dir": str(report_dir) if report_dir else None,
            "temp_dirs": [str(root)],
            "scratch": why,
            "clusters": [],
            "firewall_tables": [],
            "backend": {},
        }
        record = cls(directory / f"run-{me}-{token}.json", data)
        if released_by_command:
            with _UNRELEASED_LOCK:
                _UNRELEASED.add(record)
        try:
            _write_json(record.path, data)
            root.mkdir(mode=0o700)
        except BaseException:
            record.release()  # a stop (or a full disk) right here leaves nothing
            raise
        return record

    @property
    def temp_root(self) -> Path:
        return Path(self._data["temp_dirs"][0])

    @property
    def scratch(self) -> str:
        """Where the temp root is and why (:func:`scratch_base`), for the archives."""
        return f"{self.temp_root.parent} ({self._data.get('scratch', 'given')})"

    def _update(self, change: dict[str, Any]) -> None:
        with self._lock:
            for key, value in change.items():
                if isinstance(self._data.get(key), list):
                    if value not in self._data[key]:
                        self._data[key].append(value)
                else:
                    self._data[key] = value
            snapshot = json.loads(json.dumps(self._data, default=str))
            with contextlib.suppress(OSError):  # a vanished state dir must not fail the run
                _write_json(self.path, snapshot)

    def add_temp_dir(self, path: Path) -> None:
        self._update({"temp_dirs": str(path)})

    def add_cluster(self, datadir: Path) -> None:
        """Note a server just started: its data directory, pid, start time and
        System V segment, as its ``postmaster.pid`` says."""
        pidfile = PostmasterPid.read(Path(datadir) / "postmaster.pid")
        if pidfile is None:
            return  # not a local server (a container's), or not started
        self._update(
            {
                "clusters": {
                    "datadir": str(datadir),
                    "pid": pidfile.pid,
                    "started": pidfile.started,
                    "shm_key": pidfile.shm_key,
                    "shm_id": pidfile.shm_id,
                }
            }
        )

    def add_firewall_table(self, table: str) -> None:
        """Note the run's nftables table (harness/parts/port_guard.py)."""
        self._update({"firewall_tables": table})

    def set_backend(self, footprint: dict[str, Any]) -> None:
        """What the backend keeps outside the temp root (containers, a network,
        its own temp directories)."""
        self._update({"backend": footprint})

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._data, default=str))  # type: ignore[no-any-return]

    def release_local(self) -> Reaped:
        """Remove what the record names on this machine (orphaned servers, shared
        memory, temp directories), keeping the record and the containers: the
        first step of a stopping run, before it waits on a container engine."""
        return reap_record(self.path, self.as_dict(), containers=False, keep_record=True)

    def release(self) -> Reaped:
        """At the run's end: remove whatever of the record is still there (a
        segment a killed server left, a directory a failed teardown kept), then
        the record itself. Returns what had to be removed. Safe to call from two
        threads at once (an escalated stop during the orderly teardown): the
        second waits for the first."""
        with self._release_lock:
            if self._released is None:
                reaped = reap_record(self.path, self.as_dict())
                if reaped.problems:
                    # A server killed a moment ago may still be writing into
                    # its directory (an escalated stop kills, then reaps at
                    # once): one more pass after a pause removes what the
                    # first could not, instead of leaving the record for the
                    # next run (seen once in CI, a second SIGINT 50 ms after
                    # the first).
                    time.sleep(RETRY_PAUSE_S)
                    again = reap_record(self.path, self.as_dict())
                    again.merge(reaped)
                    reaped = again
                self._released = reaped
                with _UNRELEASED_LOCK:
                    _UNRELEASED.discard(self)
            return self._released


# ------------------------------------------------------------------ reaping
@dataclass
class Reaped:
    """What reaping one record removed."""

    record: str
    owner_pid: int | None
    temp_dirs: list[str] = field(default_factory=list)
    bytes_removed: int = 0
    servers_killed: list[int] = field(default_factory=list)
    segments_removed: list[int] = field(default_factory=list)
    containers_removed: list[str] = field(default_factory=list)
    firewall_tables_removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def merge(self, earlier: Reaped) -> None:
        """Count in what an earlier pass over the same record removed (its
        problems are this pass's to report: what is still there)."""
        self.temp_dirs = [*earlier.temp_dirs, *self.temp_dirs]
        self.bytes_removed += earlier.bytes_removed
        self.servers_killed = [*earlier.servers_killed, *self.servers_killed]
        self.segments_removed = [*earlier.segments_removed, *self.segments_removed]
        self.containers_removed = [*earlier.containers_removed, *self.containers_removed]
        self.firewall_tables_removed = [
            *earlier.firewall_tables_removed,
            *self.firewall_tables_removed,
        ]

    @property
    def anything(self) -> bool:
        return bool(
            self.temp_dirs
            or self.servers_killed
            or self.segments_removed
            or self.containers_removed
            or self.firewall_tables_removed
        )

    def describe(self) -> str:
        parts = [f"{len(self.temp_dirs)} temp dir(s) ({self.bytes_removed / 1e6:.1f} MB)"]
        parts.append(f"{len(self.segments_removed)} shared memory segment(s)")
        if self.servers_killed:
            parts.append(f"{len(self.servers_killed)} orphaned server(s) killed")
        if self.containers_removed:
            parts.append(f"{len(self.containers_removed)} container(s)/network(s)")
        if self.firewall_tables_removed:
            parts.append(f"firewall table(s) {', '.join(self.firewall_tables_removed)}")
        text = f"run of pid {self.owner_pid}: " + ", ".join(parts)
        if self.problems:
            text += "; NOT removed: " + "; ".join(self.problems)
        return text


@dataclass
class ReapReport:
    """The outcome of reaping a state directory."""

    state_dir: Path
    reaped: list[Reaped] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        return [p for r in self.reaped for p in r.problems]

    def lines(self) -> list[str]:
        """One line per reaped run, then the totals (nothing when nothing was found)."""
        if not self.reaped:
            return []
        total = sum(r.bytes_removed for r in self.reaped) / 1e6
        segments = sum(len(r.segments_removed) for r in self.reaped)
        return [
            *(f"reaped {r.describe()}" for r in self.reaped),
            f"reaped {len(self.reaped)} dead run(s) in {self.seconds:.2f}s: {total:.1f} MB of "
            f"temp directories, {segments} shared memory segment(s)"
            + (f"; {len(self.live)} live run(s) left alone" if self.live else ""),
        ]


def _postmaster_pids(temp_dirs: Iterable[Path]) -> list[PostmasterPid]:
    found: list[PostmasterPid] = []
    for root in temp_dirs:
        for dirpath, _dirs, files in os.walk(root):  # errors (a dir gone meanwhile) skipped
            if "postmaster.pid" in files:
                parsed = PostmasterPid.read(Path(dirpath) / "postmaster.pid")
                if parsed is not None:
                    found.append(parsed)
    return found


def _kill_orphan_server(pid: int, started: float) -> bool:
    """SIGKILL a server a dead run left running, if it is still that server."""
    actual = process_started(pid)
    if actual is None or abs(actual - started) > START_TIME_TOLERANCE_S + 1:
        return False
    if not process_running(pid):
        return False  # dead already (a zombie its new parent has yet to reap)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    return False


def _remove_containers(footprint: dict[str, Any], reaped: Reaped) -> None:
    run = footprint.get("container_run")
    if not run:
        return
    try:
        from harness.backends import containers
    except ImportError as exc:
        reaped.problems.append(f"containers of run {run}: {exc}")
        return
    try:
        reaped.containers_removed += containers.remove_run(str(run), footprint.get("engine"))
    except Exception as exc:
        reaped.problems.append(
            f"containers of run {run}: {type(exc).__name__}: {exc} (`make containers-clean` "
            "removes them once the engine answers)"
        )


def reap_record(
    path: Path, data: dict[str, Any], *, containers: bool = True, keep_record: bool = False
) -> Reaped:
    """Remove everything a record names whose owner is gone (or is the caller at
    its end), then the record; a record with something left keeps it for next time."""
    owner = data.get("owner") or {}
    reaped = Reaped(record=path.name, owner_pid=owner.get("pid"))
    temp_dirs = [Path(p) for p in data.get("temp_dirs") or []]
    footprint: dict[str, Any] = data.get("backend") or {}
    temp_dirs += [Path(p) for p in footprint.get("temp_dirs") or []]
    servers = [
        (c["pid"], c["started"], c.get("shm_key"), c.get("shm_id"))
        for c in data.get("clusters") or []
        if isinstance(c, dict) and "pid" in c and "started" in c
    ]
    servers += [(p.pid, p.started, p.shm_key, p.shm_id) for p in _postmaster_pids(temp_dirs)]
    for pid, started, key, shmid in dict.fromkeys(servers):
        if pid != os.getpid() and _kill_orphan_server(int(pid), float(started)):
            reaped.servers_killed.append(int(pid))
        if key is None or shmid is None:
            continue
        before = shmid in shared_memory.segments()
        problem = shared_memory.remove(int(key), int(shmid))
        if problem is None and before and shmid not in reaped.segments_removed:
            reaped.segments_removed.append(int(shmid))
        elif problem is not None and "someone else's" not in problem:
            reaped.problems.append(problem)
    for directory in temp_dirs:
        if not directory.exists():
            continue
        size = remove_tree(directory)
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)  # whatever the walk could not
        if directory.exists():
            reaped.problems.append(f"could not remove {directory}")
        else:
            reaped.temp_dirs.append(str(directory))
            reaped.bytes_removed += size
    for table in data.get("firewall_tables") or []:
        problem = port_guard.delete_table(str(table))
        if problem is None:
            reaped.firewall_tables_removed.append(str(table))
        else:
            reaped.problems.append(problem)
    # Containers last: an engine can take seconds per container, and a stop
    # cut short here must still have removed what is on this machine's disk.
    if containers:
        _remove_containers(footprint, reaped)
    if not reaped.problems and not keep_record:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # The last record gone, the state directory goes too: a finished run
        # leaves nothing in the temp dir (a run starting now recreates it).
        with contextlib.suppress(OSError):
            path.parent.rmdir()
    return reaped


def reap_dead(base: Path | None = None) -> ReapReport:
    """Reap every record in the state directory whose owner is dead.

    A live run's record (pid alive with the recorded start time) and a record
    of another host are left alone; so is one that cannot be parsed (it is
    reported).
    """
    started = time.monotonic()
    report = ReapReport(state_dir(base))
    if not report.state_dir.is_dir():
        return report
    for path in sorted(report.state_dir.glob("run-*.json")):
        try:
            data = json.loads(path.read_text())
            owner = data["owner"]
        except (OSError, ValueError, KeyError, TypeError):
            report.unreadable.append(path.name)
            continue
        if owner_alive(owner):
            report.live.append(f"pid {owner.get('pid')} ({path.name})")
            continue
        report.reaped.append(reap_record(path, data))
    report.seconds = time.monotonic() - started
    return report
