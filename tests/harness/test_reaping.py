"""A run killed with SIGKILL leaves its temp root, its data directories and
its servers' System V segments behind (its servers die with it through their
parent-death signal); the next run, or `fencecheck clean`, reaps all of it
and says so, and leaves live runs alone.

Attribution is by a private TMPDIR: the killed run's record, temp root and
data directories live there, and its segments are the ones its servers'
postmaster.pid files named while it ran.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.engine import run_records
from harness.parts import shared_memory
from tests.harness import outside

pytestmark = pytest.mark.slow


def _kill_during_h(tmp_path: Path) -> tuple[outside.Run, outside.Observed]:
    """`run H` killed with SIGKILL once its replicated pairs stream."""
    run = outside.start(["run", "H"], tmp_path)
    try:
        run.wait_file("fencecheck-run-*/H-*/pg/replica/postmaster.pid", contains="ready")
        run.signal(signal.SIGKILL)
        code, _, seen = run.finish()
    except BaseException:
        run.close()
        raise
    assert code == -signal.SIGKILL
    return run, seen


def _cli(run: outside.Run, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=outside.REPO,
        env={**os.environ, "TMPDIR": str(run.tmpdir)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _left(run: outside.Run, seen: outside.Observed) -> tuple[list[str], list[int]]:
    roots = [p.name for p in run.tmpdir.iterdir() if p.name.startswith("fencecheck-run-")]
    live = shared_memory.segments()
    segments = [s for s, key in seen.segments.items() if s in live and live[s].key == key]
    return roots, segments


@pytest.mark.parametrize("reaper", ["clean", "next run"])
def test_a_killed_run_is_reaped(tmp_path: Path, reaper: str) -> None:
    run, seen = _kill_during_h(tmp_path)
    try:
        roots, segments = _left(run, seen)
        # What the kill left: the test can fail, so it must first see the mess.
        assert roots and segments, "the killed run left nothing to reap"
        (record,) = run_records.state_dir(run.tmpdir).glob("run-*.json")
        assert json.loads(record.read_text())["clusters"], "the record named no server"
        if reaper == "clean":
            proc = _cli(run, "clean")
        else:
            proc = _cli(run, "run", "A", "--report-dir", str(tmp_path / "next"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reaped = [line for line in proc.stdout.splitlines() if "reaped" in line]
        print("\n".join(reaped))
        (line,) = [x for x in reaped if f"reaped run of pid {run.proc.pid}" in x]
        # At least every segment the test saw: a server that came up just
        # before the kill, after the test's last look at the postmaster.pid
        # files, is the reaper's to count too (a CI run saw 7, reaped 8).
        counted = re.search(r"(\d+) shared memory segment\(s\)", line)
        assert counted and int(counted.group(1)) >= len(segments), (line, segments)
        assert outside.leftovers(seen, run.tmpdir) == []
    finally:
        run.close()


def test_reaping_leaves_a_live_run_alone(tmp_path: Path) -> None:
    run = outside.start(["run", "D"], tmp_path)
    try:
        run.wait_file("*/logs/D-*/A.events.jsonl")
        proc = _cli(run, "clean")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "nothing left behind" in proc.stdout
        assert f"left alone (still running): pid {run.proc.pid}" in proc.stdout
        code, _, seen = run.finish()
        assert code == 0, run.output
        assert outside.leftovers(seen, run.tmpdir) == []
    finally:
        run.close()


def test_a_record_whose_pid_was_reused_is_reaped(tmp_path: Path) -> None:
    """Same pid, another start time: another process, so the owner is dead."""
    base = outside.private_tmpdir()
    try:
        record = run_records.RunRecord.create(base=base, kind="run")
        (record.temp_root / "data").mkdir()
        (record.temp_root / "data" / "file").write_bytes(b"x" * 10_000)
        data = json.loads(record.path.read_text())
        data["owner"]["started"] -= 3600  # "our" pid, but started an hour earlier
        data["owner"]["start_ticks"] -= 360_000
        record.path.write_text(json.dumps(data))
        report = run_records.reap_dead(base)
        assert [r.owner_pid for r in report.reaped] == [os.getpid()]
        assert not record.temp_root.exists() and not record.path.exists()
        # A live record (the real start time) is left alone.
        live = run_records.RunRecord.create(base=base, kind="run")
        assert run_records.reap_dead(base).live and live.temp_root.exists()
        live.release()
        assert not live.temp_root.exists() and not live.path.exists()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_live_record_read_a_clock_adjustment_later_is_left_alone() -> None:
    """The wall-clock start the record keeps is the boot time (whole seconds,
    the wall clock minus the uptime) plus the kernel's ticks; a clock
    adjustment between writer and reader moves the boot time by a second.
    The kernel's ticks do not move: the owner is alive (a live test
    session's temp root was reaped by a `fencecheck clean` beside it)."""
    base = outside.private_tmpdir()
    try:
        record = run_records.RunRecord.create(base=base, kind="run")
        data = json.loads(record.path.read_text())
        assert isinstance(data["owner"]["start_ticks"], int)
        data["owner"]["started"] -= 1.0
        record.path.write_text(json.dumps(data))
        report = run_records.reap_dead(base)
        assert report.reaped == [] and record.temp_root.exists()
        # A record of an older version (no ticks): the start time within 2 s.
        del data["owner"]["start_ticks"]
        record.path.write_text(json.dumps(data))
        assert run_records.reap_dead(base).reaped == [] and record.temp_root.exists()
        record.release()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_another_hosts_record_and_an_unreadable_one_are_left_alone() -> None:
    base = outside.private_tmpdir()
    try:
        state = run_records.state_dir(base)
        state.mkdir()
        elsewhere = {"owner": {"pid": 1, "started": 0, "host": "another-host"}, "temp_dirs": []}
        (state / "run-1-a.json").write_text(json.dumps(elsewhere))
        (state / "run-2-b.json").write_text("{not json")
        report = run_records.reap_dead(base)
        assert report.reaped == [] and len(report.live) == 1
        assert report.unreadable == ["run-2-b.json"]
        assert sorted(p.name for p in state.iterdir()) == ["run-1-a.json", "run-2-b.json"]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_record_kept_past_commands_is_not_released_by_their_end(tmp_path: Path) -> None:
    # The test session's record: every in-process `fencecheck` command ends by
    # releasing this process's records, which once killed the session cluster.
    kept = run_records.RunRecord.create(base=tmp_path, kind="test", released_by_command=False)
    mine = run_records.RunRecord.create(base=tmp_path, kind="run")
    try:
        run_records.release_unreleased()
        assert kept.temp_root.is_dir() and kept.path.exists()
        assert not mine.temp_root.exists() and not mine.path.exists()
    finally:
        kept.release()
    assert not kept.temp_root.exists() and not kept.path.exists()


