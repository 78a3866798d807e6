"""Workers forked from a fork server (harness/parts/fork_server.py, worker contract
§1) are real processes the harness signals and reaps like exec'd ones."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.parts.fork_server import ForkServer
from harness.parts.processes import WorkerProcess

SCRIPTS = Path(__file__).parent / "scripts"
COMMAND = [sys.executable, str(SCRIPTS / "ops_worker.py")]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    fork = ForkServer(COMMAND, log_path=tmp_path / "fork-server.log", env=dict(os.environ))
    assert fork.start(), fork.why_not
    try:
        yield fork
    finally:
        fork.close()


def forked(server: ForkServer, tmp_path: Path, name: str = "A") -> WorkerProcess:
    return WorkerProcess(name, COMMAND, "ops", log_dir=tmp_path, fork_server=server).start()


def test_a_forked_worker_is_a_child_of_the_server_in_its_own_session(
    server: ForkServer, tmp_path: Path
) -> None:
    with forked(server, tmp_path, "w1") as worker:
        assert worker.forked_by == server.pid
        who = worker.request("whoami", timeout_s=10).result
        assert who["pid"] == worker.pid and who["ppid"] == server.pid
        assert who["sid"] == worker.pid  # a session of its own, as start_new_session
        assert who["worker"] == "w1" and who["cwd"] == os.getcwd()
        assert worker.request("echo", {"x": 1}, timeout_s=10).result["echo"] == {"x": 1}
    assert worker.returncode == 0  # closing stdin ends it, and the exit status arrives


def test_signals_reach_the_forked_process_itself(server: ForkServer, tmp_path: Path) -> None:
    worker = forked(server, tmp_path)
    try:
        worker.request("echo", timeout_s=10)
        paused = worker.pause()
        assert paused.state == "stopped"
        pending = worker.request_async("echo")
        time.sleep(0.2)
        assert not pending.done()  # frozen in the kernel: nobody reads the request
        worker.resume()
        assert pending.result(10).ok
        killed = worker.kill()
        assert worker.returncode == -signal.SIGKILL, killed
        with pytest.raises(ProcessLookupError):
            os.kill(worker.pid, 0)  # reaped by its parent, not a zombie
    finally:
        worker.stop()


def test_exit_status_and_stderr_as_from_an_exec(server: ForkServer, tmp_path: Path) -> None:
    worker = WorkerProcess(
        "B", COMMAND, "exit-with", ["7"], log_dir=tmp_path, fork_server=server
    ).start()
    assert worker.wait(10) == 7
    bad = WorkerProcess("C", COMMAND, "bogus", log_dir=tmp_path, fork_server=server).start()
    assert bad.wait(10) == 2
    assert "usage: ops_worker.py ops" in bad.stderr_log.read_text()


def test_workers_die_with_their_server(server: ForkServer, tmp_path: Path) -> None:
    worker = forked(server, tmp_path)
    worker.request("echo", timeout_s=10)
    server.close()
    assert worker.wait(10) == -signal.SIGKILL
    # Later starts are exec'd: a fork server only ever saves time.
    with forked(server, tmp_path, "D") as again:
        assert again.forked_by is None
        assert again.request("whoami", timeout_s=10).result["ppid"] == os.getpid()


def test_a_command_without_the_mode_is_exec_d(tmp_path: Path) -> None:
    fork = ForkServer(
        [sys.executable, "-c", "import sys; sys.exit(2)"],
        log_path=tmp_path / "fork-server.log",
        env=dict(os.environ),
    )
    assert not fork.start(timeout_s=5)
    assert "does not offer it" in fork.why_not


def test_an_older_childs_exit_is_not_a_new_childs_with_the_same_pid(tmp_path: Path) -> None:
    """Pids wrap: an exit on record for a pid nobody adopted (it came before
    the new spawn was asked for) must not mark the new child of that pid dead.
    An exit that comes after the spawn reply and before the adoption is the
    new child's own and is applied."""
    import subprocess

    fork = ForkServer(COMMAND, log_path=tmp_path / "fork-server.log", env=dict(os.environ))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fork._ids = 1
        fork._dispatch({"exited": 1, "pid": alive.pid, "status": -9})  # an older child
        fork._ids = 2
        fork._dispatch({"spawned": 2, "pid": alive.pid})
        assert fork.adopt(alive.pid, None, None).poll() is None
        fork._children.clear()
        fork._dispatch({"spawned": 3, "pid": alive.pid})
        fork._dispatch({"exited": 3, "pid": alive.pid, "status": 7})  # its own, before adopt
        assert fork.adopt(alive.pid, None, None).poll() == 7
    finally:
        alive.kill()
        alive.wait()


def test_the_kill_report_probe_passes_the_real_server(server: ForkServer) -> None:
    """A child stopped, then killed with SIGKILL, is reported -9: no problem."""
    assert server.check_kill_report(dict(os.environ)) is None


def test_the_kill_report_probe_names_a_server_that_misreports(tmp_path: Path) -> None:
    """The reference server with its exit report as a careless edit leaves it
    (the exit code of a status, 0 for a killed child): every crash fault would
    read "did not take effect"; the probe says what is wrong instead."""
    misreporting = [
        sys.executable,
        "-c",
        "import os, runpy; os.waitstatus_to_exitcode = os.WEXITSTATUS; "
        f"runpy.run_path({str(SCRIPTS / 'ops_worker.py')!r}, run_name='__main__')",
    ]
    fork = ForkServer(misreporting, log_path=tmp_path / "fork-server.log", env=dict(os.environ))
    assert fork.start(), fork.why_not
    try:
        problem = fork.check_kill_report(dict(os.environ))
    finally:
        fork.close()
    assert problem is not None and "reported status 0" in problem and "-9" in problem


def test_the_sigterm_probe_passes_the_real_server(server: ForkServer) -> None:
    """A forked ops child waiting for requests ends on SIGTERM, as an exec'd one does."""
    assert server.check_sigterm_ends(dict(os.environ)) is None


def test_the_sigterm_probe_names_a_child_that_keeps_the_servers_handler(
    tmp_path: Path,
) -> None:
    """The reference server with the child's reset of SIGTERM dropped (blind hunt
    45 #05): the child keeps the server's do-nothing handler, so SIGTERM no
    longer ends a worker; the probe says so instead of every drain hanging."""
    keeping = [
        sys.executable,
        "-c",
        "import runpy, signal; real = signal.signal; "
        "signal.signal = lambda sig, h: None if sig == signal.SIGTERM and h is signal.SIG_DFL "
        "else real(sig, h); "
        f"runpy.run_path({str(SCRIPTS / 'ops_worker.py')!r}, run_name='__main__')",
    ]
    fork = ForkServer(keeping, log_path=tmp_path / "fork-server.log", env=dict(os.environ))
    assert fork.start(), fork.why_not
    try:
        problem = fork.check_sigterm_ends(dict(os.environ), timeout_s=2.0)
    finally:
        fork.close()
    assert problem is not None and "after SIGTERM" in problem
