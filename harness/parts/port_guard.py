"""The run's loopback ports reachable by the run alone (an owner-matched firewall rule).

Every part of a run listens on 127.0.0.1: toxiproxy's API (no authentication:
whoever reaches it cuts or heals any link), its proxies, the mock tool's
ports (whose ``/admin`` endpoints set faults and read the evidence), the
PostgreSQL servers. On a shared host every local user reaches them, and
could change a fault or the evidence of someone else's run. PostgreSQL asks
for the run's secret (harness/parts/pg_auth.py); the rest cannot, so when
the harness runs as root it adds an nftables table of its own whose output
chain rejects a connection to any of the run's ports from a socket whose
owner is neither the run's user nor the servers' (``meta skuid``), and
removes the table when the run ends (a killed run's record names it, and
the next run or ``fencecheck clean`` removes it). Where that is not
possible (not root, no ``nft``), :func:`start` says so, and the run writes it
into its deployment facts: a gate then knows its evidence was exposed.

Ports are added as the parts open them (:func:`guard_port`): a port a part
opens in the instant before is reachable for that instant.

The same table counts the connection attempts (TCP SYNs) to each guarded
port, in a set of per-port counters: a worker that reconnects to a link the
harness cut without a pause between its attempts shows there
(``worker.connections_are_paced``), which no server sees, since the
attempts never reach one. :func:`count_from_now` starts a port's count
(ports are reused after a link is deleted), :func:`connection_attempts`
reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable

TABLE_PREFIX = "fencecheck_"
SYN_SET = "connection_attempts"
NFT_TIMEOUT_S = 10.0


class PortGuardError(RuntimeError):
    """nft refused a change; the message has its stderr."""


def _nft(script: str | None = None, *args: str) -> str:
    """Run nft with ``script`` on its stdin, or with ``args``; its stdout."""
    nft = shutil.which("nft") or "/usr/sbin/nft"
    done = subprocess.run(
        [nft, *(["-f", "-"] if script is not None else list(args))],
        input=script,
        capture_output=True,
        text=True,
        timeout=NFT_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise PortGuardError(f"nft {' '.join(args) or '-f -'}: {done.stderr.strip()[:300]}")
    return done.stdout


class PortGuard:
    """One run's nftables table: its ports, open to ``uids`` only."""

    def __init__(self, table: str, uids: Iterable[int]) -> None:
        self.table = table
        self.uids = sorted(set(uids))
        self._lock = threading.Lock()
        self.ports: set[int] = set()

    def create(self) -> None:
        owners = ", ".join(str(u) for u in self.uids)
        _nft(
            f"table inet {self.table} {{\n"
            "  set ports { type inet_service; }\n"
            f"  set {SYN_SET} {{ type inet_service; size 65535; flags dynamic; counter; }}\n"
            "  chain output {\n"
            "    type filter hook output priority 0; policy accept;\n"
            # Every connection attempt to a guarded port, whoever makes it.
            "    ip daddr 127.0.0.0/8 tcp dport @ports tcp flags & (syn | ack) == syn "
            f"update @{SYN_SET} {{ tcp dport }}\n"
            f"    ip daddr 127.0.0.0/8 tcp dport @ports meta skuid != {{ {owners} }} "
            "counter reject with tcp reset\n"
            "  }\n"
            "}\n"
        )

    def add(self, port: int) -> None:
        with self._lock:
            if port in self.ports:
                return
            _nft(None, "add", "element", "inet", self.table, "ports", f"{{ {port} }}")
            self.ports.add(port)

    def count_from_now(self, port: int) -> None:
        """Forget ``port``'s count so far (a deleted link's port may come back)."""
        try:
            _nft(None, "delete", "element", "inet", self.table, SYN_SET, f"{{ {port} }}")
        except PortGuardError as exc:
            if "No such file or directory" not in str(exc):
                raise

    def connection_attempts(self, ports: Iterable[int]) -> dict[int, int]:
        """The connection attempts to each of ``ports`` since its count began."""
        listed = json.loads(_nft(None, "-j", "list", "set", "inet", self.table, SYN_SET))
        seen: dict[int, int] = {}
        for item in listed.get("nftables", []):
            for elem in (item.get("set") or {}).get("elem", []):
                body = elem.get("elem", {}) if isinstance(elem, dict) else {}
                if isinstance(body.get("val"), int):
                    seen[body["val"]] = int((body.get("counter") or {}).get("packets", 0))
        return {port: seen.get(port, 0) for port in ports}

    def close(self) -> None:
        delete_table(self.table)


def delete_table(table: str) -> str | None:
    """Remove ``table`` (a no-op when it is gone); a problem text when nft refused."""
    try:
        _nft(None, "delete", "table", "inet", table)
    except PortGuardError as exc:
        if "No such file or directory" in str(exc):
            return None
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nft delete table {table}: {exc}"
    return None


_CURRENT: PortGuard | None = None


def start(token: str, uids: Iterable[int]) -> tuple[PortGuard | None, str]:
    """The run's guard (installed for :func:`guard_port`) and what the run's
    parts expose, for the deployment facts; no guard where none can be had."""
    global _CURRENT
    if os.geteuid() != 0:
        return None, (
            "toxiproxy's API, its proxies and the mock tool's endpoints are reachable by every "
            "local user: not root, so no owner-matched firewall rule (PostgreSQL asks for the "
            "run's secret)"
        )
    if shutil.which("nft") is None and not os.path.exists("/usr/sbin/nft"):
        return None, (
            "toxiproxy's API, its proxies and the mock tool's endpoints are reachable by every "
            "local user: nft is missing (apt-get install nftables; make setup does) "
            "(PostgreSQL asks for the run's secret)"
        )
    guard = PortGuard(TABLE_PREFIX + token, uids)
    try:
        guard.create()
    except (PortGuardError, OSError, subprocess.SubprocessError) as exc:
        return None, (
            "toxiproxy's API, its proxies and the mock tool's endpoints are reachable by every "
            f"local user: nftables refused the run's table ({exc})"
        )
    _CURRENT = guard
    return guard, (
        f"the run's ports answer only its own users (uids {', '.join(map(str, guard.uids))}; "
        f"nftables table inet {guard.table}); PostgreSQL asks for the run's secret"
    )


def stop(guard: PortGuard | None) -> str | None:
    """Remove ``guard``'s table; a problem text when it could not."""
    global _CURRENT
    if guard is None:
        return None
    if _CURRENT is guard:
        _CURRENT = None
    return delete_table(guard.table)


def guard_port(port: int) -> None:
    """Open ``port`` to the run's users only (a no-op without a guard)."""
    guard = _CURRENT
    if guard is not None:
        guard.add(port)


def count_from_now(port: int) -> bool:
    """Start counting the connection attempts to ``port`` from zero; False
    when they cannot be counted here (no guard)."""
    guard = _CURRENT
    if guard is None:
        return False
    try:
        guard.count_from_now(port)
    except (PortGuardError, OSError, subprocess.SubprocessError):
        return False
    return True


def connection_attempts(ports: Iterable[int]) -> dict[int, int] | str:
    """The connection attempts to each of ``ports`` since :func:`count_from_now`,
    or why they are not known."""
    guard = _CURRENT
    if guard is None:
        return "no firewall table of the run counts them (not root, or no nft)"
    try:
        return guard.connection_attempts(ports)
    except (PortGuardError, OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"reading the counts failed: {exc}"[:300]
