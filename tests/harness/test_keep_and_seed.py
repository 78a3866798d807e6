"""`--keep` keeps every part of the kept experiments up and says how to reach
each; `--seed` decides every random choice, so the same seed gives the same
schedule and another seed another one."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.harness import outside

pytestmark = pytest.mark.slow


def _field(output: str, label: str) -> str:
    match = re.search(rf"^\s+{re.escape(label)}:? (.+)$", output, re.M)
    assert match, f"no {label!r} line:\n{output}"
    return match.group(1)


def test_keep_keeps_every_part_up_and_says_how_to_reach_it(tmp_path: Path) -> None:
    run = outside.start(["run", "B", "--keep"], tmp_path)
    try:
        run.wait_line("control socket:", timeout_s=180)
        time.sleep(0.5)
        out = run.output
        dsn = re.search(r"database \(superuser\): psql '([^']+)'", out)
        assert dsn, out
        with psycopg.connect(dsn.group(1), connect_timeout=5) as conn:
            runs = conn.execute("SELECT count(*) FROM agent_runs").fetchone()
        assert runs and runs[0] >= 1, "the kept database is not the experiment's"
        tool = _field(out, "mock tool").split()[0]
        with urllib.request.urlopen(f"{tool}/health", timeout=5) as answer:
            assert json.loads(answer.read())["ok"] is True
        worker_pg = re.search(r"proxy \S+ \(worker_pg\): 127\.0\.0\.1:(\d+) ->", out)
        assert worker_pg, out
        socket.create_connection(("127.0.0.1", int(worker_pg.group(1))), timeout=5).close()
        control = Path(_field(out, "control socket"))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(control))
        sent = run.signal(signal.SIGINT, group=True)  # Ctrl-C ends --keep
        code, ended, seen = run.finish()
        assert code == 0, run.output  # the run's verdict: B passed
        assert ended - sent < 5.0
        assert "ending --keep" in run.output and "--keep ended" in run.output
        assert outside.leftovers(seen, run.tmpdir) == []
    finally:
        run.close()


def _run_seeded(tmp_path: Path, ids: str, seed: int, name: str) -> dict[str, dict[str, Any]]:
    reports = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", *ids.split(), "--seed", str(seed),
         "--report-dir", str(reports), "--quiet"],
        cwd=outside.REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir() and not p.is_symlink()]
    return {
        p.stem: yaml.safe_load(p.read_text()) for p in sorted((run_dir / "archives").glob("*.yaml"))
    }


def _schedule(archive: dict[str, Any]) -> tuple[Any, ...]:
    """What the seed decides: tenant, task ids, the tools and workers Q picks."""
    commands = " ".join(c["command"] for c in archive["commands_executed"])
    return (
        archive["tenant_id"],
        re.findall(r"task-[a-q]-[0-9a-f]{8}", commands),
        re.findall(r'"tool": "(\w+)"', commands),
        sorted(re.findall(r"arm after_lease_acquired for (w\d)", commands)),
    )


def test_the_same_seed_gives_the_same_schedule(tmp_path: Path) -> None:
    first = _run_seeded(tmp_path, "A Q", 7, "first")
    again = _run_seeded(tmp_path, "A Q", 7, "again")
    other = _run_seeded(tmp_path, "A", 8, "other")
    assert set(first) == {"A", "Q"}
    for name in first:
        assert first[name]["seed"] == again[name]["seed"] == 7
        assert _schedule(first[name]) == _schedule(again[name]), name
    assert _schedule(first["A"]) != _schedule(other["A"])
    assert len(_schedule(first["Q"])[1]) == 24 and len(_schedule(first["Q"])[3]) == 2
