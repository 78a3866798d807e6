"""Hostile files: what a reading command does with a FIFO, a symlink to
/dev/zero, a file over the size cap, YAML nested too deep, a file that is not
what it should be (never echoed), an archive that fails the schema, and a
signal while it is blocked on a read.

Every command runs as a user runs it (a subprocess, with a timeout and a
memory limit, so a regression fails here instead of hanging or filling the
machine) and must end in seconds with one line naming the file and the cap.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from harness.evidence import archive as evidence
from harness.evidence import manifest
from tests.harness.helpers import assert_usage_error, sample_archive
from tests.harness.outside import REPO

FIXTURE_RUN = REPO / "tests" / "report" / "fixtures" / "run-pass"
# What one of these commands may take, start-up included, on a loaded machine.
QUICK_S = 20.0
# Lines of a file a parser must never quote back (an /etc/shadow look-alike).
SECRET_LINES = (
    "root:$y$j9T$Xk3sEcReT9hash$zzqQ:19700:0:99999:7:::",
    "daemon:*:19700:0:99999:7:::",
    "operator:$6$saltsalt$AnotherSecretHash:19700:0:99999:7:::",
)


def _limit_memory() -> None:
    # A reader that reads /dev/zero to the end hits this, not the machine.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))


def fencecheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=QUICK_S,
        env={**os.environ, **(env or {})},
        preexec_fn=_limit_memory,
        check=False,
    )
    assert time.monotonic() - started < QUICK_S
    return proc


def sealed_run(root: Path) -> Path:
    run = Path(shutil.copytree(FIXTURE_RUN, root / "run"))
    (run / "summary.md").write_text("# fencecheck run\n\n- **run**: x\n")
    manifest.write_manifest(run)
    return run


def schedule_path(root: Path) -> Path:
    return root / "schedule.yaml"


# ------------------------------------------------------------- not a file
def _verify(run: Path, hostile: Path) -> list[str]:
    return ["verify", str(run)]


def _report_out(run: Path, hostile: Path) -> list[str]:
    return ["report", str(run), "--out", str(run.parent / "pages")]


def _show(run: Path, hostile: Path) -> list[str]:
    return ["show", str(hostile)]


def _replay(run: Path, hostile: Path) -> list[str]:
    return ["replay", str(hostile), "--report-dir", str(run.parent / "replays")]


def _merge(run: Path, hostile: Path) -> list[str]:
    # What merge reads first is the part's shard record.
    if not (run / "shard.json").exists():
        (run / "shard.json").write_text("{}\n")
    return ["merge", str(run), "--into", str(run.parent / "merged")]


def _triage(run: Path, hostile: Path) -> list[str]:
    (run / "run.json").write_text("{}\n")
    return ["mutants", "--rebuild-report", str(run), "--triage", str(hostile)]


COMMANDS: list[Callable[[Path, Path], list[str]]] = [
    _verify,
    _report_out,
    _show,
    _replay,
    _merge,
    _triage,
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.__name__[1:] for c in COMMANDS])
def test_a_fifo_is_refused_at_once(
    tmp_path: Path, command: Callable[[Path, Path], list[str]]
) -> None:
    run = sealed_run(tmp_path)
    fifo = run / "archives" / "X.yaml"
    os.mkfifo(fifo)
    if command is _merge:
        os.mkfifo(run / "shard.json")
    started = time.monotonic()
    proc = fencecheck(*command(run, fifo))
    line = assert_usage_error(proc, "is a FIFO (named pipe), not a regular file")
    assert "X.yaml" in line or "shard.json" in line
    assert time.monotonic() - started < 10


def test_a_symlink_to_dev_zero_is_refused_naming_where_it_leads(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    link = tmp_path / "schedule.yaml"
    link.symlink_to("/dev/zero")
    for args in (_replay(run, link), _show(run, link), _triage(run, link)):
        assert_usage_error(fencecheck(*args), f"{link} (a symlink to /dev/zero)", "device")


def test_a_directory_or_a_device_given_as_a_schedule_is_refused(tmp_path: Path) -> None:
    assert_usage_error(fencecheck("replay", str(tmp_path)), "is a directory")
    assert_usage_error(fencecheck("replay", "/dev/null"), "is a character device")


# ---------------------------------------------------------------- too big
def test_a_file_over_the_cap_is_refused_without_being_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(200 << 20)  # sparse: 200 MiB that cost nothing to make
    for args in (["show", str(huge)], ["replay", str(huge)]):
        assert_usage_error(
            fencecheck(*args), str(huge), "200.0 MiB", "16 MiB cap", "FENCECHECK_READ_CAP_MB"
        )


def test_the_cap_can_be_raised_and_lowered(tmp_path: Path) -> None:
    path = evidence.write_archive(tmp_path / "B.yaml", sample_archive())
    with path.open("a") as f:
        f.write("# " + "x" * (2 << 20) + "\n")  # still a valid archive, 2 MiB
    assert_usage_error(
        fencecheck("show", str(path), env={"FENCECHECK_READ_CAP_MB": "1"}), "over the 1 MiB cap"
    )
    assert fencecheck("show", str(path), env={"FENCECHECK_READ_CAP_MB": "3"}).returncode == 0
    assert_usage_error(
        fencecheck("show", str(path), env={"FENCECHECK_READ_CAP_MB": "lots"}),
        "FENCECHECK_READ_CAP_MB='lots' is not a whole number",
    )


# --------------------------------------------------------------- too deep
@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, "".join("  " * i + "a:\n" for i in range(200))],
    ids=["flow", "block"],
)
def test_yaml_nested_too_deep_is_a_usage_error(tmp_path: Path, text: str) -> None:
    path = schedule_path(tmp_path)
    path.write_text(text)
    for args in (["replay", str(path)], ["show", str(path)]):
        assert_usage_error(fencecheck(*args), str(path), "deeper than 64 levels")


def test_json_nested_too_deep_is_a_usage_error(tmp_path: Path) -> None:
    run = sealed_run(tmp_path)
    (run / "shard.json").write_text("[" * 100_000 + "]" * 100_000)
    proc = fencecheck("merge", str(run), "--into", str(tmp_path / "merged"))
    assert_usage_error(proc, "shard.json nests deeper than 64 levels")


def test_yaml_aliases_that_expand_are_refused(tmp_path: Path) -> None:
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, 9):
        refs = ", ".join([f"*a{n - 1}"] * 9)
        levels.append(f"a{n}: &a{n} [{refs}]")
    path = schedule_path(tmp_path)
    path.write_text("\n".join(levels) + "\n")  # 9**9 values from under 1 KB
    assert_usage_error(fencecheck("replay", str(path)), "expands to more than")


# --------------------------------------------------------- never echoed
def _not_echoed(proc: subprocess.CompletedProcess[str], code: int = 64) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    for piece in ("Xk3sEcReT9hash", "AnotherSecretHash", "99999", "daemon", "operator"):
        assert piece not in out, f"{piece!r} of the file was echoed:\n{out}"


@pytest.mark.parametrize(
    "body",
    [
        "\n".join(SECRET_LINES) + "\n",  # parses: whole lines become keys
        "\n".join(SECRET_LINES) + "\n\t" + SECRET_LINES[0] + ": [\n",  # does not parse
        f"workers: {SECRET_LINES[0]!r}\nruns: [{{}}]\n",  # a value of the wrong type
    ],
    ids=["keys", "broken", "value"],
)
def test_a_file_that_is_not_what_it_should_be_is_not_echoed(tmp_path: Path, body: str) -> None:
    run = sealed_run(tmp_path)
    path = schedule_path(tmp_path)
    path.write_text(body)
    for args in (_replay(run, path), _show(run, path), _triage(run, path)):
        _not_echoed(fencecheck(*args))
    (run / "MANIFEST.sha256").write_text(body)
    proc = fencecheck("verify", str(run))
    _not_echoed(proc, code=1)
    assert "MANIFEST.sha256 line(s) 1" in proc.stdout, proc.stdout


# ------------------------------------------------- fails the schema: report
def test_report_never_builds_a_verdict_from_an_archive_that_fails_the_schema(
    tmp_path: Path,
) -> None:
    run = Path(shutil.copytree(FIXTURE_RUN, tmp_path / "run"))
    archive = run / "archives" / "B.yaml"
    data = yaml.safe_load(archive.read_text())
    for field in ("checks", "history", "duration_s", "natural_wait_s"):
        del data[field]  # truncated: still YAML, still says pass
    archive.write_text(yaml.safe_dump(data))
    assert fencecheck("show", str(archive)).returncode == 64
    pages = tmp_path / "pages"
    proc = fencecheck("report", str(run), "--out", str(pages))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 archive(s) UNREADABLE" in proc.stdout
    assert "missing field(s): checks, history, duration_s, natural_wait_s" in proc.stdout
    index = (pages / "index.html").read_text()
    assert "1 pass, 0 fail, 0 unknown, 1 unreadable of 2" in index
    assert 'data-experiment="B" data-verdict="unknown" data-unreadable="true"' in index
    page = (pages / "experiments" / "B.html").read_text()
    assert "PASS" not in page and "This archive is unreadable" in page


# -------------------------------------------------- a signal while blocked
BLOCKED = """
import contextlib, os, sys
from harness.evidence import bounded_read

