"""The container backend: PostgreSQL, toxiproxy and the mock tool as containers.

Chosen with ``fencecheck run --backend containers`` (or ``FENCECHECK_BACKEND=
containers`` for the pytest matrix); set up once with ``make containers-setup``.
Containers are created through testcontainers-python and controlled (kill,
pause, logs, cleanup) through docker-py, against any Docker-compatible engine:
``$DOCKER_HOST`` when set, else the podman service ``make containers-setup``
starts on ``.tools/containers/podman.sock``, else the usual sockets. Workers
stay processes on the host, so SIGSTOP/SIGKILL reach them exactly as before.

What runs where
---------------
* One private bridge network per backend (one ``fencecheck run`` or pytest
  session), ``fencecheck-<run>``. Every container gets a fixed address on it,
  chosen by the backend, and containers reach each other by address, not by
  name: the engine's DNS (aardvark-dns 1.4 under podman 4.3) was seen losing
  a name while containers started concurrently (a standby's ``pg_basebackup``
  could not resolve its primary), and an address chosen by us also survives
  a restart, which an engine-assigned one does not.
* PostgreSQL primary and standby: containers of ``$FENCECHECK_PG_IMAGE``
  (any image whose entrypoint behaves like the official postgres image's;
  default the locally built ``localhost/fencecheck/postgres:latest``), each
  publishing 5432 on a random ``127.0.0.1`` port. An init script copied into
  ``/docker-entrypoint-initdb.d`` appends the harness's server settings
  (``harness.parts.postgres.BASE_SETTINGS``) to ``postgresql.conf`` and allows
  replication connections; authentication is ``trust``, as for the local
  clusters. A standby's container runs ``pg_basebackup`` from the primary's
  container (direct, over the network), then streams through toxiproxy.
* toxiproxy: a container on the same network, built from the binary the
  local backend would run. Its API is published on a random loopback port,
  and a pool of proxy ports is published with the *same* number inside and
  out: a proxy listening on ``0.0.0.0:P`` in the container is
  ``127.0.0.1:P`` for the harness and host workers, and ``<toxiproxy's
  address>:P`` for the standby's WAL receiver. Cutting the replication link therefore
  cuts exactly the standby's stream, as with local processes.
* mock tool: a container of this repository's ``mock_tool`` package, its
  SQLite storage bind-mounted from the experiment's directory on the host
  (so the log survives a restart and stays on the host as evidence), its
  port published on loopback. A restart is a new container with the same
  storage, published port and network address.

Addressing
----------
Each service has two addresses: the harness's (``127.0.0.1:<published>``)
and the network's (``<container address>:<port>``). ``inner_address`` maps
the first to the second; the environment asks it for every proxy upstream,
and a standby asked to stream from ``127.0.0.1:P`` streams from
``<toxiproxy's address>:P``.

Host networking was the alternative: it would spare the port pool, but the
standby on a private network would then need toxiproxy to listen on the
bridge's gateway address, and PostgreSQL with trust authentication would
listen on host interfaces. Here nothing is reachable from outside the
machine: only loopback ports are published.

Faults beyond toxiproxy
-----------------------
* fence, ``stop("immediate")``: ``docker kill`` (SIGKILL) of the container,
  so no process of the old primary survives, then promote the standby with
  ``pg_promote()`` exactly as for local clusters (``harness.parts.postgres.failover``).
* ``stop("fast")``: SIGINT (PostgreSQL's fast shutdown), waiting for the exit.
* ``pause()``/``unpause()``: ``docker pause`` (cgroup freezer) of the whole
  server: every backend freezes with its sockets open, an extra
  PostgreSQL-side fault the local backend has no equivalent of.

Cleanup
-------
Every container and the network are named ``fencecheck-<run>-...`` and
labelled with the run, the owning harness's pid, that pid's start time and
the host name. ``close()`` removes all of them (by label, so even one whose
creation failed half-way), also on Ctrl-C/SIGTERM through the environment's
exit stack, and an ``atexit`` hook covers an interpreter that ends without
``close()``. No Ryuk reaper (its image cannot be pulled here): instead every
backend start removes leftovers of runs whose owner is dead (pid gone or
reused), and ``python -m harness.backends.containers cleanup`` does the same by hand.

Limits
------
* The engine must run on this machine: the harness and the workers reach
  services on published loopback ports, and the tool's storage is a bind mount.
* The mock tool's HTTP callbacks (``callback_url``) cannot reach a URL on
  the host's loopback from inside its container; the matrix does not use them.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import ipaddress
import itertools
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal, cast

try:
    import docker
    import docker.errors
    from docker.types import EndpointConfig
    from testcontainers.core.config import ConnectionMode, testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
except ImportError as exc:  # make_backend turns this into BackendUnavailable
    raise ImportError(
        f"{exc}: the containers backend needs docker-py and testcontainers: "
        "`pip install -e '.[containers]'` (or `make containers-setup`)"
    ) from exc

import psycopg

from harness import stopping
from harness.backends import containers_images as images
from harness.backends.base import BackendUnavailable
from harness.backends.containers_setup import SOCKET_PATH as PROJECT_SOCKET
from harness.parts.os_user import OsUser
from harness.parts.pg_binaries import PgBinaries
from harness.parts.ports import free_port as free_loopback_port
from harness.parts.postgres import BASE_SETTINGS, ClusterError, PostgresCluster
from harness.parts.processes import ProcessRegistry, process_started
from harness.parts.toxiproxy import (
    FaultRecord,
    Link,
    ToxiproxyClient,
    ToxiproxyError,
    ToxiproxyServer,
)
from harness.waiting import WaitTimeout, wait_for
from mock_tool.client import ToolClient
from mock_tool.errors import ToolError
from mock_tool.process import MockToolProcess, MockToolStartError

DEFAULT_SOCKETS = ("/run/podman/podman.sock", "/var/run/docker.sock")
SETUP_HINT = (
    "run `make containers-setup` (installs podman, runc and debootstrap with apt, builds the "
    f"images and starts `podman system service` on {PROJECT_SOCKET}), or set DOCKER_HOST to "
    "a running Docker-compatible engine"
)

LABEL_RUN = "org.fencecheck.run"
LABEL_PID = "org.fencecheck.owner-pid"
LABEL_STARTED = "org.fencecheck.owner-started"
LABEL_HOST = "org.fencecheck.owner-host"
LABEL_ROLE = "org.fencecheck.role"
LABEL_TMP = "org.fencecheck.tmp"  # on the network: the run's host temp directory

PG_PORT = 5432
TOOL_PORT = 8000
TOXIPROXY_API_PORT = 8474
PGDATA = "/var/lib/postgresql/data/pgdata"
INIT_SCRIPT_PATH = "/docker-entrypoint-initdb.d/fencecheck.sh"
START_ATTEMPTS = 3
STATUS_POLL_S = 0.5
PROXY_POOL_ENV = "FENCECHECK_TOXIPROXY_PORTS"
# How long a new proxy waits for a pool port when all are held: finished
# experiments' teardowns give theirs back within seconds, even loaded.
POOL_WAIT_S = 60.0
# Where proxies to a stopped container point: a closed port in toxiproxy's
# own container, so a dial is refused at once (see upstream_down).
REFUSING = "127.0.0.1:1"
DEFAULT_PROXY_POOL = 48
LOOPBACK = ("127.0.0.1", "localhost")

# Settings as -c cannot carry them (ALTER SYSTEM must still be able to change
# them, as for local clusters): appended to postgresql.conf after initdb.
_SETTINGS = {**BASE_SETTINGS, "listen_addresses": "'*'"}
_SETTING_LINES = "".join(f"{k} = {v}\n" for k, v in _SETTINGS.items())
INIT_SCRIPT = f"""#!/bin/sh
# fencecheck: the harness's server settings, and replication over the network.
cat >> "$PGDATA/postgresql.conf" <<'FENCECHECK'
# fencecheck
{_SETTING_LINES}FENCECHECK
printf '\\n# fencecheck\\nhost all all all trust\\nhost replication all all trust\\n' \\
  >> "$PGDATA/pg_hba.conf"
