"""One host process, many tools (mock_tool/host.py): each tool its own port,
storage, log and fault board, exactly as a process of its own; closing one
leaves the others serving; the host ends with its input or its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mock_tool.errors import ToolError
from mock_tool.process import MockToolHost, MockToolStartError


def _create(tool_client: object, op: str) -> str:
    res = tool_client.create("idem", op, "run-1", 1, {"n": 1})  # type: ignore[attr-defined]
    return str(res.resource_id)


def test_two_tools_share_nothing_but_the_process(tmp_path: Path) -> None:
    host = MockToolHost(tmp_path / "host.log").start()
    try:
        one = host.open("one", tmp_path / "s1", log_path=tmp_path / "one.log")
        two = host.open("two", tmp_path / "s2", log_path=tmp_path / "two.log")
        assert one.port != two.port and one.pid == two.pid == host.pid
        _create(one.client(), "op-a")
        one.client().set_fault("idem", "reject_429")
        # Two's log and faults are its own: op-a is unknown to it, its creates pass.
        _create(two.client(), "op-b")
        assert [r["operation_id"] for r in one.client().export()["requests"]] == ["op-a"]
        assert [r["operation_id"] for r in two.client().export()["requests"]] == ["op-b"]
        with pytest.raises(ToolError):
            _create(one.client(), "op-c")  # one's fault
        one.stop()
        with pytest.raises(ToolError):
            one.client(timeout_s=1.0).health()  # closed: its port no longer answers
        assert two.client().health()["ok"] is True
        assert "serving on port" in (tmp_path / "one.log").read_text()
        assert "GET /admin/export" in (tmp_path / "two.log").read_text()
        # The closed tool's storage is free again; an open one's is locked.
        again = host.open("again", tmp_path / "s1", log_path=tmp_path / "again.log")
        kept = [r["operation_id"] for r in again.client().export()["requests"]]
        assert kept == ["op-a", "op-c"]  # its log survived the close; two's is apart
        with pytest.raises(MockToolStartError, match="in use by another mock_tool"):
            host.open("clash", tmp_path / "s2", log_path=tmp_path / "clash.log")
    finally:
        host.stop()
    assert not host.running


def test_the_host_dies_with_its_parent(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mock_tool.process import MockToolHost\n"
        f"h = MockToolHost(Path({str(tmp_path / 'h.log')!r})).start()\n"
        "print(h.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"host {pid} outlived its parent")