never, _keep = os.pipe()
real = bounded_read.regular_file

@contextlib.contextmanager
def hung(path):
    # Where every reader reads: a read that never returns (a hung disk, a
    # FUSE file, a FIFO a reader got past the checks).
    with real(path) as opened:
        try:
            # Inside the try: the signal may land right after the line is out,
            # before the read has begun; that too is the signal ending the wait.
            print("blocked on a read", file=sys.stderr, flush=True)
            os.read(never, 1)
        except BaseException as exc:
            # Proof that the signal itself ended the read: the escalation
            # (os._exit) never unwinds the main thread, so it prints nothing.
            print(f"the read ended by {type(exc).__name__}", file=sys.stderr, flush=True)
            raise
        yield opened

bounded_read.regular_file = hung
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _compare(run: Path, hostile: Path) -> list[str]:
    return ["report", "--compare", str(run), str(run)]


SIGNALLED = [
    (_verify, signal.SIGINT),
    (_show, signal.SIGTERM),
    (_report_out, signal.SIGINT),
    (_compare, signal.SIGTERM),
    (_merge, signal.SIGINT),
    (_replay, signal.SIGTERM),
    (_triage, signal.SIGINT),
]


@pytest.mark.parametrize(
    ("command", "signum"),
    SIGNALLED,
    ids=[f"{c.__name__[1:]}-{s.name}" for c, s in SIGNALLED],
)
def test_a_signal_ends_a_command_blocked_on_a_read_at_once(
    tmp_path: Path, command: Callable[[Path, Path], list[str]], signum: signal.Signals
) -> None:
    """Exit 128+N: the signal itself ends the read (the main thread unwinds
    and says so), not only the escalation a run's orderly stop falls back on
    after 3 s, which exits without unwinding. Judged by what the process
    printed, never by a stopwatch or by which came first: on a loaded machine
    (the fresh-clone CI) the unwinding itself once took longer than the 3 s,
    so the escalation's "did not finish" may rightly follow the proof."""
    run = sealed_run(tmp_path)
    hostile = run / "archives" / "B.yaml"
    argv = command(run, hostile)
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "blocked on a read" in line, line + proc.stderr.read()
        proc.send_signal(signum)
        code = proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert code == 128 + signum, err
    assert "the read ended by Interrupted" in err, err
    assert f"interrupted by {signum.name}" in err, err
    assert "Traceback" not in err
