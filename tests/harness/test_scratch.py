"""Where a run's temp root goes (harness/engine/run_records.scratch_base)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from harness.engine import run_records
from harness.engine.run_records import RunRecord, scratch_base, state_dir


def test_a_given_work_dir_wins(tmp_path: Path) -> None:
    assert scratch_base(tmp_path, prefer_memory=True) == (tmp_path, "--work-dir")


def test_tmpdir_is_respected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert scratch_base(None, prefer_memory=True)[0] == tmp_path


def test_a_roomy_tmpfs_or_the_system_temp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    where, why = scratch_base(None, prefer_memory=True)
    if why == "tmpfs":
        assert where == run_records.MEMORY_SCRATCH
    else:
        assert where == Path(tempfile.gettempdir())
    monkeypatch.setattr(run_records, "MEMORY_SCRATCH_MIN_FREE", 1 << 62)  # never that roomy
    assert scratch_base(None, prefer_memory=True)[1] == "system temp directory"
    assert scratch_base(None, prefer_memory=False)[1] == "system temp directory"


def test_the_record_stays_in_the_state_dir_wherever_the_root_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    record = RunRecord.create(base=None, kind="test", prefer_memory=True)
    try:
        assert record.path.parent == state_dir(None)
        assert record.temp_root.is_dir()
        assert str(record.temp_root.parent) in record.scratch
    finally:
        record.release()
    assert not record.temp_root.exists()
