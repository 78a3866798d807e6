"""``fencecheck smoke``: bring up every real part once, prove each works, tear down.

Each step prints what it did, what it observed and how long it took. The run
ends by proving it left nothing behind: no child process and no temp dir.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg

from harness.engine.environment import Settings
from harness.engine.run_records import RunRecord
from harness.parts.control import ControlServer, Hold
from harness.parts.pg_binaries import find_pg_binaries
from harness.parts.postgres import PostgresCluster, failover
from harness.parts.processes import ProcessRegistry, WorkerProcess
from harness.parts.toxiproxy import ToxiproxyServer, find_toxiproxy_server
from harness.waiting import wait_for
from mock_tool.errors import ToolError
from mock_tool.process import MockToolProcess


class SmokeFailure(AssertionError):
    """A part of the environment did not behave as it must."""


class Steps:
    def __init__(self) -> None:
        self.timings: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[Callable[[str], None]]:
        started = time.monotonic()
        print(f"- {title}", flush=True)
        yield lambda note: print(f"    {note}", flush=True)
        took = time.monotonic() - started
        self.timings.append((title, took))
        print(f"    ok ({took:.2f}s)", flush=True)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeFailure(message)


def _query_fails_through(dsn: str, timeout_s: float) -> str:
    started = time.monotonic()
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, int(timeout_s)), autocommit=True) as c:
            c.execute("SET statement_timeout = '1s'")
            c.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.2f}s"
    raise SmokeFailure("a query through a cut link succeeded")


def smoke(settings: Settings) -> int:
    steps = Steps()
    started = time.monotonic()
    # A record first, so a smoke run killed with SIGKILL is reaped by the next run.
    record = RunRecord.create(base=settings.work_dir, kind="smoke")
    root = record.temp_root
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        with contextlib.ExitStack() as stack, ProcessRegistry() as registry:
            stack.callback(registry.reap_all)
            _run_steps(steps, stack, registry, root, settings)
    except SmokeFailure as exc:
        print(f"SMOKE FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
        record.release()
    with steps.step("no leftovers") as note:
        left = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
        _expect(not left, f"processes left behind: {[p.cmdline() for p in left]}")
        _expect(not root.exists(), f"temp dir left behind: {root}")
        note("no child process and no temp directory left")
    print(f"\nsmoke run passed in {time.monotonic() - started:.2f}s")
    for title, took in steps.timings:
        print(f"  {took:6.2f}s  {title}")
    return 0


def _run_steps(
    steps: Steps,
    stack: contextlib.ExitStack,
    registry: ProcessRegistry,
    root: Path,
    settings: Settings,
) -> None:
    with steps.step("find binaries") as note:
        binaries = find_pg_binaries(settings.pg_bin)
        note(binaries.describe())
        note(f"toxiproxy-server: {find_toxiproxy_server(settings.toxiproxy_bin)}")
    with steps.step("start toxiproxy") as note:
        toxi = stack.enter_context(
            ToxiproxyServer(root / "logs", binary=settings.toxiproxy_bin, registry=registry)
        )
        note(f"toxiproxy {toxi.version} at {toxi.url}")
    with steps.step("start primary") as note:
        primary = PostgresCluster.init_primary(binaries, root / "pg", name="primary")
        stack.callback(primary.remove)
        facts = primary.server_facts()
        note(
            f"{facts['version'][:40]} on port {primary.port}, running as uid "
            f"{psutil.Process(primary.process.pid).uids().effective if primary.process else '?'}"
        )

    def init(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE smoke (id int PRIMARY KEY, v int NOT NULL)")
            conn.execute("INSERT INTO smoke VALUES (1, 0)")
            conn.execute("CREATE ROLE smoke_worker LOGIN")
            conn.execute("GRANT SELECT, UPDATE ON smoke TO smoke_worker")

    with steps.step("database per experiment from a template") as note:
        template = primary.create_template("smoke_template", init)
        db = primary.create_database(template=template)
        note(f"database {db.name} copied from {template}")

    with steps.step("worker->postgres link: cut makes a query fail, heal restores") as note:
        link = toxi.link("worker_pg", f"127.0.0.1:{primary.port}")
        dsn = f"host=127.0.0.1 port={link.listen_port} dbname={db.name} user=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT 1")
        rec = link.cut()
        note(f"{rec.detail}: {_query_fails_through(dsn, 2)}")
        link.heal()
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        note("healed: query succeeds again")

    with steps.step("streaming replica (async) through a proxy") as note:
        repl = toxi.link("replication", f"127.0.0.1:{primary.port}")
        standby = primary.create_standby(
            root / "pg", upstream_host="127.0.0.1", upstream_port=repl.listen_port
        )
        stack.callback(standby.remove)
        row = primary.wait_streaming("replica")
        note(f"replica streaming, sync_state={row['sync_state']}")
        repl.cut()
        wait_for(
            lambda: not primary.replication_status(),
            what="primary to notice the cut replication link",
            timeout_s=15,
        )
        db.query("UPDATE smoke SET v = 100 WHERE id = 1")
        lag = standby.query("SELECT v FROM smoke WHERE id = 1", dbname=db.name)[0]["v"]
        _expect(lag != 100, "the standby saw a commit made while its link was cut")
        note(f"link cut: commit acknowledged on primary, standby still reads v={lag}")
        repl.heal()
        wait_for(
            lambda: (
                standby.query("SELECT v FROM smoke WHERE id = 1", dbname=db.name)[0]["v"] == 100
            ),
            what="standby to catch up after heal",
            timeout_s=15,
        )
        note("healed: standby caught up")

    with steps.step("sync replication: commit blocks while the standby is cut off") as note:
        primary.set_sync_standby("replica")
        db.query("UPDATE smoke SET v = 200 WHERE id = 1")
        repl.cut()
        done = threading.Event()

        def commit() -> None:
            with contextlib.suppress(Exception):
                db.query("UPDATE smoke SET v = 300 WHERE id = 1")
            done.set()

        threading.Thread(target=commit, daemon=True).start()
        _expect(not done.wait(1.0), "a sync commit returned while the standby was cut off")
        note("commit still waiting after 1.0s")
        repl.heal()
        _expect(done.wait(15), "the sync commit did not finish after heal")
        note("healed: commit returned")

    with steps.step("failover: fence the primary, promote the standby") as note:
        moved = failover(primary, standby)
        note(f"fenced in {moved.fence_seconds:.3f}s, promoted in {moved.promote_seconds:.3f}s")
        v = standby.query("SELECT v FROM smoke WHERE id = 1", dbname=db.name)[0]["v"]
        _expect(v == 300, f"promoted standby reads v={v}, expected the sync commit 300")
        note("promoted standby has the synchronously committed row")

    with steps.step("mock tool: its own process and storage, reached through a proxy") as note:
        tool = stack.enter_context(MockToolProcess(root / "tool", log_path=root / "tool.log"))
        tlink = toxi.link("worker_tool", f"127.0.0.1:{tool.port}")
        from mock_tool.client import ToolClient

        client = ToolClient(f"http://127.0.0.1:{tlink.listen_port}", timeout_s=2)
        created = client.create("plain", "op-smoke-1", "run-smoke", 1, {"hello": "world"})
        exported = tool.client().export()
        _expect(len(exported["resources"]) == 1, f"tool resources: {exported['resources']}")
        note(f"created {created.resource_id}; tool log holds {len(exported['requests'])} request")
        tlink.cut()
        try:
            client.create("plain", "op-smoke-2", "run-smoke", 1, {})
            raise SmokeFailure("a tool call through a cut link succeeded")
        except ToolError as exc:
            note(f"cut link: {type(exc).__name__}")
        tlink.heal()

    with steps.step("worker process: barrier, SIGSTOP holds a row lock, SIGKILL frees it") as note:
        primary2 = standby  # the promoted server is the primary now
        wlink = toxi.link("worker_pg2", f"127.0.0.1:{primary2.port}")
        control = stack.enter_context(ControlServer(root / "ctl"))
        control.arm("probe", "after_lease_row_locked", Hold())
        worker = WorkerProcess(
            "probe",
            [sys.executable, "-m", "harness.parts.probe_worker"],
            "smoke",
            ["1", "--linger"],
            log_dir=root / "logs",
            control_socket=control.socket_path,
            env={
                "FENCECHECK_DSN": f"host=127.0.0.1 port={wlink.listen_port} dbname={db.name} "
                "user=smoke_worker"
            },
            registry=registry,
        )
        worker.start()
        hit = control.wait_reached("probe", "after_lease_row_locked", timeout_s=15)
        note(f"barrier reached by pid {hit.peer_pid}")
        paused = worker.pause()
        note(f"SIGSTOP: kernel state {paused.state!r}")
        locked = _row_locked(primary2.admin_dsn(db.name))
        _expect(locked, "the stopped worker's row lock was not held")
        note("row lock still held by the stopped worker (NOWAIT lock attempt fails)")
        killed = worker.kill()
        note(f"SIGKILL: {killed.state}")
        wait_for(
            lambda: not _row_locked(primary2.admin_dsn(db.name)),
            what="the killed worker's row lock to be freed",
            timeout_s=10,
        )
        note("row lock freed after SIGKILL")


def _row_locked(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        try:
            conn.execute("SELECT 1 FROM smoke WHERE id = 1 FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
        conn.rollback()
    return False
