"""A run that fails midway leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.parts.control import ControlServer, Hold
from harness.parts.processes import ProcessRegistry, WorkerProcess
from harness.parts.toxiproxy import ToxiproxyServer
from tests.harness.helpers import PYTHON, SCRIPTS, descendants, pid_alive


def test_exception_inside_the_contexts_leaves_the_process_set_unchanged(tmp_path: Path) -> None:
    before = descendants()
    started: list[int] = []
    with (
        pytest.raises(RuntimeError, match="midway"),
        ProcessRegistry() as registry,
        ToxiproxyServer(tmp_path / "toxiproxy", registry=registry) as proxy,
        ControlServer(tmp_path) as control,
    ):
        assert proxy.process is not None
        started.append(proxy.process.pid)
        proxy.link("worker_pg", "127.0.0.1:9").cut()
        control.arm("A", "before_commit", Hold())
        held = WorkerProcess(
            "A", [PYTHON, str(SCRIPTS / "point_worker.py")], "before_commit",
            log_dir=tmp_path / "logs", control_socket=control.socket_path, registry=registry,
        ).start()  # fmt: skip
        paused = WorkerProcess(
            "B", [PYTHON, str(SCRIPTS / "ops_worker.py")], "ops",
            log_dir=tmp_path / "logs", registry=registry,
        ).start()  # fmt: skip
        started += [held.pid, paused.pid]
        control.wait_reached("A", "before_commit", timeout_s=10)
        paused.pause()
        assert len(descendants() - before) == 3
        raise RuntimeError("midway")
    assert descendants() == before
    assert [pid for pid in started if pid_alive(pid)] == []
