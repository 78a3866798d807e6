"""Control protocol end to end: a real worker process at real injection points."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import injection
from harness.parts.control import (
    ANY_WORKER,
    Continue,
    ControlError,
    ControlServer,
    ControlTimeout,
    Crash,
    Delay,
    Hold,
)
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for
from tests.harness.helpers import PYTHON, SCRIPTS

POINT_WORKER = [PYTHON, str(SCRIPTS / "point_worker.py")]


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlServer]:
    with ControlServer(tmp_path) as server:
        yield server


def start_worker(
    tmp_path: Path, control: ControlServer | None, *points: str, worker_id: str = "A"
) -> WorkerProcess:
    # point_worker takes its points as arguments; the "mode" slot carries the first one.
    return WorkerProcess(
        worker_id,
        POINT_WORKER,
        points[0],
        points[1:],
        log_dir=tmp_path / "logs",
        control_socket=control.socket_path if control else None,
    ).start()


def events(worker: WorkerProcess) -> list[tuple[str, str]]:
    lines = worker.events_path.read_text().splitlines()
    return [(e["type"], e["op"]) for e in map(json.loads, lines)]


def test_held_worker_is_blocked_until_released(tmp_path: Path, control: ControlServer) -> None:
    control.arm("A", "before_commit", Hold())
    worker = start_worker(tmp_path, control, "after_lease_acquired", "before_commit")
    with worker:
        hit = control.wait_reached("A", "before_commit", timeout_s=10)
        assert hit.action == "hold" and hit.worker == "A"
        assert hit.peer_pid == worker.pid == hit.pid  # the kernel agrees with the worker
        assert (hit.run_id, hit.epoch, hit.revision) == ("run-1", 2, 2)
        time.sleep(0.2)  # give a worker that wrongly went on the time to show it
        assert worker.kernel_state() == "sleeping"  # blocked reading the answer
        assert events(worker)[-1] == ("invoke", "before_commit")
        assert [h.point for h in control.held()] == ["before_commit"]
        released = control.release("A", "before_commit")
        assert released.released_with == "continue" and released.released_at is not None
        assert worker.wait(10) == 0
    assert events(worker)[-1] == ("ok", "before_commit")
    assert [h.action for h in control.hits()] == ["continue", "hold"]


def test_crash_kills_the_worker_at_the_point(tmp_path: Path, control: ControlServer) -> None:
    control.arm("A", "after_checkpoint_commit", Crash())
    worker = start_worker(tmp_path, control, "after_checkpoint_commit", "never_reached")
    with worker:
        assert worker.wait(10) == -signal.SIGKILL
    assert events(worker) == [("invoke", "after_checkpoint_commit")]
    assert control.hits()[0].action == "crash"


def test_release_with_crash(tmp_path: Path, control: ControlServer) -> None:
    control.arm("A", "after_tool_response_before_tx2_commit", Hold())
    with start_worker(tmp_path, control, "after_tool_response_before_tx2_commit") as worker:
        control.wait_reached("A", "after_tool_response_before_tx2_commit", timeout_s=10)
        control.release("A", "after_tool_response_before_tx2_commit", Crash())
        assert worker.wait(10) == -signal.SIGKILL
    assert control.hits()[0].released_with == "crash"


def test_delay_delays(tmp_path: Path, control: ControlServer) -> None:
    control.arm("A", "before_renew", Delay(300))
    with start_worker(tmp_path, control, "before_renew") as worker:
        assert worker.wait(10) == 0
    times = [json.loads(line)["time"] for line in worker.events_path.read_text().splitlines()]
    assert times[1] - times[0] >= 0.3
    assert control.hits()[0].action == "delay 300ms"


def test_unarmed_points_continue_and_are_journaled(tmp_path: Path, control: ControlServer) -> None:
    points = ["after_lease_acquired", "after_lease_row_locked", "before_commit"]
    with start_worker(tmp_path, control, *points) as worker:
        assert worker.wait(10) == 0
    assert [(h.point, h.action) for h in control.hits()] == [(p, "continue") for p in points]
    assert [h.seq for h in control.hits()] == [0, 1, 2]


def test_arms_are_consumed_in_order_and_any_worker_matches(
    tmp_path: Path, control: ControlServer
) -> None:
    control.arm(ANY_WORKER, "p", Delay(1), times=2)
    control.arm("B", "p", Continue())
    with start_worker(tmp_path, control, "p", "p", "p", worker_id="B") as worker:
        assert worker.wait(10) == 0
    # B's own arm first, then the two ANY_WORKER delays.
    assert [h.action for h in control.hits()] == ["continue", "delay 1ms", "delay 1ms"]
    assert [control.wait_reached("B", "p", 1).seq for _ in range(3)] == [0, 1, 2]


def test_wait_reached_timeout_names_point_and_what_was_reached(
    tmp_path: Path, control: ControlServer
) -> None:
    with start_worker(tmp_path, control, "after_lease_acquired") as worker:
        worker.wait(10)
    with pytest.raises(ControlTimeout) as err:
        control.wait_reached("A", "before_commit", timeout_s=0.2)
    message = str(err.value)
    assert "'before_commit'" in message and "'A'" in message and "0.2s" in message
    assert "after_lease_acquired x1" in message


def test_release_without_a_hold_is_an_error(control: ControlServer) -> None:
    with pytest.raises(ControlError, match="nothing held"):
        control.release("A", "before_commit")


def test_release_all_frees_held_workers(tmp_path: Path, control: ControlServer) -> None:
    control.arm("A", "before_commit", Hold())
    with start_worker(tmp_path, control, "before_commit") as worker:
        control.wait_reached("A", "before_commit", 10)
        assert [h.released_with for h in control.release_all()] == ["closed"]
        assert worker.wait(10) == 0  # closed without an answer: warn and go on
    assert "without an answer" in worker.stderr_log.read_text()


def test_hold_expires_after_its_timeout(tmp_path: Path) -> None:
    with ControlServer(tmp_path, hold_timeout_s=0.3) as control:
        control.arm("A", "before_commit", Hold())
        with start_worker(tmp_path, control, "before_commit") as worker:
            assert worker.wait(10) == 0
        assert control.hits()[0].released_with == "expired"


def test_unreachable_socket_warns_and_continues(tmp_path: Path) -> None:
    worker = WorkerProcess(
        "A", POINT_WORKER, "before_commit", log_dir=tmp_path,
        control_socket=tmp_path / "nobody-listens.sock",
    ).start()  # fmt: skip
    with worker:
        assert worker.wait(10) == 0
    assert "unreachable" in worker.stderr_log.read_text()
    assert events(worker) == [("invoke", "before_commit"), ("ok", "before_commit")]


def test_without_control_env_points_are_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a real worker process first...
    with start_worker(tmp_path, None, "before_commit") as worker:
        assert worker.wait(10) == 0
    assert worker.stderr_log.read_text() == ""
    # ...then timed in-process (printed, not asserted: timing is machine-dependent).
    monkeypatch.delenv("FENCECHECK_CONTROL", raising=False)
    monkeypatch.delenv("FENCECHECK_EVENTS", raising=False)
    injection.reload_environment()
    n = 200_000
    start = time.perf_counter()
    for _ in range(n):
        injection.point("before_commit", run_id="r", epoch=1, revision=2)
    per_call_ns = (time.perf_counter() - start) / n * 1e9
    print(f"\ninjection.point() without FENCECHECK_CONTROL: {per_call_ns:.0f} ns per call")
    assert not injection.active()


def test_bad_message_is_recorded_not_answered(control: ControlServer) -> None:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(control.socket_path))
        s.sendall(b"this is not json\n")
        assert s.recv(100) == b""
    wait_for(lambda: control.protocol_errors, what="the protocol error to be recorded", timeout_s=5)
    assert control.hits() == []


def test_a_silent_connection_blocks_no_other_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread serves every connection: a client that connects and says
    nothing (or half a line) neither delays another worker's answer nor stays
    open past the read timeout, which records it as a protocol error."""
    import socket

    from harness.parts import control as control_module

    monkeypatch.setattr(control_module, "READ_TIMEOUT_S", 0.5)
    with ControlServer(tmp_path) as control, socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(control.socket_path))
        silent.sendall(b'{"type": "po')  # half a message, then nothing
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(control.socket_path))
            started = time.monotonic()
            s.sendall(b'{"type": "point", "point": "before_commit", "worker": "A"}\n')
            assert json.loads(s.recv(100)) == {"action": "continue"}
            assert time.monotonic() - started < 0.4  # not after the silent one's timeout
        assert [h.point for h in control.hits()] == ["before_commit"]
        wait_for(lambda: control.protocol_errors, what="the silent client dropped", timeout_s=5)
        assert "no whole line within 0.5s" in control.protocol_errors[0]
        silent.settimeout(5)
        assert silent.recv(100) == b""  # closed, never answered