"""

# A standby's container: base backup from the primary's container, then the
# server; a restarted container keeps its data and skips the backup.
STANDBY_SCRIPT = """\
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$(dirname "$PGDATA")"
  pg_basebackup -h "$FC_PRIMARY_HOST" -p "$FC_PRIMARY_PORT" -U postgres -D "$PGDATA" \
    -X stream -c fast -S "$FC_SLOT"
  touch "$PGDATA/standby.signal"
  printf "\\n# fencecheck\\nprimary_conninfo = '%s'\\nprimary_slot_name = '%s'\\n" \
    "$FC_CONNINFO" "$FC_SLOT" >> "$PGDATA/postgresql.auto.conf"
fi
exec postgres
"""

_LIVE: weakref.WeakSet[ContainerBackend] = weakref.WeakSet()


def _close_live() -> None:
    for backend in list(_LIVE):
        with contextlib.suppress(Exception):
            backend.close()


atexit.register(_close_live)


# ------------------------------------------------------------------- engine
def _ping(base_url: str, timeout_s: float = 30.0) -> str | None:
    """None when the engine at ``base_url`` answers, else why not.

    A missing socket or a refused connection fails at once; the timeout is
    for an engine that is there but busy (podman's service answered /version
    in over 3 s while three runs started containers at once).
    """
    try:
        client = docker.DockerClient(base_url=base_url, timeout=int(timeout_s))
    except docker.errors.DockerException as exc:
        return str(exc)
    try:
        client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def find_engine() -> str:
    """The base URL of a reachable engine; BackendUnavailable naming what to do."""
    explicit = os.environ.get("DOCKER_HOST")
    if explicit:
        problem = _ping(explicit)
        if problem is None:
            return explicit
        raise BackendUnavailable(
            f"no container engine answers at DOCKER_HOST={explicit} ({problem}); start it, "
            f"point DOCKER_HOST at a running engine, or unset it and {SETUP_HINT}"
        )
    tried = []
    for path in (str(PROJECT_SOCKET), *DEFAULT_SOCKETS):
        url = f"unix://{path}"
        if not Path(path).exists():
            tried.append(f"{path} (no such socket)")
            continue
        problem = _ping(url)
        if problem is None:
            return url
        tried.append(f"{path} ({problem})")
    raise BackendUnavailable(
        f"no container engine is reachable (DOCKER_HOST is not set; tried {'; '.join(tried)}); "
        f"{SETUP_HINT}"
    )


def _configure_testcontainers(base_url: str) -> None:
    # testcontainers reads the engine from DOCKER_HOST; Ryuk (its reaper) is an
    # image that cannot be pulled here, and our own label-based cleanup
    # replaces it; docker_host mode because a /.dockerenv file on a VM would
    # otherwise send it down the docker-in-docker path, which breaks on podman.
    os.environ["DOCKER_HOST"] = base_url
    testcontainers_config.ryuk_disabled = True
    testcontainers_config.connection_mode_override = ConnectionMode.docker_host


# ------------------------------------------------------------------ cleanup
def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the harness that created something with these labels still runs.

    Another host's objects (a shared engine) count as alive: we cannot tell.
    """
    if labels.get(LABEL_HOST) != socket.gethostname():
        return True
    try:
        pid = int(labels.get(LABEL_PID, ""))
        started = float(labels.get(LABEL_STARTED, ""))
    except ValueError:
        return False
    actual = process_started(pid)
    # Two seconds: the boot time under a wall-clock start moves by one when
    # the clock is adjusted (harness/engine/run_records.py).
    return actual is not None and abs(actual - started) < 2.0


