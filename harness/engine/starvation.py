"""How long the processes of a run waited for a CPU: the kernel's own account.

On a busy machine a worker's heartbeat thread can be runnable and still not
run: its renewal then times out and the worker cancels itself, as the
protocol says it must. That is no bug, but a check that expects the run to
finish would call it one. The kernel counts, per thread, the time it spent
runnable on a run queue without a CPU (``/proc/PID/task/TID/schedstat``, the
second field: run delay in nanoseconds). :class:`StarvationMonitor` samples
that counter of every watched process every ``TICK_S`` and records an
*episode* wherever one thread of a process waited for a CPU for at least
half of a sampling interval in a row; a process stopped by SIGSTOP or
blocked on I/O waits on no run queue, so a fault the harness injected never
reads as starvation.

Waiting for the disk is measured too, from the process's state: a process
seen in uninterruptible sleep (``D`` in ``/proc/PID/stat``) at consecutive
ticks waited for I/O at least the time between the first and the last of
them (one sighting alone counts nothing, so a short fsync is never inflated
to a tick). Under a machine's heavy I/O a worker's own write can sit in its
backend's fsync while its renewal queues behind that write's row lock, and
the lease runs out: correct behaviour (the renewal is refused and the worker
cancels itself), no bug. No fault the harness injects puts a process in
``D``: a SIGSTOP is ``T``, a partitioned socket is ``S``.

The database backends serving an experiment are watched too
(:meth:`StarvationMonitor.watch_backends`): a worker's renewal is a
statement its backend must run, so a backend starved of CPU times out a
correct worker as surely as its own thread would. The server forks one
backend per connection and names it in its process title (``postgres:
USER DATABASE HOST(PORT) STATE``); the monitor lists the postmaster's
children every tick and watches those whose title names a watched
database, under the experiment's name.

Episodes are evidence of timing, measured by the harness itself: an unmet
progress check whose window saw one long enough to fire a protocol timer is
*unknown* naming it (harness/engine/experiment.py), never *fail*.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from harness.engine import waits
from harness.parts.processes import proc_stat_fields

TICK_S = 0.05
# A sample counts as starved when one thread waited this share of it.
STARVED_SHARE = 0.5
MAX_KEPT = 20_000
# A forked backend keeps the postmaster's title until it has read the
# client's startup packet: it is looked at again for this many ticks.
UNTITLED_TICKS = 100
TITLE_PREFIX = "postgres: "
DISK = "the disk"


@dataclass(frozen=True)
class Starvation:
    """``process`` had a thread waiting for a CPU for ``waited_s`` of the
    ``length_s`` from ``started_at`` (wall clock)."""

    process: str
    pid: int
    started_at: float
    length_s: float
    waited_s: float
    waited_for: str = "a CPU"  # or DISK

    @property
    def ended_at(self) -> float:
        return self.started_at + self.length_s

    def describe(self) -> str:
        at = dt.datetime.fromtimestamp(self.started_at, dt.UTC).isoformat(timespec="milliseconds")
        return (
            f"{self.process} (pid {self.pid}) waited {self.waited_s:.2f}s for {self.waited_for} "
            f"in {self.length_s:.2f}s from {at}"
        )


def _thread_delays(pid: int, only: frozenset[int] | None = None) -> dict[int, int] | None:
    """Run delay (ns) of every thread of ``pid`` (or of its threads ``only``);
    None once it is gone (or every one of those threads is)."""
    if only is not None:
        tids: list[str] | list[int] = sorted(only)
    else:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
    delays: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            delays[int(tid)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return None if only is not None and not delays else delays


def _in_disk_wait(pid: int) -> bool:
    """Whether ``pid``'s main thread is in uninterruptible sleep (I/O)."""
    fields = proc_stat_fields(pid) or []
    return bool(fields) and fields[0] == b"D"


