"""Where the environment's servers run: local processes (default) or containers.

A backend starts PostgreSQL (primary and standby), toxiproxy and the mock tool
and says how to reach them; everything above it (environment, scenarios,
checkers, evidence) is the same for every backend. Workers always stay
processes on the host, so that SIGSTOP/SIGKILL reach them directly.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from harness import stopping
from harness.parts.pg_auth import PgAuth
from harness.parts.pg_binaries import PgBinaries
from harness.parts.port_guard import guard_port
from harness.parts.postgres import PostgresCluster
from harness.parts.processes import ProcessRegistry
from harness.parts.toxiproxy import ToxiproxyServer
from mock_tool.process import HostedTool, MockToolHost, MockToolProcess

BACKENDS = ("local", "containers")
IMAGE_ENV = "FENCECHECK_IMAGE"


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here."""


class Backend(Protocol):
    """What the environment needs from a place to run servers."""

    kind: str  # the evidence's deployment kind
    # Whether clone_primary can make a primary from a stopped data directory.
    clones_data_directories: bool
    # The run's PostgreSQL secret, set once the run's temp root exists.
    auth: PgAuth | None

    def start_primary(self, base_dir: Path, name: str) -> PostgresCluster: ...

    def clone_primary(
        self, seed: Path, base_dir: Path, name: str, templates: Sequence[str]
    ) -> PostgresCluster:
        """A primary whose data directory is a copy of the stopped cluster
        ``seed`` with its migrated databases ``templates``."""
        ...

    def start_standby(
        self,
        primary: PostgresCluster,
        base_dir: Path,
        *,
        upstream_host: str,
        upstream_port: int,
        name: str,
    ) -> PostgresCluster: ...

    def start_toxiproxy(self, log_dir: Path, registry: ProcessRegistry) -> ToxiproxyServer: ...

    def start_mock_tool(
        self,
        storage: Path,
        log_path: Path,
        tools: dict[str, str] | None,
        retention_s: float | None = None,
    ) -> MockToolProcess | HostedTool: ...

    def inner_address(self, host: str, port: int) -> str:
        """How toxiproxy (and the backend's other servers) reach what the harness
        reaches at ``host:port``: the upstream to give a proxy."""
        ...

    def deployment(self) -> dict[str, Any]: ...

    def footprint(self) -> dict[str, Any]:
        """What the backend keeps outside the run's temp root, for the run record
        (``harness.engine.run_records``): ``temp_dirs``, ``container_run``, ``engine``."""
        ...

    def abort(self) -> None:
        """The run is stopping: end every server of this backend now, the fastest
        way it has (called once, from a thread of its own)."""
        ...

    def close(self) -> None: ...


class LocalBackend:
    """Servers as child processes of the harness on 127.0.0.1 (the default)."""

    kind = "local-processes"
    clones_data_directories = True

    def __init__(self, binaries: PgBinaries, toxiproxy_bin: str | None) -> None:
        self.binaries = binaries
        self.toxiproxy_bin = toxiproxy_bin
        # One host process serves every experiment's tool (mock_tool/host.py),
        # each on its own port with its own storage: started on first use.
        self._tool_host: MockToolHost | None = None
        self._tool_host_lock = threading.Lock()
        self.auth: PgAuth | None = None

    def start_primary(self, base_dir: Path, name: str) -> PostgresCluster:
        return PostgresCluster.init_primary(self.binaries, base_dir, name=name, auth=self.auth)

    def clone_primary(
        self, seed: Path, base_dir: Path, name: str, templates: Sequence[str]
    ) -> PostgresCluster:
        return PostgresCluster.from_seed(
            self.binaries, seed, base_dir, name=name, templates=templates, auth=self.auth
        )

    def start_standby(
        self,
        primary: PostgresCluster,
        base_dir: Path,
        *,
        upstream_host: str,
        upstream_port: int,
        name: str,
    ) -> PostgresCluster:
        return primary.create_standby(
            base_dir, upstream_host=upstream_host, upstream_port=upstream_port, name=name
        )

    def start_toxiproxy(self, log_dir: Path, registry: ProcessRegistry) -> ToxiproxyServer:
        return ToxiproxyServer(log_dir, binary=self.toxiproxy_bin, registry=registry).start()

    def start_mock_tool(
        self,
        storage: Path,
        log_path: Path,
        tools: dict[str, str] | None,
        retention_s: float | None = None,
    ) -> MockToolProcess | HostedTool:
        with self._tool_host_lock:
            if self._tool_host is None or not self._tool_host.running:
                # Its log sits beside the run's other servers' (the experiment
                # tool's own log is log_path).
                self._tool_host = MockToolHost(
                    log_path.parent.parent / "run" / "mock_tool_host.log"
                )
                self._tool_host.start()
            host = self._tool_host
        tool = host.open(
            str(storage),
            storage,
            log_path=log_path,
            tools=tools,
            idempotency_retention_s=retention_s,
        )
        guard_port(tool.port)  # its /admin endpoints set faults: the run's users only
        return tool

    @property
    def tool_host_pid(self) -> int | None:
        host = self._tool_host
        return host.pid if host is not None and host.running else None

    def inner_address(self, host: str, port: int) -> str:
        return f"{host}:{port}"  # every server shares the harness's loopback

    def deployment(self) -> dict[str, Any]:
        found: dict[str, Any] = {"kind": self.kind, "postgres_binaries": self.binaries.describe()}
        # Set by the fencecheck container image (make image): which image ran.
        if os.environ.get(IMAGE_ENV):
            found["inside_image"] = os.environ[IMAGE_ENV]
        return found

    def footprint(self) -> dict[str, Any]:
        return {}  # everything lives in the run's temp root

    def abort(self) -> None:
        # Each local server is stopped (in milliseconds) by its owner; the tool
        # host serves every experiment's tool, so it goes here at once.
        if self._tool_host is not None:
            self._tool_host.kill()

    def close(self) -> None:
        if self._tool_host is not None:
            self._tool_host.stop(grace_s=1.0 if stopping.requested() else 5.0)


def make_backend(name: str, binaries: PgBinaries, toxiproxy_bin: str | None) -> Backend:
    """The backend called ``name``; a clear error when it cannot run here."""
    if name == "local":
        return LocalBackend(binaries, toxiproxy_bin)
    if name == "containers":
        try:
            # Imported by name: the module and its dependencies (docker-py,
            # testcontainers) are only needed when this backend is chosen.
            containers = importlib.import_module("harness.backends.containers")
        except ImportError as exc:
            raise BackendUnavailable(
                f"the containers backend is not available: {exc}; see README.md "
                "(make containers-setup)"
            ) from exc
        backend: Backend = containers.ContainerBackend.create(binaries=binaries)
        return backend
    raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
