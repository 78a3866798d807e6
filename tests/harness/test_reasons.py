"""Reasons are one short line wherever a person reads a list of them; the
archive keeps the whole text; a worker's short reply is *unknown* naming the
field, never a KeyError (fast, no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.engine.experiment import Inconclusive, ReplyFields
from harness.evidence.summary import (
    ExperimentResult,
    write_junit,
    write_results_json,
    write_summary,
)
from harness.verdict import REASON_CHARS, Verdict, reason_line

SQL_ERROR = "\n".join(
    ["inconclusive: setup op 'claim' on A failed: InternalError: syntax error at or near"]
    + [f"CONTEXT:  PL/pgSQL function procrastinate_fetch_job(x) line {i} at SQL statement" for i in range(40)]
)  # fmt: skip


def test_a_long_reason_is_one_line_of_bounded_length() -> None:
    line = reason_line(SQL_ERROR)
    assert "\n" not in line and len(line) <= REASON_CHARS
    assert line.startswith("inconclusive: setup op 'claim' on A failed") and line.endswith("…")


def test_a_short_reason_is_kept_as_it_is() -> None:
    assert reason_line("every invariant held") == "every invariant held"
    assert reason_line("two\n  lines") == "two lines"


def result(reason: str) -> ExperimentResult:
    return ExperimentResult(
        "R", "stale holder", None, 0, Verdict.UNKNOWN, reason, 1.0, 0.8, None, ""
    )


def test_every_list_shows_one_line(tmp_path: Path) -> None:
    results = [result(SQL_ERROR)]
    summary = write_summary(tmp_path / "summary.md", results, header={}, wall_s=1.0).read_text()
    (row,) = [line for line in summary.splitlines() if line.startswith("| R |")]
    assert "<br>" not in row and results[0].reason in row
    assert len(results[0].reason) <= REASON_CHARS
    junit = write_junit(tmp_path / "junit.xml", results, suite="s").read_text()
    assert f'message="{results[0].reason}"' in junit
    data = json.loads(write_results_json(tmp_path / "r.json", results).read_text())
    assert data["results"][0]["reason"] == results[0].reason


def test_a_missing_reply_field_is_inconclusive_naming_it() -> None:
    fields = ReplyFields("A", "claim", {"run_id": "r-1"})
    assert fields["run_id"] == "r-1" and fields.get("epoch") is None
    with pytest.raises(Inconclusive, match="A's reply to claim has no field 'epoch'"):
        fields["epoch"]
