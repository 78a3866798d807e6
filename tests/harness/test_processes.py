"""ManagedProcess and WorkerProcess against real child processes."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest

from harness.parts.os_user import OsUser, is_root, unprivileged_user
from harness.parts.processes import (
    KEPT_NOISE_LINES,
    ManagedProcess,
    OpTimeout,
    ProcessRegistry,
    ProcessTimeout,
    WorkerChannelClosed,
    WorkerProcess,
)
from harness.waiting import wait_for
from tests.harness.helpers import PYTHON, SCRIPTS, pid_alive

THREADED_SLEEPER = textwrap.dedent(
    """
    import threading, time
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
    """
)
IGNORES_SIGTERM = textwrap.dedent(
    """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def started(tmp_path: Path, code: str, **kwargs: object) -> ManagedProcess:
    proc = ManagedProcess("child", [PYTHON, "-c", code], log_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
    proc.start()
    wait_for(
        lambda: b"ready" in proc.stdout_log.read_bytes(),
        what="the child to print ready",
        timeout_s=5,
    )
    return proc


def test_pause_is_confirmed_by_the_kernel_for_every_thread(tmp_path: Path) -> None:
    with started(tmp_path, THREADED_SLEEPER) as proc:
        paused = proc.pause()
        assert paused.state == "stopped" and proc.kernel_state() == "stopped"
        assert paused.confirmed_at is not None and paused.confirmed_at >= paused.sent_at
        threads = psutil.Process(proc.pid).threads()
        assert len(threads) == 2
        for t in threads:
            stat = Path(f"/proc/{proc.pid}/task/{t.id}/stat").read_text()
            assert stat.rsplit(")", 1)[1].split()[0] == "T"
        resumed = proc.resume()
        assert resumed.state != "stopped" and proc.kernel_state() in ("sleeping", "running")
        killed = proc.kill()
        assert killed.state == "exited"
    assert proc.returncode == -signal.SIGKILL
    assert not pid_alive(proc.pid)


def test_kill_of_a_stopped_process_reaps_it(tmp_path: Path) -> None:
    proc = started(tmp_path, THREADED_SLEEPER)
    proc.pause()
    proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert proc.kernel_state() == "exited"


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    proc = started(tmp_path, IGNORES_SIGTERM)
    proc.pause()  # stop() must also cope with a stopped child
    assert proc.stop(grace_s=0.3) == -signal.SIGKILL
    assert not proc.is_alive()


def test_stop_uses_sigterm_first(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", ["sleep", "60"], log_dir=tmp_path).start()
    assert proc.stop(grace_s=5.0) == -signal.SIGTERM


def test_logs_are_captured_per_process_and_never_overwritten(tmp_path: Path) -> None:
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    first = ManagedProcess("talker", [PYTHON, "-c", code], log_dir=tmp_path).start()
    assert first.wait(10) == 0
    second = ManagedProcess("talker", [PYTHON, "-c", code], log_dir=tmp_path).start()
    assert second.wait(10) == 0
    assert first.stdout_log.read_text() == "to stdout\n"
    assert first.stderr_log.read_text() == "to stderr\n"
    assert second.stdout_log != first.stdout_log
    assert second.stdout_log.read_text() == "to stdout\n"


def test_env_overrides_and_removals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCECHECK_LEAK", "outer")
    code = "import os; print(os.environ.get('FENCECHECK_LEAK'), os.environ['FENCECHECK_SET'])"
    proc = ManagedProcess(
        "env",
        [PYTHON, "-c", code],
        log_dir=tmp_path,
        env={"FENCECHECK_LEAK": None, "FENCECHECK_SET": "yes"},
    ).start()
    assert proc.wait(10) == 0
    assert proc.stdout_log.read_text() == "None yes\n"


def test_wait_timeout_names_the_process(tmp_path: Path) -> None:
    with (
        ManagedProcess("slowpoke", ["sleep", "60"], log_dir=tmp_path) as proc,
        pytest.raises(ProcessTimeout, match="slowpoke"),
    ):
        proc.wait(0.1)


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    from harness.parts.processes import ProcessError

    with pytest.raises(ProcessError, match="no-such-binary"):
        ManagedProcess("ghost", ["/nonexistent/no-such-binary"], log_dir=tmp_path).start()


@pytest.mark.skipif(not is_root(), reason="switching user needs root")
def test_run_as_unprivileged_user_gets_its_uid_gid_and_home(tmp_path: Path) -> None:
    user = unprivileged_user()
    assert user.name == "postgres" and user.uid != 0
    # /bin/sh, not the venv's python: root's home (where pyenv lives) is 0700.
    proc = ManagedProcess(
        "as-postgres",
        ["/bin/sh", "-c", 'echo "$HOME $USER"; echo ready; exec sleep 60'],
        log_dir=tmp_path,
        run_as=user,
    ).start()
    wait_for(
        lambda: b"ready" in proc.stdout_log.read_bytes(),
        what="the child to print ready",
        timeout_s=5,
    )
    try:
        ps = psutil.Process(proc.pid)
        assert tuple(ps.uids()) == (user.uid,) * 3
        assert tuple(ps.gids()) == (user.gid,) * 3
        status = Path(f"/proc/{proc.pid}/status").read_text()
        groups_line = next(line for line in status.splitlines() if line.startswith("Groups:"))
        assert groups_line.split(":")[1].split() in ([], [str(user.gid)])
        assert proc.stdout_log.read_text().startswith(f"{user.home} {user.name}\n")
    finally:
        proc.stop(grace_s=1.0)


def test_unprivileged_user_is_current_user_when_not_root() -> None:
    user = unprivileged_user()
    if not is_root():
        assert user == OsUser.current()
    else:
        assert user == OsUser.by_name("postgres")


INTERMEDIATE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from harness.parts.os_user import unprivileged_user
    from harness.parts.processes import ManagedProcess
    run_as = unprivileged_user() if sys.argv[2] == "postgres" else None
    child = ManagedProcess("grandchild", ["sleep", "60"], log_dir=Path(sys.argv[1]), run_as=run_as)
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("who", ["self", "postgres"])
def test_children_die_with_a_sigkilled_parent(tmp_path: Path, who: str) -> None:
    if who == "postgres" and not is_root():
        pytest.skip("switching user needs root")
    # The intermediate stands in for a harness that is SIGKILLed: no cleanup runs.
    parent = subprocess.Popen(
        [PYTHON, "-c", INTERMEDIATE, str(tmp_path), who], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert pid_alive(grandchild)
        if who == "postgres":
            assert psutil.Process(grandchild).uids().real != 0
        parent.kill()
        parent.wait(5)
        wait_for(
            lambda: not pid_alive(grandchild),
            what=f"grandchild {grandchild} to die with its parent",
            timeout_s=5,
        )
    finally:
        parent.kill()
        parent.wait(5)
        if parent.stdout is not None:
            parent.stdout.close()


def test_registry_stops_everything_in_reverse_order(tmp_path: Path) -> None:
    registry = ProcessRegistry()
    procs = [
        ManagedProcess(f"p{i}", ["sleep", "60"], log_dir=tmp_path, registry=registry).start()
        for i in range(3)
    ]
    procs[1].pause()
    assert registry.reap_all(grace_s=1.0) == []
    assert all(not p.is_alive() for p in procs)
    ended = [p.ended_at for p in procs]
    assert all(e is not None for e in ended)
    assert ended[2] <= ended[1] <= ended[0]  # type: ignore[operator]


def test_signal_group_reaches_grandchildren(tmp_path: Path) -> None:
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    proc = ManagedProcess(
        "group", [PYTHON, "-c", code], log_dir=tmp_path, signal_group=True
    ).start()
    wait_for(lambda: proc.stdout_log.read_text().strip(), what="the grandchild pid", timeout_s=5)
    grandchild = int(proc.stdout_log.read_text())
    proc.pause()
    wait_for(
        lambda: psutil.Process(grandchild).status() == "stopped",
        what="the grandchild to be stopped too",
        timeout_s=5,
    )
    proc.stop(grace_s=1.0)
    wait_for(lambda: not pid_alive(grandchild), what="the grandchild to be gone", timeout_s=5)


# -- ops channel ---------------------------------------------------------------


def ops_worker(tmp_path: Path, worker_id: str = "A") -> WorkerProcess:
    return WorkerProcess(
        worker_id, [PYTHON, str(SCRIPTS / "ops_worker.py")], "ops", log_dir=tmp_path
    ).start()


def test_worker_environment_follows_the_contract(tmp_path: Path) -> None:
    code = (
        "import os; print(' '.join(os.environ.get(k, '-') for k in "
        "('FENCECHECK_WORKER_ID', 'PGAPPNAME', 'FENCECHECK_CONTROL', 'FENCECHECK_EVENTS')))"
    )
    worker = WorkerProcess(
        "w1", [PYTHON, "-c", code], "run", ["--once"], log_dir=tmp_path,
        control_socket=tmp_path / "control.sock",
    ).start()  # fmt: skip
    assert worker.argv[-2:] == ["run", "--once"]
    assert worker.wait(10) == 0
    assert worker.stdout_log.read_text().split() == [
        "w1",
        "w1",
        str(tmp_path / "control.sock"),
        str(tmp_path / "w1.events.jsonl"),
    ]
    assert worker.events_path.exists()


def test_ops_requests_are_matched_by_id(tmp_path: Path) -> None:
    with ops_worker(tmp_path) as worker:
        reply = worker.request("echo", {"x": 1}, timeout_s=10)
        assert reply.ok and reply.result["echo"] == {"x": 1} and reply.op == "echo"
        assert reply.result["pid"] == worker.pid
        slow = worker.request_async("sleep", {"s": 0.5}, worker_async=True)
        fast = worker.request("echo", {"y": 2}, timeout_s=10)
        assert fast.ok and not slow.done()  # answered out of order, matched by id
        assert slow.result(10).result == {"slept": 0.5}
        unsupported = worker.request("teleport", timeout_s=10)
        assert unsupported.unsupported
        assert b'"op": "echo"' not in worker.stdout_log.read_bytes()  # requests are not logged
        assert worker.stdout_log.read_bytes().count(b"\n") == 4  # every reply is
    assert worker.returncode == 0  # closing stdin ends an ops worker cleanly


def test_ops_timeout_names_op_and_worker(tmp_path: Path) -> None:
    with ops_worker(tmp_path, "B") as worker:
        pending = worker.request_async("sleep", {"s": 2})
        with pytest.raises(OpTimeout, match=r"op 'sleep' \(id 1\) on worker 'B'"):
            pending.result(0.2)


def test_ops_worker_exit_fails_pending_requests(tmp_path: Path) -> None:
    with ops_worker(tmp_path) as worker:
        pending = worker.request_async("exit")
        with pytest.raises(WorkerChannelClosed, match="closed stdout"):
            pending.result(10)
        worker.wait(10)
        with pytest.raises(WorkerChannelClosed):
            worker.request("echo", timeout_s=1)
    assert worker.returncode == 3


def test_a_stopped_worker_leaves_its_request_unanswered(tmp_path: Path) -> None:
    with ops_worker(tmp_path) as worker:
        worker.pause()
        pending = worker.request_async("echo")
        with pytest.raises(OpTimeout, match="stopped"):
            pending.result(0.3)
        worker.resume()
        assert pending.result(10).ok


CHATTY = textwrap.dedent(
    """
    import sys, time
    for line in sys.stdin:
        print("INFO connecting to the database...", flush=True)
        print("DEBUG still working", flush=True)
        time.sleep(60)
    """
)


def test_non_json_lines_on_the_ops_channel_are_kept_and_named(tmp_path: Path) -> None:
    worker = WorkerProcess("A", [PYTHON, "-c", CHATTY], "ops", log_dir=tmp_path).start()
    try:
        with pytest.raises(OpTimeout) as info:
            worker.request("claim", timeout_s=1.0)
    finally:
        worker.stop(grace_s=0.5)
    message = str(info.value)
    assert "got no reply within 1.0s" in message
    assert "printed 2 line(s) on its ops channel (stdout) that are not JSON replies" in message
    assert "INFO connecting to the database..." in message and "logs go to stderr" in message
    assert [e for e in worker.protocol_errors if "DEBUG still working" in e]
    assert "INFO connecting" in worker.stdout_log.read_text()  # kept in its log too


def test_a_flood_on_the_ops_channel_is_kept_once(tmp_path: Path) -> None:
    """Every line is in the stdout log; the archive's copy is the first lines
    and a count, so a 100 MB flood is not stored twice."""
    worker = WorkerProcess("A", [PYTHON, "-c", "pass"], "ops", log_dir=tmp_path)
    for n in range(50_000):
        worker._dispatch_reply(f"noise {n}\n".encode(), 0.0)
    lines = worker.noise_lines()
    assert len(lines) == KEPT_NOISE_LINES + 1 and lines[0] == "not a reply: b'noise 0\\n'"
    assert (
        lines[-1] == f"(and {50_000 - KEPT_NOISE_LINES} more line(s), all in worker-A.stdout.log)"
    )
    assert "it printed 50000 line(s) on its ops channel" in worker.channel_noise()


def test_a_worker_that_exits_at_once_is_reported_as_such(tmp_path: Path) -> None:
    code = "import sys; print('cannot parse FENCECHECK_DSN', file=sys.stderr); sys.exit(3)"
    worker = WorkerProcess("A", [PYTHON, "-c", code], "ops", log_dir=tmp_path).start()
    with pytest.raises(WorkerChannelClosed) as info:
        worker.request("claim", timeout_s=10)
    message = str(info.value)
    assert "it exited at once with status 3" in message, message
    assert "cannot parse FENCECHECK_DSN" in message and str(worker.stderr_log) in message


POOL_PARENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from harness.parts.processes import die_with_parent

    if __name__ == "__main__":
        pool = ProcessPoolExecutor(
            2, mp_context=multiprocessing.get_context("spawn"),
            initializer=die_with_parent, initargs=(os.getpid(),),
        )
        futures = [pool.submit(time.sleep, 600) for _ in range(2)]
        time.sleep(3)  # the workers are up
        print(" ".join(str(p) for p in pool._processes), flush=True)
        time.sleep(600)
    """
)


def test_a_page_pool_worker_dies_with_its_sigkilled_parent(tmp_path: Path) -> None:
    """A pool worker holds both ends of its queue's pipe: without the parent-death
    signal it waits forever once its parent is SIGKILLed (seen: page writers left
    by a run a test's timeout killed)."""
    script = tmp_path / "pool_parent.py"
    script.write_text(POOL_PARENT)
    parent = subprocess.Popen(
        [PYTHON, str(script)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    try:
        assert parent.stdout is not None
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(pid_alive(p) for p in workers)
    finally:
        parent.kill()
        parent.wait(10)
    wait_for(
        lambda: not any(pid_alive(p) for p in workers),
        timeout_s=10,
        what="the pool's workers to die with their SIGKILLed parent",
    )