def test_socket_is_private_and_removed_on_close(tmp_path: Path) -> None:
    with ControlServer(tmp_path) as control:
        assert oct(os.stat(control.socket_path).st_mode & 0o777) == "0o600"
    assert not control.socket_path.exists()


def test_too_long_socket_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="limit"):
        ControlServer(tmp_path / ("d" * 120))


def test_a_go_worker_speaks_the_protocol(tmp_path: Path, control: ControlServer) -> None:
    """The Go client from docs/control-protocol.md, built and run for real."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        pytest.skip("Go toolchain not installed")
    binary = tmp_path / "go_point_worker"
    subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=SCRIPTS / "go_point_worker",
        check=True,
        timeout=120,
        capture_output=True,
    )
    control.arm("G", "after_lease_acquired", Delay(50))
    control.arm("G", "before_commit", Hold())
    control.arm("G", "after_checkpoint_commit", Crash())
    points = ["after_lease_acquired", "before_commit", "after_checkpoint_commit", "never"]
    worker = WorkerProcess(
        "G", [str(binary)], points[0], points[1:], log_dir=tmp_path,
        control_socket=control.socket_path,
    ).start()  # fmt: skip
    with worker:
        hit = control.wait_reached("G", "before_commit", timeout_s=10)
        assert (hit.pid, hit.run_id, hit.epoch, hit.revision) == (worker.pid, "run-go", 1, 2)
        control.release("G", "before_commit")
        assert worker.wait(10) == -signal.SIGKILL
    assert worker.stdout_log.read_text().split("\n")[:2] == [
        "passed after_lease_acquired", "passed before_commit",
    ]  # fmt: skip
    assert [h.action for h in control.hits()] == ["delay 50ms", "hold", "crash"]
