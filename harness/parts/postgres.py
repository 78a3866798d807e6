"""Real PostgreSQL clusters for experiments: a primary, databases, a streaming replica.

Every server runs as a direct child of the harness (``postgres -D``, not the
daemonising ``pg_ctl start``) with a parent-death signal, so even a harness
killed with SIGKILL leaves no server behind. When the harness runs as root
the servers run as the unprivileged ``postgres`` OS user; nothing outside the
harness's own temp directory is changed for that.

Authentication: a run's servers ask every TCP connection on 127.0.0.1 for
the run's secret (``scram-sha-256``; harness/parts/pg_auth.py), since every
local user reaches loopback; a cluster made without one (the harness's own
tests) trusts loopback.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
import psycopg
from psycopg import sql

from harness import stopping
from harness.parts import shared_memory
from harness.parts.files import remove_tree
from harness.parts.os_user import OsUser, first_untraversable, give_to, unprivileged_user
from harness.parts.pg_auth import PgAuth
from harness.parts.pg_binaries import PgBinaries
from harness.parts.pg_sessions import SessionPool
from harness.parts.port_guard import guard_port
from harness.parts.ports import free_port
from harness.parts.processes import pdeathsig_preexec, run_bounded
from harness.waiting import wait_for

ReplicationMode = Literal["async", "sync"]

# Settings every cluster gets. Fast feedback matters more than throughput:
# short WAL-receiver retry so a healed replication link resumes at once,
# frequent status reports so pg_stat_replication is current when we read it.
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "wal_keep_size": "128MB",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "wal_retrieve_retry_interval": "100ms",
    "wal_sender_timeout": "5s",
    "wal_receiver_timeout": "5s",
    "log_line_prefix": "'%m [%p] %a %u@%d '",
    "log_min_messages": "warning",
    "log_lock_waits": "on",
    "deadlock_timeout": "200ms",
    "fsync": "on",
    "synchronous_commit": "on",
    # The audit trail's row changes are stamped when the trigger fires, before
    # COMMIT; what another session could see at a moment is decided by the
    # commit time, which PostgreSQL records only with this on.
    "track_commit_timestamp": "on",
    # Which functions an experiment's database ran (pg_stat_user_functions):
    # the reach of a generated mutant of one of them (harness/mutation/reach.py).
    "track_functions": "all",
    # Dynamic shared memory as files in the data directory, not /dev/shm:
    # a server killed with SIGKILL then leaves nothing outside the directory
    # the harness removes (its one System V segment is in postmaster.pid).
    "dynamic_shared_memory_type": "mmap",
    # No parallel query: the tables are tiny, and a harness query over the
    # audit trail once spun for 11 minutes on PostgreSQL 18 (its leader in
    # AioIoCompletion, both parallel workers in MessageQueueSend).
    "max_parallel_workers_per_gather": "0",
}

# Every statement of the harness's own sessions ends within this, so a server
# that never answers one fails the experiment instead of hanging the run.
HARNESS_STATEMENT_TIMEOUT_MS = 120_000

# Settings recorded in every evidence archive: they decide what a commit means.
EVIDENCE_SETTINGS = (
    "server_version",
    "synchronous_commit",
    "synchronous_standby_names",
    "fsync",
    "wal_level",
    "default_transaction_isolation",
)


class ClusterError(RuntimeError):
    """A PostgreSQL cluster could not be set up or did not behave as required."""


@dataclass(frozen=True)
class PostmasterPid:
    """What a server wrote into its data directory's ``postmaster.pid``: enough
    to find it, and its System V segment, after the harness that started it died."""

    path: Path
    pid: int
    datadir: str
    started: float  # seconds since the epoch
    shm_key: int | None
    shm_id: int | None

    @classmethod
    def read(cls, path: Path) -> PostmasterPid | None:
        """The parsed file, or None when it is missing or not (yet) complete."""
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        try:
            pid, datadir, started = int(lines[0]), lines[1], float(lines[2])
        except (IndexError, ValueError):
            return None
        shm_key = shm_id = None
        if len(lines) > 6 and len(lines[6].split()) == 2:
            with contextlib.suppress(ValueError):
                shm_key, shm_id = (int(f) for f in lines[6].split())
        return cls(path, pid, datadir, started, shm_key, shm_id)


def _dsn(port: int, dbname: str, user: str, auth: PgAuth | None = None, **extra: str | int) -> str:
    parts: dict[str, str | int] = {"host": "127.0.0.1", "port": port, "dbname": dbname}
    parts["user"] = user
    if auth is not None:  # names where the secret is, never the secret
        parts["passfile"] = str(auth.passfile)
    parts.update(extra)
    return " ".join(f"{k}={v}" for k, v in parts.items())


@dataclass
class Database:
    """One database of a cluster, created fresh for one experiment or test."""

    cluster: PostgresCluster
    name: str

    @property
    def admin_dsn(self) -> str:
        return self.cluster.admin_dsn(self.name)

    def dsn(self, user: str, **extra: str | int) -> str:
        return _dsn(self.cluster.port, self.name, user, self.cluster.auth, **extra)

    def query(self, statement: str, params: Any = None) -> list[dict[str, Any]]:
        """Run one statement as superuser and return its rows as dicts."""
        return self.cluster.query(statement, params, dbname=self.name)


@dataclass
class PostgresCluster:
    """One running PostgreSQL server (primary or standby) owned by the harness."""

    binaries: PgBinaries
    datadir: Path
    port: int
    name: str
    run_as: OsUser
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    superuser: str = "postgres"
    _db_counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _templates: dict[str, str] = field(default_factory=dict)
    _last_probe_error: str = ""
    # The run's secret (pg_auth.py): password authentication for every role;
    # None: trust (a cluster of the harness's own tests).
    auth: PgAuth | None = None
    # The harness's own idle sessions, reused between queries (pg_sessions.py);
    # emptied whenever this server stops or one of its databases is dropped.
    _sessions: SessionPool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sessions = SessionPool(self.connect)
        self._verifier: str | None = None  # the run secret's SCRAM verifier, once

    # ----------------------------------------------------------- lifecycle
    @classmethod
    def init_primary(
        cls,
        binaries: PgBinaries,
        base_dir: Path,
        *,
        name: str = "primary",
        run_as: OsUser | None = None,
        settings: dict[str, str] | None = None,
        start_timeout_s: float = 30.0,
        auth: PgAuth | None = None,
    ) -> PostgresCluster:
        """initdb a new cluster under ``base_dir`` and start it on a free port;
        with ``auth`` every connection over TCP must give the run's secret."""
        stopping.check(f"PostgreSQL cluster {name}")
        user = run_as or unprivileged_user()
        datadir = _make_owned_dir(base_dir / name, user)
        pwfile = auth.pwfile_for(user, base_dir) if auth is not None else None
        try:
            _initdb(binaries, datadir, user, name, pwfile)
        finally:
            if pwfile is not None:
                pwfile.unlink(missing_ok=True)
        cluster = cls(
            binaries=binaries,
            datadir=datadir,
            port=0,
            name=name,
            run_as=user,
            log_path=base_dir / f"{name}.log",
            auth=auth,
        )
        _append_conf(
            datadir / "postgresql.conf",
            {
                **BASE_SETTINGS,
                **_version_settings(binaries),
                **_statement_stats_settings(binaries),
                **(settings or {}),
            },
        )
        method = "scram-sha-256" if auth is not None else "trust"
        (datadir / "pg_hba.conf").write_text(
            # No Unix socket is opened (-k ''): every connection is TCP.
            f"host all all 127.0.0.1/32 {method}\nhost replication all 127.0.0.1/32 {method}\n"
        )
        cluster.start(timeout_s=start_timeout_s)
        return cluster

    @classmethod
    def from_seed(
        cls,
        binaries: PgBinaries,
        seed: Path,
        base_dir: Path,
        *,
        name: str,
        templates: Sequence[str] = (),
        run_as: OsUser | None = None,
        start_timeout_s: float = 30.0,
        auth: PgAuth | None = None,
    ) -> PostgresCluster:
        """A new cluster whose data directory is a copy of ``seed`` (made with the
        same ``auth``), the data
        directory of a cluster made by :meth:`init_primary` and stopped cleanly
        (its databases ``templates`` already migrated): no initdb, no migrate,
        the same settings. A copy of a cleanly stopped cluster is a cluster."""
        stopping.check(f"PostgreSQL cluster {name}")
        user = run_as or unprivileged_user()
        datadir = _make_owned_dir(base_dir / name, user)
        # cp -a keeps owners and modes (the server refuses a data directory
        # that is not its own, mode 0700).
        done = run_bounded(["cp", "-a", f"{seed}/.", str(datadir)], timeout_s=60.0)
        if done.returncode != 0:
            raise ClusterError(f"copying {seed} to {datadir} failed: {done.stderr.strip()}")
        (datadir / "postmaster.pid").unlink(missing_ok=True)
        cluster = cls(
            binaries=binaries,
            datadir=datadir,
            port=0,
            name=name,
            run_as=user,
            log_path=base_dir / f"{name}.log",
            auth=auth,
        )
        cluster._templates.update({t: t for t in templates})
        cluster.start(timeout_s=start_timeout_s)
        return cluster

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the server on a free port; retry with a new port if one was taken."""
        if self.process is not None and self.process.poll() is None:
            raise ClusterError(f"{self.name} is already running (pid {self.process.pid})")
        stopping.check(f"PostgreSQL server {self.name}")
        last = ""
        for _ in range(3):
            self.port = free_port()
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
            try:
                self.process = subprocess.Popen(
                    [
                        self.binaries.path("postgres"),
                        "-D",
                        str(self.datadir),
                        "-p",
                        str(self.port),
                        # No Unix socket: everything connects over TCP, and a
                        # socket path in a deep temp directory can exceed the
                        # 107-byte limit (the server then refuses to start).
                        "-k",
                        "",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=_server_env(self.run_as),
                    preexec_fn=pdeathsig_preexec(os.getpid()),
                    # Its own session: a terminal's Ctrl-C reaches the harness
                    # alone, which decides when the server stops.
                    start_new_session=True,
                    **_user_kwargs(self.run_as),
                )
            finally:
                log.close()
            try:
                wait_for(
                    self._ready,
                    what=f"{self.name} to accept connections on 127.0.0.1:{self.port}",
                    timeout_s=timeout_s,
                    fatal=(ClusterError,),  # the server exited: no use waiting on
                )
                guard_port(self.port)  # besides the secret: the run's users only
                return
            except (TimeoutError, ClusterError) as exc:
                last = str(exc)
                if self._last_probe_error:
                    last += f" (last connection attempt: {self._last_probe_error})"
                self._kill_now()
                if "already in use" not in self.log_tail():
                    break
        raise ClusterError(f"{self.name} did not start: {last}\nserver log:\n{self.log_tail()}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise ClusterError(
                f"{self.name} exited with code {self.process.returncode}:\n{self.log_tail()}"
            )
        try:
            with psycopg.connect(self.admin_dsn(), connect_timeout=2, autocommit=True):
                return True
        except psycopg.OperationalError as exc:
            # Kept for the timeout message: a server whose log says it is
            # ready but refuses the probe needs the probe's side to diagnose.
            self._last_probe_error = str(exc).strip() + self._resume_if_stopped()
            return False

    def _resume_if_stopped(self) -> str:
        """SIGCONT a postmaster found stopped, and say so.

        Seen twice (CI and a loaded suite): a server whose log said "ready to
        accept connections" timed out every probe for 30-60 s, as a postmaster
        frozen by a stray SIGSTOP would (the kernel still completes the TCP
        handshake, nobody answers the startup packet). The server is ours and
        must run; the message names what was found so the sender can be traced.
        """
        assert self.process is not None
        try:
            state = psutil.Process(self.process.pid).status()
        except psutil.Error:
            return ""
        if state != psutil.STATUS_STOPPED:
            return ""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
        note = f"the postmaster {self.process.pid} was found stopped by a signal: SIGCONT sent"
        # Also in the server's log: when the next probe succeeds, no error
        # message carries it, and a found-stopped server must not pass unseen.
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"fencecheck harness: {note}\n")
        return f" ({note})"

    def stop(self, mode: Literal["fast", "immediate"] = "fast", timeout_s: float = 30.0) -> float:
        """Stop the server; returns how long it took. ``immediate`` is a crash-stop."""
        self._sessions.forget()
        if self.process is None or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_now()
        return time.monotonic() - started

    def _kill_now(self) -> None:
        """SIGKILL the server and its backends (its process group) and reap it."""
        self._sessions.forget()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def postmaster_pid(self) -> int | None:
        """The server's postmaster as a pid of this host (None: not running)."""
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def remove(self) -> None:
        """Stop (immediate) and delete the data directory (its thousand files
        unlinked from many threads: a stopping run has seconds)."""
        pidfile = PostmasterPid.read(self.datadir / "postmaster.pid")
        took = self.stop("immediate", timeout_s=2.0 if stopping.requested() else 30.0)
        stopping.trace(f"server {self.datadir.name} stopped in {took:.2f}s")
        if pidfile is not None and pidfile.shm_key is not None and pidfile.shm_id is not None:
            # A server SIGKILLed (a crashed primary, a stop past its time)
            # leaves its System V segment: it is the data directory's too.
            shared_memory.remove(pidfile.shm_key, pidfile.shm_id)
        remove_tree(self.datadir)
        stopping.trace(f"server {self.datadir.name} removed")

    # ------------------------------------------------------------- queries
    def admin_dsn(self, dbname: str = "postgres", **extra: str | int) -> str:
        return _dsn(self.port, dbname, self.superuser, self.auth, **extra)

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 5)
        kwargs.setdefault("options", f"-c statement_timeout={HARNESS_STATEMENT_TIMEOUT_MS}")
        return psycopg.connect(
            self.admin_dsn(dbname, application_name="fencecheck-harness"), **kwargs
        )

    def query(
        self, statement: str, params: Any = None, *, dbname: str = "postgres"
    ) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        def run(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(statement.encode(), params)
                return list(cur.fetchall()) if cur.description else []

        return self._sessions.call(dbname, run)

    def statement_counts(self, dbname: str) -> list[dict[str, Any]] | None:
        """How many times each role but the harness's ran each top-level
        statement in ``dbname`` (pg_stat_statements: the server's own count,
        made as each statement ends); None where the server does not count."""
        loaded = self.query("SELECT current_setting('shared_preload_libraries') AS libs")
        if STATEMENT_STATS not in str(loaded[0]["libs"] if loaded else ""):
            return None
        statement = (
            "SELECT r.rolname AS role, s.query, s.calls::bigint AS calls "
            f"FROM {STATEMENT_STATS} s JOIN pg_roles r ON r.oid = s.userid "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s AND r.rolname <> current_user ORDER BY s.calls DESC"
        )
        try:
            return self.query(statement, [dbname])
        except psycopg.errors.UndefinedTable:
            pass
        # Made on first use, in the maintenance database only; another
        # experiment may make it at the same moment.
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            self.execute(f"CREATE EXTENSION IF NOT EXISTS {STATEMENT_STATS}")
        return self.query(statement, [dbname])

    def execute(self, statement: sql.Composed | str, dbname: str = "postgres") -> None:
        """Run one statement that returns nothing (DDL) on a harness session."""
        text = statement if isinstance(statement, sql.Composed) else statement.encode()
        self._sessions.call(dbname, lambda conn: conn.execute(text))

    def create_login_role(self, name: str, group: str) -> None:
        """``CREATE ROLE name LOGIN IN ROLE group`` (see create_login_roles)."""
        self.create_login_roles([(name, group)])

    def create_login_roles(self, roles: Sequence[tuple[str, str]]) -> None:
        """``CREATE ROLE name LOGIN IN ROLE group`` for each ``(name, group)``, in
        one round trip, with the run's secret as their password when the cluster
        has one: sent as the SCRAM verifier libpq computes, so the secret itself
        is in no statement (nor in the server's log of a failing one). The
        verifier is computed once per cluster: SCRAM's does not depend on the
        role's name, and its 4096 PBKDF2 rounds are most of a role's cost."""
        if not roles:
            return
        with self._sessions.session("postgres") as conn:
            password: sql.Composable = sql.SQL("")
            if self.auth is not None:
                if self._verifier is None:
                    self._verifier = conn.pgconn.encrypt_password(
                        self.auth.password.encode(), roles[0][0].encode(), b"scram-sha-256"
                    ).decode()
                password = sql.SQL(" PASSWORD {}").format(sql.Literal(self._verifier))
            conn.execute(
                sql.SQL("; ").join(
                    sql.SQL("CREATE ROLE {} LOGIN{} IN ROLE {}").format(
                        sql.Identifier(name), password, sql.Identifier(group)
                    )
                    for name, group in roles
                )
            )

    def server_facts(self) -> dict[str, str]:
        """The server version and the settings that decide what a commit means."""
        rows = self.query(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(EVIDENCE_SETTINGS)]
        )
        facts = {r["name"]: r["setting"] for r in rows}
        facts["version"] = self.query("SELECT version() AS v")[0]["v"]
        return facts

    # ----------------------------------------------------------- databases
    def create_database(self, template: str | None = None, prefix: str = "fc") -> Database:
        """A new database, copied from ``template`` when given (fast: no migrations)."""
        name = f"{prefix}_{next(self._db_counter)}_{secrets.token_hex(3)}"
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            # FILE_COPY (PostgreSQL 15+; the only way before): the files copied
            # whole and one WAL record, where the default WAL_LOG reads and logs
            # every page: half the server's CPU per experiment database.
            strategy = " STRATEGY FILE_COPY" if self.binaries.major >= 15 else ""
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}" + strategy).format(
                sql.Identifier(name), sql.Identifier(template)
            )
            self._sessions.forget(template)  # no session may be on a template copied
        self.execute(stmt)
        return Database(cluster=self, name=name)

    def create_template(self, name: str, init: Callable[[str], None]) -> str:
        """Build a template database once (``init`` gets its admin DSN); return its name."""
        if name in self._templates:
            return self._templates[name]
        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        init(self.admin_dsn(name))
        # No session may stay connected to a template while it is copied.
        self._sessions.forget(name)
        with self.connect() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
        self._templates[name] = name
        return name

    def drop_template(self, name: str) -> None:
        """Drop a template database built by :meth:`create_template` (if it exists)."""
        self._templates.pop(name, None)
        self.drop_database(name)

    def drop_database(self, name: str) -> None:
        self._sessions.forget(name)
        self.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    # --------------------------------------------------------- replication
    def create_standby(
        self,
        base_dir: Path,
        *,
        upstream_host: str,
        upstream_port: int,
        name: str = "replica",
        timeout_s: float = 60.0,
    ) -> PostgresCluster:
        """pg_basebackup this primary and start a streaming standby.

        ``upstream_host:upstream_port`` is what the standby's WAL receiver
        connects to: normally a toxiproxy proxy in front of this primary, so
        the replication link can be cut. The base backup itself goes direct.
        The standby streams from a physical slot so the primary keeps the WAL
        it needs while the link is cut.
        """
        stopping.check(f"PostgreSQL standby {name}")
        slot = name.replace("-", "_")
        with self.connect() as conn:
            conn.execute(
                "SELECT pg_create_physical_replication_slot(%s) "
                "WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)",
                [slot, slot],
            )
        datadir = _make_owned_dir(base_dir / name, self.run_as)
        secret = {"PGPASSWORD": self.auth.password} if self.auth is not None else {}
        _run_as(
            self.run_as,
            [
                self.binaries.path("pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.superuser,
                "-D",
                str(datadir),
                "-X",
                "stream",
                "-c",
                "fast",
                "-S",
                slot,
            ],
            what=f"pg_basebackup for {name}",
            timeout_s=timeout_s,
            env=secret,
        )
        # The WAL receiver's secret sits in the standby's own data directory
        # (0700, the server's user): no other local user reads it.
        password = f" password={self.auth.password}" if self.auth is not None else ""
        conninfo = (
            f"host={upstream_host} port={upstream_port} user={self.superuser} "
            f"application_name={name} connect_timeout=2{password}"
        )
        _append_conf(
            datadir / "postgresql.auto.conf",
            {"primary_conninfo": f"'{conninfo}'", "primary_slot_name": f"'{slot}'"},
        )
        (datadir / "standby.signal").touch()
        give_to(datadir / "standby.signal", self.run_as)
        standby = PostgresCluster(
            binaries=self.binaries,
            datadir=datadir,
            port=0,
            name=name,
            run_as=self.run_as,
            log_path=base_dir / f"{name}.log",
            auth=self.auth,
        )
        standby.start(timeout_s=timeout_s)
        return standby

    def wait_streaming(self, standby_name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until the primary sees ``standby_name`` streaming; return its row."""

        def probe() -> dict[str, Any] | None:
            rows = self.replication_status()
            row = next((r for r in rows if r["application_name"] == standby_name), None)
            return row if row is not None and row["state"] == "streaming" else None

        return wait_for(
            probe, what=f"{standby_name} streaming from {self.name}", timeout_s=timeout_s
        )

    def set_sync_standby(self, standby_name: str | None, timeout_s: float = 30.0) -> None:
        """Switch synchronous replication on (for ``standby_name``) or off.

        Turned on only once the standby streams: with the setting in place and
        no standby, every commit on the primary blocks, DDL included.
        """
        value = f"FIRST 1 ({standby_name})" if standby_name else ""
        if standby_name:
            self.wait_streaming(standby_name, timeout_s)
        with self.connect() as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(value))
            conn.execute("SELECT pg_reload_conf()")
        if standby_name:
            wait_for(
                lambda: any(
                    r["application_name"] == standby_name and r["sync_state"] == "sync"
                    for r in self.replication_status()
                ),
                what=f"pg_stat_replication.sync_state = 'sync' for {standby_name}",
                timeout_s=timeout_s,
            )

    def replication_status(self) -> list[dict[str, Any]]:
        """pg_stat_replication as seen on this primary, with byte lags."""
        return self.query(
            "SELECT application_name, state, sync_state, "
            "sent_lsn::text, write_lsn::text, flush_lsn::text, replay_lsn::text, "
            "pg_current_wal_lsn()::text AS primary_lsn, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint AS flush_lag_bytes, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint AS replay_lag_bytes "
            "FROM pg_stat_replication ORDER BY application_name"
        )

    def standby_position(self) -> dict[str, Any]:
        """On a standby: what it has received and replayed."""
        return self.query(
            "SELECT pg_is_in_recovery() AS in_recovery, "
            "pg_last_wal_receive_lsn()::text AS receive_lsn, "
            "pg_last_wal_replay_lsn()::text AS replay_lsn"
        )[0]

    def promote(self, timeout_s: float = 30.0) -> float:
        """Promote this standby; returns how long it took until it accepts writes."""
        started = time.monotonic()
        rows = self.query(
            "SELECT pg_promote(wait => true, wait_seconds => %s) AS ok", [int(timeout_s)]
        )
        if not rows or not rows[0]["ok"]:
            raise ClusterError(f"{self.name} did not finish promotion within {timeout_s}s")
        wait_for(
            lambda: not self.query("SELECT pg_is_in_recovery() AS r")[0]["r"],
            what=f"{self.name} to leave recovery",
            timeout_s=timeout_s,
        )
        return time.monotonic() - started


@dataclass(frozen=True)
class FailoverRecord:
    """What a promote-and-fence did, for the evidence archive."""

    old_primary: str
    new_primary: str
    fenced_at: float
    fence_seconds: float
    promoted_at: float
    promote_seconds: float
    lag_before: list[dict[str, Any]]
    standby_before: dict[str, Any]


def failover(primary: PostgresCluster, standby: PostgresCluster) -> FailoverRecord:
    """Fence the old primary (immediate stop), then promote the standby.

    The old primary is stopped first so there is never a moment with two
    writable primaries (no split brain), as the English seed section 10 asks.
    """
    lag = primary.replication_status()
    position = standby.standby_position()
    fence_started = time.time()
    fence_s = primary.stop("immediate")
    promoted_at = time.time()
    promote_s = standby.promote()
    return FailoverRecord(
        old_primary=primary.name,
        new_primary=standby.name,
        fenced_at=fence_started,
        fence_seconds=fence_s,
        promoted_at=promoted_at,
        promote_seconds=promote_s,
        lag_before=lag,
        standby_before=position,
    )


# ----------------------------------------------------------------- helpers
def _initdb(
    binaries: PgBinaries, datadir: Path, user: OsUser, name: str, pwfile: Path | None
) -> None:
    """initdb as ``user``: the superuser ``postgres``, with the run's secret as
    its password when ``pwfile`` is given."""
    _run_as(
        user,
        [
            binaries.path("initdb"),
            "-D",
            str(datadir),
            "-U",
            "postgres",
            *(["--pwfile", str(pwfile), "-A", "scram-sha-256"] if pwfile else ["-A", "trust"]),
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
            "--no-instructions",
            # initdb's own bootstrap servers, too, keep their dynamic shared
            # memory out of /dev/shm (initdb -c exists from PostgreSQL 16).
            *(["-c", "dynamic_shared_memory_type=mmap"] if binaries.major >= 16 else []),
            # The superuser's verifier with the run's iteration count, too.
            *(f"-c{k}={v}" for k, v in _version_settings(binaries).items()),
        ],
        what=f"initdb of {name}",
    )


def _make_owned_dir(path: Path, user: OsUser) -> Path:
    """A new 0700 directory owned by ``user``, reachable by that user.

    Only the harness's own temp directories (named ``fencecheck-*``) are
    opened for traversal (mode +x); anything else in the way is an error that
    says which directory to fix, never something we change.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while (blocked := first_untraversable(path.parent, user)) is not None:
        ours = any(p.name.startswith("fencecheck-") for p in (blocked, *blocked.parents))
        if not ours:
            raise ClusterError(
                f"{user.name} cannot enter {blocked}, so the server cannot reach its "
                f"data directory {path}; use a base directory under /tmp (--work-dir)"
            )
        blocked.chmod(blocked.stat().st_mode | 0o111)
    path.mkdir(mode=0o700)
    give_to(path, user)
    return path


def _user_kwargs(user: OsUser) -> dict[str, Any]:
    # user=, group= and extra_groups=[] (which drops root's supplementary
    # groups; `user=` alone would not), or nothing when we already are ``user``.
    return dict(user.popen_kwargs())


def _server_env(user: OsUser) -> dict[str, str]:
    # A clean environment: the server must not inherit PG* variables meant
    # for clients (PGAPPNAME, PGHOST...) or the harness's own settings.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", **user.env()}


# PBKDF2 rounds of a SCRAM verifier (see _version_settings).
SCRAM_ITERATIONS = 16


def _version_settings(binaries: PgBinaries) -> dict[str, str]:
    """Settings only some versions know.

    ``scram_iterations`` (PostgreSQL 16+): SCRAM's 4096 PBKDF2 rounds by default
    slow down an offline guess at a weak password; the run's secret is 24
    random bytes, which no number of rounds makes harder to guess, and each
    client paid the rounds on each of a run's thousand-odd connections
    (2.5 ms each, a few CPU-seconds of a matrix). Still SCRAM, still the
    secret."""
    return {"scram_iterations": str(SCRAM_ITERATIONS)} if binaries.major >= 16 else {}


# Per statement counts by role and database (pg_stat_statements): how often a
# worker ran each of its statements, the evidence a poll without a pause
# leaves (worker.statements_are_paced). Top-level plannable statements only:
# BEGIN and COMMIT say nothing a statement count does not.
STATEMENT_STATS = "pg_stat_statements"


def _statement_stats_settings(binaries: PgBinaries) -> dict[str, str]:
    """Load pg_stat_statements where the binaries ship it (the wheel and
    Debian's server packages do); without it the count is simply not known."""
    if not (binaries.bindir.parent / "lib" / f"{STATEMENT_STATS}.so").exists():
        return {}
    return {
        "shared_preload_libraries": f"'{STATEMENT_STATS}'",
        "pg_stat_statements.track_utility": "off",
        # Entries are per (role, database, statement), and a run's experiments
        # each have a database and roles of their own: room for all of them.
        "pg_stat_statements.max": "20000",
        "pg_stat_statements.save": "off",
    }


def _append_conf(path: Path, settings: dict[str, str]) -> None:
    with open(path, "a") as f:
        f.write("\n# fencecheck\n")
        for key, value in settings.items():
            f.write(f"{key} = {value}\n")


def _run_as(
    user: OsUser,
    argv: list[str],
    *,
    what: str,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> None:
    done = run_bounded(
        argv, timeout_s=timeout_s, env={**_server_env(user), **(env or {})}, **_user_kwargs(user)
    )
    if done.how == "interrupted":
        raise stopping.Interrupted(f"{stopping.reason()}: {what} was killed")
    if done.how == "timeout":
        raise ClusterError(f"{what} did not finish within {timeout_s}s:\n{done.stderr.strip()}")
    if done.returncode != 0:
        raise ClusterError(f"{what} failed (exit {done.returncode}):\n{done.stderr.strip()}")
