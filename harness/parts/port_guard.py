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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterable

TABLE_PREFIX = "fencecheck_"
NFT_TIMEOUT_S = 10.0


class PortGuardError(RuntimeError):
    """nft refused a change; the message has its stderr."""


def _nft(script: str | None = None, *args: str) -> None:
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
            "  chain output {\n"
            "    type filter hook output priority 0; policy accept;\n"
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
