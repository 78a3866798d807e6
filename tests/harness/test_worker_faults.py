"""Real signals to a real worker holding a real row lock, and barrier crash points."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.checking.history import load_history
from harness.parts.control import ControlServer, Crash, Hold
from harness.parts.postgres import Database
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for


@pytest.fixture
def lock_db(fresh_db: Database) -> Database:
    fresh_db.query("CREATE TABLE locks (id int PRIMARY KEY, v int NOT NULL)")
    fresh_db.query("INSERT INTO locks VALUES (1, 0)")
    return fresh_db


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlServer]:
    with ControlServer(tmp_path) as server:
        yield server


def _probe(db: Database, control: ControlServer, tmp_path: Path) -> WorkerProcess:
    return WorkerProcess(
        "probe",
        [sys.executable, "-m", "harness.parts.probe_worker"],
        "locks",
        ["1", "--linger"],
        log_dir=tmp_path / "logs",
        control_socket=control.socket_path,
        env={"FENCECHECK_DSN": db.dsn("postgres")},
    )


def _locked(db: Database) -> bool:
    with psycopg.connect(db.admin_dsn) as conn:
        try:
            conn.execute("SELECT 1 FROM locks WHERE id = 1 FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_stopped_worker_keeps_its_row_lock_and_sigkill_frees_it(
    lock_db: Database, control: ControlServer, tmp_path: Path
) -> None:
    control.arm("probe", "after_lease_row_locked", Hold())
    with _probe(lock_db, control, tmp_path) as worker:
        control.wait_reached("probe", "after_lease_row_locked", timeout_s=15)
        record = worker.pause()
        assert record.state == "stopped"
        assert worker.kernel_state() == "stopped"
        control.release("probe", "after_lease_row_locked")
        # Released while stopped: the worker cannot act on the reply, the lock stays.
        assert _locked(lock_db)
        activity = lock_db.query(
            "SELECT state FROM pg_stat_activity WHERE application_name = 'probe'"
        )
        assert activity == [{"state": "idle in transaction"}]
        worker.kill()
        wait_for(lambda: not _locked(lock_db), what="row lock freed after SIGKILL", timeout_s=10)
    assert lock_db.query("SELECT v FROM locks") == [{"v": 0}], "a killed transaction committed"


def test_barrier_held_then_released_lets_the_worker_commit(
    lock_db: Database, control: ControlServer, tmp_path: Path
) -> None:
    control.arm("probe", "before_commit", Hold())
    with _probe(lock_db, control, tmp_path) as worker:
        control.wait_reached("probe", "before_commit", timeout_s=15)
        assert lock_db.query("SELECT v FROM locks") == [{"v": 0}], "committed past a held barrier"
        control.release("probe", "before_commit")
        wait_for(
            lambda: lock_db.query("SELECT v FROM locks") == [{"v": 1}],
            what="the released worker's commit",
            timeout_s=10,
        )
        events = load_history([worker.events_path])
        assert [e.op for e in events if e.type == "ok"] == ["lock_row", "commit"]


def test_crash_point_kills_the_worker_before_its_commit(
    lock_db: Database, control: ControlServer, tmp_path: Path
) -> None:
    control.arm("probe", "before_commit", Crash())
    with _probe(lock_db, control, tmp_path) as worker:
        worker.wait(timeout_s=15)
        assert worker.returncode == -9
    assert lock_db.query("SELECT v FROM locks") == [{"v": 0}]
    assert not _locked(lock_db)
