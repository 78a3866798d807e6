"""The process helper starts, reports and cleans up; nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.waiting import wait_for
from mock_tool.client import ToolClient
from mock_tool.errors import ToolUnavailable
from mock_tool.process import MockToolProcess, MockToolStartError


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_context_manager_leaves_no_process(tmp_path: Path) -> None:
    with MockToolProcess(tmp_path / "s") as proc:
        pid = proc.pid
        assert pid is not None and alive(pid)
        url = proc.base_url
    assert not alive(pid)
    assert proc.returncode == 0
    with pytest.raises(ToolUnavailable):
        # Refused connect: the request was never sent, so it is a definite no.
        ToolClient(url).health()


def test_start_failure_says_why(tmp_path: Path) -> None:
    proc = MockToolProcess(tmp_path / "s", tools={"x": "telepathy"})
    with pytest.raises(MockToolStartError) as info:
        proc.start()
    message = str(info.value)
    assert "exited with code 2" in message and "capability must be one of" in message
    assert not proc.running


def test_server_exits_when_its_parent_dies(tmp_path: Path) -> None:
    # A parent that starts the tool and then dies without any cleanup.
    script = textwrap.dedent(
        f"""
        import sys, time
        from mock_tool.process import MockToolProcess
        proc = MockToolProcess({str(tmp_path / "s")!r}).start()
        print(proc.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: not alive(server_pid), what="the orphaned server to exit", timeout_s=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()
