"""The exit-code contract, input by input: 64 with one line naming what to fix
(never a traceback) for bad usage, 2 with one paragraph (what failed, its exit
status, the last lines of its stderr, where the full log is) for a harness or
environment error, and a run directory that says why a start failed."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.helpers import assert_usage_error
from tests.harness.outside import REPO, private_tmpdir


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--repeat", "0"], ["--repeat", "expected 1 or more, got 0"]),
        (["run", "--repeat", "x"], ["--repeat", "expected a whole number"]),
        (["run", "--jobs", "0"], ["--jobs", "expected 1 or more"]),
        (["run", "--retry-unknown", "-1"], ["--retry-unknown", "expected 0 or more, got -1"]),
        (["run", "--seed", "abc"], ["--seed", "expected a whole number such as 7, got 'abc'"]),
        (["run", "--backend", "foo"], ["--backend", "invalid choice: 'foo'"]),
        (["run", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["run", "ZZ"], ["unknown experiment 'ZZ'", "fencecheck list"]),
        (["frobnicate"], ["invalid choice: 'frobnicate'"]),
        ([], ["the following arguments are required"]),
        (["run", "--worker-cmd", ""], ["--worker-cmd is empty", "reference worker"]),
        (["run", "--worker-cmd", "   "], ["--worker-cmd is empty"]),
        (["run", "--worker-cmd", "python3 'unbalanced"], ["cannot be split", "quotes"]),
        (
            ["run", "--worker-cmd", "/fencecheck-no-such-path/worker"],
            ["/fencecheck-no-such-path/worker does not exist"],
        ),
        (
            ["run", "--worker-cmd", "no-such-worker-xyz"],
            ["'no-such-worker-xyz' is not found on PATH"],
        ),
        (
            ["run", "--mutant", "nosuch"],
            ["--mutant 'nosuch' is not a mutant", "write_ignores_epoch"],
        ),
        (
            ["run", "--work-dir", "/fencecheck-no-such-path"],
            ["--work-dir /fencecheck-no-such-path is not a directory"],
        ),
        (
            ["run", "--pg-bin", "/fencecheck-no-such-path"],
            ["/fencecheck-no-such-path, which does not exist"],
        ),
        (["run", "--pg-bin", "/etc"], ["/etc, which lacks initdb"]),
        (["report", "/etc/hostname"], ["/etc/hostname is not a folder"]),
        (["mutants", "--diff"], ["add --auto"]),
        (
            ["run", "--toxiproxy", "/fencecheck-no-such-path"],
            ["not an executable file: /fencecheck-no-such-path"],
        ),
        (
            ["show", "/fencecheck-no-such-path.yaml"],
            ["no archive at /fencecheck-no-such-path.yaml"],
        ),
        (
            ["clean", "--work-dir", "/fencecheck-no-such-path"],
            ["--work-dir /fencecheck-no-such-path is not a directory"],
        ),
        (["mutants", "nosuch"], ["unknown mutant(s) ['nosuch']"]),
        (["smoke", "--backend", "containers"], ["smoke runs local processes only"]),
    ],
)
def test_bad_usage_exits_64_with_one_line(args: list[str], expected: list[str]) -> None:
    assert_usage_error(_cli(*args), *expected)


def test_worker_command_that_is_not_executable(tmp_path: Path) -> None:
    worker = _script(tmp_path / "worker", "exit 0\n", mode=0o644)
    assert_usage_error(
        _cli("run", "--worker-cmd", str(worker)), f"{worker} is not executable", "chmod +x"
    )


def test_report_dir_on_a_file(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    assert_usage_error(_cli("run", "A", "--report-dir", str(file)), "is a file, not a directory")


@contextlib.contextmanager
def _read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write: a read-only mount as root, else mode 0500."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "none", str(path)], check=True)
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], check=True)
    else:
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield path
        finally:
            path.chmod(0o755)


def test_report_dir_on_a_read_only_mount(tmp_path: Path) -> None:
    with _read_only_dir(tmp_path) as ro:
        assert_usage_error(
            _cli("run", "A", "--report-dir", str(ro / "reports")), "cannot be written"
        )
        assert not any(ro.iterdir())


def test_list_into_a_closed_pipe_prints_no_traceback() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m harness.cli list | head -1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.startswith("== the queue layer"), proc.stdout
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


# ------------------------------------------------- harness / environment errors
def _failed_start(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmpdir = private_tmpdir()
    try:
        proc = _cli(
            "run", "A", "--report-dir", str(tmp_path / "reports"), *args,
            env={"TMPDIR": str(tmpdir), **(env or {})},
        )  # fmt: skip
        assert list(tmpdir.iterdir()) == []  # not even the emptied state directory
    finally:
        subprocess.run(["rm", "-rf", str(tmpdir)], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if not p.is_symlink()]
    assert "did not start" in (run_dir / "error.txt").read_text()
    return proc, run_dir


pytestmark_slow = pytest.mark.slow


@pytestmark_slow
def test_worker_whose_migrate_fails(tmp_path: Path) -> None:
    worker = _script(
        tmp_path / "worker", 'echo "line one" >&2\necho "boom: no schema" >&2\nexit 3\n'
    )
    proc, run_dir = _failed_start(tmp_path, "--worker-cmd", str(worker))
    assert "migrate` failed" in proc.stderr and "exit status 3" in proc.stderr, proc.stderr
    assert "boom: no schema" in proc.stderr
    log = run_dir / "logs" / "run" / "migrate.log"
    assert f"full log: {log}" in proc.stderr and "boom" in log.read_text()


@pytestmark_slow
def test_a_flooding_migrate_is_stored_once(tmp_path: Path) -> None:
    """20 MB on migrate's stdout: one log holds it (logs/run/migrate.log, with
    the command and both streams), no copy of it anywhere else in the run."""
    worker = _script(
        tmp_path / "worker",
        "head -c 20000000 /dev/zero | tr '\\0' x | fold -w 100\necho 'boom' >&2\nexit 3\n",
    )
    proc, run_dir = _failed_start(tmp_path, "--worker-cmd", str(worker))
    log = run_dir / "logs" / "run" / "migrate.log"
    big = [p for p in run_dir.rglob("*") if p.is_file() and p.stat().st_size > 1_000_000]
    assert big == [log], big
    text = log.read_text()
    assert text.startswith(f"$ {worker} migrate\n--- stdout\nxxxx") and "--- stderr\nboom" in text
    assert f"Its whole output: {log}." in proc.stdout, proc.stdout
    assert sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()) < 20_300_000


@pytestmark_slow
def test_worker_whose_migrate_hangs(tmp_path: Path) -> None:
    worker = _script(tmp_path / "worker", 'echo "migrating..." >&2\nexec sleep 600\n')
    proc, _ = _failed_start(
        tmp_path,
        "--worker-cmd",
        str(worker),
        # Its `mapping` mode hangs too: taken as no such mode after 2 s.
        env={"FENCECHECK_MIGRATE_TIMEOUT_S": "2", "FENCECHECK_MAPPING_TIMEOUT_S": "2"},
    )
    assert "did not finish within 2s" in proc.stderr and "migrating..." in proc.stderr
    assert "killed" in proc.stderr


@pytestmark_slow
def test_worker_that_exits_at_once(tmp_path: Path) -> None:
    proc, _ = _failed_start(tmp_path, "--worker-cmd", "/bin/true")
    assert "exited 0" in proc.stderr and "created no table agent_tasks" in proc.stderr
    assert "relation" not in proc.stderr  # not a later SQL error


@pytestmark_slow
def test_toxiproxy_that_exits_at_once(tmp_path: Path) -> None:
    fake = _script(tmp_path / "toxiproxy-server", 'echo "not a proxy" >&2\nexit 7\n')
    proc, _ = _failed_start(tmp_path, env={"FENCECHECK_TOXIPROXY": str(fake)})
    assert "exited" in proc.stderr and "exit status 7" in proc.stderr, proc.stderr
    assert "not a proxy" in proc.stderr and "full log:" in proc.stderr
    assert "not ready within" not in proc.stderr
