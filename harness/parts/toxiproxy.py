"""The real toxiproxy server, a typed client for its HTTP API, and link faults.

Every network path the experiments may break (worker to PostgreSQL, worker to
the tool, primary to replica) goes through a toxiproxy proxy; a `Link` wraps
one proxy and offers its faults as start/stop pairs that refuse to start
twice and return a `FaultRecord` of what they did. The server keeps a journal
of every record: the evidence that a fault was really in place.

Why not the PyPI `toxiproxy-python` (0.1.1, 2019, unmaintained): its host and
port are class globals (two servers in one process, as parallel experiments
need, cannot coexist), it updates proxies with the deprecated POST instead of
PATCH, and it ignores most HTTP errors, so a fault that failed to apply would
pass silently and an experiment would report "pass" for a fault that never
happened. The API is small; this client uses stdlib `http.client` and turns
every non-2xx answer or transport error into `ToxiproxyError` with the status
and body.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from harness.failures import PartFailed
from harness.parts.port_guard import connection_attempts, guard_port
from harness.parts.ports import free_port
from harness.parts.processes import ManagedProcess, ProcessRegistry

ENV_VAR = "FENCECHECK_TOXIPROXY"
BINARY_NAME = "toxiproxy-server"
PINNED_VERSION = "v2.12.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_BINARY = REPO_ROOT / ".tools" / "bin" / BINARY_NAME
INSTALL_HINT = (
    f"run `make setup` (it builds the pinned release into {LOCAL_BINARY}), or build it yourself "
    f"with `GOBIN={LOCAL_BINARY.parent} go install "
    f"github.com/Shopify/toxiproxy/v2/cmd/server@{PINNED_VERSION}` and rename `server` to "
    f"`{BINARY_NAME}` (Go 1.23+), or set {ENV_VAR} to an existing binary"
)

# Toxic names are ours alone so heal() can tell them apart from none at all.
_TOXIC_PREFIX = "fencecheck_"


class ToxiproxyError(Exception):
    """The toxiproxy API refused a request or could not be reached."""

    def __init__(self, method: str, path: str, status: int | None, body: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        where = f"HTTP {status}" if status is not None else "no HTTP answer"
        super().__init__(f"toxiproxy {method} {path}: {where}: {body.strip()[:500]}")


class ToxiproxyNotFound(FileNotFoundError):
    """No toxiproxy-server binary was found; the message says how to get one."""


class FaultActive(RuntimeError):
    """A fault was started on a link where the same fault is already active."""


def _check_executable(path: Path, source: str) -> Path:
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ToxiproxyNotFound(f"toxiproxy-server from {source} is not an executable file: {path}")


def find_toxiproxy_server(explicit: str | Path | None = None) -> Path:
    """Locate the server binary: argument, $FENCECHECK_TOXIPROXY, PATH, <repo>/.tools/bin.

    An explicit argument or environment value that does not point at an
    executable is an error, never silently skipped.
    """
    if explicit is not None:
        return _check_executable(Path(explicit), "the explicit argument")
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return _check_executable(Path(from_env), f"${ENV_VAR}")
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        return Path(on_path)
    if LOCAL_BINARY.is_file() and os.access(LOCAL_BINARY, os.X_OK):
        return LOCAL_BINARY
    raise ToxiproxyNotFound(
        f"toxiproxy-server not found (looked at ${ENV_VAR}, PATH, {LOCAL_BINARY}); {INSTALL_HINT}"
    )


def _split_hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass(frozen=True)
class Toxic:
    """One toxic as the API describes it."""

    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": self.attributes,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Toxic:
        return cls(
            name=str(obj["name"]),
            type=str(obj["type"]),
            stream=str(obj.get("stream", "downstream")),
            toxicity=float(obj.get("toxicity", 1.0)),
            attributes=dict(obj.get("attributes") or {}),
        )


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as the API describes it; `listen` is the real bound address."""

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[Toxic, ...] = ()

    @property
    def listen_host(self) -> str:
        return _split_hostport(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return _split_hostport(self.listen)[1]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ProxyInfo:
        return cls(
            name=str(obj["name"]),
            listen=str(obj["listen"]),
            upstream=str(obj["upstream"]),
            enabled=bool(obj["enabled"]),
            toxics=tuple(Toxic.from_json(t) for t in obj.get("toxics") or ()),
        )


class ToxiproxyClient:
    """Typed client for one toxiproxy server's HTTP API (no global state)."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        # One connection per call: no keep-alive state to go stale across a
        # server restart, and the API is far from any hot path.
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            text = response.read().decode("utf-8", errors="replace")
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            raise ToxiproxyError(method, path, None, repr(exc)) from exc
        finally:
            conn.close()
        if not 200 <= status < 300:
            raise ToxiproxyError(method, path, status, text)
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ToxiproxyError(method, path, status, f"not JSON: {text}") from exc

    def version(self) -> str:
        answer = self._call("GET", "/version")
        # v2.12 answers {"version": "..."}; older servers answered plain text.
        return str(answer.get("version")) if isinstance(answer, dict) else str(answer)

    def create_proxy(
        self, name: str, upstream: str, *, listen: str = "127.0.0.1:0", enabled: bool = True
    ) -> ProxyInfo:
        """Create a proxy; with port 0 the answer carries the port actually bound."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        return ProxyInfo.from_json(self._call("POST", "/proxies", body))

    def get_proxy(self, name: str) -> ProxyInfo:
        return ProxyInfo.from_json(self._call("GET", f"/proxies/{name}"))

    def list_proxies(self) -> dict[str, ProxyInfo]:
        answer = self._call("GET", "/proxies") or {}
        return {k: ProxyInfo.from_json(v) for k, v in answer.items()}

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    def set_enabled(self, name: str, enabled: bool) -> ProxyInfo:
        """PATCH enabled; disabling closes every open connection and stops listening."""
        return ProxyInfo.from_json(self._call("PATCH", f"/proxies/{name}", {"enabled": enabled}))

    def set_upstream(self, name: str, upstream: str) -> ProxyInfo:
        """PATCH upstream; connections made from now on dial ``upstream``."""
        return ProxyInfo.from_json(self._call("PATCH", f"/proxies/{name}", {"upstream": upstream}))

    def add_toxic(self, proxy: str, toxic: Toxic) -> Toxic:
        return Toxic.from_json(self._call("POST", f"/proxies/{proxy}/toxics", toxic.to_json()))

    def remove_toxic(self, proxy: str, toxic_name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic_name}")

    def list_toxics(self, proxy: str) -> list[Toxic]:
        return [Toxic.from_json(t) for t in self._call("GET", f"/proxies/{proxy}/toxics") or ()]


@dataclass
class FaultRecord:
    """One fault on one link: what was done, when it started and stopped.

    `stopped_at` is None while the fault is active. Times are time.time()
    taken right after the API confirmed the change.
    """

    link: str
    kind: str
    started_at: float
    stopped_at: float | None = None
    detail: str = ""
    # For a cut: the run's count of connection attempts to the link's port
    # when it started and stopped (harness/parts/port_guard.py; None: not
    # counted here), so the attempts made against the closed port are known.
    attempts_at_start: int | None = None
    attempts_at_stop: int | None = None


class Link:
    """Faults on one proxy, each a start/stop pair returning a FaultRecord.

    Invariants: at most one active fault of each kind; `stop()` and `heal()`
    only end faults this object started, plus (heal) any toxic found on the
    proxy, so after `heal()` the proxy is enabled and toxic-free.
    """

    def __init__(self, server: ToxiproxyServer, info: ProxyInfo) -> None:
        self._server = server
        self.name = info.name
        self.listen = info.listen
        self.upstream = info.upstream
        self._active: dict[str, tuple[FaultRecord, list[str]]] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> ToxiproxyClient:
        return self._server.client

    @property
    def listen_host(self) -> str:
        return _split_hostport(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return _split_hostport(self.listen)[1]

    def __repr__(self) -> str:
        return f"Link({self.name}: {self.listen} -> {self.upstream})"

    def info(self) -> ProxyInfo:
        return self.client.get_proxy(self.name)

    def _attempts(self) -> int | None:
        """The run's count of connection attempts to this link's port so far."""
        counts = connection_attempts([self.listen_port])
        return None if isinstance(counts, str) else counts[self.listen_port]

    def active(self) -> list[FaultRecord]:
        with self._lock:
            return [replace(rec) for rec, _ in self._active.values()]

    def _start(
        self, kind: str, what: str, toxics: list[Toxic], disable: bool = False
    ) -> FaultRecord:
        with self._lock:
            if kind in self._active:
                raise FaultActive(
                    f"fault {kind!r} already active on link {self.name} since "
                    f"{self._active[kind][0].started_at:.3f}; stop it first"
                )
            added: list[str] = []
            try:
                for toxic in toxics:
                    self.client.add_toxic(self.name, toxic)
                    added.append(toxic.name)
                if disable:
                    self.client.set_enabled(self.name, False)
            except ToxiproxyError:
                # Leave nothing half-applied behind a failed start.
                for name in added:
                    with contextlib.suppress(ToxiproxyError):
                        self.client.remove_toxic(self.name, name)
                raise
            record = FaultRecord(
                link=self.name,
                kind=kind,
                started_at=time.time(),
                detail=f"{what} link {self.name} ({self.listen} -> {self.upstream})",
                attempts_at_start=self._attempts() if disable else None,
            )
            self._active[kind] = (record, added)
            self._server._journal_add(record)
            return replace(record)

    def stop(self, fault: FaultRecord | str) -> FaultRecord:
        """End one active fault (by record or kind); returns its final record."""
        kind = fault if isinstance(fault, str) else fault.kind
        with self._lock:
            if kind not in self._active:
                raise KeyError(f"no active fault {kind!r} on link {self.name}")
            record, toxic_names = self._active[kind]
            if kind == "cut":
                # Counted before the port opens again: attempts after it succeed.
                record.attempts_at_stop = self._attempts()
                self.client.set_enabled(self.name, True)
            for name in toxic_names:
                self.client.remove_toxic(self.name, name)
            del self._active[kind]
            record.stopped_at = time.time()
            return replace(record)

    # -- faults ------------------------------------------------------------

    def cut(self) -> FaultRecord:
        """Link down (enabled=false): open connections close, new ones are refused."""
        return self._start("cut", "cut", [], disable=True)

    def blackhole(self, direction: str = "both") -> FaultRecord:
        """Silently drop data ('timeout' toxic, timeout=0); connections stay open.

        `direction` is 'both', 'upstream' (client to server) or 'downstream'.
        """
        streams = {
            "both": ("upstream", "downstream"),
            "upstream": ("upstream",),
            "downstream": ("downstream",),
        }.get(direction)
        if streams is None:
            raise ValueError(f"direction must be both/upstream/downstream, not {direction!r}")
        toxics = [
            Toxic(f"{_TOXIC_PREFIX}blackhole_{s}", "timeout", s, 1.0, {"timeout": 0})
            for s in streams
        ]
        return self._start("blackhole", f"blackhole ({direction})", toxics)

    def drop_responses(self, close_after_ms: int = 0) -> FaultRecord:
        """Requests reach the server, answers never come back (downstream timeout toxic).

        Used to make a COMMIT's outcome unknown to the client while the
        server may well have committed it. With ``close_after_ms`` > 0
        toxiproxy closes the connections that long after the fault starts,
        so the client sees an error instead of waiting forever.
        """
        toxic = Toxic(
            f"{_TOXIC_PREFIX}drop_responses",
            "timeout",
            "downstream",
            1.0,
            {"timeout": close_after_ms},
        )
        what = "drop responses on" + (
            f" (close after {close_after_ms}ms)" if close_after_ms else ""
        )
        return self._start("drop_responses", what, [toxic])

    def reset(self, timeout_ms: int = 0, direction: str = "upstream") -> FaultRecord:
        """TCP RST connections (reset_peer toxic) once data flows in `direction`,
        after `timeout_ms`: 'upstream' resets on the client's request (it never
        reaches the server), 'downstream' on the server's answer (the server
        got the request and acted; the client sees only the reset)."""
        if direction not in ("upstream", "downstream"):
            raise ValueError(f"direction must be upstream/downstream, not {direction!r}")
        toxic = Toxic(
            f"{_TOXIC_PREFIX}reset_peer_{direction}",
            "reset_peer",
            direction,
            1.0,
            {"timeout": timeout_ms},
        )
        return self._start("reset", f"reset peers (after {timeout_ms}ms, {direction}) on", [toxic])

    def latency(self, ms: int, jitter: int = 0, direction: str = "downstream") -> FaultRecord:
        """Add `ms` (+/- `jitter`) of delay to data in `direction`."""
        toxic = Toxic(
            f"{_TOXIC_PREFIX}latency_{direction}", "latency", direction, 1.0,
            {"latency": ms, "jitter": jitter},
        )  # fmt: skip
        return self._start("latency", f"latency {ms}ms +/-{jitter}ms ({direction}) on", [toxic])

    def heal(self) -> list[FaultRecord]:
        """End every fault: enable the proxy and remove every toxic on it."""
        with self._lock:
            kinds = list(self._active)
        healed = [self.stop(kind) for kind in kinds]
        # Toxics someone else added (or a half-failed stop) are faults too.
        for toxic in self.client.list_toxics(self.name):
            self.client.remove_toxic(self.name, toxic.name)
        if not self.client.get_proxy(self.name).enabled:
            self.client.set_enabled(self.name, True)
        return healed


def _describe_version(reported: str, binary: Path) -> str:
    """The server's version; a `go install` build reports "git", so the module
    version is read from the binary's build info instead."""
    if reported not in ("", "git"):
        return reported
    try:
        out = subprocess.run(
            ["go", "version", "-m", str(binary)], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return reported
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "mod" and "toxiproxy" in parts[1]:
            return f"{parts[2]} ({parts[1]})"
    return reported


class ToxiproxyServer:
    """A real toxiproxy-server on a free loopback port, stopped on exit.

    Invariant: after `__exit__` (or `stop()`) no server process is left,
    also when start-up failed half-way or the body raised.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        binary: str | Path | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 10.0,
        registry: ProcessRegistry | None = None,
    ) -> None:
        self.binary = find_toxiproxy_server(binary)
        self.log_dir = Path(log_dir)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self._registry = registry
        self.process: ManagedProcess | None = None
        self.port: int | None = None
        self.version: str | None = None
        self._client: ToxiproxyClient | None = None
        self._links: dict[str, Link] = {}
        self._journal: list[FaultRecord] = []
        self._journal_lock = threading.Lock()

    @property
    def client(self) -> ToxiproxyClient:
        if self._client is None:
            raise RuntimeError("toxiproxy server not started")
        return self._client

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        """Start and wait for /version; retries a port lost to a race, up to 3 times."""
        last_error = ""
        for _attempt in range(3):
            port = free_port(self.host)
            proc = ManagedProcess(
                "toxiproxy",
                [str(self.binary), "-host", self.host, "-port", str(port)],
                log_dir=self.log_dir,
                registry=self._registry,
            ).start()
            client = ToxiproxyClient(self.host, port, timeout_s=2.0)
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline and proc.is_alive():
                try:
                    self.version = _describe_version(client.version(), self.binary)
                except ToxiproxyError as exc:
                    last_error = str(exc)
                    time.sleep(0.02)
                    continue
                self.process, self.port = proc, port
                self._client = ToxiproxyClient(self.host, port)
                return self
            exited = not proc.is_alive()
            lived = time.monotonic() - (deadline - self.startup_timeout_s)
            proc.stop(grace_s=1.0)
            if exited and "address already in use" in proc.log_tail():
                continue
            if exited:
                raise PartFailed(
                    f"toxiproxy-server {self.binary} exited {lived:.2f}s after it started, "
                    "before answering GET /version",
                    status=f"exit status {proc.returncode}",
                    stderr=proc.log_tail(),
                    log=proc.stderr_log,
                    hint=f"is {self.binary} toxiproxy-server {PINNED_VERSION}? {INSTALL_HINT}",
                )
            raise PartFailed(
                f"toxiproxy-server {self.binary} did not answer GET /version within "
                f"{self.startup_timeout_s}s (last: {last_error or 'no answer'})",
                status="still running, then stopped",
                stderr=proc.log_tail(),
                log=proc.stderr_log,
            )
        raise PartFailed(
            f"toxiproxy-server {self.binary} could not bind a free port in 3 attempts",
            status="exit: address already in use",
            stderr=last_error,
            log=None,
        )

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the server (SIGTERM, ``grace_s``, then SIGKILL); idempotent."""
        if self.process is not None:
            self.process.stop(grace_s=grace_s)

    def __enter__(self) -> Self:
        if self.process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def link(self, name: str, upstream: str, *, listen: str | None = None) -> Link:
        """Create a proxy `name` to `upstream` and return its Link."""
        info = self.client.create_proxy(name, upstream, listen=listen or f"{self.host}:0")
        link = Link(self, info)
        guard_port(link.listen_port)  # the run's users only (harness/parts/port_guard.py)
        self._links[name] = link
        return link

    def links(self) -> dict[str, Link]:
        return dict(self._links)

    def remove_link(self, name: str) -> None:
        """Delete the proxy and forget its Link (its journal entries stay)."""
        self._links.pop(name, None)
        self.client.delete_proxy(name)

    def heal_all(self) -> list[FaultRecord]:
        """Heal every link this server made; the final step of every run.

        A proxy deleted behind our back (404) is forgotten, not an error;
        any other API failure raises.
        """
        healed: list[FaultRecord] = []
        for name, link in list(self._links.items()):
            try:
                healed.extend(link.heal())
            except ToxiproxyError as exc:
                if exc.status != 404:
                    raise
                self._links.pop(name, None)
        return healed

    def _journal_add(self, record: FaultRecord) -> None:
        with self._journal_lock:
            self._journal.append(record)

    def journal(self) -> list[FaultRecord]:
        """Copies of every FaultRecord started on this server, in start order."""
        with self._journal_lock:
            return [replace(r) for r in self._journal]