def _writes_to_disk(name: str) -> bool:
    """Whether a watched process is one that writes to disk on a worker's
    path (a database backend, the mock tool): only those are read for disk
    waits, which halves the sampling's own cost."""
    return "/backend " in name or "mock tool" in name


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _title(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def backend_of(title: str) -> tuple[str, str] | None:
    """(user, database) of a client backend's process title, or None for any
    other title (the postmaster's own, a background process, a walsender)."""
    if not title.startswith(TITLE_PREFIX):
        return None
    words = title[len(TITLE_PREFIX) :].split()
    if len(words) < 3 or "(" not in words[2] or words[0] == "walsender":
        return None
    return words[0], words[1]


@dataclass
class _Server:
    """A postmaster whose client backends on some databases are watched."""

    postmaster: int
    databases: dict[str, str]  # database -> the experiment's name
    skip_users: frozenset[str]
    settled: set[int]  # children already watched or known not to be ours
    untitled: dict[int, int]  # child -> ticks seen without a backend's title

    def scan(self) -> list[tuple[int, str]]:
        """The new children to watch, with their names."""
        found: list[tuple[int, str]] = []
        children = _children(self.postmaster)
        alive = set(children)
        self.settled &= alive
        self.untitled = {c: n for c, n in self.untitled.items() if c in alive}
        for child in children:
            if child in self.settled:
                continue
            title = _title(child)
            backend = backend_of(title) if title is not None else None
            if backend is None and not (title or "").startswith(TITLE_PREFIX):
                # Still the postmaster's title: looked at again next tick.
                self.untitled[child] = self.untitled.get(child, 0) + 1
                if self.untitled[child] < UNTITLED_TICKS:
                    continue
            self.settled.add(child)
            self.untitled.pop(child, None)
            if backend is None:
                continue  # a background process, a walsender
            user, database = backend
            name = self.databases.get(database)
            if name is not None and user not in self.skip_users:
                found.append((child, f"{name}/backend {user}"))
        return found


@dataclass
class DiskWait:
    """Consecutive sightings of one process in disk wait, made an episode."""

    name: str
    pid: int
    first_seen: float | None = None  # wall time of the run's first sighting
    last_seen: float = 0.0

    def sample(self, blocked: bool, now: float) -> Starvation | None:
        """Note one tick's sighting; the episode a run of sightings made once
        it ends (None while it goes on, or for a single sighting)."""
        if blocked:
            if self.first_seen is None:
                self.first_seen = now
            self.last_seen = now
            return None
        return self.close()

    def close(self) -> Starvation | None:
        first, self.first_seen = self.first_seen, None
        if first is None or self.last_seen <= first:
            return None
        length = self.last_seen - first
        return Starvation(self.name, self.pid, first, length, length, DISK)

    def open_episode(self) -> Starvation | None:
        """The run going on now, as an episode so far."""
        if self.first_seen is None or self.last_seen <= self.first_seen:
            return None
        length = self.last_seen - self.first_seen
        return Starvation(self.name, self.pid, self.first_seen, length, length, DISK)


@dataclass
class _Watched:
    name: str
    pid: int
    last: dict[int, int]
    disk: DiskWait
    only: frozenset[int] | None = None  # some threads of the process, not all
    open_since: float | None = None  # wall time the current episode began
    open_waited: float = 0.0


class StarvationMonitor:
    """One sampling thread for every watched process of the harness process."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self._watched: dict[int, _Watched] = {}
        self._episodes: list[Starvation] = []
        self._servers: dict[int, _Server] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.available = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")

    def watch(self, pid: int, name: str, *, tids: Iterable[int] | None = None) -> None:
        """Start measuring process ``pid`` (until it exits), or only its
        threads ``tids`` (until they exit: a server thread of the harness)."""
        if not self.available:
            return
        only = frozenset(tids) if tids is not None else None
        key = min(only) if only else pid  # thread ids and pids share one space
        with self._lock:
            if key in self._watched:  # a shared process (the tool host): watched once
                return
        first = _thread_delays(pid, only)
        if first is None:
            return
        with self._lock:
            self._watched[key] = _Watched(name, pid, first, DiskWait(name, pid), only)
            self._ensure_thread()

    def watch_backends(
        self, postmaster: int, database: str, name: str, skip_users: Iterable[str] = ()
    ) -> None:
        """Watch, as ``NAME/backend USER``, every client backend the server
        ``postmaster`` forks for ``database`` from now until
        :meth:`forget_backends` (``skip_users``: the harness's own sessions)."""
        if not self.available or not os.path.exists(
            f"/proc/{postmaster}/task/{postmaster}/children"
        ):
            return
        with self._lock:
            server = self._servers.get(postmaster)
            if server is None:
                server = _Server(postmaster, {}, frozenset(skip_users), set(), {})
                self._servers[postmaster] = server
            server.databases[database] = name
            self._ensure_thread()

    def forget_backends(self, postmaster: int, database: str) -> None:
        """Stop watching new backends of ``database`` (those watched stay
        watched until they exit)."""
        with self._lock:
            server = self._servers.get(postmaster)
            if server is None:
                return
            server.databases.pop(database, None)
            if not server.databases:
                del self._servers[postmaster]

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="starvation-monitor", daemon=True
            )
            self._thread.start()

    def episodes(self, since: float, until: float) -> list[Starvation]:
        """Episodes overlapping the wall-clock window [since, until] (one still
        going on counts up to now)."""
        now = time.time()
        with self._lock:
            found = [e for e in self._episodes if e.started_at < until and e.ended_at > since]
            found += [
                Starvation(w.name, w.pid, w.open_since, now - w.open_since, w.open_waited)
                for w in self._watched.values()
                if w.open_since is not None and w.open_since < until
            ]
            going = [w.disk.open_episode() for w in self._watched.values()]
            found += [e for e in going if e is not None and e.started_at < until]
        return found

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(self.tick_s)
            now_mono = time.monotonic()
            interval = now_mono - last
            last = now_mono
            with self._lock:
                if not self._watched and not self._servers:
                    self._thread = None
                    return
                # Under the lock: forget_backends changes the databases.
                found = [f for server in self._servers.values() for f in server.scan()]
            for pid, name in found:
                self._watch_found(pid, name)
            with self._lock:
                watched = list(self._watched.values())
            for w in watched:
                self._sample(w, interval)

    def _watch_found(self, pid: int, name: str) -> None:
        first = _thread_delays(pid)
        if first is not None:
            with self._lock:
                self._watched.setdefault(pid, _Watched(name, pid, first, DiskWait(name, pid)))

    def _sample(self, w: _Watched, interval: float) -> None:
        now = time.time()
        delays = _thread_delays(w.pid, w.only)
        if delays is None:
            with self._lock:
                self._close(w, now)
                self._keep(w.disk.close())
                self._watched.pop(min(w.only) if w.only else w.pid, None)
            return
        waited = max(((d - w.last.get(tid, d)) / 1e9 for tid, d in delays.items()), default=0.0)
        w.last = delays
        # Every wait, however short, for the sums within one timer (waits.py):
        # over the tick's real length, which a busy harness stretches.
        waits.log().add(w.name, w.pid, now - interval, now, waited)
        blocked = _writes_to_disk(w.name) and _in_disk_wait(w.pid)
        with self._lock:
            self._keep(w.disk.sample(blocked, now))
            if waited >= STARVED_SHARE * interval:
                if w.open_since is None:
                    w.open_since = now - interval
                    w.open_waited = 0.0
                w.open_waited += waited
            else:
                self._close(w, now - interval)

    def _close(self, w: _Watched, ended_at: float) -> None:
        if w.open_since is None:
            return
        self._keep(
            Starvation(w.name, w.pid, w.open_since, max(0.0, ended_at - w.open_since),
                       w.open_waited)
        )  # fmt: skip
        w.open_since = None

    def _keep(self, episode: Starvation | None) -> None:
        if episode is not None:
            if episode.waited_for == DISK:  # CPU waits went to the log tick by tick
                waits.log().add(
                    episode.process, episode.pid, episode.started_at, episode.ended_at,
                    episode.waited_s,
                )  # fmt: skip
            self._episodes.append(episode)
            del self._episodes[:-MAX_KEPT]


_MONITOR = StarvationMonitor()


def monitor() -> StarvationMonitor:
    """The harness process's starvation monitor."""
    return _MONITOR
