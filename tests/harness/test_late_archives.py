"""A job whose teardown outlasted a stop's grace writes its archive later; the
run's results then name it (results.json used to show no archive for it)."""

from __future__ import annotations

from pathlib import Path

from harness.cli.run import _attach_late_archives
from harness.evidence.summary import ExperimentResult
from harness.verdict import Verdict


def _result(variant: str | None, started: bool) -> ExperimentResult:
    return ExperimentResult(
        experiment_id="E", title="t", variant=variant, repeat_index=1, verdict=Verdict.UNKNOWN,
        reason="interrupted", duration_s=2.5 if started else 0.0, natural_wait_s=0.0,
        archive_path=None, invariant="i",
    )  # fmt: skip


def test_late_archives_are_attached_only_when_written(tmp_path: Path) -> None:
    (tmp_path / "archives").mkdir()
    (tmp_path / "archives" / "E-query-r1.yaml").write_text("{}\n")
    written, missing, never_started = (
        _result("query", True),
        _result("none", True),
        _result("query", False),
    )
    assert _attach_late_archives([written, missing, never_started], tmp_path)
    assert written.archive_path == tmp_path / "archives" / "E-query-r1.yaml"
    assert missing.archive_path is None and never_started.archive_path is None
    assert not _attach_late_archives([missing], tmp_path)