def listed_containers(client: Any, filters: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers matching ``filters`` as the engine lists them, in one call.

    Not ``containers.list``: it inspects each listed container afterwards, and a
    container its own run removes meanwhile (an interrupted run's teardown races
    the next run's sweep) makes that inspection fail: Podman answers 500 "no such
    container", not 404."""
    return list(client.api.containers(all=True, filters=filters))


def container_name(entry: dict[str, Any]) -> str:
    names = entry.get("Names") or [entry["Id"]]
    return str(names[0]).lstrip("/")


def _already_gone(exc: docker.errors.APIError) -> bool:
    # Podman reports a container removed under us as a 500, Docker as a 404.
    return isinstance(exc, docker.errors.NotFound) or "no such container" in str(exc).lower()


def remove_listed(client: Any, entry: dict[str, Any]) -> str | None:
    """Remove a listed container; its name, or None if it was gone already."""
    try:
        client.api.remove_container(entry["Id"], force=True, v=True)
    except docker.errors.APIError as exc:
        if _already_gone(exc):
            return None
        raise
    return container_name(entry)


def cleanup_leftovers(client: Any, *, everything: bool = False) -> list[str]:
    """Remove containers and networks of dead runs (all of ours with ``everything``)."""
    removed: list[str] = []
    for entry in listed_containers(client, {"label": LABEL_RUN}):
        if everything or not owner_alive(entry.get("Labels") or {}):
            name = remove_listed(client, entry)
            if name is not None:
                removed.append(name)
    for network in client.networks.list(filters={"label": LABEL_RUN}):
        labels = network.attrs.get("Labels") or {}
        if everything or not owner_alive(labels):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                network.remove()
                removed.append(str(network.name))
            tmp = Path(labels.get(LABEL_TMP) or "/nonexistent")
            if tmp.name.startswith("fencecheck-") and tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(str(tmp))
    return removed


def remove_run(run_id: str, engine: str | None = None) -> list[str]:
    """Remove the containers and network of run ``run_id`` (a dead run's, from its
    run record); returns what was removed."""
    client = docker.DockerClient(base_url=engine or find_engine(), timeout=30)
    removed: list[str] = []
    try:
        flt = {"label": f"{LABEL_RUN}={run_id}"}
        for entry in listed_containers(client, flt):
            name = remove_listed(client, entry)
            if name is not None:
                removed.append(name)
        for network in client.networks.list(filters=flt):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                network.remove()
                removed.append(str(network.name))
    finally:
        client.close()
    return removed


# ------------------------------------------------------------------ backend
@dataclass(frozen=True)
class _Inner:
    owner: str  # the container serving it
    host: str
    port: int


class ContainerBackend:
    """PostgreSQL, toxiproxy and the mock tool as containers on a private network."""

    kind = "containers"
    clones_data_directories = False
    # The image's entrypoint sets up trust authentication (docs/running.md:
    # what a run's parts expose): no run secret here.
    auth = None

    def __init__(self, client: Any, base_url: str, binaries: PgBinaries) -> None:
        self.client = client
        self.base_url = base_url
        self.binaries = binaries
        self.run_id = secrets.token_hex(3)
        self.prefix = f"fencecheck-{self.run_id}"
        self.labels = {
            LABEL_RUN: self.run_id,
            LABEL_PID: str(os.getpid()),
            LABEL_STARTED: f"{process_started(os.getpid()) or 0:.3f}",
            LABEL_HOST: socket.gethostname(),
        }
        self.images: dict[str, str] = {}
        self.network: Network | None = None
        self.removed_leftovers: list[str] = []
        self._lock = threading.Lock()
        self._counter = 0
        self._containers: dict[str, DockerContainer] = {}
        self._inner: dict[int, _Inner] = {}
        self._free_ips: collections.deque[str] = collections.deque()
        self._ip_of: dict[str, str] = {}  # container -> address run_container allocated
        self._closed = False
        self._tmp: Path | None = None
        self._toxiproxies: list[ContainerToxiproxy] = []
        self._deployment: dict[str, Any] | None = None

    # ------------------------------------------------------------ creation
    @classmethod
    def create(cls, *, binaries: PgBinaries) -> ContainerBackend:
        """Reach the engine, clean up dead runs, check the images, make the network."""
        base_url = find_engine()
        _configure_testcontainers(base_url)
        client = docker.DockerClient(base_url=base_url, timeout=120, max_pool_size=32)
        backend = cls(client, base_url, binaries)
        try:
            backend.removed_leftovers = cleanup_leftovers(client)
            if backend.removed_leftovers:
                print(
                    f"fencecheck: removed {len(backend.removed_leftovers)} container(s)/network(s) "
                    f"left by dead runs: {', '.join(backend.removed_leftovers)}",
                    file=sys.stderr,
                )
            try:
                backend.images = {
                    "postgres": images.ensure_pg_image(client),
                    "mock_tool": images.ensure_mock_tool_image(client)[0],
                    "toxiproxy": images.ensure_toxiproxy_image(client)[0],
                }
            except images.ImageMissing as exc:
                raise BackendUnavailable(str(exc)) from exc
            tmp = backend.init_script().parent
            network = Network(docker_network_kw={"labels": {**backend.labels, LABEL_TMP: str(tmp)}})
            network.name = backend.prefix
            backend.network = network.create()
            backend._init_addresses()
        except BaseException:
            backend.close()
            raise
        _LIVE.add(backend)
        return backend

    def init_script(self) -> Path:
        """The init script on the host, bind-mounted read-only into every primary.

        A bind mount rather than a copy into the container (the archive API):
        podman 4.3 failed such copies now and then under concurrent starts.
        """
        with self._lock:
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
                self._tmp.chmod(0o755)
                script = self._tmp / "fencecheck.sh"
                script.write_text(INIT_SCRIPT)
                script.chmod(0o755)
            return self._tmp / "fencecheck.sh"

    def _init_addresses(self) -> None:
        ipam = self.client.networks.get(self.prefix).attrs.get("IPAM") or {}
        config = (ipam.get("Config") or [{}])[0]
        subnet = ipaddress.ip_network(config["Subnet"])
        gateway = config.get("Gateway") or str(next(subnet.hosts()))
        hosts = itertools.islice(subnet.hosts(), 4096)  # a Docker /16 needs no more
        self._free_ips.extend(str(ip) for ip in hosts if str(ip) != gateway)

    def allocate_ip(self, prefer: str | None = None) -> str:
        """A free address on the network (``prefer`` when it is free)."""
        with self._lock:
            if prefer is not None:
                if prefer not in self._free_ips:
                    raise ClusterError(f"address {prefer} on {self.prefix} is taken meanwhile")
                self._free_ips.remove(prefer)
                return prefer
            if not self._free_ips:
                raise ClusterError(f"no free address left on network {self.prefix}")
            return self._free_ips.popleft()

    def release_ip(self, ip: str) -> None:
        with self._lock:
            if ip not in self._free_ips:
                self._free_ips.append(ip)  # at the end: reused as late as possible

    def new_name(self, role: str) -> str:
        with self._lock:
            self._counter += 1
            n = self._counter
        clean = "".join(c if c.isalnum() else "-" for c in role.lower()).strip("-")
        return f"{self.prefix}-{clean}-{n}"

    def run_container(
        self,
        *,
        role: str,
        image: str,
        name: str,
        aliases: tuple[str, ...] = (),
        command: list[str] | None = None,
        entrypoint: list[str] | None = None,
        user: str | None = None,
        env: dict[str, str] | None = None,
        ports: dict[int, int | None] | None = None,
        volumes: tuple[tuple[str, str, str], ...] = (),
        ip: str | None = None,
    ) -> DockerContainer:
        """Create and start one container on the network; removed again if that fails.

        ``ports`` maps a container port to a host port on 127.0.0.1 (None: any).
        The container gets a fixed address on the network: ``ip`` (the
        caller's to keep and release) or one allocated here and released
        with the container. It keeps that address across restarts.
        """
        network = self.network
        if self._closed or network is None:
            raise ClusterError("the containers backend is closed")
        address = ip or self.allocate_ip()
        if ip is None:
            with self._lock:
                self._ip_of[name] = address

        def build() -> DockerContainer:
            made = DockerContainer(image, name=name, env=dict(env or {}))
            made.with_network(network)
            kwargs: dict[str, Any] = {
                "labels": {**self.labels, LABEL_ROLE: role},
                "networking_config": {
                    self.prefix: EndpointConfig(
                        self.client.api.api_version,
                        aliases=[name, *aliases],
                        ipv4_address=address,
                    )
                },
            }
            if command is not None:
                made.with_command(command)
            if entrypoint is not None:
                kwargs["entrypoint"] = entrypoint
            if user is not None:
                kwargs["user"] = user
            made.with_kwargs(**kwargs)
            # docker-py takes (host_ip,) or (host_ip, host_port) bindings, and
            # testcontainers hands its port map to it unchanged; its annotation
            # is narrower than what it forwards. Loopback only, never 0.0.0.0.
            bindings = {
                f"{inner}/tcp": ("127.0.0.1",) if outer is None else ("127.0.0.1", outer)
                for inner, outer in (ports or {}).items()
            }
            made.ports = cast("dict[str, int | None]", bindings)
            for host_path, bind, access in volumes:
                made.with_volume_mapping(host_path, bind, access)
            return made

        for attempt in range(1, START_ATTEMPTS + 1):
            container = build()
            with self._lock:
                self._containers[name] = container
            try:
                container.start()
                return container
            except docker.errors.APIError as exc:
                # podman 4.3 under concurrent load sometimes answers 500 for a
                # create or start that would work a moment later.
                transient = (exc.status_code or 0) >= 500 and not any(
                    s in str(exc).lower() for s in ("already in use", "already allocated")
                )
                if attempt < START_ATTEMPTS and transient:
                    self._discard(name)
                    time.sleep(0.2 * attempt)
                    continue
                self.remove_container(name)
                raise ClusterError(f"starting container {name} ({image}) failed: {exc}") from exc
            except BaseException:
                self.remove_container(name)
                raise
        raise AssertionError("unreachable")

    def _discard(self, name: str) -> None:
        """Remove the engine's container ``name`` only (address and ports stay ours)."""
        with self._lock:
            container = self._containers.pop(name, None)
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.containers.get(name).remove(force=True, v=True)
        if container is not None:
            with contextlib.suppress(Exception):
                container.get_docker_client().client.close()

    def remove_container(self, name: str) -> None:
        """Remove one container (force, with its anonymous volumes); idempotent."""
        with self._lock:
            container = self._containers.pop(name, None)
            for port, inner in list(self._inner.items()):
                if inner.owner == name:
                    del self._inner[port]
            ip = self._ip_of.pop(name, None)
        try:
            self.client.containers.get(name).remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        finally:
            if ip is not None:
                self.release_ip(ip)
            if container is not None:
                with contextlib.suppress(Exception):
                    container.get_docker_client().client.close()

    def upstream_down(self, inner_host: str) -> None:
        """Before a container stops: proxies to it refuse instead of dialling it.

        toxiproxy dials an upstream synchronously in its accept loop, with no
        timeout. A dial to the address of a container that is gone hangs until
        the kernel gives up, and a DELETE or PATCH of that proxy waits for it
        while holding the lock every API call needs: the whole server hangs
        (seen after H's fence, when the old owner's worker reconnected). A
        local server's dead port refuses at once; pointing the proxies at a
        closed port inside toxiproxy's own container keeps that behaviour.
        """
        with self._lock:
            servers = list(self._toxiproxies)
        for server in servers:
            server.redirect(inner_host, down=True)

    def register_toxiproxy(self, server: ContainerToxiproxy) -> None:
        with self._lock:
            if server not in self._toxiproxies:
                self._toxiproxies.append(server)

    def unregister_toxiproxy(self, server: ContainerToxiproxy) -> None:
        with self._lock:
            if server in self._toxiproxies:
                self._toxiproxies.remove(server)

    def upstream_up(self, inner_host: str) -> None:
        """After a container (re)started: its proxies dial it again."""
        with self._lock:
            servers = list(self._toxiproxies)
        for server in servers:
            server.redirect(inner_host, down=False)

    def address_of(self, name: str) -> str:
        """The address the network gives container ``name``."""
        with self._lock:
            known = self._ip_of.get(name)
        if known is not None:
            return known
        attrs = self.client.containers.get(name).attrs
        return str(attrs["NetworkSettings"]["Networks"][self.prefix]["IPAddress"])

    def publish(self, host_port: int, owner: str, inner_host: str, inner_port: int) -> None:
        """Record that 127.0.0.1:host_port is inner_host:inner_port on the network."""
        with self._lock:
            self._inner[host_port] = _Inner(owner, inner_host, inner_port)

    # ---------------------------------------------------- Backend protocol
    def inner_address(self, host: str, port: int) -> str:
        """How a container on the network reaches what the harness reaches at host:port."""
        if host not in LOOPBACK:
            return f"{host}:{port}"
        with self._lock:
            inner = self._inner.get(port)
        if inner is None:
            raise ClusterError(
                f"{host}:{port} is not a port this containers backend published; a container "
                "cannot reach a service on the host's loopback"
            )
        return f"{inner.host}:{inner.port}"

    def start_primary(self, base_dir: Path, name: str) -> ContainerPostgres:
        return ContainerPostgres.start_container(self, base_dir, name)

    def clone_primary(
        self, seed: Path, base_dir: Path, name: str, templates: Sequence[str]
    ) -> ContainerPostgres:
        # A container's data lives in the engine's storage: every primary is
        # made by its image's entrypoint (clones_data_directories is False).
        raise NotImplementedError("the containers backend does not clone data directories")

    def start_standby(
        self,
        primary: PostgresCluster,
        base_dir: Path,
        *,
        upstream_host: str,
        upstream_port: int,
        name: str,
    ) -> PostgresCluster:
        if not isinstance(primary, ContainerPostgres):
            raise ClusterError("a container standby needs a container primary")
        return primary.create_standby(
            base_dir, upstream_host=upstream_host, upstream_port=upstream_port, name=name
        )

    def start_toxiproxy(self, log_dir: Path, registry: ProcessRegistry) -> ToxiproxyServer:
        return ContainerToxiproxy(self, log_dir, registry=registry).start()

    def start_mock_tool(
        self,
        storage: Path,
        log_path: Path,
        tools: dict[str, str] | None,
        retention_s: float | None = None,
    ) -> MockToolProcess:
        tool = ContainerMockTool(self, storage, log_path=log_path, tools=tools)
        tool.idempotency_retention_s = retention_s
        return tool.start()

    def deployment(self) -> dict[str, Any]:
        """What runs where, for every archive: asked of the engine once per run
        (it does not change, and a busy or stopping engine answers slowly)."""
        with self._lock:
            if self._deployment is not None:
                return dict(self._deployment)
        engine: dict[str, Any] = {"url": self.base_url}
        with contextlib.suppress(Exception):
            version = self.client.version()
            names = [c.get("Name") for c in version.get("Components") or []]
            engine.update(version=version.get("Version"), components=names)
        described = {
            "kind": self.kind,
            "engine": engine,
            "images": images.describe(self.client, self.images),
            "network": self.prefix,
            "workers": "host processes",
        }
        with self._lock:
            self._deployment = described
        return dict(described)

    def footprint(self) -> dict[str, Any]:
        return {
            "container_run": self.run_id,
            "engine": self.base_url,
            "temp_dirs": [str(self._tmp)] if self._tmp is not None else [],
        }

    def close(self) -> None:
        """Remove every container and the network of this run; idempotent.
        After a stop request the abort already removed the containers.

        Containers are removed in parallel (each removal is a round trip of a
        second or so to a busy engine): a stopping run has seconds, not tens.
        """
        self._closed = True
        with self._lock:
            names = [] if stopping.requested() else list(self._containers)
        removers = [
            threading.Thread(target=self._remove_quietly, args=(name,), daemon=True)
            for name in names
        ]
        for thread in removers:
            thread.start()
        for thread in removers:
            thread.join(timeout=30)
        # By label too: whatever was created but never registered.
        with contextlib.suppress(Exception):
            for entry in listed_containers(self.client, {"label": f"{LABEL_RUN}={self.run_id}"}):
                remove_listed(self.client, entry)
        if self.network is not None:
            with contextlib.suppress(Exception):
                self.network.remove()
            self.network = None
        with contextlib.suppress(Exception):
            for network in self.client.networks.list(
                filters={"label": f"{LABEL_RUN}={self.run_id}"}
            ):
                network.remove()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        _LIVE.discard(self)

    def abort(self) -> None:
        """Kill every container of this run at once (SIGKILL, in parallel), then
        remove them all with one prune: a stopping run has seconds, and the
        engine takes about a second per removal (measured under load: six
        PostgreSQL containers removed one by one 4 s, in parallel 2.8 s, killed
        in parallel and pruned 2.3 s)."""
        flt = {"label": f"{LABEL_RUN}={self.run_id}"}
        stopping.trace("containers: abort")
        try:
            # sparse: one call, not one inspection per container
            containers = self.client.containers.list(all=True, sparse=True, filters=flt)
        except Exception:
            return
        stopping.trace(f"containers: {len(containers)} to kill")
        killers = [
            threading.Thread(target=_kill_quietly, args=(c,), daemon=True) for c in containers
        ]
        for thread in killers:
            thread.start()
        for thread in killers:
            thread.join(timeout=10)
        stopping.trace(f"containers: {len(containers)} killed")
        with contextlib.suppress(Exception):
            self.client.containers.prune(filters=flt)
        stopping.trace("containers: pruned")

    def _remove_quietly(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.remove_container(name)

    def leftovers(self) -> list[str]:
        """Names of this run's containers and networks still in the engine."""
        flt = {"label": f"{LABEL_RUN}={self.run_id}"}
        return [container_name(e) for e in listed_containers(self.client, flt)] + [
            str(n.name) for n in self.client.networks.list(filters=flt)
        ]


def _kill_quietly(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.kill(signal="SIGKILL")


# ---------------------------------------------------------------- postgres
def _container_status(container: DockerContainer) -> tuple[str, int | None]:
    wrapped = container.get_wrapped_container()
    try:
        wrapped.reload()
    except docker.errors.NotFound:
        return "removed", None
    state = wrapped.attrs.get("State") or {}
    return str(state.get("Status", "unknown")), state.get("ExitCode")


def published_port(container: DockerContainer, inner: int) -> int:
    """The loopback port the engine published for ``inner``/tcp."""
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    bindings = ((wrapped.attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{inner}/tcp")
    if not bindings:
        raise ClusterError(
            f"container {wrapped.name} has no published port for {inner}/tcp "
            f"(status {wrapped.status}):\n{_logs(container, tail=30)}"
        )
    return int(bindings[0]["HostPort"])


def _logs(container: DockerContainer, tail: int | Literal["all"] = "all") -> str:
    try:
        data = container.get_wrapped_container().logs(stdout=True, stderr=True, tail=tail)
    except docker.errors.APIError as exc:
        return f"(no container logs: {exc})"
    return bytes(data).decode("utf-8", errors="replace")


@dataclass(eq=False)
class ContainerPostgres(PostgresCluster):
    """A PostgresCluster whose server runs in a container.

    Queries, replication status, promote and everything else above the
    lifecycle are inherited: they go over TCP to the published loopback port.
    """

    backend: ContainerBackend | None = None
    container: DockerContainer | None = None
    container_name: str = ""
    image: str = ""
    inner_host: str = ""  # its address on the network

    @classmethod
    def start_container(
        cls,
        backend: ContainerBackend,
        base_dir: Path,
        name: str,
        *,
        standby_env: dict[str, str] | None = None,
        timeout_s: float = 90.0,
    ) -> ContainerPostgres:
        """Start a primary (or, with ``standby_env``, a standby) and wait until it serves."""
        base_dir.mkdir(parents=True, exist_ok=True)
        cname = backend.new_name(f"pg-{name}")
        cluster = cls(
            binaries=backend.binaries,
            datadir=Path(PurePosixPath(PGDATA)),
            port=0,
            name=name,
            run_as=OsUser.current(),
            log_path=base_dir / f"{name}.log",
            backend=backend,
            container_name=cname,
            image=backend.images["postgres"],
        )
        env = {
            "POSTGRES_HOST_AUTH_METHOD": "trust",
            "PGDATA": PGDATA,
            "POSTGRES_INITDB_ARGS": "--no-sync",  # as the local clusters' initdb -N
        }
        common: dict[str, Any] = {
            "role": "pg-standby" if standby_env else "pg-primary",
            "image": cluster.image,
            "name": cname,
            "user": "postgres",
            "ports": {PG_PORT: None},
        }
        if standby_env is None:
            cluster.container = backend.run_container(
                **common,
                env=env,
                volumes=((str(backend.init_script()), INIT_SCRIPT_PATH, "ro"),),
            )
        else:
            cluster.container = backend.run_container(
                **common,
                env={**env, **standby_env},
                entrypoint=["sh", "-c", STANDBY_SCRIPT, "fencecheck-standby"],
            )
        try:
            cluster.inner_host = backend.address_of(cname)
            cluster._await_ready(timeout_s)
        except BaseException:
            cluster.remove()
            raise
        return cluster

    def _wrapped(self) -> Any:
        if self.container is None:
            raise ClusterError(f"{self.name} has no container")
        return self.container.get_wrapped_container()

    def _await_ready(self, timeout_s: float) -> None:
        assert self.container is not None and self.backend is not None
        self.port = published_port(self.container, PG_PORT)
        self.backend.publish(self.port, self.container_name, self.inner_host, PG_PORT)
        deadline = time.monotonic() + timeout_s
        last = ""
        next_status = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_status:  # the engine is asked less often than the port
                next_status = time.monotonic() + STATUS_POLL_S
                status, code = _container_status(self.container)
                if status not in ("running", "created", "configured", "initialized"):
                    raise ClusterError(
                        f"{self.name} (container {self.container_name}, {self.image}) is "
                        f"{status} (exit code {code}) before it accepted connections:\n"
                        f"{self.log_tail()}"
                    )
            try:
                with psycopg.connect(self.admin_dsn(), connect_timeout=2, autocommit=True):
                    return
            except psycopg.OperationalError as exc:
                last = str(exc).strip()
            time.sleep(0.05)
        raise ClusterError(
            f"{self.name} (container {self.container_name}) did not accept connections on "
            f"127.0.0.1:{self.port} within {timeout_s:.0f}s ({last}):\n{self.log_tail()}"
        )

    # ------------------------------------------------------- lifecycle
    def start(self, *, timeout_s: float = 90.0) -> None:
        """Start the stopped container again (same data) and wait until it serves."""
        if self.running:
            raise ClusterError(f"{self.name} is already running (container {self.container_name})")
        self._wrapped().start()
        self._await_ready(timeout_s)
        if self.backend is not None:
            self.backend.upstream_up(self.inner_host)

    def stop(self, mode: Literal["fast", "immediate"] = "fast", timeout_s: float = 30.0) -> float:
        """Stop the server; ``immediate`` is the fence: SIGKILL of the whole container."""
        self._sessions.forget()
        if self.container is None or not self.running:
            return 0.0
        wrapped = self._wrapped()
        started = time.monotonic()
        sig = "SIGINT" if mode == "fast" else "SIGKILL"
        if self.backend is not None:
            self.backend.upstream_down(self.inner_host)
        try:
            if self.is_paused() and mode == "immediate":
                # podman kills a frozen container as it is (no thaw, so no
                # last write slips out); Docker refuses: thaw, then kill.
                try:
                    wrapped.kill(signal=sig)
                except docker.errors.APIError:
                    wrapped.unpause()
                    wrapped.kill(signal=sig)
            else:
                if self.is_paused():
                    wrapped.unpause()  # a frozen server cannot shut down
                wrapped.kill(signal=sig)
            wrapped.wait(timeout=timeout_s)
        except docker.errors.NotFound:
            return time.monotonic() - started
        except Exception:
            with contextlib.suppress(docker.errors.APIError):
                wrapped.kill(signal="SIGKILL")
                wrapped.wait(timeout=10)
        return time.monotonic() - started

    @property
    def running(self) -> bool:
        if self.container is None:
            return False
        return _container_status(self.container)[0] in ("running", "paused")

    def is_paused(self) -> bool:
        return self.container is not None and _container_status(self.container)[0] == "paused"

    def log_tail(self, lines: int = 30) -> str:
        if self.container is not None:
            text = _logs(self.container, tail=lines)
            if not text.startswith("(no container logs"):
                return text.rstrip("\n")
        return super().log_tail(lines)

    def remove(self) -> None:
        """Keep the server's log next to the local backend's, then remove the container.

        Once the run is stopping, the backend's abort kills and removes every
        container at once; this then only lets go of it.
        """
        if self.container is None or self.backend is None:
            return
        if stopping.requested():
            self.container = None
            return
        self.backend.upstream_down(self.inner_host)
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as log:
                log.write(_logs(self.container))
        self.backend.remove_container(self.container_name)
        self.container = None

    def postmaster_pid(self) -> int | None:
        """The container's first process as a pid of this host, when it is the
        postmaster (the image's entrypoint execs postgres): its backends are the
        host's processes too, and their CPU waits can be measured like a local
        server's (a CI run's containers matrix failed Q on correct code: every
        renewal timed out while the database's backends, not watched, waited)."""
        if self.container is None:
            return None
        wrapped = self.container.get_wrapped_container()
        try:
            wrapped.reload()
        except docker.errors.APIError:
            return None
        pid = int((wrapped.attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return None
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            return None  # another pid namespace than this host's view
        return pid if title.endswith(b"postgres") else None

    # ------------------------------------------------ extra fault: pause
    def pause(self) -> FaultRecord:
        """Freeze the whole server (cgroup freezer); returns once the engine says paused."""
        if not self.running or self.is_paused():
            raise ClusterError(f"{self.name} is not running, or already paused")
        self._wrapped().pause()
        if not self.is_paused():
            raise ClusterError(f"{self.name}: the engine did not report the container paused")
        return FaultRecord(
            link=self.container_name,
            kind="pause",
            started_at=time.time(),
            detail=f"container pause of {self.name} ({self.container_name})",
        )

    def unpause(self, record: FaultRecord | None = None) -> FaultRecord | None:
        self._wrapped().unpause()
        if record is not None:
            record.stopped_at = time.time()
        return record

    @contextlib.contextmanager
    def paused(self) -> Iterator[FaultRecord]:
        """``with cluster.paused():`` freezes the server and always thaws it."""
        record = self.pause()
        try:
            yield record
        finally:
            if self.is_paused():
                self.unpause(record)

    # ------------------------------------------------------ replication
    def create_standby(
        self,
        base_dir: Path,
        *,
        upstream_host: str,
        upstream_port: int,
        name: str = "replica",
        timeout_s: float = 90.0,
    ) -> PostgresCluster:
        """A standby container streaming from ``upstream_host:upstream_port``.

        The address is the harness's view (normally a toxiproxy proxy on
        127.0.0.1); the standby's WAL receiver uses the network's view of it.
        The base backup comes straight from this primary's container.
        """
        if self.backend is None:
            raise ClusterError(f"{self.name} has no backend")
        slot = name.replace("-", "_")
        with self.connect() as conn:
            conn.execute(
                "SELECT pg_create_physical_replication_slot(%s) "
                "WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)",
                [slot, slot],
            )
        inner_host, _, inner_port = self.backend.inner_address(
            upstream_host, upstream_port
        ).rpartition(":")
        conninfo = (
            f"host={inner_host} port={inner_port} user={self.superuser} "
            f"application_name={name} connect_timeout=2"
        )
        return ContainerPostgres.start_container(
            self.backend,
            base_dir,
            name,
            standby_env={
                "FC_PRIMARY_HOST": self.inner_host,
                "FC_PRIMARY_PORT": str(PG_PORT),
                "FC_SLOT": slot,
                "FC_CONNINFO": conninfo,
            },
            timeout_s=timeout_s,
        )


# --------------------------------------------------------------- toxiproxy
class ContainerToxiproxy(ToxiproxyServer):
    """The real toxiproxy server in a container, with a pool of published proxy ports."""

    def __init__(
        self,
        backend: ContainerBackend,
        log_dir: Path,
        *,
        registry: ProcessRegistry | None = None,
    ) -> None:
        super().__init__(log_dir, registry=registry, startup_timeout_s=60.0)
        self.backend = backend
        self.container: DockerContainer | None = None
        self.container_name = backend.new_name("toxiproxy")
        self.inner_host = ""  # its address on the network
        self.pool_size = int(os.environ.get(PROXY_POOL_ENV, DEFAULT_PROXY_POOL))
        self._free: list[int] = []
        self._port_of: dict[str, int] = {}
        self._upstream_of: dict[str, str] = {}  # proxy -> upstream it was made with
        self._pool_lock = threading.Lock()

    def start(self) -> ContainerToxiproxy:
        last = ""
        for _attempt in range(3):
            pool: list[int] = []
            while len(pool) < self.pool_size:
                port = free_loopback_port()
                if port not in pool:
                    pool.append(port)
            try:
                self.container = self.backend.run_container(
                    role="toxiproxy",
                    image=self.backend.images["toxiproxy"],
                    name=self.container_name,
                    command=["-host", "0.0.0.0", "-port", str(TOXIPROXY_API_PORT)],
                    ports={TOXIPROXY_API_PORT: None, **{p: p for p in pool}},
                )
            except ClusterError as exc:  # a pool port taken meanwhile: new pool
                last = str(exc)
                if "address already in use" not in last.lower():
                    break
                continue
            self._free = pool
            self.backend.register_toxiproxy(self)
            self.inner_host = self.backend.address_of(self.container_name)
            for port in pool:
                self.backend.publish(port, self.container_name, self.inner_host, port)
            self.port = published_port(self.container, TOXIPROXY_API_PORT)
            client = ToxiproxyClient(self.host, self.port, timeout_s=2.0)
            deadline = time.monotonic() + self.startup_timeout_s
            next_status = 0.0
            while time.monotonic() < deadline:
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_POLL_S
                    if _container_status(self.container)[0] != "running":
                        break
                try:
                    self.version = client.version()
                except ToxiproxyError as exc:
                    last = str(exc)
                    time.sleep(0.02)
                    continue
                self._client = ToxiproxyClient(self.host, self.port)
                return self
            last = f"{last}; container log: {_logs(self.container, tail=20)}"
            break
        self.stop()
        raise ToxiproxyError(
            "GET",
            "/version",
            None,
            f"toxiproxy container ({self.backend.images['toxiproxy']}) not ready: {last}",
        )

    def stop(self, grace_s: float = 3.0) -> None:
        del grace_s  # removing the container is the stop
        if self.container is None:
            return
        self.backend.unregister_toxiproxy(self)
        if stopping.requested():  # the backend's abort removes every container at once
            self.container = None
            return
        with contextlib.suppress(OSError):
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / "toxiproxy.log").write_text(_logs(self.container))
        self.backend.remove_container(self.container_name)
        self.container = None

    def link(self, name: str, upstream: str, *, listen: str | None = None) -> Link:
        """A proxy on a pool port: 127.0.0.1:P for the host, <toxiproxy>:P on the network."""
        if listen is not None:
            raise ValueError("proxies of a toxiproxy container listen on its published pool")
        port = self._free_port()
        if port is None:
            with self._pool_lock:
                holders = ", ".join(sorted(self._port_of))
            raise ToxiproxyError(
                "POST",
                "/proxies",
                None,
                f"all {self.pool_size} published proxy ports stayed in use for "
                f"{POOL_WAIT_S:.0f} s (by {holders}); raise {PROXY_POOL_ENV} or run fewer "
                "experiments at once (--jobs)",
            )
        try:
            info = self.client.create_proxy(name, upstream, listen=f"0.0.0.0:{port}")
        except BaseException:
            with self._pool_lock:
                self._free.append(port)
            raise
        with self._pool_lock:
            self._port_of[name] = port
            self._upstream_of[name] = upstream
        link = Link(self, replace(info, listen=f"127.0.0.1:{port}"))
        self._links[name] = link
        return link

    def remove_link(self, name: str) -> None:
        try:
            super().remove_link(name)
        except ToxiproxyError as exc:
            if exc.status != 404:
                # Not known whether it went (an answer lost on a busy machine):
                # its port stays taken until the server no longer lists it.
                raise
        self._release(name)

    def _release(self, name: str) -> None:
        with self._pool_lock:
            port = self._port_of.pop(name, None)
            self._upstream_of.pop(name, None)
            if port is not None:
                self._free.append(port)

    def _free_port(self) -> int | None:
        """A pool port, taken; None when none came free within POOL_WAIT_S.
        An empty pool is mostly finished experiments whose teardown (off the
        critical path, behind the janitor) has not deleted their proxies yet:
        their ports come back within seconds, so a new link waits for one
        (and takes back the ports of proxies the server no longer lists)."""

        def take() -> int | None:
            with self._pool_lock:
                if self._free:
                    return self._free.pop(0)
            self._reclaim()
            with self._pool_lock:
                return self._free.pop(0) if self._free else None

        try:
            return wait_for(
                take,
                what=f"a free port of the toxiproxy pool ({self.pool_size} ports, every one "
                "held by a proxy)",
                timeout_s=POOL_WAIT_S,
                interval_s=0.1,
                max_interval_s=0.5,
            )
        except WaitTimeout:
            return None

    def _reclaim(self) -> None:
        """Give back the ports of proxies the server no longer lists (deleted,
        but the answer to the delete was lost). Only names made before the
        listing are judged: one made meanwhile is not listed yet."""
        with self._pool_lock:
            before = set(self._port_of)
        try:
            listed = set(self.client.list_proxies())
        except ToxiproxyError:
            return  # the pool stays as it is; the caller reports it full
        for name in sorted(before - listed):
            self._release(name)

    def redirect(self, inner_host: str, *, down: bool) -> None:
        """Point the proxies to ``inner_host`` at a refusing port (down) or back."""
        if self.container is None or inner_host == "":
            return
        with self._pool_lock:
            targets = [
                (name, upstream)
                for name, upstream in self._upstream_of.items()
                if upstream.rpartition(":")[0] == inner_host
            ]
        for name, upstream in targets:
            with contextlib.suppress(ToxiproxyError):  # deleted meanwhile: nothing to do
                self.client.set_upstream(name, REFUSING if down else upstream)


# --------------------------------------------------------------- mock tool
class ContainerMockTool(MockToolProcess):
    """The mock tool server in a container; storage bind-mounted from the host.

    A restart makes a new container on the same storage, the same published
    port and the same network alias, so proxies pointing at it keep working.
    """

    def __init__(
        self,
        backend: ContainerBackend,
        storage: str | Path,
        *,
        log_path: str | Path,
        tools: dict[str, str] | None = None,
    ) -> None:
        # Container start-up under a busy engine takes longer than a process's.
        super().__init__(storage, tools=tools, log_path=log_path, startup_timeout_s=60.0)
        self.backend = backend
        self.alias = backend.new_name("tool")
        self.container: DockerContainer | None = None
        self.container_name = ""
        # One address for every incarnation: proxies made before a restart
        # still reach the tool after it.
        self.inner_host: str | None = None

    def command(self) -> list[str]:
        cmd = ["--host", "0.0.0.0", "--port", str(TOOL_PORT), "--storage", "/data"]
        for name, capability in (self.tools or {}).items():
            cmd += ["--tool", f"{name}={capability}"]
        if self.idempotency_retention_s is not None:
            cmd += ["--idempotency-retention-s", str(self.idempotency_retention_s)]
        if self.callback_attempts is not None:
            cmd += ["--callback-attempts", str(self.callback_attempts)]
        return cmd + self.extra_args

    @property
    def pid(self) -> int | None:
        return None

    @property
    def running(self) -> bool:
        return self.container is not None and _container_status(self.container)[0] == "running"

    @property
    def returncode(self) -> int | None:
        if self.container is None:
            return None
        status, code = _container_status(self.container)
        return None if status == "running" else code

    def start(self) -> ContainerMockTool:
        if self.running:
            raise RuntimeError(f"mock tool already running (container {self.container_name})")
        self.storage.mkdir(parents=True, exist_ok=True)
        self.container_name = f"{self.alias}-{self.starts + 1}"
        self.inner_host = self.backend.allocate_ip(prefer=self.inner_host)
        try:
            self.container = self.backend.run_container(
                role="mock-tool",
                image=self.backend.images["mock_tool"],
                name=self.container_name,
                aliases=(self.alias,),
                command=self.command(),
                ports={TOOL_PORT: self._port or None},
                volumes=((str(self.storage), "/data", "rw"),),
                ip=self.inner_host,
            )
        except BaseException:
            self.backend.release_ip(self.inner_host)
            raise
        try:
            self._port = published_port(self.container, TOOL_PORT)
            self.backend.publish(self._port, self.container_name, self.inner_host, TOOL_PORT)
            self._await_healthy()
        except BaseException:
            self.kill()
            raise
        self.backend.upstream_up(self.inner_host)
        self.starts += 1
        return self

    def _await_healthy(self) -> None:
        assert self.container is not None
        client = ToolClient(self.base_url, timeout_s=1.0)
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no attempt"
        next_status = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_POLL_S
                status, code = _container_status(self.container)
                if status != "running":
                    raise MockToolStartError(
                        f"mock tool container {self.container_name} is {status} (exit {code}) "
                        f"before GET /health answered; log:\n{_logs(self.container, tail=30)}"
                    )
            try:
                if client.health().get("ok") is True:
                    return
                last = "answered without ok=true"
            except ToolError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise MockToolStartError(
            f"timed out after {self.startup_timeout_s:.1f}s waiting for GET {self.base_url}/health "
            f"(container {self.container_name}); last: {last}"
        )

    def _going_down(self) -> None:
        if self.inner_host is not None:
            self.backend.upstream_down(self.inner_host)

    def _finish(self, code: int | None) -> int | None:
        if self.container is not None:
            with contextlib.suppress(OSError):
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with self.log_path.open("a") as log:
                    log.write(_logs(self.container))
            self.backend.remove_container(self.container_name)
            self.container = None
            if self.inner_host is not None:
                self.backend.release_ip(self.inner_host)
        return code

    def _wait_exit(self, timeout_s: float) -> int | None:
        assert self.container is not None
        try:
            result = self.container.get_wrapped_container().wait(timeout=timeout_s)
        except docker.errors.NotFound:
            return None
        return int(result.get("StatusCode", -1))

    def kill(self) -> int | None:
        """SIGKILL the server (a crash) and remove its container; the storage stays."""
        return self._shut_down(lambda wrapped: wrapped.kill(signal="SIGKILL"))

    def stop(self) -> int | None:
        """SIGTERM, ``stop_grace_s``, then SIGKILL; the container goes, the storage stays."""
        return self._shut_down(lambda wrapped: wrapped.stop(timeout=int(self.stop_grace_s)))

    def _shut_down(self, signal_it: Callable[[Any], object]) -> int | None:
        """``signal_it`` the running container, wait for its exit, remove it
        (once the run is stopping, the backend's abort does all of that)."""
        if self.container is None:
            return None
        if stopping.requested():
            self.container = None
            return None
        self._going_down()
        code: int | None = None
        with contextlib.suppress(docker.errors.APIError):
            if self.running:
                signal_it(self.container.get_wrapped_container())
            code = self._wait_exit(10)
        return self._finish(code)


# --------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.backends.containers",
        description="Remove fencecheck containers and networks left behind by killed runs.",
    )
    parser.add_argument("command", choices=("cleanup",))
    parser.add_argument(
        "--all",
        action="store_true",
        help="remove every fencecheck container, also of runs still going",
    )
    args = parser.parse_args(argv)
    try:
        base_url = find_engine()
    except BackendUnavailable as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return 64
    client = docker.DockerClient(base_url=base_url)
    try:
        removed = cleanup_leftovers(client, everything=args.all)
    finally:
        client.close()
    print(f"removed {len(removed)}: {', '.join(removed) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