def test_a_command_releases_only_the_records_it_made(tmp_path: Path) -> None:
    # A test session's shared services, made before an in-process command,
    # outlive it: the command's last step must not take their temp root (the
    # main matrix of a fresh-clone CI once found its directory gone).
    before = run_records.RunRecord.create(base=tmp_path, kind="run")
    try:
        began = time.time()
        mine = run_records.RunRecord.create(base=tmp_path, kind="run")
        run_records.release_unreleased(created_after=began)
        assert before.temp_root.is_dir() and before.path.exists()
        assert not mine.temp_root.exists() and not mine.path.exists()
    finally:
        before.release()


def test_a_release_that_met_a_problem_reaps_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory a just-killed server still wrote to: the first pass keeps
    the record, one more pass after a pause removes what is left and the
    record, and the release reports both passes' removals."""
    record = run_records.RunRecord.create(base=tmp_path, kind="run")
    real = run_records.reap_record
    passes: list[int] = []

    def flaky(path: Path, data: dict[str, object], **kw: object) -> run_records.Reaped:
        passes.append(1)
        if len(passes) == 1:
            first = run_records.Reaped(record=path.name, owner_pid=os.getpid())
            first.temp_dirs, first.problems = ["/gone/early"], ["could not remove it yet"]
            return first
        return real(path, data)

    monkeypatch.setattr(run_records, "reap_record", flaky)
    monkeypatch.setattr(run_records, "RETRY_PAUSE_S", 0.0)
    reaped = record.release()
    assert len(passes) == 2 and not reaped.problems
    assert "/gone/early" in reaped.temp_dirs and str(record.temp_root) in reaped.temp_dirs
    assert not record.temp_root.exists() and not record.path.exists()
