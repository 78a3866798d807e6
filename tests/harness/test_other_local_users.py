"""Another local user cannot change a run's verdict (issue: a shared CI host).

A probe runs as ``nobody`` (setpriv, the system's own python3, stdlib only)
against a live run's parts: the primary, toxiproxy's API, a proxy, the mock
tool. It must fail to log in to PostgreSQL and fail to reach anything that
sets a fault or reads the evidence; the same probe as the run's own user
reaches all of them (so the probe itself works).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.engine.environment import (
    DEFAULT_WORKER_CMD,
    Settings,
    SharedServices,
    experiment_environment,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to probe as another user (CI runs as root)",
)

# Connect, say something, report what came back: "reset"/"refused" when the
# connection was refused or reset, else the first bytes of the answer.
PROBE = r"""
import json, socket, sys, struct
def ask(port, payload):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(payload)
        return s.recv(64).hex()
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:
        return "reset"
    except OSError as exc:
        return f"error {exc}"
def startup(user, db):
    body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
    return struct.pack("!I", len(body) + 4) + body
def http(method, path, body=b""):
    head = (f"{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body
targets = json.loads(sys.argv[1])
out = {}
out["postgres"] = ask(targets["postgres"], startup("postgres", "postgres"))
out["toxiproxy_api"] = ask(targets["toxiproxy_api"], http("POST", "/reset"))
out["proxy_to_tool"] = ask(targets["proxy_to_tool"], http("GET", "/admin/export"))
out["tool"] = ask(targets["tool"], http("POST", "/admin/faults", b'{"tool":"*","mode":"reject_429"}'))
print(json.dumps(out))
"""


def _probe(targets: dict[str, int], *, as_nobody: bool) -> dict[str, str]:
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    done = subprocess.run(
        [*prefix, "/usr/bin/python3", "-c", PROBE, json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd="/",
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_nobody_reaches_no_part_of_a_run_that_its_own_user_reaches(tmp_path: Path) -> None:
    with SharedServices(Settings(worker_cmd=DEFAULT_WORKER_CMD)) as shared:
        assert shared.port_guard is not None, shared.access
        assert "answer only its own users" in shared.access
        assert shared.primary is not None and shared.toxiproxy is not None
        with experiment_environment(
            shared,
            "probe",
            lease_ttl_ms=800,
            heartbeat_ms=150,
            heartbeat_timeout_ms=300,
            dispatch_ttl_ms=600,
            log_dir=tmp_path / "logs",
            rng=random.Random(1),
        ) as env:
            targets = {
                "postgres": shared.primary.port,
                "toxiproxy_api": int(shared.toxiproxy.port or 0),
                "proxy_to_tool": env.links["worker_tool"].listen_port,
                "tool": env.tool.port,
            }
            theirs = _probe(targets, as_nobody=True)
            faults = env.tool.client().faults()  # before our own probe sets one
            ours = _probe(targets, as_nobody=False)
            ours_set = env.tool.client().faults()
    # Our own user reaches every part: PostgreSQL asks for a password
    # (AuthenticationSASL, 'R'), the HTTP servers answer.
    assert ours["postgres"].startswith("52"), ours  # 'R': an authentication request
    assert all(
        ours[k].startswith("485454502f") for k in ("toxiproxy_api", "proxy_to_tool", "tool")
    ), ours
    # nobody is refused at the door, everywhere.
    assert all(v in ("reset", "refused") for v in theirs.values()), theirs
    assert faults["faults"] == [], faults  # nobody's fault was never set
    assert len(ours_set["faults"]) == 1, ours_set  # the same request from us sets it


def test_a_killed_runs_firewall_table_is_reaped(tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves its table; its record names it, and reaping
    (the next run, `fencecheck clean`) removes it."""
    from harness.engine.run_records import RunRecord, reap_record
    from harness.parts import port_guard

    record = RunRecord.create(base=tmp_path, kind="test")
    guard, _access = port_guard.start("reaptest", [0])
    assert guard is not None
    record.add_firewall_table(guard.table)
    # The owner "dies" here: nothing removes the table but the reaping.
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert guard.table in listed
    data = json.loads(record.path.read_text())
    reaped = reap_record(record.path, data)
    assert reaped.firewall_tables_removed == [guard.table], reaped
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert guard.table not in listed
    port_guard._CURRENT = None
