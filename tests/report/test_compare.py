"""`fencecheck report --compare RUN_A RUN_B`: verdict changes, facts, exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.evidence.compare import compare_runs
from tests.report.conftest import dump, load


def test_a_regression_and_the_changed_facts(
    run_pass: Path, run_fail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "compare.html"
    code = main(["report", "--compare", str(run_pass), str(run_fail), "--html", str(page)])
    out = capsys.readouterr().out
    assert code == 1
    assert "REGRESSION B: pass → fail" in out
    assert "mutant: CHANGED" in out and "write_ignores_epoch" in out
    assert "only in before: H[sync_cancelled_wait]" in out and "only in after: K" in out
    assert "REGRESSION" in page.read_text()


def test_worker_digest_and_postgres_version_changes(run_pass: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "archives").mkdir(parents=True)
    for path in (run_pass / "archives").glob("*.yaml"):
        archive = load(path)
        archive["worker"]["digest"] = "sha256:" + "b" * 64
        archive["postgres_version"] = "PostgreSQL 15.9"
        dump(other / "archives" / path.name, archive)
    c = compare_runs(run_pass, other)
    changed = {name: (a, b) for name, a, b in c.fact_changes}
    assert changed["worker digest"][1] == "sha256:" + "b" * 64
    assert changed["PostgreSQL version"] == (
        load(run_pass / "archives" / "B.yaml")["postgres_version"],
        "PostgreSQL 15.9",
    )
    assert not c.changes and not c.regressions


def test_the_same_run_has_no_change(run_pass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--compare", str(run_pass), str(run_pass)]) == 0
    assert "0 changed, 0 regression(s)" in capsys.readouterr().out


def test_repetitions_compare_by_counts(run_mixed: Path, run_pass: Path) -> None:
    c = compare_runs(run_pass, run_mixed)
    b = next(ch for ch in c.changes if ch.experiment == "B")
    assert b.before == "pass" and b.after == "1 pass, 1 fail, 1 unknown" and b.regression


def test_compare_usage(run_pass: Path, tmp_path: Path) -> None:
    assert main(["report", str(run_pass), "--compare", str(run_pass), str(run_pass)]) == 64
    assert main(["report", "--compare", str(run_pass), str(tmp_path)]) == 64
