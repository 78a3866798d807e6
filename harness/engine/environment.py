"""The environment an experiment runs in, and the services a whole run shares.

:class:`SharedServices` lives for one ``fencecheck run`` (or one pytest
session): the PostgreSQL binaries, one toxiproxy server, one primary cluster
with a migrated template database. :class:`Environment` lives for one
experiment: a fresh database copied from the template, its own proxies (so
cutting one experiment's link never touches another's), its own mock tool with
its own storage, its own control socket and its own workers. An experiment
that needs replication gets its own primary and standby.

Both are context managers whose exit tears down everything they started, in
reverse order, also on an exception or Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg

from harness.backends.base import Backend, make_backend
from harness.checking.audit import AUDIT_SQL
from harness.evidence import metrics as worker_metrics
from harness.parts.control import ControlServer
from harness.parts.pg_binaries import PgBinaries, find_pg_binaries
from harness.parts.postgres import Database, PostgresCluster
from harness.parts.processes import ProcessRegistry, WorkerProcess
from harness.parts.toxiproxy import Link, ToxiproxyServer, free_port
from mock_tool.process import MockToolProcess

DEFAULT_WORKER_CMD = (sys.executable, "-m", "reference_impl.worker")
TEMPLATE_NAME = "fencecheck_template"
# The group roles a worker's `migrate` creates (worker contract v2): a login
# role of the harness is made a member of one and bound to one tenant.
GROUP_ROLES = {"worker": "fencecheck_worker", "operator": "fencecheck_operator"}
RoleKind = Literal["worker", "operator"]
_ROLE_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


class EnvironmentError_(RuntimeError):
    """The experiment environment could not be brought up."""


@dataclass
class Settings:
    """How a run is configured: which worker, which binaries, where to write."""

    worker_cmd: Sequence[str] = DEFAULT_WORKER_CMD
    mutant: str | None = None
    pg_bin: str | None = None
    toxiproxy_bin: str | None = None
    work_dir: Path | None = None
    keep: bool = False
    backend: str = "local"

    def worker_command_text(self) -> str:
        return shlex.join(self.worker_cmd)


class MigrateFailed(EnvironmentError_):
    """The worker's ``migrate`` exited non-zero or did not finish in time.

    For ``fencecheck run`` a harness / environment error (exit 2: no
    experiment can run); for ``fencecheck contract`` the worker's gap. Keeps
    the command, the exit code and the whole output for the report."""

    def __init__(
        self, command: str, exit_code: int | None, stdout: str, stderr: str, timeout_s: float
    ) -> None:
        self.command = command
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.timeout_s = timeout_s
        super().__init__(self.paragraph())

    def short(self) -> str:
        """One line: how it ended and its last stderr line."""
        how = (
            f"exit {self.exit_code}"
            if self.exit_code is not None
            else f"not finished within {self.timeout_s:.0f} s"
        )
        last = [line for line in self.stderr.strip().splitlines() if line.strip()][-1:]
        return how + (f": {last[0].strip()}" if last else " (nothing on stderr)")

    def paragraph(self, log: str | None = None) -> str:
        """The one-paragraph account: command, exit code, the last stderr lines."""
        how = (
            f"failed with exit code {self.exit_code}"
            if self.exit_code is not None
            else f"did not finish within {self.timeout_s:.0f} s"
        )
        tail = [line.rstrip() for line in self.stderr.strip().splitlines() if line.strip()][-5:]
        said = (
            "; its last stderr lines: " + " | ".join(tail)
            if tail
            else "; it wrote nothing on stderr"
        )
        where = f" Its whole output: {log}." if log else ""
        return (
            f"The worker's `{self.command}` {how} on a fresh database{said}. No experiment can "
            "run without the contract's schema (docs/worker-contract.md sections 1, 6 and 7); "
            f"fix migrate, then run `fencecheck contract --worker-cmd ...` to check the rest.{where}"
        )

    def output(self) -> str:
        return f"$ {self.command}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def migrate(
    worker_cmd: Sequence[str],
    admin_dsn: str,
    log_dir: Path,
    timeout_s: float = 60,
    mutant: str | None = None,
) -> None:
    """Run ``<worker-cmd> migrate`` against ``admin_dsn``, then add the audit trigger.

    Raises :class:`MigrateFailed` (with the whole output; ``migrate.log`` in
    ``log_dir`` holds it too) when migrate exits non-zero or times out."""
    import subprocess

    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FENCECHECK_ADMIN_DSN": admin_dsn}
    for key in ("FENCECHECK_CONTROL", "FENCECHECK_EVENTS", "FENCECHECK_MUTANT"):
        env.pop(key, None)
    if mutant:  # the reference worker's migrate applies the mutant's SQL overlays
        env["FENCECHECK_MUTANT"] = mutant
    command = f"{shlex.join(worker_cmd)} migrate"
    try:
        proc = subprocess.run(
            [*worker_cmd, "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out, err = (_text(exc.stdout), _text(exc.stderr))
        (log_dir / "migrate.log").write_text(out + err)
        raise MigrateFailed(command, None, out, err, timeout_s) from exc
    except OSError as exc:  # the command itself cannot be started
        raise MigrateFailed(command, 127, "", f"cannot start it: {exc}", timeout_s) from exc
    (log_dir / "migrate.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise MigrateFailed(command, proc.returncode, proc.stdout, proc.stderr, timeout_s)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(AUDIT_SQL.encode())


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


class SharedServices:
    """What one run shares across experiments: binaries, toxiproxy, one primary."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.binaries: PgBinaries = find_pg_binaries(settings.pg_bin)
        # The backend first: when it cannot run here, no temp directory is left.
        self.backend: Backend = make_backend(
            settings.backend, self.binaries, settings.toxiproxy_bin
        )
        self.root = Path(
            tempfile.mkdtemp(
                prefix="fencecheck-", dir=str(settings.work_dir) if settings.work_dir else None
            )
        )
        self.registry = ProcessRegistry()
        self._stack = contextlib.ExitStack()
        self.toxiproxy: ToxiproxyServer | None = None
        self.primary: PostgresCluster | None = None
        self.template: str | None = None

    def __enter__(self) -> SharedServices:
        try:
            self._stack.callback(self._remove_root)
            self._stack.callback(self.backend.close)
            self._stack.callback(self.registry.reap_all)
            self.toxiproxy = self.backend.start_toxiproxy(self.root / "logs", self.registry)
            self._stack.callback(self.toxiproxy.stop)
            self.primary = self.backend.start_primary(self.root / "pg", "primary")
            self._stack.callback(self.primary.remove)
            self.template = self.primary.create_template(TEMPLATE_NAME, self.migrate_database)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        # --keep is honoured by the caller blocking before this exit; the
        # environment itself is always torn down in the end.
        self._stack.close()

    def migrate_database(self, admin_dsn: str, log_dir: Path | None = None) -> None:
        """Migrate the database at ``admin_dsn`` with this run's worker (and mutant)
        and add the audit trigger; ``migrate.log`` goes to ``log_dir``."""
        migrate(
            self.settings.worker_cmd,
            admin_dsn,
            log_dir or self.root / "logs",
            mutant=self.settings.mutant,
        )

    def _remove_root(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def toxiproxy_server(self) -> ToxiproxyServer:
        if self.toxiproxy is None:
            raise EnvironmentError_("toxiproxy is not running")
        return self.toxiproxy

    def toxiproxy_version(self) -> str:
        return self.toxiproxy.version or "unknown" if self.toxiproxy else "not started"

    def describe(self) -> dict[str, Any]:
        assert self.primary is not None and self.toxiproxy is not None
        return {
            "binaries": self.binaries.describe(),
            "primary": self.primary.admin_dsn(),
            "toxiproxy": self.toxiproxy.url,
            "work_dir": str(self.root),
        }


@dataclass
class Environment:
    """One experiment's world. Build with :func:`experiment_environment`."""

    name: str
    shared: SharedServices
    work_dir: Path
    db: Database
    primary: PostgresCluster
    links: dict[str, Link]
    tool: MockToolProcess
    control: ControlServer
    tenant_id: str
    other_tenant_id: str
    lease_ttl_ms: int
    heartbeat_ms: int
    heartbeat_timeout_ms: int
    dispatch_ttl_ms: int
    tag: str
    log_dir: Path
    standby: PostgresCluster | None = None
    replication: Literal["async", "sync"] | None = None
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    aborted: str | None = None
    extra_links: list[str] = field(default_factory=list)
    roles: dict[tuple[str, RoleKind], str] = field(default_factory=dict)
    #: Every worker's metrics: scraped before it is stopped, or the snapshot
    #: it wrote when it exited on its own (harness/evidence/metrics.py).
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    #: Values the harness knows to be secret (the data key it hands workers,
    #: sensitive inputs it plants): masked wherever they appear in an archive.
    secrets: set[str] = field(default_factory=set)
    data_key: str = field(default_factory=lambda: base64.b64encode(os.urandom(32)).decode())
    write_path: str = "fast"

    def abort(self, timeout_s: float) -> None:
        """The experiment's global timeout: kill its workers and release its
        barriers so that whatever the scenario waits on fails at once."""
        self.aborted = f"experiment exceeded its global timeout of {timeout_s:.0f}s"
        self.stop_workers()

    def stop_workers(self) -> None:
        # Release held barriers first so no worker sits in a read we then wait on.
        with contextlib.suppress(Exception):
            self.control.release_all()
        for worker in reversed(list(self.workers.values())):
            with contextlib.suppress(Exception):
                self._keep_metrics(worker)
                worker.stop(grace_s=2.0)
        for worker in self.workers.values():  # those that wrote a snapshot at exit
            with contextlib.suppress(Exception):
                self._keep_metrics(worker)

    def _keep_metrics(self, worker: WorkerProcess) -> None:
        """Scrape a live worker; read the exit snapshot of one that ended."""
        wid = worker.worker_id
        if worker.is_alive() and wid in self.metrics_ports:
            text = worker_metrics.scrape(self.metrics_ports[wid])
            if text is not None:
                self.metrics[wid] = {"source": "scrape", "samples": worker_metrics.samples(text)}
                return
        if self.metrics.get(wid, {}).get("source") != "scrape":
            text = worker_metrics.read_snapshot(self.metrics_file(wid))
            if text is not None:
                self.metrics[wid] = {"source": "exit", "samples": worker_metrics.samples(text)}

    def metrics_file(self, worker_id: str) -> Path:
        return self.log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', worker_id)}.metrics.txt"

    def query(self, statement: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        return self.primary.query(statement, params, dbname=self.db.name)

    def add_pg_link(self, key: str) -> Link:
        """A proxy of its own to the primary, so one worker's link can be cut alone."""
        link = self.shared.toxiproxy_server().link(
            f"{self.tag}_{key}", self.shared.backend.inner_address("127.0.0.1", self.primary.port)
        )
        self.links[key] = link
        self.extra_links.append(link.name)
        return link

    def login_role(self, tenant_id: str, kind: RoleKind = "worker") -> str:
        """The experiment's login role for ``tenant_id`` in group ``kind``, made on
        first use: ``CREATE ROLE ... LOGIN IN ROLE <group>`` on the primary and a
        row in the experiment database's ``tenant_bindings`` (worker contract
        v2). Names are unique per experiment (roles are cluster-wide and
        experiments share a cluster); they are dropped at teardown."""
        key = (tenant_id, kind)
        if key in self.roles:
            return self.roles[key]
        name = f"fc{kind[0]}_{self.tag}_{tenant_id[:8]}".lower()[:63]
        if not _ROLE_NAME.match(name):
            raise EnvironmentError_(f"cannot make a role name of {name!r}")
        group = GROUP_ROLES[kind]
        try:
            self.primary.query(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
        except psycopg.Error as exc:
            raise EnvironmentError_(
                f"cannot create login role {name} in group {group} ({exc}): the worker's "
                "`migrate` must create the group roles fencecheck_worker and "
                "fencecheck_operator (docs/worker-contract.md, roles and tenant binding)"
            ) from exc
        self.roles[key] = name
        try:
            self.query(
                "INSERT INTO public.tenant_bindings (role_name, tenant_id) VALUES (%s, %s)",
                [name, tenant_id],
            )
        except psycopg.Error as exc:
            raise EnvironmentError_(
                f"cannot bind {name} to tenant {tenant_id} ({exc}): the worker's `migrate` "
                "must create public.tenant_bindings (docs/worker-contract.md)"
            ) from exc
        return name

    def worker_dsn(
        self, pg_link: str = "worker_pg", *, tenant_id: str | None = None, role: RoleKind = "worker"
    ) -> str:
        link = self.links[pg_link]
        user = self.login_role(tenant_id or self.tenant_id, role)
        return (
            f"host={link.listen_host} port={link.listen_port} dbname={self.db.name} "
            f"user={user} connect_timeout=3"
        )

    def worker_env(
        self, tenant_id: str | None = None, pg_link: str = "worker_pg", role: RoleKind = "worker"
    ) -> dict[str, str | None]:
        tool = self.links["worker_tool"]
        tool_url = f"http://{tool.listen_host}:{tool.listen_port}"
        tenant = tenant_id or self.tenant_id
        return {
            "FENCECHECK_DSN": self.worker_dsn(pg_link, tenant_id=tenant, role=role),
            "FENCECHECK_ADMIN_DSN": None,
            "FENCECHECK_TENANT": tenant,
            "FENCECHECK_TOOL_URL": tool_url,
            "FENCECHECK_BROKER_URL": tool_url,
            "FENCECHECK_LEASE_TTL_MS": str(self.lease_ttl_ms),
            "FENCECHECK_HEARTBEAT_MS": str(self.heartbeat_ms),
            "FENCECHECK_HEARTBEAT_TIMEOUT_MS": str(self.heartbeat_timeout_ms),
            "FENCECHECK_DISPATCH_TTL_MS": str(self.dispatch_ttl_ms),
            "FENCECHECK_MUTANT": self.shared.settings.mutant,
            "FENCECHECK_DATA_KEY": self.data_key,
            "FENCECHECK_WRITE_PATH": self.write_path,
            "PYTHONUNBUFFERED": "1",
        }

    def start_worker(
        self,
        worker_id: str,
        mode: Literal["run", "ops"],
        args: Sequence[str] = (),
        *,
        tenant_id: str | None = None,
        env: dict[str, str | None] | None = None,
        pg_link: str = "worker_pg",
        role: RoleKind = "worker",
    ) -> WorkerProcess:
        """Start a worker process under test; it is stopped when the environment ends.

        ``role`` is the group its login role belongs to: ``worker``, or
        ``operator`` for a control-plane ``ops`` process."""
        if worker_id in self.workers and self.workers[worker_id].is_alive():
            raise EnvironmentError_(f"worker {worker_id!r} is already running")
        self.metrics_ports[worker_id] = free_port()
        metrics_env = {
            "FENCECHECK_METRICS_PORT": str(self.metrics_ports[worker_id]),
            "FENCECHECK_METRICS_FILE": str(self.metrics_file(worker_id)),
        }
        proc = WorkerProcess(
            worker_id,
            list(self.shared.settings.worker_cmd),
            mode,
            list(args),
            log_dir=self.log_dir,
            control_socket=self.control.socket_path,
            env={**self.worker_env(tenant_id, pg_link, role), **metrics_env, **(env or {})},
            registry=self.shared.registry,
        )
        proc.start()
        self.workers[worker_id] = proc
        return proc

    def event_files(self) -> list[Path]:
        return sorted({w.events_path for w in self.workers.values() if w.events_path.exists()})


@contextlib.contextmanager
def experiment_environment(
    shared: SharedServices,
    name: str,
    *,
    lease_ttl_ms: int,
    heartbeat_ms: int,
    heartbeat_timeout_ms: int,
    dispatch_ttl_ms: int,
    replication: Literal["async", "sync"] | None = None,
    tools: dict[str, str] | None = None,
    tool_retention_s: float | None = None,
    log_dir: Path,
    write_path: str = "fast",
) -> Iterator[Environment]:
    """Bring up one experiment's world and tear all of it down afterwards."""
    assert shared.primary is not None and shared.toxiproxy is not None
    assert shared.template is not None
    stack = contextlib.ExitStack()
    with stack:
        work_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared.root))
        log_dir.mkdir(parents=True, exist_ok=True)
        tag = f"{name}_{uuid.uuid4().hex[:6]}".replace("-", "_")
        primary = shared.primary
        standby: PostgresCluster | None = None
        replication_link: Link | None = None
        if replication is not None:
            primary, standby, replication_link = _replicated_pair(
                shared, stack, work_dir, tag, replication
            )
            db = Database(cluster=primary, name=shared.template)
        else:
            db = primary.create_database(template=shared.template, prefix=name.lower())
            if not shared.settings.keep:  # kept databases are listed by `run --keep`
                stack.callback(primary.drop_database, db.name)
        toxi = shared.toxiproxy
        links: dict[str, Link] = {}

        def add_link(key: str, upstream: str) -> None:
            link = toxi.link(f"{tag}_{key}", upstream)
            links[key] = link
            stack.callback(_delete_link, toxi, link.name)

        add_link("worker_pg", shared.backend.inner_address("127.0.0.1", primary.port))
        tool = shared.backend.start_mock_tool(
            work_dir / "tool", log_dir / "mock_tool.log", tools, tool_retention_s
        )
        stack.callback(tool.stop)
        add_link("worker_tool", shared.backend.inner_address("127.0.0.1", tool.port))
        control = stack.enter_context(ControlServer(work_dir))
        env = Environment(
            name=name,
            shared=shared,
            work_dir=work_dir,
            db=db,
            primary=primary,
            links=links,
            tool=tool,
            control=control,
            tenant_id=str(uuid.uuid4()),
            other_tenant_id=str(uuid.uuid4()),
            lease_ttl_ms=lease_ttl_ms,
            heartbeat_ms=heartbeat_ms,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            dispatch_ttl_ms=dispatch_ttl_ms,
            tag=tag,
            log_dir=log_dir,
            standby=standby,
            replication=replication,
            write_path=write_path,
        )
        stack.callback(_remove_links, toxi, env.extra_links)
        env.secrets.add(env.data_key)
        stack.callback(_drop_roles, primary, env.roles)
        # Every role the experiment's tenants need, made before any fault (a
        # role made after the replication link is cut would not reach the standby).
        for tenant in (env.tenant_id, env.other_tenant_id):
            for kind in GROUP_ROLES:
                env.login_role(tenant, kind)  # type: ignore[arg-type]
        stack.callback(env.stop_workers)
        if replication_link is not None:
            links["replication"] = replication_link
        yield env


def _drop_roles(cluster: PostgresCluster, roles: dict[tuple[str, RoleKind], str]) -> None:
    """Drop the experiment's login roles (after its workers stopped)."""
    for name in roles.values():
        with contextlib.suppress(Exception):
            cluster.query(f"DROP ROLE IF EXISTS {name}")


def _delete_link(toxi: ToxiproxyServer, name: str) -> None:
    with contextlib.suppress(Exception):
        toxi.remove_link(name)


def _remove_links(toxi: ToxiproxyServer, names: list[str]) -> None:
    for name in names:
        _delete_link(toxi, name)


def _replicated_pair(
    shared: SharedServices,
    stack: contextlib.ExitStack,
    work_dir: Path,
    tag: str,
    mode: Literal["async", "sync"],
) -> tuple[PostgresCluster, PostgresCluster, Link]:
    """A primary of its own and a standby streaming through a proxy.

    The primary gets a migrated database named like the shared template, and
    the experiment uses that database itself: the primary is its alone.
    """
    assert shared.toxiproxy is not None and shared.template is not None
    primary = shared.backend.start_primary(work_dir / "pg", "primary")
    stack.callback(primary.remove)
    primary.create_template(
        shared.template, lambda dsn: shared.migrate_database(dsn, log_dir=work_dir / "logs")
    )
    link = shared.toxiproxy.link(
        f"{tag}_replication", shared.backend.inner_address("127.0.0.1", primary.port)
    )
    stack.callback(_delete_link, shared.toxiproxy, link.name)
    standby = shared.backend.start_standby(
        primary,
        work_dir / "pg",
        upstream_host=link.listen_host,
        upstream_port=link.listen_port,
        name="replica",
    )
    stack.callback(standby.remove)
    primary.wait_streaming("replica")
    if mode == "sync":
        primary.set_sync_standby("replica")
    return primary, standby, link
